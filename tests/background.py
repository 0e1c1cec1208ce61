"""Commands that run in processes of their own, in the background, while the in-process tests run.

A test marked `@pytest.mark.background(start=start)` checks commands that `start(root, **fixtures)`
writes the files for and returns (`Command`s; `root` is a fresh folder, the other parameters are
fixtures of the session such as `tokenizer_dir`). At the first test of the session, `start` of
every selected test is called on the main thread, in test order; their commands then run in the
background, each in a process of its own (a job's commands one after another; one job at a time
until the in-process tests end, `WORKERS` after), so that the machine's second core runs them
while the first runs the tests that need no process of their own (the suite is mostly
single-threaded). The marked tests run last
(tests/conftest.py), so that the others fill the wait; each gets its commands, finished, through
the `background` fixture: its root and their `subprocess.CompletedProcess`es, in the order given.

Two cores, few busy threads: the tests in the session's own process compute on one thread
(tests/conftest.py), and so does each background process (OMP_NUM_THREADS=1); otherwise their
thread pools would fight over the cores and slow everything several times over. One job at a time
keeps the second core busy now that few commands import the toolkit afresh (`preloaded`, below); a
second one took the tests' core from them often enough that the session ended 17 s later (277 s
against 260 s). The background processes run at a lower priority (`lower_priority`): the
session's own tests keep a whole core; once they are done (the first marked test asks for its
commands), `WORKERS` jobs run at a time, and the background takes both cores.

Most of a command's own work is importing torch, Lightning and transformers (about 5 s of CPU for
`gpt-ft fit`), so a `preloaded` command is not started afresh: it is a fork of one template process
that imported the toolkit once at the start of the session (multiprocessing's forkserver), run as
`python -m gpt_ft ARGS`, `python -c CODE ARGS` or `python SCRIPT ARGS` would run it, in its own
session, working directory and environment, its output in files. What a command checks of a fresh
interpreter (which modules an import pulls in, what `PYTHONPATH` alone finds, an environment read
at import) needs `fresh` instead. The other ranks of a preloaded DDP run are forks of its process
too (Lightning's launcher would start each as `python -m gpt_ft ARGS` afresh), run as that command
would run; those of a fresh one are fresh processes.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
Process = subprocess.Popen | multiprocessing.process.BaseProcess
WORKERS = 2  # jobs at a time once the in-process tests have ended (one before: the other core is theirs)
NICENESS = 5  # weight 335 to the tests' 1024: a DDP run's two ranks leave them a whole core


def lower_priority(pid: int) -> None:
    """A background process yields the CPU to the session's own tests (one thread): its nice value
    raised, and (Linux with autogroups, where each session is scheduled as one and a process's nice
    value counts only inside its own) its session's."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, NICENESS)
        Path(f"/proc/{pid}/autogroup").write_text(str(NICENESS))
    except OSError:  # ended already, no such file (other systems, no autogroups), or not allowed
        pass


def label(argv: list[str]) -> str:
    """A command in a few words, for the summary: its first arguments, a path's file name, code's
    first line."""
    words = (next((line for line in a.splitlines() if line.strip()), "") for a in argv[1:5])
    return " ".join(Path(w).name if w == a and " " not in a else w for a, w in zip(argv[1:5], words))


@dataclass
class Command:
    """One process: its arguments, working directory and environment (None: the session's, as it was
    when the session started; OMP_NUM_THREADS=1 is added either way); `after`, if given, is called
    once the process has ended, before the next command starts, and what it returns is the result's
    `after` (e.g. the files there were). `preloaded`: `python -m MODULE ...`, `python -c CODE ...` or
    `python SCRIPT ...` run in a fork of the template process, which has the toolkit imported already."""

    argv: list[str]
    cwd: Path = ROOT
    env: dict[str, str] | None = None
    after: Callable[[], object] | None = None
    preloaded: bool = False


def gpt_ft(
    *args: str,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    after: Callable[[], object] | None = None,
    fresh: bool = False,
) -> Command:
    """`python -m gpt_ft ARGS`, preloaded unless `fresh`."""
    return Command([sys.executable, "-m", "gpt_ft", *args], cwd, env, after, preloaded=not fresh)


# What the template imports: the command line and the training loop, and the data modules' datasets
# (each command that reads a task or token files would import it, pandas and pyarrow: 0.4 s).
PRELOADED = ["gpt_ft.cli.main", "gpt_ft.training.runs", "datasets"]
TEMPLATE = None  # where there is no forkserver (Windows), preloaded commands start afresh
if "forkserver" in multiprocessing.get_all_start_methods():
    TEMPLATE = multiprocessing.get_context("forkserver")
    TEMPLATE.set_forkserver_preload([*PRELOADED, "tests.interrupt"])


