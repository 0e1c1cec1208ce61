"""`gpt-ft fit` of a sentence embedding against sentence-transformers' trainer, end to end, on the
same weights, STS-B pairs and schedule; and what the same weights give untrained.

GLUE's STS-B train pairs are shuffled once (seed 0) and the first --train-size kept; the dev pairs
(all 1,500) score both. The weights are one transformers folder (--init-from: pretrained ones,
e.g. SmolLM2-135M's GGUF; else one random initialisation at --layers x --width with --tokenizer).
Then, one whole process each, in turns:

- `untrained`: `gpt-ft validate` of tasks/embedding/stsb.yaml from the weights as they are (the
  extract token's state, no projection);
- `ours`: `gpt-ft fit` with that card: each sentence alone [start] s [extract] in packed batches,
  its extract state normalised, --loss over the batch (cosent: CoSENT on the gold scores, the
  card's default; infonce: the pairs scored >= 4 as positives against the batch's others);
- `sentence-transformers`: `SentenceTransformerTrainer` with `Transformer` + last-token `Pooling` +
  `Normalize` from the same folder and its own tokenizer (no framing tokens: the last text token pools),
  padded batches, `CoSENTLoss` or `MultipleNegativesRankingLoss` (scale 20 = 1/τ for τ 0.05, as ours;
  batches without repeated texts, `NO_DUPLICATES`, as ours leaves repeats out of the negatives);
- `sentence-transformers-framed`: the same, each text framed as ours is, between the tokenizer's own
  start and end-of-text tokens (the rows ours copies into its framing tokens), so that both pool the
  same token: the token ids and the arithmetic are ours, the trainer theirs.

Both take the same batch, learning rate, linear schedule after --warmup of the steps, weight decay 0.01,
gradient clipping at 1.0, epochs and seed; neither saves a checkpoint. The wall time is each process's,
start to exit (scoring the dev pairs included); the score is the Spearman correlation of the dev pairs'
cosines with their gold scores (MTEB's STS). A row's ratio divides its time by ours.

With `--nli SNLI_DEV_JSONL` the training data are NLI triplets instead, as SBERT and SimCSE train: each
premise with both an entailed and a contradicted hypothesis (SNLI dev: 2,943) the anchor, its first
entailment the positive, its first contradiction the hard negative; InfoNCE both sides (ours:
tasks/embedding/pairs.yaml; theirs: `MultipleNegativesRankingLoss`, scale 1/τ), and the trained model then
scores STS-B dev, which it never saw (ours: `gpt-ft validate` of the STS-B card from the run's last.ckpt,
its time counted in ours). `ours-last` and `ours-mean` read each vector from the text's last token or the
mean of its tokens (`pooling`); `ours-mean-row`, the extract token whose row starts at the vocabulary's mean
(`--model.new_tokens mean`); `--seeds` repeats each contender. `pip install -e .[bench,sentence]` brings
sentence-transformers.

    python benchmarks/bench_embed.py --glue GLUE --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --bf16
    python benchmarks/bench_embed.py --glue GLUE --tokenizer GPT2_BPE  # a random Llama-shaped model
    python benchmarks/bench_embed.py --glue GLUE --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --nli SNLI_DIR/dev.jsonl --batch-size 32 --lr 5e-5 --seeds 0 1 2 \\
        --contenders untrained ours ours-last ours-mean sentence-transformers
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_vs_trainer  # noqa: E402  (the weights folder and the timing of whole processes)
import harness  # noqa: E402
import peers  # noqa: E402  (the peer's arguments and schedule)
from embed_data import nli_triplets, sts_files  # noqa: E402
from paths import existing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "tasks" / "embedding" / "stsb.yaml"
CONTENDERS = ["untrained", "ours", "ours-last", "ours-mean", "ours-mean-row", "sentence-transformers",
              "sentence-transformers-framed"]  # fmt: skip
PAIRS = ROOT / "tasks" / "embedding" / "pairs.yaml"


def ours(args, base: Path, data: Path, out: Path, train: bool, pooling: str = "extract", seed: int = 0,
         nli: Path | None = None) -> list[list[str]]:  # fmt: skip
    """The `gpt-ft` commands of one contender: validate (untrained), fit (STS-B), or fit on the NLI
    triplets then validate on STS-B from the run's last.ckpt."""
    precision = "bf16-mixed" if args.device == "cuda" or args.bf16 else "32-true"
    common = [
        f"--data.tokenizer={base}", f"--data.max_length={args.max_length}",
        f"--data.batch_size={args.batch_size}", f"--data.task.init_args.pooling={pooling}",
        f"--seed_everything={seed}", f"--trainer.precision={precision}",
        f"--trainer.accelerator={args.device}", "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={out}",
    ]  # fmt: skip
    sts = [f"--data.task={CARD}", f"--data.data_dir={data}", *common]
    gpt_ft = [sys.executable, "-m", "gpt_ft"]
    if not train:
        return [[*gpt_ft, "validate", *sts, f"--model.init_from={base}"]]
    schedule = [
        f"--model.init_from={base}", f"--model.lr={args.lr}", f"--model.warmup_fraction={args.warmup}",
        "--model.weight_decay=0.01", f"--trainer.max_epochs={args.epochs}", "--trainer.gradient_clip_val=1.0",
        "--trainer.enable_checkpointing=false", "--trainer.num_sanity_val_steps=0",
    ]  # fmt: skip
    if nli is not None:  # last.ckpt saved (a cost the peer has not) for the STS-B run to read
        schedule.remove("--trainer.enable_checkpointing=false")
        triplets = [f"--data.task={PAIRS}", f"--data.data_dir={nli}", *common]
        triplets.append("--trainer.limit_val_batches=0")  # (the STS-B run validates)
        last = out / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
        return [
            [*gpt_ft, "fit", *triplets, *schedule],
            [*gpt_ft, "validate", *sts, f"--model.init_from={last}"],
        ]
    loss = ["--data.task.init_args.loss=infonce", "--data.task.init_args.metrics=[spearman]"]
    return [[*gpt_ft, "fit", *sts, *(loss if args.loss == "infonce" else []), *schedule]]


