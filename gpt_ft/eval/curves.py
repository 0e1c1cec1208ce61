"""Learning curves of a suite: the main metric against the number of labelled training examples,
one curve per row (say pretrained and from scratch), mean and spread over seeds, and the labels
pretraining saves (their table and chart, learning_curves.png: `gpt_ft.eval.results`).

GPT-1's thesis shows where labels are scarce (ULMFiT, Howard & Ruder 2018, Fig. 3): at a few
hundred examples a pretrained model can match one trained from scratch on many times more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpt_ft.eval.results import mean_std

MISSING = object()
"""What a curve's `score` callback returns for a run that has not finished."""


def collect_curves(
    score: Callable[[str | None, int | None, int], Any],
    rows: list[str | None],
    sizes: list[int | None],
    seeds: list[int],
    whole: Callable[[], int],
) -> dict[str, dict[str, Any]]:
    """Each row's curve, {row: curve}, from `score(row, size, seed)`: a score in percent, None where
    undefined, or MISSING where the run has not finished. A size of None is the whole split, of
    `whole()` examples (left off the chart where the split cannot be read)."""
    out = {}
    for row in rows:
        values: dict[int | None, dict[int, float | None]] = {}
        for size in sizes:
            for seed in seeds:
                value = score(row, size, seed)
                if value is not MISSING:
                    values.setdefault(size, {})[seed] = value
        examples: dict[int | None, int | None] = {size: size for size in values if size is not None}
        if None in values:
            try:
                examples[None] = whole()
            except Exception:  # noqa: BLE001  (the split is not readable here: "all" is left off the chart)
                examples[None] = None
        out[row or "fine-tuned"] = curve(values, examples)
    return out


def curve(
    values: dict[int | None, dict[int, float | None]], examples: dict[int | None, int]
) -> dict[str, Any]:
    """One row's curve from {size (None: all): {seed: score}} and the examples each size trained on:
    {size key: {"examples", "seeds", "mean", "std"}}, the sizes in increasing order."""
    out = {}
    for size in sorted(values, key=lambda s: examples.get(s) or float("inf")):
        seeds = values[size]
        out["all" if size is None else str(size)] = {
            "examples": examples.get(size),
            "seeds": {str(k): v for k, v in seeds.items()},
            **mean_std(list(seeds.values())),
        }
    return out


def labels_saved(curves: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """How many labels the first row needs to reach the second row's score at the largest size
    measured: the smallest size at which its mean is at least that score, and the ratio of the two
    sizes (None where it never does); None with fewer than two rows."""
    if len(curves) < 2:
        return None
    (first, mine), (second, theirs) = list(curves.items())[:2]
    measured = [p for p in theirs.values() if p["mean"] is not None and p["examples"]]
    if not measured:
        return None
    largest = max(measured, key=lambda p: p["examples"])
    reached = [p for p in mine.values() if p["mean"] is not None and p["mean"] >= largest["mean"]]
    at = min(reached, key=lambda p: p["examples"]) if reached else None
    return {
        "row": first,
        "against": second,
        "target": largest["mean"],
        "target_examples": largest["examples"],
        "examples": at["examples"] if at else None,
        "ratio": largest["examples"] / at["examples"] if at else None,
    }
