"""Predictions written as a leaderboard wants them: `index<TAB>prediction`, one row per example."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from gpt_ft.adapters import TaskAdapter
from gpt_ft.errors import writing


def write_predictions(
    task: TaskAdapter,
    split: str,
    index: Tensor,
    predictions: Tensor,
    out_dir: Path,
    names: dict[int, str] | None = None,
) -> Path:
    """Rows in example order, each example once, in the file the leaderboard expects
    (`submission_files`, else TASK-SPLIT.tsv); the task writes each prediction. An example is
    named by its id: the integer, or the text `names` gives its row."""
    path = out_dir / task.submission_files.get(split, f"{task.name}-{split}.tsv")
    order = torch.argsort(index)
    seen = set()
    lines = ["index\tprediction"]
    for i in order.tolist():
        row = int(index[i])
        if row in seen:  # a distributed sampler may repeat examples to even out ranks
            continue
        seen.add(row)
        lines.append(f"{names.get(row, row) if names else row}\t{task.format_prediction(predictions[i])}")
    tmp = path.with_suffix(path.suffix + ".tmp")
    with writing(path):  # no space left, permission denied: one sentence, the previous file kept
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text("\n".join(lines) + "\n")
            tmp.replace(path)  # atomic: a crash never leaves half a file
        finally:
            tmp.unlink(missing_ok=True)
    return path
