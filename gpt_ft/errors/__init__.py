"""Errors as users read them: one sentence naming the file, field or value at fault."""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gpt_ft.errors.parsing import absent, parse_error_message


class TaskDataError(ValueError):
    """Bad task data: one sentence naming the file, field or value at fault."""


class CardError(TaskDataError):
    """A task card that cannot work, in one sentence naming the field at fault (the command line
    puts the card's file in front)."""


@contextmanager
def about(name, i: int, task: str) -> Iterator[None]:
    """A missing field or bad value of record or example `i` in one sentence that names it first:
    `name(i)` ("FILE, line 3", "example 0"), asked only then; `name` None: left to the caller."""
    try:
        yield
    except (KeyError, TaskDataError) as exc:
        if name is None:
            raise
        missing = isinstance(exc, KeyError)
        raise TaskDataError(
            f"{name(i)} has no field {exc.args[0]!r} (task {task!r})." if missing else f"{name(i)}: {exc}"
        ) from None


class OptionError(argparse.ArgumentError, ValueError):
    """A value an option gave that is refused, in one sentence naming the option: the command line
    reports it as its own error, Python callers catch a ValueError."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class FileProblem(ValueError):
    """A file named on the command line that cannot be used (a config, a card, a checkpoint), in one
    sentence naming it: every process of a distributed run reads it and meets the fault alike."""


def os_error_message(exc: OSError) -> str:
    """An OSError that names its file as one sentence: the file, then what went wrong."""
    reason = exc.strerror or (exc.args[-1] if exc.args else "cannot be used")
    return f"{exc.filename}: {str(reason).rstrip('.')}."


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turns an OSError while writing `path` (no space left, permission denied, read-only file
    system) into one that names `path` and says what became of the file there. The writers write a
    temporary file and rename it into place, so a failed write leaves the previous file as it was."""
    try:
        yield
    except WriteError:
        raise
    except OSError as exc:
        raise WriteError(path, exc) from exc
    except Exception as exc:  # safetensors' and tokenizers' own errors around an I/O error ("os error 28")
        code = re.search(r"\(os error (\d+)\)", str(exc))
        if code is None:
            raise
        raise WriteError(path, OSError(int(code[1]), os.strerror(int(code[1])))) from exc


class WriteError(OSError):
    """A file that could not be written, named, with the previous one kept."""

    def __init__(self, path: str | os.PathLike, cause: OSError) -> None:
        there = Path(path)
        kept = "nothing was written there"
        if there.exists():
            kept = f"the previous {'file' if there.is_file() else 'folder'} is kept"
        why = cause.strerror or str(cause)
        super().__init__(cause.errno, f"could not be written ({why}); {kept}", str(path))


def check_output_dir(path: str | os.PathLike, option: str) -> Path:
    """An output folder, checked before any work starts: not a file, under a folder that can be written."""
    out = Path(path).expanduser()
    if (real := real_path(out)).exists() and not real.is_dir():
        raise ValueError(f"{option} {out} is a file, not a folder: give a folder's name (the file is kept).")
    _check_parent(real, option, out)
    return real if ".." in out.parts else out  # (what the caller checks next is then where it leads)


def check_output_file(
    path: str | os.PathLike, option: str, *, overwrite: bool | None = None, reads: Path | None = None
) -> Path:
    """An output file, checked before any work starts: not a folder, not the file the command
    `reads`, not an existing file unless `overwrite` (None: the command has no `--overwrite`), and
    under a folder (not a file) that can be written."""
    out = Path(path).expanduser()
    real = real_path(out)
    if real.is_dir() or os.path.basename(os.fspath(path)) in ("", ".", ".."):  # (a folder meant: "out/")
        what = "is a folder" if real.is_dir() else "names a folder, not a file"
        raise ValueError(f"{option} {path} {what}: give a file's name.")
    if reads is not None and real.exists() and real == reads.resolve():
        raise ValueError(f"{option} {out} is the input file: give another name, the input is kept.")
    if real.exists() and not overwrite:
        remedy = "" if overwrite is None else ", or --overwrite true to replace it"
        raise ValueError(f"{option} {out} already exists: give another name{remedy} (it is kept).")
    _check_parent(real, option, out)
    return real if ".." in out.parts else out


def real_path(path: Path) -> Path:
    """Where `path` leads once written: `a/../b` is `b` even while `a` does not exist (the writer
    makes `a`, then reaches `b`), a link is followed."""
    return Path(os.path.realpath(path))


