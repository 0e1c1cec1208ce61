"""How `gpt-ft` runs a command of the table (`gpt_ft.cli.main.COMMANDS`).

`fit`, `validate`, `test` and `predict` go to the LightningCLI (gpt_ft/training/runs.py). Every other
command is a typed function or class where its work is (`prepare` in gpt_ft/data/prepare.py, `suite`
in gpt_ft/eval/suite.py, ...), and `run` runs it: jsonargparse builds its parser from the signature
and the docstring's `Args:` (each option's `--help`, with `--config FILE` and `--print_config`),
parses the arguments, builds the classes they name and calls it (a class: builds it and calls its
`run`). Each raises ValueError or FileNotFoundError for bad input: `gpt_ft.cli.main` says it, exit 2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run(function: Callable[..., Any], name: str, argv: list[str]) -> None:
    """`gpt-ft NAME ARGV` of a typed function or class: its parser comes from its signature and
    docstring, and reads jsonargparse's own syntax (lists `[a, b]` or `--x+=a`, booleans `--x true`).

    Args:
        function: The command: typed parameters, a Google-style docstring whose `Args:` are the help.
        name: The command's name, for its usage line.
        argv: The arguments after the command's name.
    """
    from jsonargparse import auto_parser

    from gpt_ft.adapters.cards import PARSER_MODE  # the cards' YAML reading, registered on import
    from gpt_ft.errors import check_not_null
    from gpt_ft.workarounds.cli import remember_options

    whole = dict(exit_on_error=False, parser_mode=PARSER_MODE, return_instance=True, allow_abbrev=False)
    parser = auto_parser(function, prog=f"gpt-ft {name}", **whole)  # (allow_abbrev: an option typed whole)
    remember_options(parser, name)
    arguments = parser.instantiate(parser.parse_args(argv))
    arguments.pop("config", None)
    check_not_null(arguments, function, "")  # a config file's null where the command takes none
    made = function(**arguments)
    if isinstance(function, type):
        made.run()


def lightning(subcommand: str, argv: list[str]) -> None:
    """`gpt-ft fit|validate|test|predict ARGV`: LightningCLI's subcommand."""
    from gpt_ft.training.runs import lightning_main

    lightning_main([subcommand, *argv])


def lazy(path: str, *, typed: bool = True) -> Callable[[str, list[str]], None]:
    """The command `module:function` (or a class), imported when it runs: `gpt-ft --help` and each
    command import only what they use. `typed=False`: the function is called with the command's
    name and arguments as they are (it parses them itself)."""

    def command(name: str, argv: list[str]) -> None:
        from importlib import import_module

        module, _, attribute = path.partition(":")
        function = getattr(import_module(module), attribute)
        if typed:
            run(function, name, argv)
        else:
            function(name, argv)

    return command
