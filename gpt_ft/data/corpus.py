"""A text corpus as files: those named, and those found in the folders named."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path

from gpt_ft.errors import absent

TEXT_SUFFIXES = (".txt", ".text", ".md", ".raw", ".tokens")


def find_files(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Text files named directly, or found (recursively, sorted) in the folders named; each once,
    where it first comes (a file named and in a folder named, or folders within folders: read twice,
    its text would be in both the training and the validation split)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
            if not found:
                raise ValueError(f"Folder {path} holds no text files ({', '.join(TEXT_SUFFIXES)}).")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"Corpus input {path} {absent(path)}.")
    first = {}
    for file in files:
        first.setdefault(file.resolve(), file)
    return list(first.values())


def file_lines(paths: list[Path], batch: int = 1000) -> Iterator[list[str]]:
    """The files' lines in batches, read as `gpt-ft prepare` reads them: a byte-order mark dropped and
    Windows line ends made \\n, so that the merges learned are those of the text prepare encodes."""
    for path in paths:
        with path.open(encoding="utf-8-sig") as f:
            while lines := list(islice(f, batch)):
                yield lines
