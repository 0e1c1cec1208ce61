"""Learning curves of a suite: the main metric against the number of labelled training examples,
one curve per row (say pretrained and from scratch), mean and spread over seeds, and the labels
pretraining saves (their table and chart, learning_curves.png: `gpt_ft.eval.results`), and
reference curves measured elsewhere on the same subsets (a TF-IDF baseline) drawn beside them.

GPT-1's thesis shows where labels are scarce (ULMFiT, Howard & Ruder 2018, Fig. 3): at a few
hundred examples a pretrained model can match one trained from scratch on many times more.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt_ft.eval.results import mean_std

Values = dict[int | None, dict[int, float | None]]
"""Scores by training size (None: the whole split) and seed."""

CURVE_FILE = '{"name": NAME, "tasks": {TASK: {SIZE: {SEED: SCORE}}}}'
"""A baseline's learning curves as a JSON file (`read_baselines`)."""

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
        out[row or ONE_ROW] = curve(values, examples_of(values, whole))
    return out


def examples_of(sizes, whole: Callable[[], int]) -> dict[int | None, int | None]:
    """The examples each size trains on: a size beyond the split, the whole split's `whole()`
    (`stratified_subset`), as does None ("all"; None where the split cannot be read: off the chart)."""
    try:
        total = whole() if sizes else None
    except Exception:  # noqa: BLE001  (the split is not readable here: "all" is left off the chart)
        total = None
    return {size: total if size is None else min(size, total or size) for size in sizes}


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
    if not measured or not any(p["mean"] is not None and p["examples"] for p in mine.values()):
        return None  # (a row with no point measured reaches nothing, nor fails to)
    largest = max(measured, key=lambda p: p["examples"])
    reached = [
        p for p in mine.values() if p["mean"] is not None and p["examples"] and p["mean"] >= largest["mean"]
    ]
    at = min(reached, key=lambda p: p["examples"]) if reached else None
    return {
        "row": first,
        "against": second,
        "target": largest["mean"],
        "target_examples": largest["examples"],
        "examples": at["examples"] if at else None,
        "ratio": largest["examples"] / at["examples"] if at else None,
    }


ONE_ROW = "fine-tuned"
"""The curve of a suite without `rows`: its one row's."""


def read_baselines(paths: list[str | Path], rows: list[str | None]) -> dict[str, dict[str, Values]]:
    """Reference curves to draw beside a suite's rows (dashed where named like TF-IDF), {name:
    {task: {size (None: all): {seed: score}}}}, from JSON files of {"name": NAME, "tasks": {TASK:
    {SIZE: {SEED: SCORE}}}} (scores in percent or null, sizes whole numbers or "all"), as
    `benchmarks/tfidf_baseline.py --train-sizes ... --json FILE` writes. A file that is not one, or
    a name already taken by a row or another file, is named in one sentence."""
    out: dict[str, dict[str, Values]] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(
                f"Baseline file {path} cannot be read: {getattr(e, 'strerror', None) or e}."
            ) from None
        except ValueError as e:
            raise ValueError(f"Baseline file {path} is not JSON: {e}.") from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(data.get("tasks"), dict)
        ):
            raise ValueError(f"Baseline file {path} is not a learning curve: expected {CURVE_FILE}.")
        name = data["name"]
        if name in out or name in [row or ONE_ROW for row in rows or [None]]:
            raise ValueError(f"Baseline file {path} names its curve {name!r}, as a row or another file does.")
        out[name] = {task: _points(path, task, points) for task, points in data["tasks"].items()}
    return out


def _points(path: str | Path, task: str, points: Any) -> Values:
    where = f"Baseline file {path}, task {task}"
    if not isinstance(points, dict):
        raise ValueError(f"{where}: expected {{SIZE: {{SEED: SCORE}}}}, got {points!r}.")
    values: Values = {}
    for size, seeds in points.items():
        if size != "all" and not (re.fullmatch("[0-9]+", size) and int(size) > 0):  # ('²', '١٠': no size)
            raise ValueError(f"{where}: size {size!r} is not a positive whole number or 'all'.")
        if not isinstance(seeds, dict):
            raise ValueError(f"{where}, size {size}: expected {{SEED: SCORE}}, got {seeds!r}.")
        for seed, score in seeds.items():
            number = isinstance(score, (int, float)) and not isinstance(score, bool)
            if not re.fullmatch("[0-9]+", seed) or not (score is None or number):
                raise ValueError(
                    f"{where}, size {size}: seed {seed!r} with score {score!r} is not SEED: SCORE."
                )
        # NaN or Infinity (JSON's, as Python writes a correlation of constant predictions): undefined
        defined = {int(k): v if v is None or math.isfinite(v) else None for k, v in seeds.items()}
        values[None if size == "all" else int(size)] = defined
    return values


def baseline_curves(
    baselines: dict[str, dict[str, Values]],
    task: str,
    sizes: list[int | None],
    seeds: list[int],
    whole: Callable[[], int],
) -> dict[str, dict[str, Any]]:
    """{name: curve} of the baselines that measured `task`, on the suite's sizes and seeds only (the
    same subsets as its rows, of as many examples: `examples_of`)."""
    out = {}
    for name, tasks in baselines.items():
        values = {
            size: {seed: v for seed, v in by_seed.items() if seed in seeds}
            for size, by_seed in tasks.get(task, {}).items()
            if size in sizes
        }
        values = {size: by_seed for size, by_seed in values.items() if by_seed}
        if values:
            out[name] = curve(values, examples_of(values, whole))
    return out
