"""JSON task files as written: their records with their own keys, a record lacking a field the task
reads, a line that is no JSON object, and text no UTF-8 holds (half of a surrogate pair, which JSON
may escape), each in one sentence naming the file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpt_ft.adapters import TaskDataError
from gpt_ft.adapters.sources import path_value
from gpt_ft.data.file_faults import file_bytes, file_format, json_kind, place, record_lines

SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""A JSON escape of half a surrogate pair: a file without one holds no lone half (no UTF-8 does)."""


def lone_half(records: list, text: str) -> tuple[int, str] | None:
    """The first record (its index) holding half of a UTF-16 surrogate pair escaped alone, which
    Python's json reads and no text holds, and that half; None where none does."""
    if SURROGATE.search(text) is None:
        return None
    for i, record in enumerate(records):
        try:
            json.dumps(record, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            return i, ascii(exc.object[exc.start : exc.end])[1:-1]
    return None


HALF = ("{}: {} escapes half of a UTF-16 surrogate pair alone, which is no text; escape the whole pair, "
        "or write the character")  # fmt: skip
"""The sentence of `lone_half` (where, the half)."""


def json_records(path: Path, rows: list[dict], start: int = 0) -> list[dict]:
    """The records of a JSON-lines file or JSON array as written, each with its own keys (a table
    gives every record every key, None where it had none), from record `start` (a slice of the file)
    on, as many as `rows`, the table's; those rows for any other file."""
    if file_format(path) != "json":
        return rows
    text = file_bytes(path).decode("utf-8-sig")
    try:
        if text.lstrip().startswith("["):  # a JSON array; else JSON lines (one document: not a list)
            records = json.loads(text)
        else:
            records = [json.loads(line) for line in text.split("\n") if line.strip()]
    except ValueError:
        return rows
    if isinstance(records, list) and start:
        records = records[start : start + len(rows)]
    ok = isinstance(records, list) and len(records) == len(rows) and all(isinstance(r, dict) for r in records)
    if ok and (found := lone_half(records, text)):  # Python's json keeps what the table dropped
        where = place(path, record_lines(path, "json"), start + found[0])
        raise TaskDataError(HALF.format(where, found[1]) + ".")
    return records if ok else rows


def absent_field(origin, fields: dict[str, str], table) -> str | None:
    """Where a JSON file's record lacks a field the task reads text from (`fields`: its name in the
    table -> in the file, or its path, `a.text`), which the table gives as null, an empty text: the
    first such record (named by its `Origin`) in one sentence; None where each has them, or no JSON."""
    if origin.path is None or file_format(origin.path) != "json":
        return None
    nulls = [f for f in fields if f in table.column_names and None in table[f]]
    if not nulls:
        return None
    first = origin.first_row(record_lines(origin.path, "json"))
    records = json_records(origin.path, [None] * len(table), first)
    absent = object()
    lacks = lambda record, name: name not in record and path_value(record, name, absent) is absent  # noqa: E731
    for i, record in enumerate(records if records and isinstance(records[0], dict) else []):
        for field in (f for f in nulls if lacks(record, fields[f])):
            return (
                f"{origin.of(i)}: the record has no field {fields[field]!r}, a text the task reads "
                "(null: an empty one)."
            )
    return None


def json_lines_problem(path: Path) -> str | None:
    """The first line of a JSON-lines file that is not one JSON object, as `, line N: ...`, or what
    a one-document file holds that is not records; None for a good file. Found before loading: the
    loader is never handed such a line or document (`null` crashes the process)."""
    try:
        text = file_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError:
        return None  # the loader's failure names the line
    deep = "values nested too deeply to read (objects or arrays one inside another, a thousand deep)"
    try:
        document = json.loads(text)  # one document (or one line)
    except json.JSONDecodeError:
        pass
    except RecursionError:  # (Python's parser recurses: a crafted line ended in a traceback)
        if text.lstrip(" \t\r\n").startswith("["):
            return f": {deep}"
    else:
        if isinstance(document, dict):
            return None
        if not isinstance(document, list):
            records = "records (an array of objects, or an object a line)"
            return f": a JSON file holds {records}, not {json_kind(document)}"
        bad = next(((n, r) for n, r in enumerate(document, 1) if not isinstance(r, dict)), None)
        if bad:
            return f": record {bad[0]} of its array is {json_kind(bad[1])}, not a JSON object ({{...}})"
        found = lone_half(document, text)
        return found and HALF.format(place("", record_lines(path, "json"), found[0]), found[1])
    if text.lstrip(" \t\r\n").startswith("["):
        return None  # a JSON array that does not parse: named after the loader fails
    records, starts = [], []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as bad:
            return f", line {n}, column {bad.colno}: not valid JSON ({bad.msg})"
        except RecursionError:
            return f", line {n}: {deep}"
        if not isinstance(record, dict):
            return f", line {n}: a JSON object ({{...}}) is expected on each line, not {json_kind(record)}"
        records.append(record), starts.append(n)
    found = lone_half(records, text)
    return found and HALF.format(place("", starts, found[0]), found[1])