def peer(
    args, base: Path, data: Path, out: Path, framed: bool, seed: int = 0, nli: Path | None = None
) -> list[str]:
    train = nli / "train.jsonl" if nli is not None else data / "STS-B" / "train.tsv"
    return [
        sys.executable, __file__, "peer", f"--base={base}", f"--train={train}",
        f"--dev={data / 'STS-B' / 'dev.tsv'}", f"--out={out}", f"--device={args.device}",
        f"--batch-size={args.batch_size}", f"--lr={args.lr}", f"--warmup={args.warmup}",
        f"--epochs={args.epochs}", f"--loss={'infonce' if nli else args.loss}",
        f"--max-length={args.max_length}", f"--seed={seed}",
        *(["--bf16"] if args.bf16 else []), *(["--framed"] if framed else []),
    ]  # fmt: skip


def run_peer(argv: list[str]) -> None:
    """sentence-transformers' side, in its own process: trains, scores the dev pairs, prints Spearman."""
    parser = peers.peer_parser()
    parser.add_argument("--loss", choices=["cosent", "infonce"], required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--framed", action="store_true", help="each text as ours frames it")
    args = parser.parse_args(argv)

    import numpy as np
    from datasets import Dataset
    from scipy.stats import spearmanr
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from sentence_transformers.training_args import BatchSamplers

    def read(path: str) -> dict[str, list]:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        return {
            "sentence1": [start + r["sentence1"] + end for r in rows],
            "sentence2": [start + r["sentence2"] + end for r in rows],
            "score": [float(r["score"]) for r in rows],
        }

    # The text as it is: sentence-transformers 6 otherwise renders each text through the tokenizer's
    # chat template (SmolLM2's: a system prompt and the user turn around it) and pools its last token.
    plain = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
    text_only = dict(modality_config=plain, module_output_name="token_embeddings")
    takes = "modality_config" in inspect.signature(Transformer.__init__).parameters
    transformer = Transformer(args.base, max_seq_length=args.max_length, **(text_only if takes else {}))
    model = SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_word_embedding_dimension(), "lasttoken"), Normalize()],
        device="cuda" if args.device == "cuda" else "cpu",
    )
    start = end = ""
    if args.framed:  # the tokenizer parses its own special tokens out of the text: ours' ids exactly
        from gpt_ft.data.tokenizer import own_framing_tokens

        own = own_framing_tokens(transformer.tokenizer)
        start, end = transformer.tokenizer.convert_ids_to_tokens([own["start"], own["extract"]])
    if args.train.endswith(".jsonl"):  # NLI triplets: anchor, positive, hard negative
        with open(args.train, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        triplets = {"anchor": [start + r["anchor"] + end for r in rows],
                    "positive": [start + r["positive"] + end for r in rows],
                    "negative": [start + r["negatives"][0] + end for r in rows]}  # fmt: skip
        dataset, loss = Dataset.from_dict(triplets), losses.MultipleNegativesRankingLoss(model, scale=20.0)
        train = None
    else:
        train = read(args.train)
    if train is None:
        pass
    elif args.loss == "cosent":
        dataset, loss = Dataset.from_dict(train), losses.CoSENTLoss(model, scale=20.0)
    else:
        pairs = {"anchor": train["sentence1"], "positive": train["sentence2"]}
        dataset, loss = Dataset.from_dict(pairs), losses.MultipleNegativesRankingLoss(model, scale=20.0)
    negatives = train is None or args.loss != "cosent"  # in-batch: no text twice, as their docs advise
    sampler = {"batch_sampler": BatchSamplers.NO_DUPLICATES} if negatives else {}
    config = SentenceTransformerTrainingArguments(**peers.peer_schedule(args, len(dataset)), **sampler)
    SentenceTransformerTrainer(model=model, args=config, train_dataset=dataset, loss=loss).train()
    dev = read(args.dev)
    a = model.encode(dev["sentence1"], batch_size=args.batch_size)
    b = model.encode(dev["sentence2"], batch_size=args.batch_size)
    cosines = (np.asarray(a) * np.asarray(b)).sum(axis=1)
    print(json.dumps({"spearman": float(spearmanr(cosines, dev["score"]).statistic)}))


def spearman_of(contender: str, run_dir: Path, log: Path) -> float:
    if contender.startswith("sentence-transformers"):
        lines = [line for line in log.read_text().splitlines() if line.startswith('{"spearman"')]
        return json.loads(lines[-1])["spearman"]
    return harness.last_value(harness.metrics_rows(run_dir), "validation/spearman")


POOLING = {"untrained": "extract", "ours": "extract", "ours-last": "last", "ours-mean": "mean",
           "ours-mean-row": "extract"}  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["peer"]:
        return run_peer(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", type=existing, required=True, help="GLUE's folder (STS-B/{train,dev}.tsv)")
    parser.add_argument("--nli", type=existing, help="NLI records (JSON lines: premise, hypothesis, label) "
                        "to train on as triplets instead of STS-B's pairs")  # fmt: skip
    parser.add_argument("--tokenizer", help="a tokenizer for random weights; not with --init-from")
    parser.add_argument("--init-from", default=None, help="pretrained weights (a .gguf, a folder, a hub id)")
    parser.add_argument("--contenders", nargs="+", default=None, choices=CONTENDERS,
                        help="default: all but ours-mean; ours-mean-row with --init-from only")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="each contender once per seed")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--train-size", type=int, default=5749, help="STS-B train pairs (all: 5749), or "
                        "the first NLI triplets")  # fmt: skip
    parser.add_argument("--loss", choices=["cosent", "infonce"], default="cosent")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16, help="pairs a batch")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=float, default=0.1, help="share of the steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], type=harness.device)
    parser.add_argument("--bf16", action="store_true", help="bf16 on the CPU too (bf16-mixed, the peer's)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_embed"))
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    if not (args.tokenizer or args.init_from):
        parser.error("give --tokenizer (random weights) or --init-from (pretrained ones)")
    if args.contenders is None:  # all but ours-mean; ours-mean-row needs pretrained rows
        unfit = {"ours-mean", *["ours-mean-row"] * (not args.init_from)}
        args.contenders = [c for c in CONTENDERS if c not in unfit]
    if "ours-mean-row" in args.contenders and not args.init_from:  # random weights hold their rows
        parser.error("ours-mean-row needs --init-from: it starts the framing rows of pretrained weights")
    out = Path(args.out).resolve()  # (a relative one from where it runs)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    model = args.init_from or f"random, {args.layers} layers x {args.width}"
    precision = "bf16" if args.bf16 or args.device == "cuda" else "fp32"
    base = bench_vs_trainer.base_folder(args, "pretrained" if args.init_from else "llama", out)
    data = sts_files(args, out)
    nli = nli_triplets(args, out) if args.nli else None
    trained_on = (
        f"NLI triplets ({sum(1 for _ in open(nli / 'train.jsonl'))}), infonce"
        if nli else f"STS-B, {args.train_size} train pairs, {args.loss}"
    )  # fmt: skip
    print(
        f"{model}; {trained_on}, {args.batch_size} a batch, {args.epochs} epoch(s), lr {args.lr}; "
        f"{args.device}, {precision}, {torch.get_num_threads()} threads; scored on STS-B dev"
    )
    results: dict[str, list[tuple[float, float]]] = {}
    for seed in args.seeds:
        for contender in args.contenders:
            if contender == "untrained" and seed != args.seeds[0]:
                continue  # nothing random in it
            run_dir = out / f"{contender}-seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh version_0 (NLI: its last.ckpt)
            log = run_dir.with_suffix(".log")
            if contender.startswith("sentence-transformers"):
                commands = [peer(args, base, data, run_dir, contender.endswith("framed"), seed, nli)]
            else:
                train = contender != "untrained"
                commands = ours(args, base, data, run_dir, train, POOLING[contender], seed, nli)
                if contender == "ours-mean-row":  # the weights as given: new framing rows, at the mean
                    start = f"--model.init_from={args.init_from or base}"
                    commands[0] = [start if a.startswith("--model.init_from") else a for a in commands[0]]
                    commands[0].append("--model.new_tokens=mean")
            seconds = sum(bench_vs_trainer.timed(command, log.with_suffix(f".{i}.log"))[0]
                          for i, command in enumerate(commands))  # fmt: skip
            logs = run_dir.with_suffix(f".{len(commands) - 1}.log")
            spearman = spearman_of(contender, run_dir, logs)
            results.setdefault(contender, []).append((seconds, spearman))
            print(f"{contender:30} seed {seed} {seconds:7.1f} s  dev Spearman {spearman:.4f}", flush=True)
    mean = {c: [sum(x) / len(x) for x in zip(*runs)] for c, runs in results.items()}
    mine = mean.get("ours", (None,))[0]
    rows = []
    for c, runs in results.items():
        seconds, spearman = mean[c]
        spread = [r for _, r in runs]
        rows.append(dict(contender=c, seconds=round(seconds, 1), spearman=spearman, runs=len(runs),
                         spearman_min=min(spread), spearman_max=max(spread),
                         vs_ours=round(seconds / mine, 2) if mine else None))  # fmt: skip
    print("\n| contender | runs | wall s (mean) | STS-B dev Spearman: mean (min-max) | its time / ours |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['vs_ours']:.2f}x" if r["vs_ours"] and r["contender"] != "untrained" else ""
        spread = f" ({r['spearman_min']:.4f}-{r['spearman_max']:.4f})" if r["runs"] > 1 else ""
        print(
            f"| {r['contender']} | {r['runs']} | {r['seconds']:.0f} | {r['spearman']:.4f}{spread} | {ratio} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
