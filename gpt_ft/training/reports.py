"""What `validate` and `test` write beside their logs for a task with classes: each class's (or
label's) precision, recall, F1 and support, and the confusion matrix, as a Markdown table and a
PNG per split, with a compact form printed."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from torch import Tensor

from gpt_ft.adapters import TaskAdapter
from gpt_ft.errors import writing


def write_report(task: TaskAdapter, split: str, predictions: Tensor, labels: Tensor, folder: Path) -> None:
    """`folder/{split}.md` (and `{split}_confusion.png` for classes); one line printed per class."""
    rows = task.output.per_class(predictions.cpu(), labels.cpu())
    if rows is None:
        return
    confusion = task.output.confusion(predictions.cpu(), labels.cpu())
    text = report_text(task, split, rows, confusion)
    path = folder / f"{split}.md"
    with writing(path):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    if confusion is not None:
        plot_confusion(confusion, list(rows), folder / f"{split}_confusion.png", title=f"{task.name} {split}")
    width = max(shown_width(name) for name in rows)
    print(f"{split}: precision / recall / F1 / support per class ({path})", flush=True)
    for name, row in rows.items():
        pad = " " * (width - shown_width(name))  # (a column of CJK or Devanagari names lines up)
        print(
            f"  {name}{pad}  {row['precision']:.3f}  {row['recall']:.3f}  {row['f1']:.3f}  "
            f"{int(row['support'])}",
            flush=True,
        )


def shown_width(text: str) -> int:
    """The columns `text` takes in a terminal: a wide character (CJK) two, a combining mark none."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text
    )


def report_text(task: TaskAdapter, split: str, rows: dict, confusion: Tensor | None) -> str:
    """The per-class table and the confusion matrix as Markdown."""
    lines = [
        f"# {task.name}: {split}",
        "",
        "| class | precision | recall | F1 | support |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        scores = " | ".join(f"{row[column]:.4f}" for column in ("precision", "recall", "f1"))
        lines.append(f"| {name} | {scores} | {int(row['support'])} |")
    if confusion is not None:
        names = list(rows)
        lines += ["", "Confusion matrix (rows: true class, columns: predicted class):", ""]
        lines += ["| true \\ predicted | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for name, counts in zip(names, confusion.tolist()):
            lines.append(f"| {name} | " + " | ".join(str(int(c)) for c in counts) + " |")
    return "\n".join(lines) + "\n"


def plot_confusion(confusion: Tensor, names: list[str], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = 1.2 + 0.5 * len(names)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    counts = confusion.numpy()
    image = ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    for i in range(len(names)):
        for j in range(len(names)):
            color = "white" if counts[i, j] > counts.max() / 2 else "black"
            ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", color=color)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, dpi=100)
    plt.close(fig)
