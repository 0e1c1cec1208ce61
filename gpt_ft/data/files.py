"""A task's split as a `datasets.Dataset`: from local files (csv, tsv, json/jsonl, parquet) under
`--data.data_dir` laid out as the card's `local` says, or from the Hugging Face Hub."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from gpt_ft.adapters import TaskAdapter, TaskDataError

SLICE = re.compile(r"^(?P<file>.*?)(?P<slice>\[[^\[\]]*\])?$")
_FORMATS = {".tsv": "tsv", ".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_split(task: TaskAdapter, split: str, data_dir: str | Path | None):
    """One split of the task as a `datasets.Dataset`, columns renamed to the adapter's field names.

    From local files under `data_dir` when given (the card's `local` layout), else from the Hub.
    """
    import datasets

    if data_dir is not None:
        return _load_local(task, split, Path(data_dir).expanduser())
    if task.hub is None:
        raise TaskDataError(
            f"Task {task.name!r} has no hub dataset; pass its files with --data.data_dir DIR."
        )
    hub_split = (task.hub.splits or {}).get(split, split)
    config = (task.hub.configs or {}).get(split, task.hub.name)
    try:
        ds = datasets.load_dataset(task.hub.path, config, split=hub_split)
    except ValueError as exc:  # unknown split
        raise TaskDataError(
            f"Hub dataset {task.hub.path} ({config}) has no split {hub_split!r}: {exc}"
        ) from exc
    return _rename(ds, task.hub.columns, f"hub dataset {task.hub.path}")


def _load_local(task: TaskAdapter, split: str, data_dir: Path):
    spec = task.local
    if spec is None:
        raise TaskDataError(
            f"Task {task.name!r} defines no local file layout; drop --data.data_dir to use the hub."
        )
    if split not in spec.splits:
        raise TaskDataError(
            f"Task {task.name!r} has no local split {split!r}; its card defines {sorted(spec.splits)}."
        )
    match = SLICE.match(spec.splits[split])
    path, selection = data_dir / match["file"], match["slice"] or ""
    if not path.is_file():
        raise TaskDataError(f"{path}: file not found (split {split!r} of task {task.name!r}).")
    if path.stat().st_size == 0:
        raise TaskDataError(f"{path}: file is empty (split {split!r} of task {task.name!r}).")
    headerless = spec.column_names is not None and (
        spec.headerless_splits is None or split in spec.headerless_splits
    )
    ds = read_table(
        path,
        fmt=spec.format,
        column_names=spec.column_names if headerless else None,
        selection=selection,
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

    fmt = fmt or _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise TaskDataError(
            f"{path}: unknown file format; set `format` (tsv, csv, json, parquet) in the card."
        )
    if fmt in ("tsv", "csv"):
        sep = "\t" if fmt == "tsv" else ","
        try:
            columns = list(column_names) if column_names is not None else _header(path, sep)
        except UnicodeDecodeError as exc:
            raise TaskDataError(f"{path}: not UTF-8 text ({exc.reason}); save it as UTF-8.") from None
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
    try:
        files = {"data": str(path)}
        return datasets.load_dataset(builder, data_files=files, split="data" + selection, **kwargs)
    except Exception as exc:  # pandas/pyarrow parse errors, an empty selection
        if "corresponds to no data" in str(exc):
            raise TaskDataError(f"{path}: split {split!r} has no examples.") from None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskDataError(f"{path}: cannot be read as {fmt} ({reason}).") from exc


def _header(path: Path, sep: str) -> list[str]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        line = f.readline()
    if sep == "\t":
        return line.rstrip("\r\n").split("\t")
    return next(csv.reader([line]))


def _rename(ds, columns: dict[str, str] | None, source: str):
    renames = {old: new for old, new in (columns or {}).items() if old in ds.column_names and old != new}
    return ds.rename_columns(renames) if renames else ds


def split_file(task: TaskAdapter, split: str, data_dir: str | Path) -> Path:
    """The local file of a split (without its slice)."""
    return Path(data_dir).expanduser() / SLICE.match(task.local.splits[split])["file"]
