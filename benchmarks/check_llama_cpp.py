"""gpt_ft's GGUF files read by llama.cpp itself (llama-cpp-python), on real weights and texts.

0. Reading: where --weights is a GGUF file, llama.cpp's ids for STS-B's sentences (dev and train),
   --lines WikiText-2 lines (--wikitext) and 40 lines of code indented by 1 to 40 spaces against
   gpt_ft's tokenizer of the file, each text as training reads it (a text spelling a special token is
   text: llama.cpp's `special=False`).
1. The language model: the weights (--weights: a GGUF file, a hub id or a folder) as transformers'
   causal-LM folder with their tokenizer, written by `write_gguf` as each --types (a family it does
   not write is said and skipped); for a GGUF file, the written file's vocabulary against the file's
   (tokens, types, the order of the pieces' scores); llama.cpp's ids for STS-B dev's sentences and the
   indented lines against gpt_ft's tokenizer, and its logits at every position of --prompts sentences
   against gpt_ft's (f32 KV cache): the largest difference, and how often the top token agrees.
2. A fine-tuned embedding model: `gpt-ft fit` of tasks/embedding/pairs.yaml from the weights on STS-B
   train's first --pairs sentence pairs (--steps of 16), `gpt-ft export --format gguf` as each
   --types, then llama.cpp's vectors (normalised, as llama-server gives them) for the first --texts dev
   sentences against `Encoder.encode`: ids, the largest difference, the least cosine, and each one's
   Spearman correlation on the dev pairs (whose both sentences are among the texts).

    python benchmarks/check_llama_cpp.py --weights weights/SmolLM2-135M-Instruct.Q4_1.gguf --glue GLUE_DIR
    python benchmarks/check_llama_cpp.py --weights weights/gemma-3-270m-q4_k_m.gguf --glue GLUE_DIR \\
        --wikitext WIKITEXT_DIR/valid.txt
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from paths import existing


def sts(glue: str, split: str) -> list[dict]:
    with open(Path(glue) / "STS-B" / f"{split}.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def llama(path: Path, **kwargs):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=512, n_threads=torch.get_num_threads(), verbose=False, type_k=0,
                 type_v=0, **kwargs)  # fmt: skip


def reading(args, texts: list[str]) -> None:
    from gpt_ft.data.tokenizer import load_tokenizer

    if args.wikitext is not None:
        lines = Path(args.wikitext).read_text(encoding="utf-8").splitlines()
        texts = texts + [line for line in lines if line.strip()][: args.lines]
    tokenizer, llm = load_tokenizer(args.weights), llama(Path(args.weights), vocab_only=True)
    ours = tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    print(f"reading {Path(args.weights).name}: ids equal on {agreeing(llm, texts, ours)}")


INDENTED = [f"def f(x):\n{' ' * n}return x  # {n} spaces" for n in range(1, 41)]  # runs of 1 to 40 spaces


def agreeing(llm, texts: list[str], ids: list[list[int]]) -> str:
    """On how many texts llama.cpp's ids (each text as training reads it) are `ids`, and of INDENTED's."""
    same = [llm.tokenize(t.encode(), add_bos=False, special=False) == i for t, i in zip(texts, ids)]
    indented = sum(s for t, s in zip(texts, same) if t in INDENTED)
    return f"{sum(same)}/{len(texts)} texts ({indented}/{len(INDENTED)} of the indented lines)"


def language_model(args, texts: list[str], out: Path) -> None:
    from gpt_ft import GPT
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.weights.gguf_write import write_gguf
    from gpt_ft.weights.hf import to_hf

    gpt, tokenizer = GPT.from_pretrained(args.weights).eval(), load_tokenizer(args.weights)
    folder = out / "lm"
    to_hf(gpt).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ids = tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    for kind in args.types:
        start = time.perf_counter()
        try:
            path = write_gguf(folder, out / f"lm-{kind}.gguf", outtype=kind)
        except ValueError as refused:
            print(f"language model: not written: {refused}")
            return
        written = time.perf_counter() - start
        if kind == args.types[0] and str(args.weights).endswith(".gguf"):
            vocabulary(Path(args.weights), path)
        llm = llama(path, logits_all=True)
        same = agreeing(llm, texts, ids)
        worst, agree, positions = 0.0, 0, 0
        for prompt in ids[: args.prompts]:
            llm.reset()
            llm.eval(prompt)
            theirs = np.array(llm.scores[: len(prompt)])
            with torch.no_grad():
                ours = gpt.lm_logits(gpt(torch.tensor([prompt])))[0].numpy()
            worst = max(worst, float(np.abs(theirs - ours).max()))
            agree += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
            positions += len(prompt)
        print(f"language model {kind}: written in {written:.1f} s; ids equal on {same}; "
              f"logits within {worst:.2e} at {positions} positions of {args.prompts} texts, the top token "
              f"the same at {agree}/{positions}")  # fmt: skip


def vocabulary(source: Path, written: Path) -> None:
    """The written file's tokens and their types against the source file's, and whether its pieces'
    scores (SentencePiece's: llama.cpp merges the best-scored pair) order them as the source's do."""
    import gguf

    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    a, b = ([f[k].contents() if k in f else None for k in keys] for f in (gguf.GGUFReader(p).fields for p in
            (source, written)))  # fmt: skip
    same = [sum(x == y for x, y in zip(a[i], b[i])) for i in (0, 1)]
    print(f"vocabulary: of {len(a[0])} ids ({len(b[0])} written), tokens equal on {same[0]}, types on "
          f"{same[1]}")  # fmt: skip
    if a[2] is not None and b[2] is not None:
        normal = [i for i, kind in enumerate(a[1]) if kind == gguf.TokenType.NORMAL]
        order = sorted(normal, key=lambda i: -a[2][i]) == sorted(normal, key=lambda i: -b[2][i])
        print(f"  its {len(normal)} normal pieces in the source's order of scores: {order}")


def embedding_model(args, out: Path) -> None:
    from scipy.stats import spearmanr

    from gpt_ft.eval.encoder import Encoder

    data = out / "pairs"
    data.mkdir()
    train = sts(args.glue, "train")
    splits = {"train": train[: args.pairs], "validation": train[args.pairs : args.pairs + 32]}
    for split, rows in {**splits, "test": splits["validation"]}.items():
        lines = [json.dumps({"anchor": r["sentence1"], "positive": r["sentence2"]}) for r in rows]
        (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = [
        sys.executable,
        "-m",
        "gpt_ft",
        "fit",
        "--data.task=tasks/embedding/pairs.yaml",
        f"--data.data_dir={data}",
        f"--model.init_from={args.weights}",
        "--data.batch_size=16",
        "--data.max_length=64",
        f"--trainer.max_steps={args.steps}",
        f"--trainer.default_root_dir={out / 'runs'}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--seed_everything=0",
    ]
    subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
    ckpt = next((out / "runs").rglob("last.ckpt"))
    dev = [r for r in sts(args.glue, "dev")][: args.texts // 2]
    texts, gold = (
        [r["sentence1"] for r in dev] + [r["sentence2"] for r in dev],
        [float(r["score"]) for r in dev],
    )
    encoder = Encoder.from_checkpoint(ckpt, device="cpu")
    start = time.perf_counter()
    ours = np.asarray(encoder.encode(texts))
    print(f"gpt_ft Encoder: {len(texts)} texts in {time.perf_counter() - start:.1f} s; Spearman "
          f"{spearman(ours, gold, spearmanr):.4f}")  # fmt: skip
    clf = encoder.classifier
    framed = [clf.task.frame(clf.specials, ids)[0] for ids in encoder.tokens(texts, None)]
    for kind in args.types:
        path = out / f"embedding-{kind}.gguf"
        export = [
            sys.executable,
            "-m",
            "gpt_ft",
            "export",
            f"--ckpt_path={ckpt}",
            f"--out={path}",
            "--format=gguf",
            f"--gguf_type={kind}",
        ]
        subprocess.run(export, check=True, stdout=subprocess.DEVNULL)
        llm = llama(path, embedding=True)
        same = sum(llm.tokenize(t.encode()) == ids for t, ids in zip(texts, framed))
        start = time.perf_counter()
        theirs = np.array([llm.embed(t, normalize=True) for t in texts])
        took = time.perf_counter() - start
        print(f"llama.cpp {kind}: ids equal on {same}/{len(texts)} texts; vectors within "
              f"{np.abs(theirs - ours).max():.2e}, least cosine {(theirs * ours).sum(1).min():.6f}; Spearman "
              f"{spearman(theirs, gold, spearmanr):.4f} ({took:.1f} s, one text at a time)")  # fmt: skip


def spearman(vectors: np.ndarray, gold: list[float], spearmanr) -> float:
    half = len(gold)
    return float(spearmanr((vectors[:half] * vectors[half : 2 * half]).sum(1), gold)[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--weights", required=True, help="a GGUF file, a hub id or a transformers folder")
    parser.add_argument("--glue", type=existing, required=True, help="GLUE's folder (STS-B/{train,dev}.tsv)")
    parser.add_argument("--types", nargs="+", default=["f32", "q8_0"], choices=["f32", "f16", "bf16", "q8_0"])
    parser.add_argument("--prompts", type=int, default=8, help="texts whose logits are compared")
    parser.add_argument("--texts", type=int, default=1000, help="dev sentences embedded (half the pairs)")
    parser.add_argument("--pairs", type=int, default=256, help="STS-B train pairs to fine-tune on")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--wikitext", type=existing, help="WikiText-2's valid.txt, for the reading check")
    parser.add_argument("--lines", type=int, default=1500, help="its first non-empty lines read")
    parser.add_argument("--skip", choices=["reading", "language-model", "embedding"], nargs="*", default=[])
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        texts = [r[key] for r in sts(args.glue, "dev") for key in ("sentence1", "sentence2")] + INDENTED
        if "reading" not in args.skip and str(args.weights).endswith(".gguf"):
            train = [r[key] for r in sts(args.glue, "train") for key in ("sentence1", "sentence2")]
            reading(args, texts + train)
        if "language-model" not in args.skip:
            language_model(args, texts, Path(scratch))
        if "embedding" not in args.skip:
            embedding_model(args, Path(scratch))


if __name__ == "__main__":
    main()
