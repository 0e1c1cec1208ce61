"""`gpt-ft`: one entry point for every command; bad input ends in one sentence and exit code 2.

`fit`, `validate`, `test`, `predict` are LightningCLI's (gpt_ft/cli/lightning.py); the other
commands live in gpt_ft/cli/commands.py.
"""

from __future__ import annotations

import argparse
import sys

from lightning.pytorch.utilities.exceptions import SIGTERMException

import gpt_ft
from gpt_ft.errors import parse_error_message

LIGHTNING_COMMANDS = {
    "fit": "train (fine-tune or pretrain) a model",
    "validate": "evaluate on the validation splits",
    "test": "evaluate on the test splits",
    "predict": "write predictions for the test splits (GLUE submission files)",
}
COMMANDS = {
    **LIGHTNING_COMMANDS,
    "explain": "print one example of a task split as the model sees it",
    "prepare": "tokenize a text corpus into token files for pretraining",
    "tokenizer": "train a byte-level BPE tokenizer on text files",
    "generate": "continue a prompt with a trained model",
    "suite": "fine-tune and evaluate many tasks over seeds: results table, chart, GLUE submission",
}
USER_ERRORS = (ValueError, FileNotFoundError, KeyError, FloatingPointError)


def user_message(exc: BaseException) -> str:
    """The sentence for the user: the innermost cause (jsonargparse wraps errors raised in __init__)."""
    while isinstance(exc.__cause__, USER_ERRORS):
        exc = exc.__cause__
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return str(text).strip()


def fail(message: str) -> None:
    print(f"gpt-ft: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    from_shell = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: gpt-ft {" + ",".join(COMMANDS) + "} ... [--debug]\n")
        for name, text in COMMANDS.items():
            print(f"  {name:<10} {text}")
        print("\n`gpt-ft COMMAND --help` lists a command's arguments.")
        return
    if argv[0] == "--version":
        print(f"gpt-ft {gpt_ft.__version__}")
        return
    command = argv[0]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; choose from {', '.join(COMMANDS)}.")
    try:
        if command in LIGHTNING_COMMANDS:
            if debug and from_shell:
                sys.argv.remove("--debug")
            from gpt_ft.cli.lightning import checkpoint_data, lightning_main

            with checkpoint_data(argv) as extended:
                if from_shell:
                    sys.argv = [sys.argv[0], *extended]
                    lightning_main(None)
                else:
                    lightning_main(extended)
        else:
            from gpt_ft.cli import commands

            getattr(commands, command)(argv[1:])
    except USER_ERRORS as exc:
        if debug:
            raise
        fail(user_message(exc))
    except argparse.ArgumentError as exc:
        if debug:
            raise
        fail(parse_error_message(str(exc)))
    except SIGTERMException:
        print("gpt-ft: stopped by SIGTERM", file=sys.stderr)
        raise SystemExit(128 + 15) from None
