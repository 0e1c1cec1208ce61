"""Commands that run in processes of their own, in the background, while the in-process tests run.

A test marked `@pytest.mark.background(start=start)` checks commands that `start(root, **fixtures)`
writes the files for and returns (`Command`s; `root` is a fresh folder, the other parameters are
fixtures of the session such as `tokenizer_dir`). At the first test of the session, `start` of
every selected test is called on the main thread, in test order; their commands then run in the
background, each in a process of its own (a job's commands one after another, `WORKERS` jobs at a
time), so that the machine's second core runs them while the first runs the tests that need no
process of their own (the suite is mostly single-threaded). The marked tests run last
(tests/conftest.py), so that the others fill the wait; each gets its commands, finished, through
the `background` fixture: its root and their `subprocess.CompletedProcess`es, in the order given.

Two cores, few busy threads: the tests in the session's own process compute on one thread
(tests/conftest.py), and so does each background process (OMP_NUM_THREADS=1); otherwise their
thread pools would fight over the cores and slow everything several times over. Two jobs at a time
keep the second core busy: a command spends much of its time importing the toolkit, and a DDP run's
two processes mostly take turns. The background processes run at a lower priority
(`lower_priority`): the session's own tests keep a whole core, and the background takes both once
they are done (shared equally, the three processes gave the tests two thirds of a core, and the
session ended later).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
WORKERS = 2
NICENESS = 5  # weight 335 to the tests' 1024: two background sessions leave them a whole core


def lower_priority(pid: int) -> None:
    """A background process yields the CPU to the session's own tests (one thread): its nice value
    raised, and (Linux with autogroups, where each session is scheduled as one and a process's nice
    value counts only inside its own) its session's."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, NICENESS)
        Path(f"/proc/{pid}/autogroup").write_text(str(NICENESS))
    except OSError:  # ended already, no such file (other systems, no autogroups), or not allowed
        pass


@dataclass
class Command:
    """One process: its arguments, working directory and environment (None: the session's, as it was
    when the session started; OMP_NUM_THREADS=1 is added either way); `after`, if given, is called
    once the process has ended, before the next command starts, and what it returns is the result's
    `after` (e.g. the files there were)."""

    argv: list[str]
    cwd: Path = ROOT
    env: dict[str, str] | None = None
    after: Callable[[], object] | None = None


def gpt_ft(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, after: Callable[[], object] | None = None
) -> Command:
    """`python -m gpt_ft ARGS`."""
    return Command([sys.executable, "-m", "gpt_ft", *args], cwd, env, after)


class Background:
    """The background thread, the jobs by `start` function, and the live processes (killed, with
    their children, when the session ends before they do)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tests-background")
        self._jobs: dict[Callable, tuple[Path, Future]] = {}
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._env = dict(os.environ)  # before any test changes it
        self.seconds: list[tuple[float, str]] = []  # each command's wall time, for the summary
        self.started = time.perf_counter()
        self.ended: float | None = None  # when the last command ended
        self.waited_from: float | None = None  # when the first marked test asked for its commands

    def __contains__(self, start: Callable) -> bool:
        return start in self._jobs

    def submit(self, start: Callable, root: Path, commands: list[Command]) -> None:
        self._jobs[start] = (root, self._executor.submit(self._run_all, commands))

    def fail(self, start: Callable, root: Path, exc: BaseException) -> None:
        """`start` itself failed: its test fails with this error, the others go on."""
        future: Future = Future()
        future.set_exception(exc)
        self._jobs[start] = (root, future)

    def result(self, start: Callable, timeout: float = 900) -> tuple[Path, list[subprocess.CompletedProcess]]:
        """The finished commands of `start`'s job, waiting for them (a hung command fails its test)."""
        root, future = self._jobs[start]
        self.waited_from = self.waited_from or time.perf_counter()
        return root, future.result(timeout=timeout)

    def _run_all(self, commands: list[Command]) -> list[subprocess.CompletedProcess]:
        return [self._run(command) for command in commands]

    def _run(self, command: Command) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        with self._lock:
            if self._closed:
                raise RuntimeError("the test session ended before this command ran")
            process = subprocess.Popen(
                command.argv,
                cwd=command.cwd,
                env={**(command.env if command.env is not None else self._env), **ONE_THREAD},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: killed with its children if need be
            )
            self._live.add(process)
        lower_priority(process.pid)
        try:
            out, err = process.communicate()
        finally:
            with self._lock:
                self._live.discard(process)
        done = subprocess.CompletedProcess(command.argv, process.returncode, out, err)
        done.after = command.after() if command.after is not None else None
        self.ended = time.perf_counter()
        self.seconds.append((self.ended - start, " ".join(Path(a).name for a in command.argv[1:5])))
        return done

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for process in self._live:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._executor.shutdown(wait=True, cancel_futures=True)
