"""A task's split as a `datasets.Dataset`: from local files (csv, tsv, json/jsonl, parquet; text
files may be gzipped, e.g. `train.jsonl.gz`) under `--data.data_dir` laid out as the card's `local`
says, or from the Hugging Face Hub."""

from __future__ import annotations

import csv
import glob
import sys
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.adapters.sources import label_spelling, with_path_columns
from gpt_ft.data.file_faults import (
    file_bytes,
    file_format,
    open_text,
    parquet_rows,
    parse_problem,
    place,
    record_lines,
    short_row,
    utf8_problem,
    wide_first_row,
)
from gpt_ft.data.folders import datasets_bars
from gpt_ft.data.json_faults import absent_field, json_lines_problem
from gpt_ft.data.layout import class_order_problem, label_file, loader_key, sliced, split_spec, with_labels
from gpt_ft.data.subsets import ALIKE, drawn, left_out
from gpt_ft.errors import CardError
from gpt_ft.workarounds.data import no_download_count


def load_split(task: TaskAdapter, split: str, data_dir: str | Path | None):
    """One split of the task as a `datasets.Dataset`, columns renamed to the adapter's field names:
    from local files under `data_dir` when given (the card's `local` layout), else from the Hub."""
    return located_split(task, split, data_dir)[0]


def located_split(task: TaskAdapter, split: str, data_dir: str | Path | None):
    """`load_split`'s dataset and where its rows come from (`Origin`, with the columns renamed)."""
    if data_dir is not None:
        ds, origin = _load_local(task, split, Path(data_dir).expanduser())
        columns = task.local.columns
    else:
        ds, origin, columns = _load_hub(task, split), split_origin(task, split, None), task.hub.columns
    renames = {old: new for old, new in (columns or {}).items() if old in ds.column_names and old != new}
    kept = [c for c in ds.column_names if c not in renames]
    for old, new in renames.items():
        clash = new if new in kept else next((o for o in renames if o != old and renames[o] == new), None)
        if clash is not None:
            other = f"its column {new!r} is kept" if clash == new else f"{clash!r} is renamed to it too"
            raise TaskDataError(
                f"{origin.source}: `columns` renames {old!r} to {new!r}, but {other}; give each its own name."
            )
    ds = ds.rename_columns(renames) if renames else ds
    origin = replace(origin, columns=tuple((new, old) for old, new in renames.items()))
    if said := class_order_problem(task, ds):
        raise TaskDataError(f"{origin.source}: {said}.")
    try:  # `choices.text`: a column of its own
        read, ds = ds, with_path_columns(ds, task.read_fields(), task.name)
    except TaskDataError as exc:
        raise TaskDataError(origin.explain(f"{origin.source}: {exc}")) from None
    texts = {field: origin.in_file(field) for field in task.text_fields()}
    if task.null_is_empty_text and (absent := absent_field(origin, texts, ds)):
        raise TaskDataError(absent)
    return ds, replace(
        origin, derived=origin.derived + tuple(c for c in ds.column_names if c not in read.column_names)
    )


def task_examples(task: TaskAdapter, split: str, raw, origin: Origin, *, scored: bool | None = None):
    """A loaded split's records as the task's examples, and their origin: regrouped where examples
    span records (NLI triplets), rows whose label the card ignores left out (`ignore_labels`), and,
    where the split is `scored` (default: the training and validation splits), rows with nothing to
    learn or score (`orders_nothing`)."""
    grouped = task.regroup(raw, where=origin.of)
    if grouped is not None:
        import datasets

        rows, records = grouped
        if not rows:
            raise TaskDataError(f"{origin.source}: split {split!r} gives no examples for task {task.name!r}.")
        shared = len(set(records)) < len(records)
        raw, origin = datasets.Dataset.from_list(rows), replace(origin.keep(records), shared=shared)
    if task.ignore_labels and task.label in raw.column_names:
        ignored = [i for i, v in enumerate(raw[task.label]) if label_spelling(v) in task.ignore_labels]
        why = f"in the card's ignore_labels {task.ignore_labels}"
        raw, origin = left_out(raw, origin, split, ignored, why)
    if (
        split == "train" or split in task.validation_splits if scored is None else scored
    ):  # (predictions: all)
        raw, origin = left_out(raw, origin, split, task.orders_nothing(raw, origin.of), ALIKE, said=True)
    return raw, origin


def examples_split(task: TaskAdapter, split: str, data_dir: str | Path | None):
    """`task_examples` of a split as `load_split` loads it: what training and evaluation count."""
    return task_examples(task, split, *located_split(task, split, data_dir))[0]