def _check_parent(out: Path, option: str, given: Path | None = None) -> None:
    """The nearest existing folder above `out` (`given` in messages) is a folder that can be written."""
    above, given = out.parent, given or out
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise ValueError(f"{option} {given}: {above} is a file, not a folder.")
    # (root passes W_OK anywhere; a folder may be a writable mount under a read-only one)
    written = out if out.is_dir() else above
    read_only = hasattr(os, "statvfs") and bool(os.statvfs(written).f_flag & os.ST_RDONLY)
    if read_only or not out.exists() and not os.access(above, os.W_OK | os.X_OK):
        why = "a read-only file system" if read_only else "permission denied"
        raise ValueError(f"{option} {given}: the folder {written} cannot be written ({why}).")


def check_not_null(values: dict, cls, option: str) -> None:
    """A null in a YAML file reaches `cls` (a class, or a command's function: `option` "") only
    where its signature admits None.

    jsonargparse takes `null` from a config file for an argument of any type (on the command line
    it refuses one), and the class would then fail on it with a TypeError: say which option instead.
    """
    import inspect
    import types
    import typing

    def admits_none(hint) -> bool:
        if hint is typing.Any or hint is type(None) or hint is None:
            return True
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return any(admits_none(arg) for arg in typing.get_args(hint))
        return False

    hints, parameters = {}, {}
    mro = reversed(cls.__mro__) if isinstance(cls, type) else ()  # (a command's function: its own)
    for owner in [o.__init__ for o in mro if "__init__" in vars(o) and o is not object] or [cls]:
        try:  # a subclass passes its card's fields up as **kwargs
            hints.update(typing.get_type_hints(owner))
            parameters.update(inspect.signature(owner).parameters)
        except (NameError, TypeError, ValueError):  # a signature that cannot be read: not checked
            continue
    for name, value in values.items():
        if value is not None or name not in hints or name not in parameters:
            continue
        if parameters[name].default is None or admits_none(hints[name]):
            continue
        kind = getattr(hints[name], "__name__", None) or str(hints[name]).replace("typing.", "")
        raise ValueError(f"{f'{option}.' if option else '--'}{name}: expected {kind}, got null.")


def check_context(data, n_positions: int) -> None:
    """Sequences longer than the model's context, said before anything runs (not at the first one)."""
    for field in ("max_length", "block_size"):  # TaskDataModule, LMDataModule
        length = getattr(data, field, None)
        if length is not None and length > n_positions:
            raise ValueError(
                f"--data.{field} {length} is longer than the model's context of {n_positions} tokens "
                f"(n_positions); use at most {n_positions}."
            )


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or during, innermost last (not those it hides:
    `raise ... from None`, which has said what they meant)."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


@contextmanager
def arguments_from(where: str) -> Iterator[None]:
    """Arguments the command-line parser refuses inside, in one sentence that begins with `where`
    they came from (a suite file's task): the parser's own names no file."""
    try:
        yield
    except argparse.ArgumentError as exc:
        problem = next((e for e in causes(exc) if isinstance(e, FileProblem)), None)
        raise ValueError(f"{where}: {problem or parse_error_message(str(exc))}") from None


def input_file(path: str | os.PathLike, option: str, give: str = "a file") -> Path:
    """`path`, a file to read: one sentence naming `option` where it is missing or a folder."""
    source = Path(path).expanduser()
    if source.is_dir():
        raise ValueError(f"{option} {source} is a folder; give {give}.")
    if source.exists() and not source.is_file():  # (`--input <(...)`: /dev/fd/63, which exists)
        raise ValueError(f"{option} {source} is not a regular file (a pipe, a device): give {give}.")
    if not source.is_file():
        raise FileNotFoundError(f"{option} {source} {absent(source)}.")
    return source


def no_such_user(args: list[str]) -> str:
    """The sentence for a path `~NAME/...` of no user here, its option named where `args` give it."""
    for before, arg in zip(["", *args], args):
        option, equals, value = arg.partition("=") if arg.startswith("--") else (before, "", arg)
        name = value[1:].split("/")[0] if value.startswith("~") and (equals or arg is value) else ""
        if name and os.path.expanduser(f"~{name}") == f"~{name}":  # (unexpanded: no such user)
            said = f"{option} {value}" if option.startswith("-") else value
            return f"{said}: this machine has no user {name!r} (~{name}: their home); write the path in full."
    return "a path starts with ~NAME, and this machine has no such user: write the path in full."


