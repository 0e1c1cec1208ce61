"""The files of a suite's folder OUT that are not its scores: each written whole or not at all
(`write_atomic`), a run written again set aside until it has finished (`set_aside`), and what a
suite may replace: OUT/submission only where it holds what a suite wrote there, as recorded beside
it, and no folder holding a suite's result files that is no suite's (`check_out_dir`)."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpt_ft.errors import writing
from gpt_ft.eval.progress import say

RESULT_FILES = ("results.json", "results.md", "results.png", "transfer.png", "learning_curves.png")

# OUT/submission: the best seeds' predictions, written again each run; beside it, what a suite wrote
SUBMISSION, SUITES_OWN = "submission", ".submission-by-gpt-ft-suite"


def check_out_dir(out: Path, submission: bool = True, archive: str | None = None) -> None:
    """Refused before any run: a folder that is no suite's (no runs/) but holds the files a suite
    writes (results.md, ..., the submission's `archive`); with a `submission`, one whose
    OUT/submission (replaced whole) holds a file no suite wrote there, or one written over since
    (`gpt-ft predict`'s): a suite's files are copies of its runs' predictions, and what it wrote is
    recorded beside them by SHA-256."""
    writes = [*RESULT_FILES, *([archive] if archive else [])]
    if not (out / "runs").is_dir() and (taken := [n for n in writes if (out / n).exists()]):
        raise ValueError(
            f"--out_dir {out} holds {', '.join(taken)}, which a suite writes, and no suite's runs: give "
            "another --out_dir (they are kept)."
        )
    marker, present = out / SUITES_OWN, digests(out / SUBMISSION) if submission else {}
    if not present:  # (the runs' predictions are not read for nothing)
        return
    ours = list((read_json(marker) if marker.is_file() and marker.stat().st_size else {}).items())
    ours += [(p.name, d) for p in sorted(out.glob("runs/**/predictions/*")) if (d := file_digest(p))]
    names, written = {name for name, _ in ours}, {digest for _, digest in ours}
    if foreign := [name for name, d in present.items() if d is None or d not in written]:
        named = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        what = "changed since a suite wrote them" if set(foreign) <= names else "no suite wrote"
        raise ValueError(
            f"{out / SUBMISSION} holds files {what} ({named}), and a suite writes its submission "
            "there anew: give another --out_dir, or move them (they are kept)."
        )


def file_digest(path: Path) -> str | None:
    """The SHA-256 of a file's bytes; None for anything else."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def digests(folder: Path) -> dict[str, str | None]:
    """Each entry of `folder` by name, with its `file_digest`; none if there is no folder."""
    return {p.name: file_digest(p) for p in (sorted(folder.iterdir()) if folder.is_dir() else [])}


def new_submission_folder(out: Path) -> Path:
    """OUT/submission, emptied (checked again to hold only what a suite wrote)."""
    check_out_dir(out)
    shutil.rmtree(folder := out / SUBMISSION, ignore_errors=True)
    folder.mkdir()
    return folder


def gather_submission(
    out: Path, archive: str, expected: list[str], results: dict[str, Any], run_of: Callable, log=say
) -> Path:
    """Each task's test predictions from its best seed by the main metric (`run_of(task, seed)`: its
    run, whose folder under OUT/runs holds them), gathered in a new submission folder and zipped."""
    folder = new_submission_folder(out)
    for name, item in results["tasks"].items():
        stats = item["metrics"].get(item["main_metric"])
        if not stats or not stats["seeds"]:
            continue
        scored = {seed: v for seed, v in stats["seeds"].items() if v is not None}
        run = run_of(name, int(max(scored, key=scored.get) if scored else next(iter(stats["seeds"]))))
        predictions = out / "runs" / run.folder / "predictions"
        files = sorted(p for p in predictions.rglob("*") if p.is_file()) if predictions.is_dir() else []
        if not files:
            log(f"warning: {run} (the best seed) wrote no test predictions")
        for file in files:
            shutil.copy(file, folder / file.name)
    return zip_submission(out, archive, expected, log)


def mark_submission(out: Path) -> set[str]:
    """What OUT/submission holds, recorded as the suite's own (`check_out_dir`): its names."""
    write_json(out / SUITES_OWN, written := digests(out / SUBMISSION))
    return set(written)


def zip_submission(out: Path, archive: str, expected: list[str], log=say) -> Path:
    """OUT/submission zipped into OUT/`archive`: the files the leaderboard expects, each missing or
    left out (a card's file not among them, which a leaderboard may refuse) named in a warning."""
    present = mark_submission(out)
    if lacks := ", ".join(f for f in expected if f not in present):
        log(f"warning: the submission lacks {lacks} (tasks not in this run or without test files)")
    if others := sorted(present - set(expected)):
        log(f"warning: {', '.join(others)} left out of {archive}: not among the submission's files")
    names = sorted(present & set(expected))
    write_zip(out / archive, out / SUBMISSION, names)
    log(f"wrote {out / archive} ({len(names)} file{'s' * (len(names) != 1)})")
    return out / archive


def write_zip(archive: Path, folder: Path, names: list[str]) -> None:
    """The files `names` of `folder` zipped into `archive` (written whole or not at all)."""

    def zip_to(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for name in names:
                zf.write(folder / name, name)

    write_atomic(archive, zip_to)


@contextmanager
def set_aside(folder: Path | None, result: str) -> Iterator[None]:
    """A run written anew into `folder`: a finished run's files there (its `result`) are moved
    aside while the new one runs, put back if it fails or is interrupted, and deleted once it has
    succeeded; an unfinished run's files are deleted at once. None: nothing to do (another
    process's turn)."""
    previous = folder.with_name(f"{folder.name}.previous") if folder is not None else None
    if folder is not None and folder.exists():
        if (folder / result).is_file():
            shutil.rmtree(previous, ignore_errors=True)
            folder.rename(previous)
        else:  # interrupted: a finished run set aside before it (if any) stays aside
            shutil.rmtree(folder)
    try:
        yield
    except BaseException:
        if previous is not None and previous.exists():
            shutil.rmtree(folder, ignore_errors=True)
            previous.rename(folder)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)


def put_back(folder: Path, result: str) -> None:
    """A finished run `set_aside` kept while a rerun of it was killed outright (SIGKILL, out of
    memory: no `except` ran), put back in place of the rerun's unfinished files: a rerun with the
    configuration it finished with then has nothing to do."""
    previous = folder.with_name(f"{folder.name}.previous")
    if (previous / result).is_file() and not (folder / result).is_file():
        shutil.rmtree(folder, ignore_errors=True)
        previous.rename(folder)


def write_json(path: Path, value: Any) -> None:
    """Written whole or not at all: a crash never leaves half a file."""
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8"))


def write_atomic(path: Path, write: Callable[[Path], Any]) -> None:
    """`write(tmp)` to a temporary file beside `path`, renamed into place: a crash or a full disk
    never leaves half a file, and a failed write is one sentence naming `path`."""
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")  # the suffix tells matplotlib the format
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(tmp)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)


def read_json(path: Path) -> dict[str, Any] | None:
    """A result file's contents, or None where there is none; one damaged (cut short by a full disk,
    edited) is refused naming it."""
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        why = None if isinstance(found, dict) else "not a mapping"
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        why = str(e)
    if why is not None:
        raise ValueError(f"{path} is not a result the suite wrote ({why}): delete it to run it again.")
    return found