def start_template() -> None:
    """Starts the template now (at the session's configuration), so that its imports run on the
    second core while the first collects the tests, and the first command forks at once. It is
    single-threaded as its commands are (OMP_NUM_THREADS=1, read by torch at import); nothing it
    imports reads the session's other variables, which its commands are given (`_preloaded`).
    Its output, and that of multiprocessing's resource tracker started with it, goes nowhere: the
    tracker counts the semaphores of the commands the tests kill (and of those ending in `os._exit`)
    as leaked when the session ends, and frees them."""
    if TEMPLATE is None:
        return
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    streams = [os.dup(1), os.dup(2)]
    nowhere = os.open(os.devnull, os.O_WRONLY)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(nowhere, 1)
        os.dup2(nowhere, 2)
        multiprocessing.forkserver.ensure_running()
    finally:
        for fd, stream in ((1, streams[0]), (2, streams[1])):
            os.dup2(stream, fd)
            os.close(stream)
        os.close(nowhere)
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _preloaded(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, status: str) -> None:
    """In the forked template: `python ARGV` (`-m MODULE ...`, `-c CODE ...` or `SCRIPT ...`) as a
    process of its own would run it, its stdout and stderr written to `out` and `err`; exits with its
    status, written to `status` first (multiprocessing reads an exit status back through the
    forkserver, and says 255 where that read fails)."""
    os.setsid()  # its own process group (killed with its children if need be) and autogroup
    lower_priority(os.getpid())
    gc.freeze()  # the template's imports live as long as the command: no collection walks them
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = os.path.dirname(os.path.realpath(os.path.join(cwd, argv[0])))
    first = {"-m": cwd, "-c": ""}.get(argv[0], script)
    sys.path[:0] = [first, *pythonpath]  # as `python -m`, `-c` or a script would have it
    sys.stdout.flush()  # what the template wrote goes where the template writes
    sys.stderr.flush()
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    from lightning.pytorch.strategies.launchers import subprocess_script

    subprocess_script.subprocess = _RankLauncher  # the DDP ranks it starts: forks of it (`_fork_rank`)
    os.environ.clear()
    os.environ.update(env)
    code = _run_as_main(argv, cwd)
    Path(status).write_text(str(code))
    os._exit(code)


