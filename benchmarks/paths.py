"""The benchmark scripts' input paths, checked as the command line is read: a data folder or file
that is not there is argparse's one sentence (`error: argument --glue: ...`, exit 2) before any
work, not a traceback minutes into a run. It imports nothing heavy: any script may use it."""

from __future__ import annotations

import argparse
from pathlib import Path


def existing(value: str) -> str:
    """An argparse type: a file or folder that exists, as given (`~` expanded)."""
    path = Path(value).expanduser()
    if not path.exists():
        where = next((p for p in path.parents if p.exists()), None)
        found = (
            f" ({where} has no {path.relative_to(where).parts[0]})" if where not in (None, Path(".")) else ""
        )
        raise argparse.ArgumentTypeError(f"{value}: no such file or folder{found}")
    return str(path)
