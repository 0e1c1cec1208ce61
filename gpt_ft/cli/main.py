"""`gpt-ft`: one entry point for every command; bad input ends in one sentence and exit code 2.

`COMMANDS` is the command table: each name's help line and what runs it with the name and the
arguments after it. `fit`, `validate`, `test`, `predict` are LightningCLI's
(gpt_ft/training/runs.py); each other is a typed function or class where its work is, whose
parser jsonargparse builds from its signature and docstring (`commands.run`).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from contextlib import nullcontext
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

import gpt_ft.data.folders as folders
import gpt_ft.errors as errors
from gpt_ft.cli.commands import lazy, lightning
from gpt_ft.data.folders import PIPED, Terminated, first_process, piped_configs_read, process_rank
from gpt_ft.errors.parsing import nearest_option, parse_error_message, repeated_in_options, untyped_parameter
from gpt_ft.training.memory import keep_freed_memory
from gpt_ft.workarounds.cli import OPTIONS, file_not_decoded, nested_help_named_whole
from gpt_ft.workarounds.kernels import torchao_import_loggers
from gpt_ft.workarounds.trainer import process_kept


class Command(NamedTuple):
    help: str
    run: Callable[[str, list[str]], None]


# fmt: off
COMMANDS = {
    "fit": Command("train (fine-tune or pretrain) a model", lightning),
    "validate": Command("evaluate on the validation splits", lightning),
    "test": Command("evaluate on the test splits", lightning),
    "predict": Command("write predictions for the test splits (GLUE submission files)", lightning),
    "explain": Command("print one example of a task split as the model sees it",
                       lazy("gpt_ft.cli.explain:run_explain", typed=False)),
    "prepare": Command("tokenize a text corpus into token files for pretraining",
                       lazy("gpt_ft.data.prepare:prepare")),
    "tokenizer": Command("train a byte-level BPE tokenizer on text files",
                         lazy("gpt_ft.data.tokenizer:train_tokenizer")),
    "generate": Command("continue a prompt, or each of a file, with a trained model",
                        lazy("gpt_ft.eval.generation:generate")),
    "label": Command("write a file's examples again with a fine-tuned model's predictions beside them",
                     lazy("gpt_ft.eval.labelling:label")),
    "embed": Command("write a file's texts as vectors with a fine-tuned embedding model",
                     lazy("gpt_ft.eval.encoder:embed")),
    "suite": Command("fine-tune and evaluate many tasks over seeds: results table, chart, GLUE submission",
                     lazy("gpt_ft.eval.suite:SuiteRunner")),
    "calibrate": Command("fit a classifier's temperature on a validation split (its probabilities)",
                         lazy("gpt_ft.eval.calibration:calibrate")),
    "export": Command("write a fine-tuned model as a transformers, sentence-transformers or ONNX folder; an "
                      "LM as GGUF", lazy("gpt_ft.eval.export:export_checkpoint")),
}
# fmt: on
DEBUG = "GPT_FT_DEBUG"  # set (not 0): errors show their traceback instead of one sentence
USER_ERRORS = (ValueError, FileNotFoundError, KeyError, FloatingPointError)
ALIKE = (errors.TaskDataError, errors.FileProblem, FloatingPointError)  # the same files read; a nan stops all
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")  # gloo's words


def user_message(exc: BaseException) -> str:
    """The sentence for the user: the innermost cause (jsonargparse wraps errors raised in __init__),
    down to a sentence of ours about task data (whose causes are the readers' own words)."""
    outer = str(exc).strip()  # (a union's report: its class's own words, where one was built)
    while isinstance(exc.__cause__, USER_ERRORS) and not isinstance(exc, errors.TaskDataError):
        exc = exc.__cause__
    if isinstance(exc, OSError) and exc.filename is not None:  # the system's error: its file, its reason
        return errors.os_error_message(exc)
    said = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).strip()
    built = said.startswith(("Does not validate", "Not a valid subclass of")) and outer.startswith("Does not")
    return parse_error_message(outer) if built else said


