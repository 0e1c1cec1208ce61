"""Where a task's examples come from (a hub dataset, local files, and which splits are evaluated),
and how a field of theirs is read: a text (`field_text`), a number (`finite_number`; `score_text`
writes one), a nested one by its path (`path_value`)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from difflib import get_close_matches
from typing import Any, Literal

from gpt_ft.adapters.names import file_part
from gpt_ft.errors import CardError, TaskDataError, about

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: scores are trained in fp32


def finite_number(value: Any, what: str, field: str, within: tuple[float, float] | None = None) -> float:
    """A label field's number (a score, a margin): finite and within fp32's range, where the loss
    stays finite, and within the card's `score_range` (`within`) where given; a boolean (JSON's
    true) is no number."""
    boolean = isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", "") == "b"
    try:
        number = float(None if boolean else value)
    except (TypeError, ValueError):
        raise TaskDataError(f"{what} {value!r} in field {field!r} is not a number.") from None
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise TaskDataError(
            f"{what} {value!r} in field {field!r} is not a finite number a 32-bit float holds."
        )
    low, high = within or (-math.inf, math.inf)
    if not low <= number <= high:
        raise TaskDataError(
            f"{what} {value!r} in field {field!r} is outside the card's score_range [{low:g}, {high:g}]."
        )
    return number


def score_text(value: float) -> str:
    """A score as predictions files write it: six significant digits, more where the model's float32
    needs them to read back the same (a cosine of 0.99999964 is not 1): metrics recomputed from the
    file equal the run's (fewer digits tie scores that differ and move a rank correlation)."""
    if not 1.2e-38 <= abs(value) <= 3.4e38:  # 0, NaN, inf, and what float32 cannot hold: as given
        return f"{value:.9g}"
    single = struct.unpack("f", struct.pack("f", value))[0]
    for digits in (6, 7, 8):
        if struct.unpack("f", struct.pack("f", float(text := f"{single:.{digits}g}")))[0] == single:
            return text
    return f"{single:.9g}"  # (nine always read back the same float32)


def label_spelling(value) -> str:
    """A label as a card's `ignore_labels` spell it: -1.0 (a float column: pandas' integers with a
    missing value, as the hub's SNLI) as -1."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def unnested(
    records: Iterable[dict[str, Any]],
    where,
    task: str,
    rows_of: Callable[[dict[str, Any]], list | None],
    layout: str,
) -> tuple[list[dict[str, Any]], list[int], bool]:
    """Records of a nested layout as rows (a release's passages as the hub's rows): `rows_of(record)`
    gives a record's rows, or None where it is a row already; then each row's record (`where(i)`
    names record i in an error), and whether any record was nested. A record whose parts are not
    laid out as `layout` says (a list where a record was due) is named with it."""
    rows, of, nested = [], [], False
    for i, record in enumerate(records):
        with about(where, i, task):
            try:
                flat = rows_of(record)
            except (TypeError, AttributeError, IndexError) as exc:
                raise TaskDataError(
                    f"its fields are not laid out as the release's, {layout} ({exc})."
                ) from None
        nested |= flat is not None
        flat = [record] if flat is None else flat
        rows += flat
        of += [i] * len(flat)
    return rows, of, nested


def short_repr(value: Any) -> str:
    """A value as a message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class HubDataset:
    """A dataset on the Hugging Face Hub, loaded with `datasets.load_dataset(path, name)`."""

    path: str
    """Dataset id, e.g. nyu-mll/glue."""
    name: str | None = None
    """Configuration (subset) name, e.g. rte."""
    columns: dict[str, str] | None = None
    """Renames: dataset column -> the field name the adapter reads."""
    splits: dict[str, str] | None = None
    """Our split name -> the dataset's split (slices such as 'train[:90%]' allowed); default: same names."""
    configs: dict[str, str] | None = None
    """Our split name -> the configuration it comes from when not `name` (GLUE's diagnostic set: ax)."""
    data_dir: str | None = None
    """The folder of the dataset's repository to load (Anthropic/hh-rlhf: a subset, e.g. helpful-base)."""