def labelled_rows(task: TaskAdapter, split: str, data_dir: str | Path | None) -> list[dict]:
    """`examples_split`'s rows, each one's texts and label read as training reads them (zero-shot
    scoring's): a column missing, a row with a bad text or no label, named by its file and line."""
    raw, origin = task_examples(task, split, *located_split(task, split, data_dir))
    if said := absent_columns(task, raw, origin, [*task.text_fields(), *filter(None, [task.label_column])]):
        raise TaskDataError(said)
    for i, row in enumerate(rows := list(raw)):
        try:
            n = len(task.scored_texts(row) if task.choices_in_examples else task.texts(row))
            if (label := task.output.example_label(row)) is None:
                raise TaskDataError(
                    f"no label ({task.label_source}): zero-shot scoring needs every example's."
                )
            if task.choices_in_examples and isinstance(label, int) and label >= n:  # (encoding refuses it)
                raise TaskDataError(f"label {row.get(task.label)!r} points past the row's {n} choices.")
        except TaskDataError as exc:
            raise TaskDataError(origin.explain(f"{origin.of(i)}: {exc}")) from None
    return rows


def absent_columns(task: TaskAdapter, raw, origin: Origin, fields: list[str]) -> str | None:
    """Which of `fields` a loaded split lacks, in one sentence naming its file and the columns it
    has (each as the file names it: the card's `columns` renames undone), or None."""
    source = task.local if origin.path is not None else task.hub
    asked = {field: column for column, field in (getattr(source, "columns", None) or {}).items()}
    if missing := [asked.get(field, field) for field in fields if field not in raw.column_names]:
        has = held_columns(raw, origin, missing)
        return (
            f"{origin.source}: missing column(s) {missing} needed by task {task.name!r}; the file has {has}."
        )
    return None


def held_columns(raw, origin: Origin, missing: list[str]) -> str:
    """A split's columns as the file names them, one the card renames away from a `missing` field said."""
    read = {c: origin.in_file(c) for c in raw.column_names if c not in origin.derived}
    has = [repr(v) + f" (read as {c!r}: the card's `columns`)" * (v in missing) for c, v in read.items()]
    return f"[{', '.join(has)}]"


def _load_hub(task: TaskAdapter, split: str):
    import datasets

    if task.hub is None:
        raise CardError(f"Task {task.name!r} has no hub dataset; pass its files with --data.data_dir DIR.")
    hub_split = (task.hub.splits or {}).get(split, split)
    config = (task.hub.configs or {}).get(split, task.hub.name)
    try:
        return datasets.load_dataset(task.hub.path, config, split=hub_split, data_dir=task.hub.data_dir)
    except ValueError as exc:  # an unknown split; offline, a configuration not in the cache
        said = " ".join(str(exc).split())  # datasets' message may run over lines
        if "Couldn't find cache" in said:
            raise TaskDataError(
                f"Hub dataset {task.hub.path} ({config}) is not in the datasets cache and cannot be "
                f"downloaded ({said}); give the task's files with --data.data_dir DIR."
            ) from None
        raise TaskDataError(
            f"Hub dataset {task.hub.path} ({config}) has no split {hub_split!r}: {said}"
        ) from None
    except OSError as exc:  # offline and not cached, or no such dataset
        raise TaskDataError(
            f"Hub dataset {task.hub.path} ({config}) cannot be loaded ({exc}); give the task's files "
            "with --data.data_dir DIR."
        ) from None


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
    if data_dir.is_file():  # else named as DIR/SST-2/train.tsv/SST-2/train.tsv
        raise TaskDataError(
            f"The data folder {data_dir} is a file: give the folder that holds the files of task "
            f"{task.name!r}."
        )
    path = (origin := split_origin(task, split, data_dir)).path
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "file not found"
        tests = task.test_splits if split in task.test_splits else []  # the other tests whose files are there
        others = [s for s in tests if s != split and s in spec.splits]
        others = ", ".join(s for s in others if split_origin(task, s, data_dir).path.is_file())
        alone = f"; the others alone: --data.task.init_args.test_splits '[{others}]'" * bool(others)
        made = f"; the task's files are written by {spec.written_by}" if spec.written_by else ""
        raise TaskDataError(f"{path}: {what} (split {split!r} of task {task.name!r}){alone}{made}.")
    if path.stat().st_size == 0:
        raise TaskDataError(f"{path}: file is empty (split {split!r} of task {task.name!r}).")
    shuffled, labels = spec.shuffle_seed is not None and origin.selection, label_file(task, split, data_dir)
    ds = read_table(
        path,
        fmt=spec.format,
        column_names=None if origin.header else spec.column_names,
        selection="" if shuffled or labels else origin.selection,
        split=split,
    )
    if labels is not None:  # the whole file's labels, then the card's slice of both
        ds = with_labels(ds, labels, task, split, origin.source, "" if shuffled else origin.selection)
        origin = replace(origin, derived=(task.label_column,), labels=(task.label_column, str(labels)))
    return drawn(ds, origin, split, spec.shuffle_seed) if shuffled else (ds, origin)


