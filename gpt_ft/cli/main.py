"""`gpt-ft`: one entry point for every command; bad input ends in one sentence and exit code 2.

`fit`, `validate`, `test`, `predict` are LightningCLI's (gpt_ft/cli/lightning.py); the other
commands live in gpt_ft/cli/commands.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version

from gpt_ft.errors import parse_error_message, yaml_file_problem

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
    "label": "write a file's examples again with a fine-tuned model's predictions beside them",
    "suite": "fine-tune and evaluate many tasks over seeds: results table, chart, GLUE submission",
}
USER_ERRORS = (ValueError, FileNotFoundError, KeyError, FloatingPointError)
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")  # gloo's words


def user_message(exc: BaseException) -> str:
    """The sentence for the user: the innermost cause (jsonargparse wraps errors raised in __init__)."""
    while isinstance(exc.__cause__, USER_ERRORS):
        exc = exc.__cause__
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return str(text).strip()


def _yaml_arguments(argv: list[str]) -> list[str]:
    """The values of --config and --data.task: files jsonargparse reads as YAML."""
    values = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("--config", "--data.task"):
            values.append(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
    return values


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
        print(f"gpt-ft {version('gpt_ft')}")
        return
    command = argv[0]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; choose from {', '.join(COMMANDS)}.")
    if command in LIGHTNING_COMMANDS or command == "explain":
        from gpt_ft.cli.lightning import reset_before_cards

        argv = reset_before_cards(argv)
        for value in _yaml_arguments(argv):  # a file that does not parse: say where, before anything
            problem = yaml_file_problem(value)
            if problem:
                fail(problem + ".")
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
    except RuntimeError as exc:  # a collective that lost its peer: another process of a DDP run died
        if debug or not any(m in str(exc) for m in LOST_PEER):
            raise
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
        reason = next(m for m in LOST_PEER if m in str(exc))
        fail(
            f"rank {rank} lost another process of this distributed run ({reason}: it stopped or was "
            "killed); every process stops now, and `--ckpt_path last` resumes from the last checkpoint."
        )
    except SystemExit as exc:
        if type(exc).__name__ != "SIGTERMException":  # Lightning's, raised at the step after SIGTERM
            raise
        print("gpt-ft: stopped by SIGTERM", file=sys.stderr)
        raise SystemExit(128 + 15) from None
