"""Examples' ids: an integer, or a text (a UUID) that names its prediction in a submission file, or a
record of ids (a MultiRC question's: its paragraph's, its own and its answers'), written as JSON."""

from __future__ import annotations

import json
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.adapters.sources import with_path_columns
from gpt_ft.data.files import Origin


def integer_id(value: Any) -> int | None:
    """An index field's value as a 64-bit integer id, or None where it is none: a text only as an
    integer writes itself ("007" and "1_000" are texts, written back as they are)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    try:
        number = int(text := str(value).strip())
    except ValueError:
        return None
    return number if -(2**63) <= number < 2**63 and str(number) == text else None


def id_text(value: Any) -> str:
    """An id as a submission's TSV file writes it: a record of ids as JSON, on one line."""
    return json.dumps(value) if isinstance(value, dict) else str(value)


def id_names(values: list, origin: Origin, field: str) -> dict[int, str | dict]:
    """A test split's ids that are not all integers, by row number, to name its predictions (a
    record of ids kept whole); {} (rows numbered, as is said) where one cannot name a row of a TSV
    file: missing, blank, spread over lines or columns, or another row's."""
    column = origin.in_file(field)
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        named = isinstance(value, (str, int, dict)) and not isinstance(value, bool)
        text = json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value) if named else ""
        if not text.strip() or any(c in text for c in "\t\n\r"):
            rank_zero_warn(
                f"{origin.of(i)}: {column} {value!r} names no prediction, so the predictions of this "
                f"split number its rows from 0 instead of by {column}."
            )
            return {}
        if (j := first.setdefault(text, i)) != i:
            raise TaskDataError(
                f"{origin.of(i)} repeats the {column} of {origin.of(j)} ({text!r}): each example needs an "
                "id of its own (its prediction is written under it)."
            )
    return {
        origin.index(i): value if isinstance(value, dict) else str(value) for i, value in enumerate(values)
    }


def example_ids(task: TaskAdapter, split: str, raw, origin: Origin):
    """A split's examples (`task_examples`'), the field holding their integer ids (None: rows
    numbered) and, for a test split whose ids are not all integers, their names by row (`id_names`).
    The card's `index` may name a nested field of the examples as the shape makes them (ReCoRD's
    `idx.query`), which gets a column of its own."""
    if task.index and task.index not in raw.column_names:
        try:
            raw = with_path_columns(raw, [task.index], task.name)
        except TaskDataError as exc:
            raise TaskDataError(origin.explain(f"{origin.source}: {exc}")) from None
    field = task.index if task.index in raw.column_names else None
    if (
        field is None and task.index not in (None, "idx") and split in task.test_splits and origin.path
    ):  # a file
        raise TaskDataError(
            f"{origin.source} has no field {task.index!r}, the card's index (the ids that name its "
            f"predictions); its fields: {', '.join(origin.file_columns(raw.column_names))}. Name the "
            "right one, or give `index: null` to number the rows."
        )
    if field is None or all(integer_id(v) is not None for v in raw[field]):
        return raw, field, {}
    return raw, None, id_names(raw[field], origin, field) if split in task.test_splits else {}
