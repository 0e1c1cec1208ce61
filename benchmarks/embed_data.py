"""The data of benchmarks/bench_embed.py: STS-B's pairs in GLUE's layout, and NLI records as
triplets in tasks/embedding/pairs.yaml's."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path


def nli_triplets(args, out: Path) -> Path:
    """DIR/{train,validation,test}.jsonl of (anchor, positive, [negative]) from the NLI records:
    each premise with an entailment and a contradiction, in the file's order (pairs.yaml's layout)."""
    by_premise: dict[str, dict[str, str]] = {}
    with open(args.nli, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            by_premise.setdefault(r["premise"], {}).setdefault(r["label"], r["hypothesis"])
    rows = [
        {"anchor": p, "positive": h["entailment"], "negatives": [h["contradiction"]]}
        for p, h in by_premise.items()
        if "entailment" in h and "contradiction" in h
    ][: args.train_size]
    folder = out / "nli"
    folder.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", rows), ("validation", rows[:64]), ("test", rows[:64])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return folder


def sts_files(args, out: Path) -> Path:
    """DIR/STS-B/train.tsv (--train-size pairs, shuffled with seed 0; with --loss infonce those
    scored >= 4) and DIR/STS-B/dev.tsv (all), in GLUE's layout."""
    folder = out / "sts" / "STS-B"
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train.tsv"), ("dev", "dev.tsv")):
        with open(Path(args.glue) / "STS-B" / name, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header, *rows = list(reader)
        if split == "train":
            random.Random(0).shuffle(rows)
            rows = rows[: args.train_size]
            if args.loss == "infonce":
                rows = [r for r in rows if float(r[header.index("score")]) >= 4.0]
        with open(folder / name, "w", encoding="utf-8", newline="") as f:
            # the text as it is: no escape character, which both readers (unquoted) would keep as text
            writer = csv.writer(
                f, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None, lineterminator="\n"
            )
            writer.writerows([header, *rows])
    return folder.parent
