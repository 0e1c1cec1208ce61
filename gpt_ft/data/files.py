"""A task's split as a `datasets.Dataset`: from local files (csv, tsv, json/jsonl, parquet; text
files may be gzipped, e.g. `train.jsonl.gz`) under `--data.data_dir` laid out as the card's `local`
says, or from the Hugging Face Hub."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.errors import CardError

SLICE = re.compile(r"^(?P<file>.*?)(?P<slice>\[[^\[\]]*\])?$")
_FORMATS = {".tsv": "tsv", ".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def file_format(path: Path) -> str | None:
    """The format a file's extension names (`.jsonl.gz`: json), or None."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes.pop()
    return _FORMATS.get(suffixes[-1]) if suffixes else None


def _bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped when its name ends in .gz (a file that does not gunzip: one
    `TaskDataError` sentence)."""
    data = path.read_bytes()
    if path.suffix.lower() != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise TaskDataError(f"{path}: cannot be gunzipped ({exc}); its name ends in .gz.") from None


def _open_text(path: Path, **kwargs):
    """A file opened as text (utf-8, a byte-order mark dropped), gunzipped when it ends in .gz."""
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8-sig", **kwargs)
    return path.open(encoding="utf-8-sig", **kwargs)


def _text(path: Path) -> str:
    return _bytes(path).decode("utf-8-sig")


def load_split(task: TaskAdapter, split: str, data_dir: str | Path | None):
    """One split of the task as a `datasets.Dataset`, columns renamed to the adapter's field names.

    From local files under `data_dir` when given (the card's `local` layout), else from the Hub.
    """
    import datasets

    if data_dir is not None:
        return _load_local(task, split, Path(data_dir).expanduser())
    if task.hub is None:
        raise CardError(f"Task {task.name!r} has no hub dataset; pass its files with --data.data_dir DIR.")
    hub_split = (task.hub.splits or {}).get(split, split)
    config = (task.hub.configs or {}).get(split, task.hub.name)
    try:
        ds = datasets.load_dataset(task.hub.path, config, split=hub_split, data_dir=task.hub.data_dir)
    except ValueError as exc:  # unknown split
        raise TaskDataError(
            f"Hub dataset {task.hub.path} ({config}) has no split {hub_split!r}: {exc}"
        ) from exc
    return _rename(ds, task.hub.columns, f"hub dataset {task.hub.path}")


def _load_local(task: TaskAdapter, split: str, data_dir: Path):
    spec = task.local
    if spec is None:
        raise CardError(
            f"Task {task.name!r} defines no local file layout; drop --data.data_dir to use the hub."
        )
    if split not in spec.splits:
        raise CardError(
            f"Task {task.name!r} has no local split {split!r}; its card defines {sorted(spec.splits)}."
        )
    origin = split_origin(task, split, data_dir)
    path = origin.path
    if not path.is_file():
        raise TaskDataError(f"{path}: file not found (split {split!r} of task {task.name!r}).")
    if path.stat().st_size == 0:
        raise TaskDataError(f"{path}: file is empty (split {split!r} of task {task.name!r}).")
    ds = read_table(
        path,
        fmt=spec.format,
        column_names=None if origin.header else spec.column_names,
        selection=origin.selection,
        split=split,
    )
    return _rename(ds, spec.columns, str(path))


def read_table(
    path: Path,
    *,
    fmt: str | None = None,
    column_names: list[str] | None = None,
    selection: str = "",
    split: str = "data",
):
    """A csv, tsv, json/jsonl or parquet file as a `datasets.Dataset`, every csv/tsv cell as text.

    `column_names` names the columns of a file without a header row; `selection` is a slice such
    as `[:1497]`. Problems are one `TaskDataError` sentence naming the file.
    """
    import datasets

    fmt = fmt or file_format(path)
    if fmt is None:
        raise TaskDataError(
            f"{path}: unknown file format; set `format` (tsv, csv, json, parquet) in the card."
        )
    if path.suffix.lower() == ".gz":
        _bytes(path)  # a file that does not gunzip is named here, not deep in the loader
    if fmt in ("tsv", "csv"):
        sep = "\t" if fmt == "tsv" else ","
        try:
            columns = list(column_names) if column_names is not None else _header(path, sep)
        except UnicodeDecodeError as exc:
            raise TaskDataError(f"{path}{parse_problem(path, fmt, None, exc)}.") from None
        except OSError as exc:
            raise TaskDataError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
        # Everything is read as text (labels and scores are parsed by the adapter). GLUE's TSVs
        # hold unbalanced quote characters, so TSVs are read with no quoting; BOMs are dropped.
        features = datasets.Features({c: datasets.Value("string") for c in columns})
        kwargs = dict(
            sep=sep,
            quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
            encoding="utf-8-sig",
            keep_default_na=False,
            na_filter=False,
            features=features,
        )
        # Names always given: pandas would rename an empty header cell (SWAG's CSVs start with one).
        kwargs.update(header=None if column_names is not None else 0, column_names=columns)
        builder = "csv"
    else:
        builder, kwargs = fmt, {}
        if fmt == "json" and (problem := _json_lines_problem(path)) is not None:
            raise TaskDataError(f"{path}{problem}.")
    verbosity = datasets.logging.get_verbosity()
    # datasets logs a file that does not parse before raising; the sentence below says it instead.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        files = {"data": str(path)}
        return datasets.load_dataset(builder, data_files=files, split="data" + selection, **kwargs)
    except Exception as exc:  # pandas/pyarrow parse errors, an empty selection
        if "corresponds to no data" in str(exc):
            raise TaskDataError(f"{path}: split {split!r} has no examples.") from None
        problem = parse_problem(path, fmt, columns if fmt in ("tsv", "csv") else None, exc)
        raise TaskDataError(f"{path}{problem}.") from exc
    finally:
        datasets.logging.set_verbosity(verbosity)


def _header(path: Path, sep: str) -> list[str]:
    with _open_text(path, newline="") as f:
        line = f.readline()
    columns = line.rstrip("\r\n").split("\t") if sep == "\t" else next(csv.reader([line]), [])
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise TaskDataError(
            f"{path}, line 1: column name(s) {repeated} appear more than once in the header; "
            "give each column its own name."
        )
    return columns


# ---- naming the line of a file at fault ----


def _reader(f, fmt: str, *, strict: bool = False):
    """Python's csv reader, reading as the file was loaded (tsv: no quoting)."""
    if fmt == "tsv":
        return csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, strict=strict)
    return csv.reader(f, delimiter=",", quoting=csv.QUOTE_MINIMAL, strict=strict)


