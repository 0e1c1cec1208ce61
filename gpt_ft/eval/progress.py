"""Progress over batches of long commands (`gpt-ft label`, `embed`, `generate`): a bar where
stderr is a terminal, and a line now and then where it is a log or a pipe."""

from __future__ import annotations

import sys
import time


def batches_bar(what: str, every: float = 30.0):
    """Progress over batches on stderr: a bar where it is a terminal; in logs and pipes, a line
    every `every` seconds of a longer run (how far, how long so far)."""
    from tqdm.auto import tqdm

    if sys.stderr.isatty():
        return lambda batches: tqdm(batches, desc=what, unit="batch", leave=False, file=sys.stderr)
    return lambda batches: progress_lines(batches, what, every)


def progress_lines(batches, what: str, every: float):
    start = said = time.perf_counter()
    total = len(batches)
    for done, batch in enumerate(batches, 1):
        yield batch
        if (now := time.perf_counter()) - said >= every and done < total:
            said = now
            print(f"{what}: {done:,} of {total:,} batches ({done / total:.0%}) in {now - start:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip


def say(line: str) -> None:
    """A long command's line: its warnings on stderr with its other notes (a script reads results
    on stdout), the rest on stdout."""
    print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)
