"""The files a card's local layout names under `--data.data_dir`: each split's file (a slice of
its rows may follow the name) and, where the labels are kept in a file of their own beside the
records, one a line in their order (AI2's releases of PIQA and Social IQa: `train.jsonl` and
`train-labels.lst`, the card's `local.label_files`), that file, read into the split as the card's
label field; and a label column that numbers its own classes, checked against the card's labels."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.data.file_faults import file_bytes, utf8_problem
from gpt_ft.errors import CardError

SLICE = re.compile(r"^(?P<file>.*?)(?P<slice>\[[^\[\]]*\])?$")


def sliced(selection: str, total: int) -> range:
    """The rows a card's slice (`[:1497]`, `[90%:]`; empty: all) takes of `total`."""
    import datasets

    if not selection:
        return range(total)
    span = datasets.ReadInstruction.from_spec("data" + selection).to_absolute({"data": total})[0]
    return range(span.from_, span.to)


def split_spec(value: str) -> re.Match:
    """A card's local split (`train.tsv[:90%]`) as its `file` and `slice`; a ValueError (the slice)
    for a slice of no rows, or one that ends before it starts (`[5:2]`, `[50%:10%]`), which datasets
    reads as it pleases: no rows, or all but two (`[2:1]`)."""
    import datasets

    match = SLICE.match(value)
    if selection := match["slice"]:
        bounds = re.fullmatch(r"\[(\d+)(%?):(\d+)(%?)\]", selection)
        try:
            datasets.ReadInstruction.from_spec("data" + selection)
        except ValueError:
            raise ValueError(selection) from None
        if bounds and bounds[2] == bounds[4] and int(bounds[3]) < int(bounds[1]):
            raise ValueError(selection)
    return match


def split_file(task: TaskAdapter, split: str, data_dir: str | Path) -> Path:
    """The local file of a split (without its slice)."""
    return Path(data_dir).expanduser() / SLICE.match(task.local.splits[split])["file"]


def file_stamp(path: Path) -> str:
    """A file as it is now: its size, modified and changed times, and inode. A copy of another
    version of a file (`cp -p`, `rsync -a`, an archive) can keep its modification time; its change
    time or inode differ."""
    stat = path.stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}-{stat.st_ctime_ns}-{stat.st_ino}"


def loader_key(path: Path) -> str:
    """datasets' cache key for the file as it is now (its own is the path and the modification time
    alone)."""
    return "file-" + hashlib.sha256(file_stamp(path).encode()).hexdigest()[:16]


def label_file(task: TaskAdapter, split: str, data_dir: str | Path) -> Path | None:
    """The file holding `split`'s labels under `data_dir`, where the card names one."""
    named = (task.local.label_files or {}).get(split) if task.local else None
    return Path(data_dir).expanduser() / named if named else None


def task_files(task: TaskAdapter, data_dir: str | Path) -> dict[Path, str]:
    """Every file the card's local layout reads under `data_dir` (without their slices), each
    with its split: the splits' own and their label files."""
    files = {split_file(task, split, data_dir): split for split in task.local.splits}
    return files | {label_file(task, split, data_dir): split for split in task.local.label_files or {}}


def with_labels(table, path: Path, task: TaskAdapter, split: str, records: str, selection: str):
    """The split's records `table` (the whole file at `records`, read without the card's slice)
    with its labels from the file at `path`, then the card's slice of both (`selection`, e.g.
    '[:1000]'). A label file of more or fewer lines than the records, an empty line or a column of
    the label's name already in the records is refused, naming the file."""
    field = task.label_column
    if field is None:
        raise CardError(
            f"Task {task.name!r}: local.label_files gives split {split!r} labels, but the task reads "
            f"none from a field ({task.label_source})."
        )
    renamed = task.local.columns or {}  # (the field a column becomes; one renamed away would take it)
    if field in renamed or field in {renamed.get(c, c) for c in table.column_names}:
        raise TaskDataError(
            f"{records} has a column {field!r} of its own (or the card's `columns` renames one to it or it "
            f"away), and the card's local.label_files gives split {split!r} its labels in {path} too: drop "
            "one of the two."
        )
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "file not found"
        raise TaskDataError(f"{path}: {what} (the labels of split {split!r} of task {task.name!r}).")
    data = file_bytes(path)
    if (problem := utf8_problem(data)) is not None:
        raise TaskDataError(f"{path}{problem}.")
    labels = re.split(r"\r\n|\r|\n", data.decode("utf-8-sig"))  # (not at a form feed: str.splitlines)
    while labels and not labels[-1].strip():
        labels.pop()  # the end of the last line, and blank lines after it
    if (empty := next((i for i, label in enumerate(labels) if not label.strip()), None)) is not None:
        raise TaskDataError(f"{path}, line {empty + 1} is empty: a label file holds one label a line.")
    if len(labels) != len(table):
        raise TaskDataError(
            f"{path} holds {len(labels):,} labels, one a line, but {records} holds {len(table):,} "
            f"records: the labels of split {split!r} must be as many, in the records' order."
        )
    table = table.add_column(field, [label.strip() for label in labels])
    if not (rows := sliced(selection, len(table))):
        raise TaskDataError(f"{records}: split {split!r} has no examples.")
    return table.select(rows) if selection else table


def class_order_problem(task: TaskAdapter, ds) -> str | None:
    """A label column numbering its own classes (a `ClassLabel`: a hub dataset's, a parquet file
    datasets wrote) as the card's labels in another order: read by the card's, every id swapped."""
    feature = ds.features.get(task.label_column) if task.label_column else None
    names, card = getattr(getattr(feature, "feature", feature), "names", None), task.output.class_names
    if names and card and sorted(names) == sorted(card) and list(names) != list(card):
        return (f"its column {task.label_column!r} numbers its classes {list(names)}, the card's labels "
                f"are {list(card)}: list the card's labels in the file's order")  # fmt: skip
    return None