def lone_value(message: str, args: list[str]) -> str:
    """argparse's "expected one argument" for an option followed by no value, or by one that starts
    with "-" (taken for the next option: `--fit_args --trainer.max_epochs=2`), saying how to give it;
    its "unrecognized arguments" for an option given several values (`--inputs a.txt b.txt`)."""
    stray = re.match(r"unrecognized arguments: (\S+?)\.?(?: |$)", message)
    at = args.index(stray[1]) if stray and stray[1] in args else 0
    if (
        at >= 2
        and args[at - 2][:2] == "--"
        and "=" not in args[at - 2]
        and "-" not in (args[at - 1][:1], stray[1][:1])
    ):
        several = "where it takes several, write them as one list, '[a, b]'"
        return f"{message.rstrip('.')} ({args[at - 2]} takes one value: {several})."
    option = re.fullmatch(r"argument (--[\w.]+)\S*: expected one argument\.?", message)
    if option is None:
        return message
    o, value = option[1], "true or false for a yes/no option"
    return f"{o} is given no value: write {o} VALUE ({value}; {o}=VALUE for a value starting with '-')."


def in_config_file(message: str, args: list[str]) -> str:
    """`message` about an option (jsonargparse names it as if typed) naming the `--config` file that
    gave the value it quotes, the last source read; a file path a config gives that cannot be read
    is said to be relative to the config's folder."""
    unknown = re.search(  # (--print_config's: "Group 'model' does not accept option 'lrr'")
        r"^(?:--([\w.]+): )?Option '([\w.]+)' is not accepted|^Group '(\w+)' does not accept option '(\w+)'|"
        r"does not accept option '([\w.]+)'",
        message,
    )
    quotes = re.match(
        r"--([\w.]+)(?::| must) .*, got (.*?)(?: \(\S+ is not an? [^()]+\))?(?:: a list .*)?\.$", message
    )
    quotes = quotes or re.match(r"--([\w.]+): class_path '([^']+)'", message)  # (a class path's, as given)
    unread = re.match(
        r"--([\w.]+): (.+?) (?:is not a file that|does not exist|is a (?:loop of )?sym).*\.$", message
    )
    named = re.search(r" \(--([\w.]+)\)\.$", message)  # a fault in a value, its option said last
    if unknown:
        group, option = unknown[1] or unknown[3], unknown[2] or unknown[4] or unknown[5]
        key = f"{group}.{option}" if group else option
    elif quotes or unread or named:
        key, quoted = (groups := (quotes or unread or named).groups())[0], groups[-1]
    else:
        return message
    for arg, following in reversed(list(zip(args, [*args[1:], ""]))):  # the last source is the one read
        option, equals, value = arg.partition("=")
        value = value if equals else following
        if option in ("-c", "--config") and (found := option_in(value, key.split("."))):
            if (
                unknown
                or named
                or (quotes and quoted in (repr(found[0]), str(found[0]), f"'{found[0]}'", f'"{found[0]}"'))
                or (quotes and isinstance(found[0], dict) and found[0].get("class_path") == quoted)
            ):  # (a list: '[1]')
                said = message.removeprefix("--").replace(f"(--{key})", f"({key})")
                return f"{PIPED.get(value, value)}: {said}"
            if unread and found[0] == quoted and not Path(quoted).is_absolute():
                pipe, folder = "a pipe's paths are relative to where gpt-ft runs", Path(value).parent
                relative = pipe if value in PIPED else f"it is relative to the config's folder, {folder}"
                said = message.removeprefix("--").removesuffix(".")
                return f"{PIPED.get(value, value)}: {said}: {relative}."
        elif option == f"--{key}" and (
            unknown or named or (unread and quoted == value) or quoted in (repr(value), value)
        ):
            return message  # typed so
        elif option == f"--{key}" and quotes and quoted == f"'{yaml_value(value)}'":  # YAML's reading
            return message.replace(f"got {quoted}", f"got {value!r}")  # ('-', not '[None]')
    return message