def read_table(
    path: Path,
    *,
    fmt: str | None = None,
    column_names: list[str] | None = None,
    selection: str = "",
    split: str = "data",
):
    """A csv, tsv, json/jsonl or parquet file as a `datasets.Dataset`, every csv/tsv cell as text;
    `column_names` name a headerless file's columns, `selection` is a slice such as `[:1497]`.
    Problems are one `TaskDataError` sentence naming the file."""
    import datasets

    fmt = fmt or file_format(path)
    if fmt is None:
        raise TaskDataError(
            f"{path}: unknown file format; set `format` (tsv, csv, json, parquet) in the card."
        )
    # A file that does not gunzip is named here, not deep in the loader; an empty one (gunzipped
    # or not) here too, as each reader would say it differently.
    gunzipped = file_bytes(path) if path.suffix.lower() == ".gz" else None
    if path.is_file() and (path.stat().st_size == 0 or gunzipped == b""):
        raise TaskDataError(
            f"{path}: split {split!r} has no examples." if split != "data" else f"{path} holds no rows."
        )
    if fmt in ("tsv", "csv", "json") and path.is_file():  # a byte past the loaders' first look: line named
        if (problem := utf8_problem(file_bytes(path))) is not None:
            raise TaskDataError(f"{path}{problem}.")
    if fmt in ("tsv", "csv"):
        sep = "\t" if fmt == "tsv" else ","
        try:
            columns = list(column_names) if column_names is not None else header_of(path, sep)
        except UnicodeDecodeError as exc:
            raise TaskDataError(f"{path}{parse_problem(path, fmt, None, exc)}.") from None
        except OSError as exc:
            raise TaskDataError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
        header = column_names is None
        problem = wide_first_row(path, fmt, len(columns), header=header) or short_row(path, fmt, len(columns))
        if problem is not None:
            raise TaskDataError(f"{path}{problem}.")
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
        if fmt == "json" and (problem := json_lines_problem(path)) is not None:
            raise TaskDataError(f"{path}{problem}.")
    verbosity = datasets.logging.get_verbosity()
    # datasets logs a file that does not parse before raising; the sentence below says it instead.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        files = {"data": glob.escape(str(path))}  # a name, not a pattern: `data [v2]/train[1].tsv`
        with no_download_count(), datasets_bars(sys.stderr.isatty()):  # (a local file: no request)
            loaded = datasets.load_dataset(
                builder, loader_key(path), data_files=files, split="data" + selection, **kwargs
            )
        # a slice that ends before it starts ([3:-498] of 500 rows): read as no rows, not as datasets reads it
        if selection and not sliced(selection, len(read_table(path, fmt=fmt, column_names=column_names))):
            raise ValueError("corresponds to no data")
        return loaded
    except Exception as exc:  # pandas/pyarrow parse errors, an empty selection
        if "corresponds to no data" in str(exc) or fmt == "parquet" and parquet_rows(path) == 0:
            if selection and (whole := read_table(path, fmt=fmt, column_names=column_names, split=split)):
                raise TaskDataError(f"{path}: split {split!r} has no examples: its slice {selection} takes "
                                    f"none of the file's {len(whole):,} rows.") from None  # fmt: skip
            if fmt == "json" and record_lines(path, fmt):  # records, each of them {}: no column
                raise TaskDataError(f"{path}: its records hold no field ({{}} on every line).") from None
            raise TaskDataError(  # (a file read for itself, not a split: `label`)
                f"{path}: split {split!r} has no examples." if split != "data" else f"{path} holds no rows."
            ) from None
        problem = parse_problem(path, fmt, columns if fmt in ("tsv", "csv") else None, exc)
        raise TaskDataError(f"{path}{problem}.") from exc
    finally:
        datasets.logging.set_verbosity(verbosity)


