"""Reading a task file's text (gzipped or not) and, when it does not load, where it is at fault:
the line (as an editor counts them, header = line 1) on which each record starts, and the first
line that does not parse, in one sentence to follow the file's path."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import json
import re
import sys
import zlib
from pathlib import Path

from gpt_ft.adapters import TaskDataError

_FORMATS = {".tsv": "tsv", ".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
PACKED = (".bz2", ".xz", ".zst", ".zip", ".7z", ".lz4")  # compressed otherwise than gzip: not read
# A cell may hold a whole document: Python's csv reader refuses one over 131,072 characters by default.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def file_format(path: Path) -> str | None:
    """The format a file's extension names (`.jsonl.gz`: json), or None."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] and suffixes[-1] in PACKED:
        file_bytes(path)  # (refused there, in one sentence)
    if suffixes[-1:] == [".gz"]:
        suffixes.pop()
    return _FORMATS.get(suffixes[-1]) if suffixes else None


def file_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped where its name ends in .gz; one sentence where it does not gunzip."""
    if (suffix := path.suffix.lower()) in PACKED:
        raise TaskDataError(f"{path}: a {suffix} file is not read (a .gz one is): decompress it, or gzip it.")
    if suffix != ".gz":
        return path.read_bytes()
    try:
        return gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise TaskDataError(f"{path}: cannot be gunzipped ({exc}); its name ends in .gz.") from None


def open_text(path: Path, **kwargs):
    """A file opened as text (utf-8, a byte-order mark dropped), gunzipped when it ends in .gz."""
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8-sig", **kwargs)
    return path.open(encoding="utf-8-sig", **kwargs)


def _reader(f, fmt: str, *, strict: bool = False):
    """Python's csv reader, reading as the file was loaded (tsv: no quoting)."""
    if fmt == "tsv":
        return csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, strict=strict)
    return csv.reader(f, delimiter=",", quoting=csv.QUOTE_MINIMAL, strict=strict)


class _Lines:
    """A text file's lines, keeping those the csv reader took for the record it read last."""

    def __init__(self, f) -> None:
        self.lines, self.taken = iter(f), []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self.lines)
        self.taken.append(line)
        return line


def _records(f, fmt: str, *, strict: bool = False):
    """(reader, records): Python's csv reader (`_reader`) and its records, each with whether the
    loader skips its line as blank: nothing on it but spaces (pandas' skip_blank_lines); a quoted
    empty text (`""`) is a row of its own there."""
    lines = _Lines(f)
    reader = _reader(lines, fmt, strict=strict)

    def records():
        for record in reader:
            taken, lines.taken = "".join(lines.taken), []
            spaces = not record or (len(record) == 1 and not record[0].strip(" \t"))
            yield record, spaces and '"' not in taken

    return reader, records()


def record_lines(
    path: Path, fmt: str, *, header: bool = True, blanks: list | None = None
) -> list[int] | None:
    """The line, as an editor counts them (from 1, the header included), on which each record of a
    csv, tsv or JSON-lines file starts (a csv's or tsv's blank lines, which hold none, into `blanks`);
    None for files whose records are not lines (parquet, a JSON document)."""
    if fmt in ("tsv", "csv"):
        starts, line = [], 1
        with open_text(path, newline="") as f:
            reader, records = _records(f, fmt)
            for _, blank in records:
                (starts if not blank else blanks if blanks is not None else []).append(line)
                line = reader.line_num + 1
        return starts[1:] if header else starts
    if fmt == "json":
        lines = (text := file_bytes(path).decode("utf-8-sig")).split("\n")
        filled = [n for n, line in enumerate(lines, 1) if line.strip()]
        if filled and _json_object(lines[filled[0] - 1]):
            return filled  # JSON lines
        return _array_lines(text)
    return None


def place(source, starts: list[int] | None, row: int) -> str:
    """'FILE, line 7' for row `row` (from 0) of records starting on lines `starts`, else 'FILE, record 7'."""
    if starts is not None and row < len(starts):
        return f"{source}, line {starts[row]}"
    return f"{source}, record {row + 1}"