def at_least_one(value: int, option: str) -> int:
    """`value` (a count: batch size, beams), refused in one sentence below 1 or not a whole number."""
    whole = None  # numpy's ints and int tensors are whole; "4", 2.0, True, a float tensor are not
    with suppress(AttributeError, TypeError, ValueError, RuntimeError):
        whole = None if "bool" in str(getattr(value, "dtype", type(value))) else type(value).__index__(value)
    if whole is None or whole < 1:
        kind, shown = ("", whole) if whole is not None else ("a whole number ", repr(value))
        raise ValueError(f"{option} must be {kind}>= 1, got {shown}.")
    return whole


def check_counts(*counts: tuple[str, int | None, int]) -> None:
    """Each (name, value, least) of a data module's counts (batch sizes, workers) refused in one
    sentence where it is no integer or below `least` (None: unset, taken)."""
    for name, value, least in counts:
        if value is not None and (isinstance(value, bool) or not hasattr(value, "__index__")):
            raise ValueError(f"{name} must be an integer, got {value!r}.")  # (from Python; numpy's too)
        if value is not None and value < least:
            room = " (room for the special tokens)" if name == "max_length" else ""
            raise ValueError(f"{name} must be >= {least}{room}, got {value}.")


def raised_by_lightning(exc: BaseException, package: str, name: str) -> bool:
    """Whether `exc` is Lightning's exception class `name` (of lightning.fabric or .pytorch); only a
    command that imported Lightning can raise one, so the others never import it to ask."""
    cls = getattr(sys.modules.get(f"lightning.{package}.utilities.exceptions"), name, None)
    return isinstance(cls, type) and isinstance(exc, cls)


def logger_refused(exc: BaseException) -> str | None:
    """A logger's service refusing the run at its start in one sentence (W&B logging live without an
    API key: wandb's UsageError, a traceback); None for any other exception."""
    if type(exc).__module__.startswith("wandb") and "API key" in str(exc):
        return ("W&B has no API key to log this run live: run `wandb login` (or set WANDB_API_KEY), or "
                "log offline (--trainer.logger.init_args.offline true; configs/trainer/wandb.yaml) and "
                "`wandb sync` the run later.")  # fmt: skip
    return None


WRITE_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def unnamed_write(exc: OSError) -> str | None:
    """A write that failed naming no file (a run's config.yaml and metrics.csv, written by
    jsonargparse and through fsspec, say only "No space left on device") in one sentence; None for
    another error."""
    if exc.filename is not None or exc.errno not in WRITE_FAULTS:
        return None
    return (
        f"a file could not be written ({exc.strerror or os.strerror(exc.errno)}): the run's config.yaml, "
        "metrics.csv or logs, under --trainer.default_root_dir (runs/ unless given)."
    )


TRAINING = (
    "--data.batch_size (raise --trainer.accumulate_grad_batches as much to keep a step's examples) or "
    "the sequences' length (--data.max_length; a corpus's --data.block_size), or a smaller model"
)
MEMORY_OPTIONS = {
    "fit": TRAINING,
    "suite": f"the runs' {TRAINING}",
    **dict.fromkeys(("validate", "test", "predict"), "--data.eval_batch_size"),
    **dict.fromkeys(("label", "embed", "generate"), "--batch_size"),
}


def out_of_memory(exc: BaseException, command: str) -> str | None:
    """Memory run out (torch's OutOfMemoryError on a GPU, its allocator's error on a CPU) in one
    sentence saying what needs less for `command`; None for another error."""
    text = str(exc)
    if type(exc).__name__ != "OutOfMemoryError" and "DefaultCPUAllocator" not in text:
        return None
    on_cpu = re.search(r"you tried to allocate (\d+) bytes", text)
    asked = f"{int(on_cpu[1]) / 2**30:.2f} GiB" if on_cpu else None
    asked = asked or next(iter(re.findall(r"Tried to allocate ([\d.]+ \w+)", text)), None)
    size = f" (it asked for {asked} more)" if asked else ""
    lower = f": lower {MEMORY_OPTIONS[command]}" if command in MEMORY_OPTIONS else ""  # (export: no option)
    return f"out of {'GPU ' * ('CUDA' in text)}memory{size}{lower}."
