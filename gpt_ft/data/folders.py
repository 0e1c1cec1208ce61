"""Output folders written safely: one writer at a time, a stop by SIGTERM cleaned up like any
other, tokenizer folders replaced whole, and new folders written whole (`written_whole`); piped
`--config`s read once, before any command reads them (`piped_configs_read`); and why a tokenizer
folder does not load (`check_tokenizer_files`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gpt_ft.errors import FileProblem, writing
from gpt_ft.errors.parsing import repeated_key, yaml_problem

# What a tokenizer's `save_pretrained` may write (transformers 4 and 5, fast and slow tokenizers).
TOKENIZER_SAVES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "additional_chat_templates", "vocab.json", "merges.txt",
    "vocab.txt", "tokenizer.model", "spiece.model",
)  # fmt: skip
LOCK = ".gpt_ft.lock"


def process_rank() -> str:
    """This process's rank in a distributed run ("0" outside one)."""
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))


def release_process_group() -> None:
    """Destroys the process group a distributed run joined while the interpreter is still whole: a
    gloo group left to the interpreter's exit can abort a process whose work is done ("terminate
    called without an active exception", exit -6; pytorch/pytorch#190489)."""
    dist = sys.modules.get("torch.distributed")  # a command that never imported it joined no group
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def first_process(of_its_group: bool = False) -> bool:
    """Whether this is the first process of a distributed run, or the only one: the one that says
    what every process would (an error, a stop), writes shared folders and prints. `of_its_group`:
    the first of the process group it joined, by the group's own rank (a process that joined none is
    first, whatever its environment holds: `srun`'s second task of a command run alone)."""
    if of_its_group:
        dist = sys.modules.get("torch.distributed")  # (a command that never imported it joined none)
        return (
            not (dist is not None and dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
        )
    return process_rank() == "0" and os.environ.get("NODE_RANK", "0") == "0"


@contextmanager
def datasets_bars(shown: bool) -> Iterator[None]:
    """datasets' progress bars (reading a file, encoding a split) as set where `shown`, else off
    while the block runs: their carriage returns belong on a terminal (in a log or a pipe they are
    noise), and on one process of a distributed run (another's unfinished line took the start of
    the first's error)."""
    import datasets

    hidden = not shown and not datasets.are_progress_bars_disabled()
    if hidden:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if hidden:
            datasets.enable_progress_bars()


class LogLines:
    """A tqdm bar's file in a log or a pipe: each redraw as a line of its own (a terminal's carriage
    returns there run every redraw into one line)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        if line := text.replace("\r", "").strip():
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def bar_output(every: float = 30.0) -> dict:
    """tqdm's options for a bar on stderr: as it is on a terminal; elsewhere a line every `every`
    seconds (how far, the rate, the time left)."""
    import sys

    return {} if sys.stderr.isatty() else {"file": LogLines(sys.stderr), "mininterval": every}


def piped_configs_read(args: list[str]) -> list[str]:
    """`args` with each `--config` that is a pipe (`--config <(envsubst < run.yaml)`) given as the
    text it holds, read here once: a pipe holds it for one read, where a command may read its
    configs twice (validate, test, predict) and a DDP run's other processes again; its paths are
    the working folder's, as a pipe has no folder (a pipe that gives no text is kept, and named).
    A folder or file option given `=~` is the home folder: no shell expands it there, and YAML would
    read it as null."""
    import yaml

    out = list(args)
    for i, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        name = option.rpartition(".")[2].removeprefix("--")  # (`data_dir`, `input`: a path's options)
        if value == "~" and equals and option[:2] == "--" and name.rpartition("_")[2] in PATHS:
            out[i] = f"{option}={Path.home()}"
        at, value = (i, value) if equals else (i + 1, args[i + 1] if i + 1 < len(args) else "")
        piped = option in ("-c", "--config") and value and is_pipe(value)
        if piped and (text := Path(value).read_text(encoding="utf-8")):
            try:  # checked as a config file is (its text, once given, names no file)
                yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise FileProblem(f"--config {value} is not valid YAML: {yaml_problem(exc)}.") from None
            if twice := repeated_key(text):
                raise FileProblem(f"--config {value}, {twice}.")
            out[at], PIPED[text] = f"{option}={text}" if equals else text, value
    return out


PATHS = ("dir", "path", "dirpath", "from", "tokenizer", "input", "output", "out")  # options (ends): `=~`
PIPED: dict[str, str] = {}  # the text of each piped config read, and the pipe's name (for messages)


def is_pipe(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, innermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


@contextmanager
def one_writer(folder: Path, command: str) -> Iterator[None]:
    """`held` for `command`; inside, SIGTERM stops it as Ctrl-C does, through the writer's own
    clean-up (`sigterm_stops`)."""
    with held(folder, command), sigterm_stops():
        yield


@contextmanager
def held(folder: Path | None, command: str) -> Iterator[None]:
    """Holds `folder` (made if need be) for this process: another process asking for it meanwhile
    is refused in one sentence naming `command`; the lock goes with the process, however it ends,
    and the folders made here (its parents too) go with it where they hold no file (a run refused
    before it wrote). None: nothing held (a process that does not write)."""
    if folder is None:
        yield
        return
    made = missing_folders(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one writer is the user's to keep
        fcntl = None
    lock = open(folder / LOCK, "a", encoding="utf-8") if fcntl else None
    if lock is not None:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()  # the file is the other writer's: left as it is
            raise ValueError(
                f"Another {command} is writing to {folder}; wait for it to end, or choose another folder."
            ) from None
        except OSError as exc:  # a file system without locks (some network ones): written unguarded
            lock.close()
            (folder / LOCK).unlink(missing_ok=True)
            lock = None
            warnings.warn(f"{folder} cannot be locked ({exc.strerror or exc}): keep other writers away.")
    try:
        yield
    finally:
        if lock is not None:
            (folder / LOCK).unlink(missing_ok=True)
            lock.close()
        if made and not any(p.is_file() or p.is_symlink() for p in folder.rglob("*")):
            for empty in [*(Path(sub) for sub, _, _ in os.walk(folder, topdown=False)), *made[1:]]:
                with suppress(OSError):  # only an empty folder goes (another process's files: kept)
                    empty.rmdir()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where it arrives as Ctrl-C's KeyboardInterrupt is (`sigterm_stops`)."""


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """Inside, SIGTERM (`kill`, a job scheduler's stop) raises `Terminated` as Ctrl-C raises
    KeyboardInterrupt, so every writer's clean-up runs (its temporary files go), where SIGTERM's
    default would end the process on the spot. (Ignored, as `nohup`-like starts may leave it, it
    stays so.) A handler set later inside takes SIGTERM over: Lightning's, as a run starts, which
    calls this one too and stops the run at a step's end."""
    ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    if threading.current_thread() is not threading.main_thread() or ignored:
        yield  # signal handlers belong to the main thread
        return

    def stop(*_) -> None:
        if signal.getsignal(signal.SIGTERM) is stop:
            raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:  # None: a handler set outside Python, which Python cannot put back; the default then
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextmanager
def stops_at_once() -> Iterator[None]:
    """Inside, Ctrl-C and SIGTERM end the process on the spot, as any program's: for native work
    (the tokenizers' trainer) that a Python handler would wait for, and that leaves nothing to
    clean up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {  # (a signal ignored, as `cmd &` ignores SIGINT, stays so)
        sig: signal.signal(sig, signal.SIG_IGN if signal.getsignal(sig) == signal.SIG_IGN else signal.SIG_DFL)
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def save_tokenizer(tokenizer, folder: str | os.PathLike) -> None:
    """`tokenizer.save_pretrained(folder)`, leaving no file of an earlier tokenizer there (its chat
    template would render the new one's chats): the tokenizer is saved beside `folder` first and
    then replaces the tokenizer files in it; other files stay."""
    staging = staged_tokenizer(tokenizer, folder)
    try:
        put_tokenizer(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def staged_tokenizer(tokenizer, folder: str | os.PathLike) -> Path:
    """`tokenizer` saved into a new folder beside `folder` (a full disk named as `folder`, nothing of
    it left), for `put_tokenizer` to move in: a writer that must not touch `folder` before every
    file is written stages it first (`prepare`)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        with writing(folder):  # a full disk named as this folder (made once saved), not the staging one
            tokenizer.save_pretrained(str(staging))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def put_tokenizer(staging: Path, folder: str | os.PathLike) -> None:
    """The tokenizer files `staged_tokenizer` saved in `staging` moved into `folder` (renames: no
    write that can fail for space), those of an earlier tokenizer there removed first."""
    folder = Path(folder)
    folder.mkdir(exist_ok=True)
    for name in TOKENIZER_SAVES:
        old = folder / name
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink(missing_ok=True)
    for item in staging.iterdir():
        os.replace(item, folder / item.name)


# The files of a saved tokenizer that say which id a text's pieces take (not its chat template).
ID_FILES = ("tokenizer.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model",
            "spiece.model")  # fmt: skip


def tokenizer_digests(folder: Path) -> dict[str, str]:
    """The SHA-256 of each of a saved tokenizer's `ID_FILES` there, by name: what `gpt-ft prepare`
    records of the tokenizer that wrote a folder's token ids."""
    files = (folder / name for name in ID_FILES)
    return {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in files if file.is_file()}


def save_new_tokenizer(tokenizer, out: Path, *, overwrite: bool) -> None:
    """`gpt-ft tokenizer`'s save into `out`, held (`one_writer`) and checked again there
    (`takes_tokenizer`): two runs given one new folder do not both write it."""
    created = missing_folders(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with one_writer(out, "`gpt-ft tokenizer`"):
            takes_tokenizer(out, overwrite)  # another run may have saved one there meanwhile
            save_tokenizer(tokenizer, out)
    except BaseException:
        for folder in created if not any(out.iterdir()) else []:
            folder.rmdir()  # the folders this run made, empty: a refused run leaves none
        raise


def takes_tokenizer(out: Path, overwrite: bool) -> None:
    """Refuses an --out_dir that holds files (but for another writer's lock), unless a tokenizer
    and `overwrite`."""
    from gpt_ft.weights.pretrained import is_tokenizer_dir  # (torch: imported by the commands that write)

    if (
        out.is_dir()
        and any(p.name != LOCK for p in out.iterdir())
        and not (overwrite and is_tokenizer_dir(out))
    ):
        if is_tokenizer_dir(out):
            raise ValueError(
                f"--out_dir {out} holds a tokenizer: give another folder, or --overwrite true to replace it."
            )
        raise ValueError(f"--out_dir {out} is not empty and holds no tokenizer; give an empty folder.")


@contextmanager
def written_whole(out: Path) -> Iterator[Path]:
    """A folder to write into beside `out` (its parent holds scratch files too), whose files move
    into `out` once all are written: a failed write leaves no half folder. A new `out` is the folder
    renamed (one step: another process's made meanwhile is refused); an empty one (a mount point, a
    folder of its own permissions) takes its files, unless another process filled it meanwhile."""
    real = Path(os.path.realpath(out))  # (a link's target: the rename stays on its file system)
    new, empty = not real.exists(), real.is_dir() and not any(real.iterdir())
    with writing(out):
        real.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=real.parent, prefix=f".{real.name}.") as scratch:
            (staged := Path(scratch) / "out").mkdir()
            yield staged
            umask = os.umask(0o022)
            os.umask(umask)
            for file in (f for f in staged.rglob("*") if f.is_file() and not f.is_symlink()):
                file.chmod(0o666 & ~umask)  # as any new file's (transformers saves its weights 0600)
            if new:
                staged.chmod(0o777 & ~umask)
                try:
                    return os.rename(staged, real)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise
                    raise OSError(exc.errno, "another process wrote there meanwhile") from None
            if empty and (not real.is_dir() or any(real.iterdir())):
                raise OSError(errno.ENOTEMPTY, "another process wrote there meanwhile")
            out.mkdir(exist_ok=True)
            for item in staged.iterdir():
                shutil.move(str(item), out / item.name)


def check_tokenizer_files(directory: Path, error: Exception | None = None) -> None:
    """Where a tokenizer folder cannot be loaded: the first JSON file that does not parse, named
    with its line, a folder of settings alone (tokenizer_config.json copied without the rest), or
    a tokenizer.json these libraries cannot read (`error`, theirs: written by a newer tokenizers)."""
    from gpt_ft.data.file_faults import utf8_problem  # (it imports the adapters: torch)

    for path in sorted(directory.glob("*.json")):
        data = path.read_bytes()
        if (problem := utf8_problem(data)) is not None:
            raise ValueError(f"{path}{problem}.")
        try:
            json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {exc.lineno} is not valid JSON ({exc.msg}).") from None
    vocabularies = {"tokenizer.json", "vocab.json"}  # of its JSON files; the others hold settings
    if all(p.suffix == ".json" and p.name not in vocabularies for p in directory.iterdir() if p.is_file()):
        raise ValueError(
            f"{directory} holds no vocabulary to load (tokenizer.json, vocab.json + merges.txt or a "
            "SentencePiece model), only its settings: copy the whole tokenizer folder."
        )
    if type(error).__module__.startswith("huggingface_hub") and (directory / "config.json").is_file():
        from gpt_ft.weights.hf import transformers_config  # (the model's config.json, read with it)

        transformers_config(directory)
    if (
        error is not None
        and not isinstance(error, (ValueError, OSError))
        and (directory / "tokenizer.json").is_file()
    ):
        import tokenizers
        import transformers

        raise ValueError(
            f"{directory / 'tokenizer.json'} is no tokenizer transformers {transformers.__version__} and "
            f"tokenizers {tokenizers.__version__} can read ({type(error).__name__}: {error}): a newer "
            "tokenizers' file, or a damaged one."
        )