def yaml_value(text: str) -> object:
    """`text` as YAML reads it (a typed `-`: [None]; `no`: False), else the text."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def option_in(file: str, keys: list[str]) -> object:
    """The value the YAML file `file` gives the option `keys` (a class's options may sit under
    init_args), as a one-element list; None where it gives none."""
    try:  # (a piped config: its text; text YAML cannot read gives no option)
        node = yaml_value(file if file in PIPED else Path(file).expanduser().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    for key in keys:
        for n in node if isinstance(node, list) else []:  # classes (--trainer.callbacks): one giving it
            node = n if isinstance(n, dict) and key in {**n, **(n.get("init_args") or {})} else node
        if isinstance(node, dict) and key not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return [node]


def undecodable_file(exc: BaseException) -> str | None:
    """The sentence naming the config file or task card that is not UTF-8, where reading one raised
    `exc` (the reader's UnicodeDecodeError names no file)."""
    path = file_not_decoded(exc)
    if path is None:
        return None
    from gpt_ft.data.file_faults import check_text_file

    weights = Path(path).suffix.lower() in (".ckpt", ".gguf", ".safetensors", ".pt", ".pth")
    try:  # (`--model run.ckpt`: read as a file of the section's options)
        remedy = "weights go to --model.init_from, a checkpoint to resume to --ckpt_path" if weights else ""
        check_text_file(Path(path), remedy=remedy or "save it as UTF-8")
    except ValueError as problem:
        return str(problem)
    return None


def not_installed(exc: BaseException) -> str | None:
    """The sentence for a package the run's settings need that is not installed (tpu: torch_xla)."""
    missing = next((e for e in errors.causes(exc) if isinstance(e, ModuleNotFoundError)), None)
    if missing is None:
        return None
    return f"a package this run needs is not installed: {str(missing).splitlines()[0].rstrip('.!')}."


def fail(message: str) -> None:
    print(f"gpt-ft: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def usage() -> None:
    print("usage: gpt-ft {" + ",".join(COMMANDS) + "} ...\n")
    for name, command in COMMANDS.items():
        print(f"  {name:<10} {command.help}")
    print(f"\n`gpt-ft COMMAND --help` lists a command's arguments; {DEBUG}=1 shows an error's traceback.")


def show_notes() -> None:
    """gpt_ft's own notes (INFO: a one-time compile's wait, ...) on stderr, as Lightning shows its."""
    log = logging.getLogger("gpt_ft")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> None:
    typed, argv = argv is None, sys.argv[1:] if argv is None else list(argv)
    debug = os.environ.get(DEBUG, "") not in ("", "0")
    if not argv or argv[0] in ("-h", "--help"):
        usage()
        raise SystemExit(0 if argv else 2)  # no command: a usage error
    if argv[0] == "--version":
        return print(f"gpt-ft {version('gpt_ft')}")
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        close = "".join(f" (did you mean {c}?)" for c in difflib.get_close_matches(name, COMMANDS, n=1))
        fail(f"unknown command {name!r}{close}; choose from {', '.join(COMMANDS)}.")
    if typed:  # the program's process (a Python caller's is its own: gpt_ft.training.memory)
        keep_freed_memory()
    with nullcontext() if typed else process_kept():  # (the program's ends with it: torchao's exit quiet)
        show_notes()
        # transformers imports torchao where it is installed (the quantize extra), which then logs
        # about parts no command uses: CUDA kernels a CPU-only torch cannot load, pytree's enums.
        for logger in torchao_import_loggers():
            logger.setLevel(logging.ERROR)
        run_command(name, args, typed=typed, debug=debug)


def run_command(name: str, args: list[str], *, typed: bool, debug: bool) -> None:
    """`gpt-ft NAME ARGS`: its errors said in one sentence each (exit 2), or raised with `debug`."""
    try:
        args = piped_configs_read(args)
        if name != "generate" and (said := repeated_in_options(args)):  # (its prompts: text as typed)
            fail(said)
        if typed:  # a DDP run's other processes start from sys.argv: they take the pipes' text read here
            sys.argv[2:] = args
        with (
            folders.sigterm_stops(),
            nested_help_named_whole(args),
        ):  # (Lightning's own stops at a step's end)
            COMMANDS[name].run(name, args)
        folders.release_process_group()
    except argparse.ArgumentError as exc:  # (first: an option's refused value is a ValueError too)
        if debug:
            raise
        problem = next((e for e in errors.causes(exc) if isinstance(e, errors.FileProblem)), None)
        said = in_config_file(lone_value(parse_error_message(str(exc), untyped_parameter(exc)), args), args)
        said = nearest_option(said, OPTIONS.get(name, []))
        fail(undecodable_file(exc) or (str(problem) if problem else said))
    except USER_ERRORS as exc:
        if debug:
            raise
        if not first_process(of_its_group=True) and any(isinstance(e, ALIKE) for e in errors.causes(exc)):
            raise SystemExit(2) from None  # the same files read, every process stopped by a non-finite loss
        said = user_message(exc)  # an option said first: the file that gave its value named (last: advice)
        said = in_config_file(said, args) if said[:2] == "--" else said
        fail(undecodable_file(exc) or not_installed(exc) or said)
    except BrokenPipeError:  # `gpt-ft generate ... | head`: the reader has what it wanted; as a shell's tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no flush at exit to fail)
        raise SystemExit(128 + signal.SIGPIPE) from None
    except OSError as exc:  # a file that cannot be read or written (no space, permission, read-only)
        if debug or exc.filename is None and (said := errors.unnamed_write(exc)) is None:
            raise
        fail(errors.os_error_message(exc) if exc.filename is not None else said)
    except RuntimeError as exc:  # a collective that lost its peer: another process of a DDP run died
        if not debug and "Could not determine home directory" in str(exc):  # pathlib's, for '~name/x'
            fail(errors.no_such_user(args))
        if not debug and (said := errors.out_of_memory(exc, name)):
            fail(said)
        if debug or not any(m in str(exc) for m in LOST_PEER):
            raise
        reason = next(m for m in LOST_PEER if m in str(exc))
        trains = name in ("fit", "suite")
        resume = ", and `--ckpt_path last` resumes from the last checkpoint" if trains else ""
        fail(
            f"rank {process_rank()} lost another process of this distributed run ({reason}: it stopped or "
            f"was killed); every process stops now{resume}."
        )
    except ModuleNotFoundError as exc:  # a package the settings need (--trainer.accelerator tpu: torch_xla)
        if debug:
            raise
        fail(not_installed(exc))
    except Exception as exc:
        if not debug and (said := errors.logger_refused(exc)):
            fail(said)
        if debug or not errors.raised_by_lightning(exc, "fabric", "MisconfigurationException"):  # a bad value
            raise
        fail(user_message(exc).rstrip(".!") + ".")
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM in a command that is no Lightning run (`label`, ...)
        if debug:
            raise
        stopped_by(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except SystemExit as exc:
        if errors.raised_by_lightning(exc, "pytorch", "SIGTERMException"):  # at the step after the signal
            # SaveLast sets the code to 128 + the signal's number: SIGTERM, or SIGINT for Ctrl-C.
            code = exc.code if isinstance(exc.code, int) and exc.code > 128 else 128 + signal.SIGTERM
            stopped_by(signal.Signals(code - 128))
        if isinstance(exc.__context__, KeyboardInterrupt) and not debug:  # Lightning's exit(1) after one
            stopped_by(signal.SIGTERM if isinstance(exc.__context__, Terminated) else signal.SIGINT)
        raise


def stopped_by(signum: signal.Signals) -> None:
    """One line and the shell's exit code for a process ended by a signal (128 + its number)."""
    name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signum.name
    if first_process():  # a DDP run says it once
        print(f"gpt-ft: stopped by {name}", file=sys.stderr)
    raise SystemExit(128 + signum) from None
