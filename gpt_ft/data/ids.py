"""Examples' ids: an integer, or a text (a UUID) that names its prediction in a submission file."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from gpt_ft.adapters import TaskDataError
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


def id_names(values: list, origin: Origin, field: str) -> dict[int, str]:
    """A test split's ids that are not all integers, by row number, to name its predictions; {} (rows
    numbered, as is said) where one cannot name a row of a TSV file: missing, blank, spread over
    lines or columns, or another row's."""
    column = dict(origin.columns).get(field, field)  # as the file names it
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
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
    return {origin.index(i): str(value) for i, value in enumerate(values)}
