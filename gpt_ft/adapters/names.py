"""What a card names that files are written by: its task's name and its splits' (the run folders,
reports and default submission files written for them), its submission files. They stay inside
the folder the command's user gives (`--model.predictions_dir`, `--out_dir`): a card, a suite or a
checkpoint from elsewhere must not write over a file outside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath

from gpt_ft.errors import CardError


def file_part(value: str, what: str) -> str:
    """`value` as one part of a file's name: no separator, not `.` or `..`, not empty."""
    if not isinstance(value, str) or value in ("", ".", "..") or any(c in value for c in "/\\\x00"):
        raise CardError(
            f"{what} {value!r} names the files and folders written for it: give a name without '/' or "
            "'\\' (nor '.' or '..')."
        )
    return value


def inside(value: str, what: str) -> str:
    """`value` as a relative path that stays inside the folder it is joined to (no root, drive or '..')."""
    posix, windows = PurePosixPath(value), PureWindowsPath(value)
    if not value or posix.is_absolute() or windows.drive or windows.root or ".." in windows.parts:
        raise CardError(
            f"{what} {value!r} would be written outside the folder given for it: give a path inside it "
            "(a file name, or a relative path without '..')."
        )
    return value


@dataclass
class Submission:
    """How predictions are written for a leaderboard: a file name per split, each class's name there."""

    files: dict[str, str]
    labels: list[str] | None = None

    @classmethod
    def from_card(cls, task_name: str, files: dict[str, str] | None, labels: list[str] | None,
                  class_names: list[str] | None) -> Submission:  # fmt: skip
        if labels is not None and len(labels) != len(class_names or []):
            raise CardError(
                f"Task {task_name!r}: submission_labels {labels} must name each of the "
                f"{len(class_names or [])} labels {class_names}."
            )
        file_part(task_name, "Task name")  # (its default files, its suite's run folders)
        files = {split: inside(path, f"Task {task_name!r}: submission file of split {split!r},")
                 for split, path in (files or {}).items()}  # fmt: skip
        return cls(files, list(labels) if labels is not None else None)
