"""Writes the quickstart's synthetic sentiment task in GLUE's SST-2 layout, and its tokenizer.

Sentences such as "the plot was not very good ." or "the acting was dull but the music was
lovely ." carry their sentiment in an adjective, flipped by a negation, and decided by the clause
after "but". It is small and learnable in a minute on a CPU, with the files, columns and labels
of the real SST-2, so the real task card (tasks/glue/sst2.yaml) reads it.

    python examples/quickstart/make_data.py      # rewrites glue/SST-2/*.tsv and tokenizer/
"""

from __future__ import annotations

import random
from pathlib import Path

from gpt_ft.data.tokenizer import train_tokenizer

HERE = Path(__file__).parent
SUBJECTS = [
    "the movie",
    "the film",
    "the plot",
    "the acting",
    "the music",
    "the story",
    "the ending",
    "the cast",
    "the script",
    "the director",
    "this picture",
    "the dialogue",
]
VERBS = ["was", "is", "seemed", "felt", "looked"]
INTENSIFIERS = ["", "", "very ", "really ", "quite ", "truly ", "rather "]
POSITIVE = [
    "good",
    "great",
    "wonderful",
    "lovely",
    "moving",
    "funny",
    "charming",
    "brilliant",
    "clever",
    "fresh",
    "gripping",
    "beautiful",
]
NEGATIVE = [
    "bad",
    "awful",
    "dull",
    "boring",
    "weak",
    "clumsy",
    "tedious",
    "silly",
    "bland",
    "messy",
    "painful",
    "flat",
]
NEGATIONS = ["not ", "never ", "hardly "]


def clause(rng: random.Random) -> tuple[str, int]:
    positive = rng.random() < 0.5
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    negated = rng.random() < 0.3
    words = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(NEGATIONS) if negated else ''}"
    return f"{words}{rng.choice(INTENSIFIERS)}{adjective}", int(positive != negated)


def sentence(rng: random.Random) -> tuple[str, int]:
    text, label = clause(rng)
    if rng.random() < 0.3:  # "X but Y": Y decides
        second, label = clause(rng)
        text = f"{text} but {second}"
    return f"{text} .", label


def main(root: Path = HERE) -> None:
    rng = random.Random(0)
    out = root / "glue" / "SST-2"
    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": 4000, "dev": 500, "test": 500}
    for split, n in splits.items():
        rows = [sentence(rng) for _ in range(n)]
        if split == "test":  # GLUE test files: an index column and no labels
            lines = ["index\tsentence", *(f"{i}\t{text}" for i, (text, _) in enumerate(rows))]
        else:
            lines = ["sentence\tlabel", *(f"{text}\t{label}" for text, label in rows)]
        (out / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    train_tokenizer(
        inputs=[out / "train.tsv"],
        vocab_size=512,
        out_dir=root / "tokenizer",
        show_progress=False,
        overwrite=True,
    )


if __name__ == "__main__":
    main()
