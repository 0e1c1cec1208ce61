"""Predictions written as a leaderboard wants them: `index<TAB>prediction` lines (GLUE) or JSON
records (SuperGLUE), one per example."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt_ft.adapters import TaskAdapter
from gpt_ft.data.ids import id_text
from gpt_ft.data.layout import task_files
from gpt_ft.errors import writing

NAMED = ("id_names", "choice_names")
"""What a data module names in a split's rows (its text ids; each row's own names of its
choices), by the split: `write_predictions` takes them."""


def submission_path(task: TaskAdapter, split: str, out_dir: str | Path) -> Path:
    """Where `predict` writes a split's predictions: `submission_files`, else TASK-SPLIT.tsv (`~`: home,
    as the writer reads it; the check against the task's own files read it literally)."""
    return Path(out_dir).expanduser() / task.submission_files.get(split, f"{task.name}-{split}.tsv")


def check_submission(task: TaskAdapter, out_dir: str | Path, data_dir: str | Path | None, limit=1.0) -> None:
    """A submission file that is one of the task's own files (a card whose test file is named as
    its submission, `--model.predictions_dir` its data folder) is refused before any work: the
    predictions would replace the texts. A `limit` of the batches predicted is warned of: the
    files, named as a leaderboard wants them, then hold part of each split."""
    if limit is not None and (isinstance(limit, int) or limit < 1.0):  # batches, or a fraction
        warnings.warn(
            f"--trainer.limit_predict_batches {limit}: the files written hold part of each test split, "
            "not a submission (a leaderboard refuses them).",
            stacklevel=2,
        )
    if data_dir is None or task.local is None:
        return
    inputs = {path.resolve(): split for path, split in task_files(task, data_dir).items()}
    for split in task.test_splits:
        path = submission_path(task, split, out_dir)
        if (read := inputs.get(path.resolve())) is not None:
            raise ValueError(
                f"--model.predictions_dir {out_dir}: the predictions of split {split!r} would replace "
                f"{path}, the task's own {read!r} split file: give another folder (the file is kept)."
            )


def write_predictions(
    task: TaskAdapter,
    split: str,
    index: Tensor,
    predictions: Tensor,
    out_dir: Path,
    id_names: dict[int, str | dict] | None = None,
    choice_names: dict[int, list[str]] | None = None,
) -> Path:
    """Rows in example order, each example once, in the file the leaderboard expects
    (`submission_files`, else TASK-SPLIT.tsv); the task writes each prediction, or where a row
    names its own choices (`choice_names`), its name of the one chosen. An example is named by
    its id: the integer, or what `id_names` gives its row (a text, or a record of ids).

    A TSV file has a line `index<TAB>prediction` per example (GLUE's); a `.jsonl` file a JSON
    record per example, its `idx` and `label` (SuperGLUE's: `TaskOutput.submission_record`),
    the records of one `idx` (a MultiRC passage's questions) merged into one line."""
    path = submission_path(task, split, out_dir)
    seen, entries = set(), []
    for i in torch.argsort(index).tolist():
        row = int(index[i])
        if row in seen:  # a distributed sampler may repeat examples to even out ranks
            continue
        seen.add(row)
        name = choice_names[row].__getitem__ if choice_names else task.submission_label
        entries.append((id_names.get(row, row) if id_names else row, predictions[i], name))
    if path.suffix == ".jsonl":
        records = merged([task.output.submission_record(*entry) for entry in entries])
        text = "".join(json.dumps(record) + "\n" for record in records)
    else:
        lines = [f"{id_text(idx)}\t{task.output.format_prediction(p, name)}" for idx, p, name in entries]
        text = "\n".join(["index\tprediction", *lines]) + "\n"
    tmp = path.with_suffix(path.suffix + ".tmp")
    with writing(path):  # no space left, permission denied: one sentence, the previous file kept
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # (a card's file name may hold a folder)
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)  # atomic: a crash never leaves half a file
        finally:
            tmp.unlink(missing_ok=True)
    return path


def merged(records: list[dict]) -> list[dict]:
    """Records of one `idx` as one, in the order their ids first come: their fields merged, the
    lists in them joined (a MultiRC passage's questions)."""
    by_id: dict[str, dict] = {}
    for record in records:
        key = json.dumps(record.get("idx"), sort_keys=True)
        by_id[key] = joined(by_id[key], record) if key in by_id else record
    return list(by_id.values())


def joined(first: Any, second: Any) -> Any:
    """Two parts of one record as one: records' fields merged, lists joined, else the first kept."""
    if isinstance(first, dict) and isinstance(second, dict):
        return {**second, **{k: joined(v, second[k]) if k in second else v for k, v in first.items()}}
    return first + second if isinstance(first, list) and isinstance(second, list) else first