@dataclass
class LocalFiles:
    """A task's files under `--data.data_dir`, and how to read them."""

    splits: dict[str, str]
    """Split name -> file path relative to data_dir; a slice may follow, e.g. 'val.csv[:1497]'."""
    format: Literal["tsv", "csv", "json", "parquet"] | None = None
    """File format; by default from the extension (.tsv, .csv, .json/.jsonl, .parquet)."""
    column_names: list[str] | None = None
    """Column names of files without a header row (e.g. GLUE's CoLA train/dev)."""
    headerless_splits: list[str] | None = None
    """Splits whose files have no header row (they use column_names); default: every split if column_names."""
    columns: dict[str, str] | None = None
    """Renames: file column -> the field name the adapter reads."""
    label_files: dict[str, str] | None = None
    """Split name -> a text file of that split's labels, one a line in its file's order (PIQA's and
    Social IQa's `train-labels.lst`), read as the card's label field."""
    shuffle_seed: int | None = None
    """Where set, a split whose file has a slice takes it of the file's rows as
    `numpy.random.RandomState(shuffle_seed).permutation` orders them (scikit-learn's
    `train_test_split`: its test rows are `[:n]`, its train rows `[n:]`)."""
    written_by: str | None = None
    """The command that writes these files, where another file is cut into them (PRMBench by
    question): said when one is missing."""

    def __post_init__(self) -> None:
        for name in ("headerless_splits", "label_files"):
            if unknown := sorted(set(getattr(self, name) or []) - set(self.splits)):
                near = [(n, m[0]) for n in unknown if (m := get_close_matches(n, list(self.splits), n=1))]
                said = "".join(f" ({a!r} or {b!r} is misspelt)" for a, b in near[:1])
                raise CardError(
                    f"local.{name} names {unknown}, which local.splits does not: "
                    f"it has {sorted(self.splits)}{said}."
                )
        if twice := sorted({c for c in self.column_names or [] if self.column_names.count(c) > 1}):
            raise CardError(f"local.column_names names {twice} twice: each column needs a name of its own.")
        if self.headerless_splits and not self.column_names:
            raise CardError(
                "local.headerless_splits needs local.column_names: the names of those files' columns."
            )


@dataclass
class Sources:
    """What a card says about its data: where it lives, the splits evaluated, the examples' ids."""

    hub: HubDataset | None = None
    local: LocalFiles | None = None
    validation_splits: list[str] = field(default_factory=lambda: ["validation"])
    test_splits: list[str] = field(default_factory=lambda: ["test"])
    index: str | None = "idx"

    def __post_init__(self) -> None:
        for name, default in (("validation_splits", "validation"), ("test_splits", "test")):
            if not (splits := getattr(self, name)) or len(set(splits)) < len(splits):
                said = "names no split" if not splits else f"names {splits!r}, a split twice"
                raise CardError(f"{name} {said}: name each split once, or leave it out for [{default}].")
            for split in splits:  # (its reports and predictions are files named after it)
                file_part(split, f"{name}' split")
        # From Python, `local=` and `hub=` may be given as a card writes them: mappings of their fields.
        for name, kind in SOURCE_KINDS.items():
            if isinstance(value := getattr(self, name), dict):
                if problem := source_problem(name, value):
                    raise CardError(problem)
                setattr(self, name, kind(**value))


SOURCE_KINDS = {"hub": HubDataset, "local": LocalFiles}


def source_problem(name: str, value: dict) -> str | None:
    """What keeps a card's `hub:` or `local:` mapping from being one: a field it does not have (a
    typo such as `column:`), or one it needs."""
    kind = SOURCE_KINDS[name]
    known = [f.name for f in fields(kind)]
    if unknown := sorted(map(str, set(value) - set(known))):
        return f"{name} has no field {' or '.join(map(repr, unknown))}; its fields: {', '.join(known)}."
    if lacking := [f.name for f in fields(kind) if f.default is MISSING and f.name not in value]:
        return f"{name} needs {', '.join(lacking)}."
    return None


def from_array(value: Any) -> Any:
    """A NumPy array (a list cell of pandas' records, of a parquet file read by pandas) as its list;
    any other value as it is."""
    return value.tolist() if hasattr(value, "tolist") and hasattr(value, "__len__") else value


def cell_list(value: Any) -> Any:
    """A field meant to hold a list: `value` (a NumPy array: its list), or the list a table's cell
    writes as JSON (`["a", "b"]`, as `gpt-ft label` writes a list into a csv or tsv); a text that
    is no JSON list as it is."""
    value = from_array(value)
    if isinstance(value, str) and value.lstrip()[:1] == "[" and value.rstrip()[-1:] == "]":
        import json

        try:
            listed = json.loads(value)
        except ValueError:
            return value
        return listed if isinstance(listed, list) else value
    return value


def field_text(value: Any, field: str | None = None, needed: str | None = None) -> str:
    """A field's text; a missing value (null, NaN) is an empty text (encoded as just the special
    tokens), or refused where the row `needed` it (why, in a few words), while an empty text is
    text (an empty cell); a number is its digits, bytes (a parquet binary column) their UTF-8 text;
    a list or mapping is refused (its repr would be trained on), and a text no UTF-8 holds (half of a
    surrogate pair alone: Python's JSON reads one from an escape)."""
    where = f"field {field!r}" if field else "a field"
    if isinstance(value, str):
        if problem := no_utf8(value):
            raise TaskDataError(f"{where} {problem}.")
        return str(value)  # (NumPy's str: a str)
    if missing(value):
        if needed:
            raise TaskDataError(f"field {field!r} has no value: {needed}.")
        return ""
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TaskDataError(f"{where} holds bytes that are not UTF-8 text ({exc.reason}).") from None
    if not isinstance(value, str) and hasattr(value, "__len__"):  # a list, mapping, array: not its repr
        raise TaskDataError(f"{where} holds a {type(value).__name__} {short_repr(value)}, not a text.")
    return str(value)


