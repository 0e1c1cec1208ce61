"""`gpt-ft label`: a file's rows written again with a fine-tuned model's prediction beside each.

A file of any length is labelled a chunk of a few thousand rows at a time: the chunk is encoded,
run (its longest examples together) and written to a hidden file beside the output, which takes
the output's name once every row is written. Memory stays a chunk's, whatever the file's length,
and a run stopped or refused part way leaves the previous file as it was. Every row is encoded
once before any is run, so a bad row is named before the model's work begins.
"""

from __future__ import annotations

import base64
import csv
import itertools
import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.adapters.truncation import TRAINED, cut_report
from gpt_ft.data.file_faults import file_format, place, record_lines
from gpt_ft.data.files import header_of, read_table
from gpt_ft.data.json_faults import json_records
from gpt_ft.errors import at_least_one, check_output_file, input_file, writing
from gpt_ft.eval.classifier import CHUNK, Classifier
from gpt_ft.eval.devices import device_named
from gpt_ft.eval.progress import batches_bar


def label(
    *,
    ckpt_path: str,
    input: str,
    output: str,
    overwrite: bool = False,
    batch_size: int = 32,
    device: str | None = None,
) -> None:
    """Write each example of a file again with the fine-tuned model's prediction beside it.

    `gpt-ft label`.

    Args:
        ckpt_path: A fine-tuned checkpoint of gpt-ft fit.
        input: csv, tsv, json/jsonl or parquet; columns named as the card's fields, or as its
            files name them (the card's `columns` renames apply).
        output: csv, tsv, json (one array), jsonl or parquet (by extension); a new file.
        overwrite: Replace --output if it exists.
        batch_size: Examples per batch.
        device: Default: cuda when there is one.
    """
    source, target = input_file(input, "--input"), Path(output).expanduser()
    at_least_one(batch_size, "--batch_size")
    if target.suffix.lower() not in (".csv", ".tsv", *WHOLE_ROWS):
        raise ValueError(f"--output {target}: write .csv, .tsv, .json, .jsonl or .parquet.")
    check_output_file(output, "--output", overwrite=overwrite, reads=source)
    fmt = file_format(source)
    if fmt is None:
        raise ValueError(
            f"--input {source}: give a .csv, .tsv, .json/.jsonl or .parquet file (by its extension)."
        )
    clf = Classifier.from_checkpoint(ckpt_path, device=device_named(device))
    if clf.task.output.embeds:
        raise ValueError(
            f"{ckpt_path} is an embedding model (task {clf.task.name!r}): `gpt-ft embed` writes its vectors."
        )
    task = clf.task
    renames = {  # a file laid out as the card's files or hub dataset: their renames apply
        **((task.hub.columns if task.hub else None) or {}),
        **((task.local.columns if task.local else None) or {}),
    }
    try:
        first = header_of(source, "\t" if fmt == "tsv" else ",") if fmt in ("tsv", "csv") else []
    except (OSError, UnicodeDecodeError, EOFError, TaskDataError):  # (said, with its line, just below)
        first = []
    headerless = bool(first) and reads_as_data(task, first, renames)  # laid out as the card's, no header
    table = read_table(source, column_names=task.local.column_names if headerless else None)  # (CoLA's)
    # A JSON file's records as written (a record's missing field stays missing), whole, as JSON is
    # read; any other file's rows a chunk at a time from its table.
    records = json_records(source, table.to_list()) if fmt == "json" else None
    count = len(records) if records is not None else table.num_rows
    blank: list[int] = []  # a csv's or tsv's blank lines, left out as training leaves them: said
    lines = record_lines(source, fmt, header=not headerless, blanks=blank)  # (parquet: rows by number)
    size = batch_size * -(-CHUNK // batch_size)  # whole batches: one bar over the file's

    def chunks() -> Iterator[tuple[int, list[dict[str, Any]]]]:
        for start in range(0, count, size):
            yield (
                start,
                records[start : start + size]
                if records is not None
                else table.select(range(start, min(start + size, count))).to_list(),
            )

    def encoded(start: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fields = [
            {renames[k] if k in renames and renames[k] not in row else k: v for k, v in row.items()}
            for row in rows
        ]
        try:
            return clf.encode(fields, where=lambda i: place(source, lines, start + i))
        except TaskDataError as exc:  # a field no row of a table has: its header's fault, not line 2's
            absent = [f for f in task.text_fields() if fmt != "json" and fields and f not in fields[0]]
            if absent and f"has no field {absent[0]!r}" in str(exc):
                raise TaskDataError(
                    f"{source} has no column {absent[0]!r}, which task {task.name!r} reads; its columns: "
                    f"{', '.join(table.column_names)}."
                ) from None
            raise

    cuts = [example["cut"] for start, rows in chunks() for example in encoded(start, rows)]
    ticks = iter(batches_bar("label")(range(-(-count // batch_size))))
    progress = lambda starts: (start for start, _ in zip(starts, ticks))  # noqa: E731
    columns = (
        list(dict.fromkeys(k for r in records for k in r)) if records is not None else table.column_names
    )
    header = not headerless or target.suffix.lower() != f".{fmt}"  # (as it was: in its own format only)
    with labelled_file(target, columns, overwrite=overwrite, header=header) as out:
        for start, rows in chunks():
            out.write(rows, clf.run_encoded(encoded(start, rows), batch_size=batch_size, progress=progress))
    next(ticks, None)  # the bar's end
    moved = [got for wanted, got in out.columns_written().items() if got != wanted]
    renamed = f" (as {' and '.join(moved)}: it has such columns)" if moved else ""
    between = [n for n in blank if lines and n < lines[-1]]  # (past the last row: no row out of place)
    left = (
        f"; blank line{'s' * (len(between) > 1)} {', '.join(map(str, between))} left out" if between else ""
    )
    print(f"labelled {count:,} example{'s' * (count != 1)} of {source} into {target}{renamed}{left}")
    if said := cut_report(str(source), cuts, clf.max_length, remedy=TRAINED):
        print(said)


def reads_as_data(task: TaskAdapter, header: list[str], renames: dict[str, str]) -> bool:
    """Whether a file's first line, read as its `header`, is a row of the card's files that have
    none (`local.column_names`): as many cells, not every text field named (`renames` applied),
    a label where the label is."""
    names, label = (task.local.column_names if task.local else None) or [], task.label_column
    named = {renames.get(c, c) for c in header}
    if len(header) != len(names) or set(task.text_fields()) <= named or label not in names:
        return False
    try:  # read as the card reads a label cell: GoEmotions' "15,17" split, an empty one unlabelled
        task.output.example_label({task.output.spec.field: header[names.index(label)]})
        return True
    except TaskDataError:  # "label", "gold": a header
        return False


NEW_COLUMNS = {"label": "prediction", "scores": "scores"}  # an outcome's keys, the columns they fill
WHOLE_ROWS = (".json", ".jsonl", ".parquet")  # outputs that take the whole outcome, typed


def write_labelled(
    path: Path,
    rows: list[dict[str, Any]],
    labelled: list[tuple[dict[str, Any], str]],
    columns: dict[str, str] = NEW_COLUMNS,
    *,
    overwrite: bool = True,
) -> dict[str, str]:
    """`rows` with their outcomes, written whole or not at all (`labelled_file`); the name each
    column written got, by the name it wanted."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    with labelled_file(path, keys, columns, overwrite=overwrite) as out:
        out.write(rows, labelled)
    return out.columns_written()


@contextmanager
def labelled_file(
    path: Path, columns: list[str], new: dict[str, str] = NEW_COLUMNS, *, overwrite: bool = True, header=True
) -> Iterator[LabelledFile]:
    """A `LabelledFile` for rows of these `columns` (a csv or tsv with a `header` line), written to a
    hidden file beside `path`, which takes `path`'s name when the block ends without an error (else
    it goes, and a previous file at `path` is kept; `put_in_place`)."""
    out = LabelledFile(path, columns, new, header=header)
    try:
        with writing(path):  # no space left, permission denied: one sentence, the previous file kept
            out.tmp.parent.mkdir(parents=True, exist_ok=True)
            out.file = out.tmp.open("w", encoding="utf-8", newline="")
        yield out
        with writing(path):
            out.close()
            put_in_place(out.tmp, path, overwrite=overwrite)
    finally:
        if out.file:
            with suppress(OSError):  # (a full disk fails the flush of what is buffered again)
                out.file.close()
        out.tmp.unlink(missing_ok=True)


class LabelledFile:
    """Rows written with a `prediction` column (json, jsonl and parquet: the `scores` and the rest of
    the outcome, such as a preference's `probability`, too), a chunk at a time. `new`: the outcome's
    keys and the columns they fill (`gpt-ft generate`'s: its `continuation`), each named apart from
    the rows' own `columns` (`prediction_1`, ... where the rows have their own)."""

    def __init__(self, path: Path, columns: list[str], new: dict[str, str], header: bool = True) -> None:
        self.path, self.columns, self.new, self.header = path, columns, new, header
        self.suffix, self.tmp = path.suffix.lower(), hidden_beside(path)
        self.file, self.csv, self.names, self.wanted, self.tables, self.rows = None, None, None, {}, [], 0

    def write(self, rows: list[dict[str, Any]], labelled: list[tuple[dict[str, Any], str]]) -> None:
        """`rows` and their outcomes (with the prediction as text, for csv and tsv), in order."""
        first, self.names = self.names is None, self.names or {}
        for key, name in [*self.new.items(), *((key, key) for outcome, _ in labelled for key in outcome)]:
            if key not in self.names:  # the columns the outcomes fill, named as met (a later chunk's too)
                self.wanted[key], self.names[key] = name, free_name(name, set(self.columns))
        if first and self.header and self.suffix in (".csv", ".tsv"):
            self._cells([*self.columns, self.names["label"]])
        with writing(self.path):
            self._write(rows, labelled)
        self.rows += len(rows)

    def _write(self, rows, labelled) -> None:
        if self.suffix not in WHOLE_ROWS:  # a csv or tsv gets the prediction alone, as text
            for row, (_, text) in zip(rows, labelled):
                self._cells([*(_cell(row.get(c)) for c in self.columns), text])
            return
        if self.suffix == ".parquet":  # every column in each record: a table's come from its first
            rows = [{c: row.get(c) for c in self.columns} for row in rows]
        own = finite if self.suffix != ".parquet" else dict  # (parquet keeps a row's own NaN and infinities)
        records = [  # the whole outcome beside each row
            {**own(row), **finite({name: outcome[key] for key, name in self.names.items() if key in outcome})}
            for row, (outcome, _) in zip(rows, labelled)
        ]
        if self.suffix == ".parquet":  # each column typed as its values are (a parquet input's kept)
            self.tables.append(self._typed(lambda pa: pa.Table.from_pylist(records), records))
        elif self.suffix == ".jsonl":
            self.file.writelines(json.dumps(r, ensure_ascii=False, default=jsonable) + "\n" for r in records)
        else:  # one array, as a .json input is read: json.dumps(all records, indent=1), a record at a time
            for i, record in enumerate(records, self.rows):
                text = json.dumps(record, ensure_ascii=False, indent=1, default=jsonable)
                self.file.write(("[\n" if i == 0 else ",\n") + re.sub("^", " ", text, flags=re.M))

    def _cells(self, cells: list[str]) -> None:
        if self.suffix == ".tsv":  # read back without quoting, as GLUE's files are
            self.file.write("\t".join(re.sub(r"\r\n|[\t\r\n]", " ", c) for c in cells) + "\n")
        else:
            self.csv = self.csv or csv.writer(self.file, lineterminator="\n")  # (as the tsv, and pandas)
            quoted = any("\r" in c for c in cells)  # (csv quotes a lone CR only where its line ends hold one)
            writer = csv.writer(self.file, lineterminator="\n", quoting=csv.QUOTE_ALL) if quoted else self.csv
            writer.writerow(cells)

    def _typed(self, make, records=()):
        import pyarrow as pa

        try:
            return make(pa)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # a column of several types (JSON records')
            kinds = {}  # (a ranking's outcomes: one reply's reward, several replies' list of rewards)
            for record in records:
                for key, value in record.items():
                    kinds.setdefault(key, set()).add(isinstance(value, list) if value is not None else None)
            mixed = [key for key, seen in kinds.items() if {True, False} <= seen]
            why = (
                f"column {mixed[0]!r} holds lists in some rows and single values in others" if mixed else exc
            )
            raise ValueError(
                f"--output {self.path}: parquet cannot hold these rows ({why}); write .jsonl."
            ) from None

    def close(self) -> None:
        if self.names is None:  # no rows: the header, or an empty array or table
            self.write([], [])
        if self.suffix == ".json":
            self.file.write("\n]\n" if self.rows else "[]\n")
        self.file.close()
        if self.suffix == ".parquet":
            import pyarrow.parquet as pq

            whole = self._typed(lambda pa: pa.concat_tables(self.tables, promote_options="permissive"))
            pq.write_table(whole, self.tmp)

    def columns_written(self) -> dict[str, str]:
        """The name each column written got, by the name it wanted (a csv or tsv: the prediction's alone)."""
        whole = self.suffix in WHOLE_ROWS
        return {self.wanted[key]: got for key, got in self.names.items() if whole or key == "label"}


def hidden_beside(path: Path) -> Path:
    """The hidden file beside `path` (the file a symbolic link names) that one process writes before
    it takes `path`'s name; a name near the file system's 255 bytes is cut to leave room."""
    path, tail = Path(os.path.realpath(path)), f".{os.getpid()}.tmp"
    return path.with_name("." + os.fsdecode(os.fsencode(path.name)[: 254 - len(tail)]) + tail)


def put_in_place(tmp: Path, path: Path, *, overwrite: bool, option: str = "--output") -> None:
    """`tmp` under `path`'s name (the file a symbolic link names, as opening it would write).
    Without `overwrite`, a file another process wrote there meanwhile (two runs with one `option`)
    is refused, not replaced: a hard link takes a name only where there is none, so no check can
    go stale before it."""
    path = Path(os.path.realpath(path))
    if overwrite:
        return tmp.replace(path)
    again = ", or --overwrite true to replace it" if option == "--output" else ""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise ValueError(
            f"{option} {path} was written by another process while this one ran: give another name"
            f"{again} (it is kept)."
        ) from None
    except OSError:  # a file system without hard links: checked, then renamed
        if path.exists():
            raise ValueError(f"{option} {path} was written by another process while this one ran.") from None
        return tmp.replace(path)
    tmp.unlink()


def free_name(name: str, taken: set[str]) -> str:
    """`name`, or the first of name_1, name_2, ... not `taken`."""
    return next(
        n for n in itertools.chain([name], (f"{name}_{i}" for i in itertools.count(1))) if n not in taken
    )


def jsonable(value: Any) -> Any:
    """A value JSON has no type for, written as text: a date or time as ISO 8601 (a parquet column's),
    bytes as their UTF-8 text (as training reads a binary column), else base64."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity (a parquet float column's missing cell) as None: JSON has
    no such numbers, and strict readers refuse Python's `NaN` (a parquet output keeps the input's)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return [finite(v) for v in value] if isinstance(value, list) else value


def _cell(value: Any) -> str:
    """A table cell: a list or mapping (a row's steps, its replies) as JSON, not Python's repr; a
    missing value (None, a parquet float column's NaN) as an empty cell, as spreadsheets write it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return (
        json.dumps(finite(value), ensure_ascii=False, default=jsonable)
        if isinstance(value, (list, dict))
        else jsonable(value)
        if isinstance(value, (bytes, bytearray))
        else str(value)
    )