def _blank(record: list[str]) -> bool:
    """A line the loader skips: nothing on it but spaces (pandas' skip_blank_lines)."""
    return not record or (len(record) == 1 and not record[0].strip(" \t"))


def record_lines(path: Path, fmt: str, *, header: bool = True) -> list[int] | None:
    """The line, as an editor counts them (from 1, the header included), on which each record of a
    csv, tsv or JSON-lines file starts; None for files whose records are not lines (parquet, a
    JSON document)."""
    if fmt in ("tsv", "csv"):
        starts, line = [], 1
        with _open_text(path, newline="") as f:
            reader = _reader(f, fmt)
            for record in reader:
                if not _blank(record):
                    starts.append(line)
                line = reader.line_num + 1
        return starts[1:] if header else starts
    if fmt == "json":
        text = _text(path)
        lines = text.split("\n")
        filled = [n for n, line in enumerate(lines, 1) if line.strip()]
        if filled and _json_object(lines[filled[0] - 1]):
            return filled  # JSON lines
        return _array_lines(text)
    return None


def _array_lines(text: str) -> list[int] | None:
    """The line on which each record of a JSON array starts; None for any other document."""
    space, decoder = re.compile(r"[ \t\r\n]*"), json.JSONDecoder()
    at = space.match(text).end()
    if not text.startswith("[", at):
        return None
    at, seen, line, starts = space.match(text, at + 1).end(), 0, 1, []
    try:
        while at < len(text) and text[at] != "]":
            line, seen = line + text.count("\n", seen, at), at
            starts.append(line)
            at = space.match(text, decoder.raw_decode(text, at)[1]).end()
            if text.startswith(",", at):
                at = space.match(text, at + 1).end()
    except ValueError:
        return None
    return starts


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def parse_problem(path: Path, fmt: str, columns: list[str] | None, exc: BaseException) -> str:
    """Why a file could not be loaded, as `: ...` or `, line N: ...` to follow its path: the line at
    fault found again with Python's own readers, else the loader's innermost reason."""
    data = _bytes(path) if fmt in ("tsv", "csv", "json") else b""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as bad:
        line = data[: bad.start].count(b"\n") + 1
        return f", line {line}: not UTF-8 text (byte {data[bad.start]:#04x}: {bad.reason}); save it as UTF-8"
    if fmt in ("tsv", "csv") and columns is not None:
        found = _csv_problem(path, fmt, len(columns))
    elif fmt == "json":
        found = _json_problem(path, _innermost(exc))
    else:
        found = None
    return found or f": cannot be read as {fmt} ({_innermost(exc)})"


def _innermost(exc: BaseException) -> str:
    """The first line of the deepest cause that says something (pandas' or pyarrow's reason)."""
    reasons = []
    while exc is not None:
        text = str(exc).strip()
        if text and "An error occurred while generating the dataset" not in text:
            reasons.append(text.splitlines()[0].rstrip("."))
        exc = exc.__cause__ or exc.__context__
    return reasons[0] if reasons else "unreadable"


def _csv_problem(path: Path, fmt: str, width: int) -> str | None:
    """The first line with more fields than the header (or the card's column names), or the line
    where a quoted field opens and never closes."""
    with _open_text(path, newline="") as f:
        reader, line = _reader(f, fmt), 1
        for record in reader:
            if len(record) > width:
                sep = "tabs" if fmt == "tsv" else "commas"
                return (
                    f", line {line}: {len(record)} fields where there are {width} columns "
                    f"(a text with {sep} in it{' needs quotes' if fmt == 'csv' else ''}?)"
                )
            line = reader.line_num + 1
    with _open_text(path, newline="") as f:
        reader, line = _reader(f, fmt, strict=True), 1
        try:
            for _ in reader:
                line = reader.line_num + 1
        except csv.Error as error:
            if "unexpected end of data" in str(error):
                return f", line {line}: a quoted field opens here and never closes"
            return f", line {line}: {error}"
    return None


