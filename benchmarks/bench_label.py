"""Labelling speed: `Classifier` (what `gpt-ft label` runs) against transformers' text-classification
pipeline on the same model exported with `gpt-ft export`, on the same texts, batch for batch.

    python benchmarks/bench_label.py --preset gpt-mini --examples 2000 --batch 32
    python benchmarks/bench_label.py --texts GLUE_DIR/SST-2/dev.tsv --tokenizer OPENAI_GPT_DIR --preset gpt1

Random weights (speed does not depend on them); the texts are a file's `sentence` column or, by
default, generated sentences of 3 to 60 words. Prints examples/s of each (median of interleaved
runs, with the range) and the ratio; the labels of the two are checked to agree.
"""

from __future__ import annotations

import argparse
import csv
import random
import tempfile
from pathlib import Path

import harness
import torch
from paths import existing

from gpt_ft.adapters import SingleText
from gpt_ft.data.tokenizer import load_tokenizer, train_tokenizer
from gpt_ft.eval.classifier import Classifier
from gpt_ft.eval.export import export_classifier
from gpt_ft.model import GPT, GPTConfig

WORDS = "the a film plot cast was is not very good bad dull gripping funny two hours of an and but".split()


def texts_from(path: str | None, n: int) -> list[str]:
    if path is not None:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
        return (rows * (n // len(rows) + 1))[:n]
    rng = random.Random(0)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 60))) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt-mini")
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--texts", type=existing, default=None, help="a tsv with a sentence column (SST-2's)")
    parser.add_argument("--tokenizer", default=None, help="default: a BPE trained on the texts")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    texts = texts_from(args.texts, args.examples)
    with tempfile.TemporaryDirectory(dir=harness.RUNS if harness.RUNS.exists() else None) as work:
        measure(args, texts, Path(work))


def measure(args, texts: list[str], work: Path) -> None:
    """The model, its export into `work` and the two contenders' timings, printed."""
    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        (work / "corpus.txt").write_text("\n".join(texts))
        train_tokenizer(
            inputs=[work / "corpus.txt"], vocab_size=2000, out_dir=work / "tok", show_progress=False
        )
        tokenizer_dir = str(work / "tok")
    tokenizer = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    config = GPTConfig.from_name(args.preset, vocab_size=len(tokenizer))
    task = SingleText(name="sst2", labels=["negative", "positive"])
    head = task.head(config.n_embd, dropout=0.0, init_std=0.02, bias=config.bias)
    clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=args.max_length, device="cpu")
    folder = export_classifier(clf, work / "exported")

    from transformers import pipeline

    classify = pipeline("text-classification", model=str(folder), device="cpu")
    examples = [{"sentence": t} for t in texts]
    ours = [o["label"] for o in clf.predict(examples, batch_size=args.batch)]
    theirs = [r["label"] for r in classify(texts, batch_size=args.batch, truncation=True)]
    agree = sum(a == b for a, b in zip(ours, theirs)) / len(texts)

    stats = harness.interleaved(
        {
            "gpt_ft Classifier (gpt-ft label)": lambda: clf.predict(examples, batch_size=args.batch),
            "transformers pipeline": lambda: classify(texts, batch_size=args.batch, truncation=True),
        },
        runs=args.runs,
        warmup=0,
    )
    print(
        f"{len(texts)} texts, {args.preset}, batch {args.batch}, {torch.get_num_threads()} threads; "
        f"labels agree on {agree:.1%}"
    )
    for name, s in stats.items():
        print(f"  {name}: {s.rate(len(texts))} examples/s")
    a, b = stats.values()
    print(f"  ratio: {b.median / a.median:.2f}x (gpt_ft / pipeline, examples/s)")


if __name__ == "__main__":
    main()