def _array_lines(text: str) -> list[int] | None:
    """The line on which each record of a JSON array starts; None for any other document (an array
    that is not valid JSON too: a comma missing between records, or one after the last)."""
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
                if text.startswith("]", at):
                    return None
            elif not text.startswith("]", at):
                return None
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
    data = file_bytes(path) if fmt in ("tsv", "csv", "json") else b""
    if (problem := utf8_problem(data)) is not None:
        return problem
    if fmt in ("tsv", "csv") and columns is not None:
        found = _csv_problem(path, fmt, len(columns))
    elif fmt == "json":
        found = _json_problem(path, _innermost(exc), _cast_columns(exc))
    else:
        found = None
    return found or f": cannot be read as {fmt} ({_innermost(exc)})"


def utf8_problem(data: bytes) -> str | None:
    """`, line N: not UTF-8 text (...)` for a file's bytes that do not decode, or that hold a NUL
    (UTF-16 without its BOM decodes, a NUL after each ASCII letter), to follow its path."""
    if (nul := data.find(b"\x00")) >= 0:
        line = data[:nul].count(b"\n") + 1
        return (
            f", line {line}: not UTF-8 text (a NUL byte, as in UTF-16 text or binary data); save it as UTF-8"
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as bad:
        line = data[: bad.start].count(b"\n") + 1
        return f", line {line}: not UTF-8 text (byte {data[bad.start]:#04x}: {bad.reason}); save it as UTF-8"
    return None


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
    with open_text(path, newline="") as f:
        reader, line = _reader(f, fmt), 1
        for record in reader:
            if len(record) > width:
                sep = "tabs" if fmt == "tsv" else "commas"
                return (
                    f", line {line}: {len(record)} fields where there are {width} columns "
                    f"(a text with {sep} in it{' needs quotes' if fmt == 'csv' else ''}?)"
                )
            line = reader.line_num + 1
    with open_text(path, newline="") as f:
        reader, line = _reader(f, fmt, strict=True), 1
        try:
            for _ in reader:
                line = reader.line_num + 1
        except csv.Error as error:
            if "unexpected end of data" in str(error):
                return f", line {line}: a quoted field opens here and never closes"
            return f", line {line}: {error}"
    return None


def wide_first_row(path: Path, fmt: str, width: int, *, header: bool) -> str | None:
    """`_csv_problem`'s sentence where the first data row has more fields than the header: the
    loader takes such a row for one led by a row index and shifts every column by one, silently
    (a wider row further down makes it fail, and is named then)."""
    with open_text(path, newline="") as f:
        records = (record for record, blank in _records(f, fmt)[1] if not blank)
        first = next(itertools.islice(records, int(header), None), None)
    return _csv_problem(path, fmt, width) if first is not None and len(first) > width else None


def short_row(path: Path, fmt: str, width: int) -> str | None:
    """`, line N: ...` for the first row with fewer fields than the header's `width`, which the
    loader would fill with empty texts and labels: in a TSV, most often a quoted text with a line
    break in it (TSVs are read without quoting, so its second line is a row of its own). Read
    strictly first: a quote that never closes is the loader's own error to name; any other quote
    Python's strict reader refuses (`"a "b" c"`), the loader reads as the lenient reader does."""
    for strict in (True, False):
        with open_text(path, newline="") as f:
            (reader, records), line = _records(f, fmt, strict=strict), 1
            try:
                for record, blank in records:
                    if len(record) < width and not blank:
                        cause = "a text with a line break? TSVs are read a row per line" * (fmt == "tsv")
                        fields = f"{len(record)} field{'s' * (len(record) != 1)} where there are {width}"
                        return f", line {line}: {fields} columns ({cause or 'cut short?'})"
                    line = reader.line_num + 1
                return None
            except csv.Error as error:
                if not strict or "unexpected end of data" in str(error):
                    return None
    return None


def parquet_rows(path: Path) -> int | None:
    """The rows a parquet file's footer counts; None where it has none to read."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # not parquet, cut short: the loader's error names it
        return None


def json_kind(value) -> str:
    """What a JSON value is, as JSON names it: 'null', 'an array', 'a string', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    kinds = {list: "an array", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def _cast_columns(exc: BaseException | None) -> set[str] | None:
    """The columns the reader took from a file's first block, where a later block did not cast to
    them (datasets' `CastError`: "... to\n{'q': Value('string'), ...}\nbecause column names don't match")."""
    while exc is not None:
        if (found := re.search(r"\nto\n\{(.*)\}\nbecause column names", str(exc), re.S)) is not None:
            return set(re.findall(r"'([^']+)': ", found[1]))
        exc = exc.__cause__ or exc.__context__
    return None


def _json_problem(path: Path, reason: str, columns: set[str] | None = None) -> str | None:
    """The line (and column) where a JSON or JSON-lines file stops being valid JSON, or the line of
    the record the loader refused (`columns`: those it took from the file's first block)."""
    text = file_bytes(path).decode("utf-8-sig")
    starts = record_lines(path, "json")
    if starts is None or text.lstrip().startswith("["):  # one document (an array's records span lines)
        try:
            records = json.loads(text)
        except json.JSONDecodeError as bad:
            return f", line {bad.lineno}, column {bad.colno}: not valid JSON ({bad.msg})"
        if starts is None:
            return None
    lines, kinds, fields, differs = text.split("\n"), {}, None, None
    for i, n in enumerate(starts):
        try:
            record = records[i] if text.lstrip().startswith("[") else json.loads(lines[n - 1])
        except json.JSONDecodeError as bad:
            return f", line {n}, column {bad.colno}: not valid JSON ({bad.msg})"
        if not isinstance(record, dict):
            return f", line {n}: a JSON object ({{...}}) is expected on each line, not {json_kind(record)}"
        fields = (columns or set(record)) if fields is None else fields  # the reader's, else the first's
        if differs is None and set(record) - fields:
            others = "the lines before have" if columns else f"line {starts[0]} has"
            differs = f", line {n}: it has fields {sorted(set(record) - fields)} that {others} not"
        for key, value in record.items():  # a field of two types: the loaders' columns take one
            kind = {dict: "an object", bool: "a boolean"}.get(type(value)) or json_kind(value)
            first = kinds.setdefault(key, (kind, n)) if value is not None else (kind, n)
            if first[0] != kind:
                return f", line {n}: field {key!r} holds {kind} where line {first[1]} holds {first[0]}"
    if differs is not None and "Couldn't cast" in reason:
        return f"{differs} (the reader takes one set of fields a file: give each record all, null where none)"
    row = re.search(r"^(.*?)\.? in row (\d+)$", reason)
    if row and int(row[2]) < len(starts):  # pyarrow counts the records from 0
        why = row[1].removeprefix("JSON parse error: ")
        return f", line {starts[int(row[2])]}: cannot be read as json ({why})"
    return None


def check_text_file(path: Path, what: str = "File", chunk_bytes: int = 1 << 20, remedy: str = "") -> bool:
    """Whether a file holds any non-whitespace text, after checking all of it is text: a ValueError
    names it in one sentence, `what` first (e.g. "Corpus file"), where it is not UTF-8 text (an
    invalid byte, or a NUL byte: binary data or UTF-16) or cannot be read, and ends with `remedy`."""
    remedy = remedy or "save it as UTF-8 or leave it out"
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False
    try:
        with path.open("rb") as f:
            while chunk := f.read(chunk_bytes):
                nul = chunk.find(b"\x00")  # valid UTF-8, but no text holds it
                pending = len(decoder.getstate()[0])  # bytes of a character split between chunks
                try:
                    text = decoder.decode(chunk)
                except UnicodeDecodeError as exc:  # named unless a NUL comes first
                    at = offset - pending + exc.start
                    if nul < 0 or at < offset + nul:
                        raise ValueError(
                            f"{what} {path} is not UTF-8 text (byte offset {at}: {exc.reason}); {remedy}."
                        ) from None
                if nul >= 0:
                    raise ValueError(
                        f"{what} {path} is not text (a NUL byte at byte offset {offset + nul}, as in binary "
                        f"data or UTF-16 text); {remedy}."
                    )
                has_text = has_text or bool((text.removeprefix("\ufeff") if offset == 0 else text).strip())
                offset += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:  # the file ends inside a character
        raise ValueError(
            f"{what} {path} is not UTF-8 text (it ends mid-character: {exc.reason}); {remedy}."
        ) from None
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None
    return has_text