def _json_kind(value) -> str:
    """What a JSON value is, as JSON names it: 'null', 'an array', 'a string', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    kinds = {list: "an array", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def _json_lines_problem(path: Path) -> str | None:
    """The first line of a JSON-lines file that is not one JSON object, as `, line N: ...`; None
    for a good file or one JSON document. Found before loading: the loader is never handed such a
    line (a `null` line beside records with lists of objects crashes the process)."""
    try:
        text = _text(path)
    except UnicodeDecodeError:
        return None  # the loader's failure names the line
    try:
        json.loads(text)
        return None  # one document (or one line)
    except json.JSONDecodeError:
        pass
    if text.lstrip(" \t\r\n").startswith("["):
        return None  # a JSON array that does not parse: named after the loader fails
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as bad:
            return f", line {n}, column {bad.colno}: not valid JSON ({bad.msg})"
        if not isinstance(record, dict):
            return f", line {n}: a JSON object ({{...}}) is expected on each line, not {_json_kind(record)}"
    return None


def _json_problem(path: Path, reason: str) -> str | None:
    """The line (and column) where a JSON or JSON-lines file stops being valid JSON, or the line of
    the record the loader refused."""
    text = _text(path)
    starts = record_lines(path, "json")
    if starts is None:  # one document
        try:
            json.loads(text)
        except json.JSONDecodeError as bad:
            return f", line {bad.lineno}, column {bad.colno}: not valid JSON ({bad.msg})"
        return None
    lines = text.split("\n")
    for n in starts:
        try:
            record = json.loads(lines[n - 1])
        except json.JSONDecodeError as bad:
            return f", line {n}, column {bad.colno}: not valid JSON ({bad.msg})"
        if not isinstance(record, dict):
            return f", line {n}: a JSON object ({{...}}) is expected on each line, not {_json_kind(record)}"
    row = re.search(r"^(.*?)\.? in row (\d+)$", reason)
    if row and int(row[2]) < len(starts):  # pyarrow counts the records from 0
        why = row[1].removeprefix("JSON parse error: ")
        return f", line {starts[int(row[2])]}: cannot be read as json ({why})"
    return None


@dataclass(frozen=True)
class Origin:
    """Where the rows of a loaded split come from, to point at one of them in a message: its file
    and the line an editor shows (header = line 1), or its record in a file without lines."""

    source: str
    """The file's path, or the hub dataset and split."""
    path: Path | None = None
    fmt: str | None = None
    header: bool = True
    selection: str = ""
    """The card's slice of the file, e.g. '[:1497]'."""
    kept: tuple[int, ...] | None = None
    """The rows left after some were dropped (`ignore_labels`), by their number before."""

    def keep(self, kept: list[int]) -> Origin:
        """The origin of the rows `kept` of this one's."""
        rows = tuple(kept) if self.kept is None else tuple(self.kept[i] for i in kept)
        return replace(self, kept=rows)

    def of(self, row: int) -> str:
        """'FILE, line 7' (or 'FILE, record 7', 'hub dataset ..., row 7') for row `row` of the split."""
        if self.kept is not None:
            row = self.kept[row]
        if self.path is None:
            return f"{self.source}, row {row + 1}"
        import datasets

        starts = record_lines(self.path, self.fmt, header=self.header)
        if self.selection:
            total = len(starts) if starts is not None else None
            if total is None:
                total = len(read_table(self.path, fmt=self.fmt))
            spec = datasets.ReadInstruction.from_spec("data" + self.selection)
            row += spec.to_absolute({"data": total})[0].from_
        if starts is not None and row < len(starts):
            return f"{self.source}, line {starts[row]}"
        return f"{self.source}, record {row + 1}"


def _rename(ds, columns: dict[str, str] | None, source: str):
    renames = {old: new for old, new in (columns or {}).items() if old in ds.column_names and old != new}
    return ds.rename_columns(renames) if renames else ds


def split_file(task: TaskAdapter, split: str, data_dir: str | Path) -> Path:
    """The local file of a split (without its slice)."""
    return Path(data_dir).expanduser() / SLICE.match(task.local.splits[split])["file"]


def split_origin(task: TaskAdapter, split: str, data_dir: str | Path | None) -> Origin:
    """Where the rows of `load_split(task, split, data_dir)` come from."""
    if data_dir is None:
        return Origin(f"hub dataset {task.hub.path if task.hub else '?'} split {split}")
    spec = task.local
    match = SLICE.match(spec.splits[split])
    path = Path(data_dir).expanduser() / match["file"]
    headerless = spec.column_names is not None and (
        spec.headerless_splits is None or split in spec.headerless_splits
    )
    fmt = spec.format or file_format(path)
    return Origin(str(path), path, fmt, header=not headerless, selection=match["slice"] or "")