def no_utf8(text: str) -> str | None:
    """What makes `text` one no UTF-8 holds (half of a surrogate pair alone, which Python's JSON
    reads from an escape and a tokenizer refuses without a word of where); None for a text."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        half = ascii(text[exc.start])[1:-1]
        return f"holds {half}, half of a UTF-16 surrogate pair alone, which is no text; give the whole pair"
    return None


def missing(value: Any) -> bool:
    """A missing value: null, pandas' NA, or a NaN of any kind (float's, NumPy's, Decimal's, NaT)."""
    if value is None or type(value).__name__ == "NAType":  # (pd.NA: no truth value)
        return True
    if isinstance(value, (bytes, bytearray)) or hasattr(value, "__len__"):
        return False
    try:
        return bool(value != value)  # (only a NaN is not itself)
    except (TypeError, ValueError, ArithmeticError):  # (a signalling NaN compares with an error)
        return False


def needed_text(value: Any, field: str, needed: str) -> str:
    """`field_text` of a field the row `needed` (why, in a few words): empty, or spaces only (a
    table's empty cell), refused as a missing value is."""
    text = field_text(value, field, needed)
    if not text.strip():
        raise TaskDataError(f"field {field!r} is empty: {needed}.")
    return text


def path_value(record: dict[str, Any], path: str, missing: Any = None) -> Any:
    """A nested field's value by its path: `choices.text` is the record's `choices` mapping's
    `text`; through a list of mappings, each one's (`question.choices.text`: every choice's text).
    A null on the way gives None; a part the record lacks, `missing`."""
    value: Any = record
    for part in path.split("."):
        value = from_array(value)
        if value is None:
            return None
        if isinstance(value, dict):
            value = value.get(part, missing) if part in value else missing
        elif isinstance(value, (list, tuple)) and all(isinstance(v, dict) for v in value):
            value = [v.get(part) for v in value]
        else:
            return missing
        if value is missing:
            return missing
    return value


def nested_paths(fields: list[str], columns: list[str]) -> list[str]:
    """Those of a card's `fields` that name a nested field by its path: not a column of their own
    (a column may have a dot in its name), their first part one."""
    return [f for f in dict.fromkeys(fields) if f not in columns and f.split(".")[0] in columns and "." in f]


def with_paths(record: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """The record with each nested field of `fields` it has as a field of its own (`path_value`);
    one it lacks stays missing, and is named as such where it is read."""
    absent = object()
    values = {path: path_value(record, path, absent) for path in nested_paths(fields, list(record))}
    return {**record, **{path: v for path, v in values.items() if v is not absent}} if values else record


def nested_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields, each named by its path (`target.span2_index`: a column a card renamed so, or a
    nested field's text as the card reads it) within its parent too, as a template reads it."""
    out = dict(fields)
    for key, value in fields.items():
        *parents, last = key.split(".")
        at = out
        for part in parents:
            if not isinstance(at.get(part, {}), dict):
                break  # (a field of that name that holds no record: kept)
            at[part] = at = dict(at.get(part, {}))
        else:
            if parents:
                at[last] = value
    return out


def with_path_columns(table, fields: list[str], task_name: str):
    """A `datasets.Dataset` with a column of its own for each of `fields` that names a nested field
    (`choices.text`); a path that names none of the table's fields is refused, by what it reaches."""
    if not (paths := nested_paths(fields, table.column_names)):
        return table
    for path in paths:
        feature, parts = table.features, path.split(".")
        for at, part in enumerate(parts):
            inner = getattr(feature, "feature", feature)  # a list of records: each record's fields
            if type(inner).__name__ == "Json":  # records of differing fields (JSON lines): read as written
                break
            if not isinstance(inner, dict) or part not in inner:
                walked, kind = ".".join(parts[:at]), getattr(inner, "dtype", type(inner).__name__)
                has = (
                    f"has no field {part!r} (its fields: {', '.join(inner)})"
                    if isinstance(inner, dict)
                    else f"holds {kind} values, not records (csv and tsv files hold no nested fields)"
                )
                raise TaskDataError(f"task {task_name!r} reads the field {path!r}, but {walked!r} {has}.")
            feature = inner[part]
    rows = table.select_columns(sorted({path.split(".")[0] for path in paths})).to_list()
    for path in paths:
        table = table.add_column(path, [path_value(row, path) for row in rows])
    return table
