"""Which rows of a split count: those a card does not leave out (`left_out`), and class-stratified,
seeded subsets of a training split, for learning curves (a score against the number of labelled
examples): every model compared at one size and seed trains on the same rows."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpt_ft.adapters import TaskDataError
from gpt_ft.data.layout import sliced

QUANTILES = 5  # strata of a real-valued label (regression): its quintiles


def stratified_subset(labels: Sequence[Any], size: int, seed: int) -> list[int]:
    """Indices (in file order) of `size` of the rows whose labels are `labels`: every row where
    there are no more than `size`.

    Each class keeps its share: it gets floor(size * n_class / n) rows, and the rows left over go
    to the classes with the largest remainders (ties: the larger class, then the label's order), so
    that a class of at least n / size rows is never left out. Real-valued labels (regression) are
    stratified by their quintiles. Within a class the rows are drawn with `random.Random(seed)`:
    the same labels, size and seed give the same rows, whatever model trains on them.
    """
    if size < 1:
        raise ValueError(f"train_size must be a positive number of examples, got {size}.")
    n = len(labels)
    if size >= n:
        return list(range(n))
    strata: dict[Any, list[int]] = {}
    for i, key in enumerate(_strata(labels)):
        strata.setdefault(key, []).append(i)
    order = sorted(strata, key=str)
    quotas = {key: size * len(strata[key]) // n for key in order}
    left = size - sum(quotas.values())
    by_remainder = sorted(
        order, key=lambda k: (-(size * len(strata[k]) % n), -len(strata[k]), order.index(k))
    )
    for key in by_remainder[:left]:
        quotas[key] += 1
    rng = random.Random(seed)
    chosen = [i for key in order for i in rng.sample(strata[key], quotas[key])]
    return sorted(chosen)


def training_subset(task, raw, size: int, seed: int) -> list[int]:
    """The rows of the training split `raw` (a dataset) that `--data.train_size` keeps. Rows without
    a label column (preference pairs: the chosen reply is the label), or whose label is no class (a
    solution's tagged steps), are one stratum. A row whose class is missing or refused is kept, so
    that its encoding names it, as the whole split's would."""
    stratified = task.output.stratified and task.label in raw.column_names
    labels, bad = class_ids(task.output, raw[task.label]) if stratified else ([None] * len(raw), None)
    kept = stratified_subset(labels, size, seed)
    return kept if bad is None else sorted({*kept, bad})


def class_ids(output, labels: Sequence[Any]) -> tuple[list[Any], int | None]:
    """Labels of one class each as its id, however the file spells it (a name in the card's
    `labels`, or its index): the same rows either way. Other labels, and a value that is no class,
    stay as they are. Also the first row whose label is missing or refused (None if none)."""
    ids, bad = [], None
    for i, value in enumerate(labels):
        try:
            label = output.example_label({output.spec.field: value})
        except Exception:  # (named, with its file and line, by the encoding)
            label = None
        if label is None and bad is None:
            bad = i
        ids.append(label if isinstance(label, int) and not isinstance(label, bool) else value)
    return ids, bad


def _strata(labels: Sequence[Any]) -> list[Any]:
    """Each row's stratum: its label, or for real-valued labels (numbers, or their text as a TSV
    cell holds them) the quintile it falls in, a row without one a stratum of its own; labels that
    are lists (a step's each, a ranking's scores) make one stratum, drawn at random."""
    if any(isinstance(v, (list, tuple)) for v in labels):
        return [0] * len(labels)
    numbers = [_number(v) for v in labels]
    if not any(x is not None and not x.is_integer() for x in numbers):
        return [str(v) for v in labels]
    ranked = sorted((i for i, x in enumerate(numbers) if x is not None), key=lambda i: numbers[i])
    strata = [-1] * len(labels)
    for rank, i in enumerate(ranked):
        strata[i] = math.floor(rank * QUANTILES / len(ranked))
    return strata


def _number(value: Any) -> float | None:
    """A label as a finite number, or None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


ALIKE = "its replies' scores, all alike (it orders nothing)"


def drawn(raw, origin, split: str, seed: int):
    """The split (and its `Origin`) a card's slice of a file (`origin.selection`) takes of the file's
    rows `raw` in the order `numpy.random.RandomState(seed).permutation` deals them: scikit-learn's
    `train_test_split(..., test_size=n, random_state=seed)` as `[:n]` (test) and `[n:]` (train)."""
    import numpy

    order = numpy.random.RandomState(seed).permutation(len(raw))
    span = sliced(origin.selection, len(raw))
    rows = [int(row) for row in order[span.start : span.stop]]
    if not rows:
        raise TaskDataError(f"{origin.source}: split {split!r} has no examples.")
    return raw.select(rows), replace(origin, selection="").keep(rows)


def left_out(raw, origin, split: str, rows: list[int], why: str, said: bool = False):
    """The split (and its `Origin`) without `rows`, whose label is `why` (`said`: how many, in a
    warning); none left is refused."""
    if rows and len(rows) == len(raw):
        raise TaskDataError(f"{origin.source}: split {split!r} has no examples: every row's label is {why}.")
    if rows and said:
        warnings.warn(
            f"{origin.source}: {len(rows)} row{'s' * (len(rows) > 1)} of split {split!r} left out: each "
            f"one's label is {why}."
        )
    kept = sorted(set(range(len(raw))) - set(rows))
    return (raw.select(kept), origin.keep(kept)) if rows else (raw, origin)