def header_of(path: Path, sep: str) -> list[str]:  # a csv's (sep ",") or tsv's ("\t") first line
    with open_text(path, newline="") as f:
        line = f.readline()  # a quoted CSV name may hold a line break (a spreadsheet's wrapped header)
        columns = line.rstrip("\r\n").split("\t") if sep == "\t" else next(csv.reader(chain([line], f)), [])
    if not line.strip():  # (the loader would take the next line for the header, the rest one line off)
        raise TaskDataError(
            f"{path}, line 1 is empty: the header (the columns' names) must be the first line."
        )
    if repeated := sorted({c for c in columns if columns.count(c) > 1}):
        raise TaskDataError(
            f"{path}, line 1: column name(s) {repeated} appear more than once in the header; "
            "give each column its own name."
        )
    return columns


@dataclass(frozen=True)
class Origin:
    """Where the rows of a loaded split come from, to point at one of them in a message: its file
    and the line an editor shows (header = line 1), or its record in a file without lines."""

    source: str  # the file's path, or the hub dataset and split
    path: Path | None = None
    fmt: str | None = None
    header: bool = True
    selection: str = ""  # the card's slice of the file, e.g. '[:1497]'
    kept: tuple[int, ...] | None = None  # the rows left after some were dropped (ignore_labels), by number
    columns: tuple[tuple[str, str], ...] = ()  # (field, column): a field read from a column of another name
    derived: tuple[str, ...] = ()  # columns made of nested fields (`choices.text`), not the file's own
    labels: tuple[str, str] | None = None  # (field, file): the labels read from a file of their own
    shared: bool = False
    """Examples share records (a passage's questions, each one example): each is numbered by its
    place among the rows (`index`), not by its record."""

    def in_file(self, field: str) -> str:
        """A field as the file names it (the card's `columns` renamed it); a path's first part too."""
        head, dot, rest = field.partition(".")
        return dict(self.columns).get(field) or dict(self.columns).get(head, head) + dot + rest

    def file_columns(self, columns: list[str]) -> list[str]:
        """A loaded split's `columns` as the file names them: renamed back, derived ones left out."""
        return [self.in_file(c) for c in columns if c not in self.derived]

    def explain(self, message: str) -> str:
        """`message`, and where it names a renamed field, the file's column that field is; where it
        names the field a label file gives (`local.label_files`), that file."""
        notes = [
            f"{field!r} is the column {column!r}" for field, column in self.columns if repr(field) in message
        ]
        said = f"{'; '.join(notes)}, renamed by the card's `columns`" if notes else ""
        if self.labels and repr(self.labels[0]) in message:
            said += "; " * bool(said) + f"{self.labels[0]!r} is read from {self.labels[1]}, a line a record"
        return f"{message.rstrip('.')} ({said})." if said else message

    def keep(self, kept: list[int]) -> Origin:
        """The origin of the rows `kept` of this one's."""
        rows = tuple(kept) if self.kept is None else tuple(self.kept[i] for i in kept)
        return replace(self, kept=rows)

    def row(self, row: int) -> int:
        """Row `row` of the rows kept, by its number among those loaded."""
        return row if self.kept is None else self.kept[row]

    def index(self, row: int) -> int:
        """Row `row`'s example id where the card names none: its record's number, or its own place
        where examples share records."""
        return row if self.shared else self.row(row)

    def of(self, row: int) -> str:
        """'FILE, line 7' (or 'FILE, record 7', 'hub dataset ..., row 7') for row `row` of the split."""
        row = self.row(row)
        if self.path is None:
            return f"{self.source}, row {row + 1}"
        starts = record_lines(self.path, self.fmt, header=self.header)
        return place(self.source, starts, row + self.first_row(starts))

    def first_row(self, starts: list[int] | None = None) -> int:
        """The file's row the split's first row is: where the card's slice starts (`starts`, the
        file's `record_lines` where known), 0 without one."""
        if not self.selection or self.path is None:
            return 0
        total = len(starts) if starts is not None else len(read_table(self.path, fmt=self.fmt))
        return sliced(self.selection, total).start


def split_origin(task: TaskAdapter, split: str, data_dir: str | Path | None) -> Origin:
    """Where the rows of `load_split(task, split, data_dir)` come from."""
    if data_dir is None:
        return Origin(f"hub dataset {task.hub.path if task.hub else '?'} split {split}")
    spec = task.local
    try:
        match = split_spec(spec.splits[split])
    except ValueError as exc:
        raise CardError(
            f"Task {task.name!r}: local split {split!r} ({spec.splits[split]}) ends in {exc}, "
            "which is no slice of rows: write [start:end], in rows or percentages ([:90%])."
        ) from None
    path = Path(data_dir).expanduser() / match["file"]
    headerless = spec.column_names is not None and (
        spec.headerless_splits is None or split in spec.headerless_splits
    )
    fmt = spec.format or file_format(path)
    return Origin(str(path), path, fmt, header=not headerless, selection=match["slice"] or "")
