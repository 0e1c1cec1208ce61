"""Parts of a checklist under a hard limit: a command in a process group of its own, killed whole
at its limit, its output kept."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRA = re.compile(r"extra == .(\w+).")


@dataclass
class Part:
    returncode: int | None
    """None: killed at its limit."""
    seconds: float
    stdout: str
    stderr: str


def run_part(cmd: list[str], limit_s: float, env: dict[str, str] | None = None) -> Part:
    """Runs `cmd` in the project root in a process group of its own, its output kept in files (no
    pipe to fill). At `limit_s` the whole group is killed with SIGKILL: neither a process that
    catches SIGTERM (Lightning's trainer does) nor its children outlive the limit. Children left
    behind by a process that exited are killed too, and so is the group when the wait ends in an
    exception (Ctrl-C, or the caller's SIGTERM handler exiting): no part outlives the checklist."""
    start = time.perf_counter()
    text = {"mode": "w+", "encoding": "utf-8", "errors": "replace"}  # a stray byte is no reason to stop
    with tempfile.TemporaryFile(**text) as out, tempfile.TemporaryFile(**text) as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            code = proc.wait(timeout=max(limit_s, 0.1))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the group is gone already
            proc.wait()
        out.seek(0), err.seek(0)
        return Part(code, time.perf_counter() - start, out.read(), err.read())


def floors_missed(version=None, also: list[str] = ()) -> list[str]:
    """gpt_ft's requirements the installed packages miss ("tokenizers 0.23.2 (needs >=0.23.3)"),
    read from its installed metadata, and those of the packages named in `also` that its extras
    require (pytest for the tests); `version(name)` gives a package's version (importlib's by
    default). Figures measured below the floors (docs/command-line.md#versions) are not gpt_ft's."""
    from importlib import metadata

    from packaging.requirements import Requirement

    version = version or metadata.version
    missed, checked = [], set()
    try:
        requires = metadata.requires("gpt_ft") or []
    except metadata.PackageNotFoundError:
        return ["gpt_ft itself (not installed, so its floors are unknown: `pip install -e .`)"]
    for text in requires:
        need = Requirement(text)
        extra = need.marker is not None and not need.marker.evaluate({"extra": ""})
        if (extra and need.name not in also) or need.name in checked:
            continue  # an extra's not asked for, or one checked already (accelerate is in two)
        checked.add(need.name)
        try:
            have = version(need.name)
        except metadata.PackageNotFoundError:
            hint = (
                f"; pip install -e '.[{name[1]}]'"
                if extra and (name := EXTRA.search(str(need.marker)))
                else ""
            )
            missed.append(f"{need.name} (needs {need.specifier or 'it'}{hint})")
            continue
        if not need.specifier.contains(have, prereleases=True):
            missed.append(f"{need.name} {have} (needs {need.specifier})")
    return missed