def _run_as_main(argv: list[str], cwd: str) -> int:
    """`python ARGV` (`-m MODULE ...`, `-c CODE ...` or `SCRIPT ...`) run in this process, in `cwd`
    (the environment set already); its exit status."""
    os.chdir(cwd)
    option, *args = argv
    status = 0
    try:
        if option == "-m":
            sys.argv = args
            runpy.run_module(args[0], run_name="__main__", alter_sys=True)
        elif option == "-c":
            sys.argv = ["-c", *args[1:]]
            exec(compile(args[0], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = argv
            runpy.run_path(option, run_name="__main__")
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return status


class _RankLauncher:
    """What Lightning's subprocess launcher (a DDP run's) finds as its `subprocess` module in a
    preloaded command: `Popen([sys.executable, "-m", MODULE, ...], env=..., cwd=...)`, the command
    of a rank, forks the command's process instead (`_fork_rank`); anything else runs as asked."""

    @staticmethod
    def Popen(argv, env=None, cwd=None, **kwargs):  # noqa: N802 (subprocess's name)
        argv = list(argv)
        if argv[:2] != [sys.executable, "-m"] or kwargs:
            return subprocess.Popen(argv, env=env, cwd=cwd, **kwargs)
        return _fork_rank(argv[1:], cwd or os.getcwd(), dict(env if env is not None else os.environ))


def _fork_rank(argv: list[str], cwd: str, env: dict[str, str]) -> ForkedRank:
    """Another rank of a DDP run, started by the command's process as a fresh `python ARGV` would
    be, but forked from it: the toolkit imported already (a fresh interpreter spends seconds
    importing torch, Lightning and transformers). It stays in the command's process group, and
    writes where the command writes, as Lightning's `Popen` child would; it starts with the
    signal handlers and the rank a fresh process has (Lightning reads the rank from the
    environment at import)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid)
    for signum in signal.valid_signals():  # a fresh interpreter's handlers, not the command's
        try:
            if callable(signal.getsignal(signum)):
                signal.signal(
                    signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
                )
        except (OSError, ValueError):
            pass
    os.environ.clear()
    os.environ.update(env)
    from lightning.fabric.utilities.rank_zero import _get_rank
    from lightning_utilities.core.rank_zero import rank_zero_only

    rank_zero_only.rank = _get_rank() or 0
    os._exit(_run_as_main(argv, cwd))


class ForkedRank:
    """A forked rank (`_fork_rank`) as Lightning's launcher uses a `subprocess.Popen`: `pid`,
    `poll()`, `returncode`, `send_signal()` (and `wait`, `kill`, `terminate`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already, its status unknown
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Background:
    """The background thread, the jobs by `start` function, and the live processes (killed, with
    their children, when the session ends before they do)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tests-background")
        self._slots = threading.Semaphore(1)  # one job runs; `result` frees the others' slots
        self._jobs: dict[Callable, tuple[Path, Future]] = {}
        self._live: set[Process] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._env = dict(os.environ)  # before any test changes it
        self.seconds: list[tuple[float, str]] = []  # each command's wall time, for the summary
        self.misread: list[str] = []  # commands whose exit status the forkserver did not pass on
        self.started = time.perf_counter()
        self.ended: float | None = None  # when the last command ended
        self.waited_from: float | None = None  # when the first marked test asked for its commands

    def __contains__(self, start: Callable) -> bool:
        return start in self._jobs

    def submit(self, start: Callable, root: Path, commands: list[Command]) -> None:
        if TEMPLATE and any(command.preloaded for command in commands):
            start_template()  # started at the session's configuration (tests/conftest.py) unless it died
        self._jobs[start] = (root, self._executor.submit(self._run_all, commands))

    def fail(self, start: Callable, root: Path, exc: BaseException) -> None:
        """`start` itself failed: its test fails with this error, the others go on."""
        future: Future = Future()
        future.set_exception(exc)
        self._jobs[start] = (root, future)

    def result(self, start: Callable, timeout: float = 900) -> tuple[Path, list[subprocess.CompletedProcess]]:
        """The finished commands of `start`'s job, waiting for them (a hung command fails its test)."""
        root, future = self._jobs[start]
        if self.waited_from is None:  # the in-process tests have ended: their core is free
            self.waited_from = time.perf_counter()
            for _ in range(WORKERS - 1):
                self._slots.release()
        return root, future.result(timeout=timeout)

    def _run_all(self, commands: list[Command]) -> list[subprocess.CompletedProcess]:
        with self._slots:
            return [self._run(command) for command in commands]

    def _run(self, command: Command) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        env = {**(command.env if command.env is not None else self._env), **ONE_THREAD}
        run = self._run_preloaded if command.preloaded and TEMPLATE else self._run_fresh
        done = subprocess.CompletedProcess(command.argv, *run(command, env))
        done.after = command.after() if command.after is not None else None
        self.ended = time.perf_counter()
        self.seconds.append((self.ended - start, label(command.argv)))
        return done

    @contextmanager
    def _live_process(self, start: Callable[[], Process]) -> Iterator[Process]:
        """The process `start()` starts, among the live ones (killed by `close`) while it runs."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the test session ended before this command ran")
            process = start()
            self._live.add(process)
        try:
            yield process
        finally:
            with self._lock:
                self._live.discard(process)

    def _run_fresh(self, command: Command, env: dict[str, str]) -> tuple[int, str, str]:
        def start() -> subprocess.Popen:
            return subprocess.Popen(
                command.argv,
                cwd=command.cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: killed with its children if need be
            )

        with self._live_process(start) as process:
            lower_priority(process.pid)
            out, err = process.communicate()
        return process.returncode, out, err

    def _run_preloaded(self, command: Command, env: dict[str, str]) -> tuple[int, str, str]:
        with tempfile.TemporaryDirectory(prefix="gpt_ft-background-") as tmp:
            out, err, status = Path(tmp, "stdout"), Path(tmp, "stderr"), Path(tmp, "status")
            args = (command.argv[1:], str(command.cwd), env, str(out), str(err), str(status))

            def start() -> multiprocessing.process.BaseProcess:
                process = TEMPLATE.Process(target=_preloaded, args=args, daemon=False)
                process.start()
                return process

            with self._live_process(start) as process:
                process.join()
            code = process.exitcode
            if status.exists():  # the command's own status (it is killed before it writes one)
                said = int(status.read_text()) % 256  # as os._exit passes it on
                if code != said:
                    self.misread.append(f"{label(command.argv)}: exit status {said}, read back as {code}")
                code = said
            elif code == 255:  # exit(-1) from native code, or the forkserver lost (its read's 255)
                self.misread.append(f"{label(command.argv)}: exit status 255 with no status written")
            return code, out.read_text(), err.read_text()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for process in self._live:
                try:  # its group, once it leads one (a preloaded command makes its own at once)
                    if os.getpgid(process.pid) == process.pid:
                        os.killpg(process.pid, signal.SIGKILL)
                    else:
                        os.kill(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._executor.shutdown(wait=True, cancel_futures=True)
