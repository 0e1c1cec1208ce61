"""LightningCLI and jsonargparse: building, parsing and reading configurations."""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout


class CheckpointHparamsAsDefaults:
    """LightningCLI mixin for a CLI whose `parse_arguments` already sets a checkpoint's recorded
    configuration as the parser's defaults: it turns off Lightning's own pass over `--ckpt_path`.

    LightningCLI applies a checkpoint's hyper-parameters over the command line's after parsing
    (`LightningCLI._parse_ckpt_path`, called from `__init__`; Lightning-AI/pytorch-lightning#20801).
    The fix, #21455 (open), makes them the parser's defaults, as the subclass does. Once a Lightning
    release has it and is the minimum, drop this mixin if the defaults Lightning sets agree with the
    subclass's; if the method is renamed before then, override the new name.
    """

    def _parse_ckpt_path(self) -> None:
        return


class ConfigDumpReadFast:
    """LightningCLI mixin: the configuration as a dict (`config_dump`, where the model's instantiator
    reads the hyperparameters it records) read back from its YAML dump by libyaml's parser, not
    PyYAML's pure-Python `safe_load` (15-30 ms a run; the same dict).

    LightningCLI makes it in `_dump_config` (src/lightning/pytorch/cli.py), which no public hook
    replaces. If the method is renamed or comes to set more, follow it (tests/test_workarounds.py
    fails)."""

    def _dump_config(self) -> None:
        import yaml

        if hasattr(self, "config_dump"):
            return
        text = self.parser.dump(self.config, skip_link_targets=False, skip_none=False, format="yaml")
        self.config_dump = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]


class RunWrapped:
    """LightningCLI mixin: the subcommand runs inside the CLI's `running()` context (errors the run
    raises, reworded as the CLI's own checks word them).

    LightningCLI runs it in `_run_subcommand(subcommand)`, called from `__init__`; no public hook
    wraps the run (`before_fit` and `after_fit` only bracket it). If the method is renamed, override
    the new name (tests/test_workarounds.py fails)."""

    def _run_subcommand(self, subcommand: str) -> None:
        with self.running():
            super()._run_subcommand(subcommand)


class ParsersBuiltOnce:
    """LightningCLI mixin: a process builds each kind of parser once (the CLI's class, the parser's
    arguments, the classes, their modes and defaults, the subcommands); each later CLI of that kind
    takes a deep copy (a few ms), so what a CLI changes on its parser stays its own. validate's and
    test's `verbose` default to false there, as their help then says (gpt_ft prints the metrics).

    LightningCLI builds its parser and one per subcommand anew at every CLI (`setup_parser`,
    src/lightning/pytorch/cli.py; about 60 ms, which `gpt-ft suite` pays two or three times a run);
    no public way gives a CLI a parser. `setup_parser` sets `PARSER_STATE` on the CLI; if it comes to
    set more, add them (tests/test_workarounds.py fails)."""

    PARSER_STATE = ("parser", "_subcommand_parsers", "_subcommand_method_arguments")
    _built: dict[str, dict] = {}

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        import copy

        defaults = {k: v for k, v in self.trainer_defaults.items() if k != "callbacks"}  # not the parser's
        kind = repr((type(self), add_subcommands, main_kwargs, subparser_kwargs, self.model_class,
                     self.datamodule_class, self.subclass_mode_model, self.subclass_mode_data,
                     self.trainer_class, defaults, self.seed_everything_default,
                     self.auto_configure_optimizers, add_subcommands and self.subcommands()))  # fmt: skip
        if kind not in self._built:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            for name, parser in getattr(self, "_subcommand_parsers", {}).items():
                reword_help(parser, name)
            self._built[kind] = {
                name: getattr(self, name) for name in self.PARSER_STATE if hasattr(self, name)
            }
        for name, value in copy.deepcopy(self._built[kind]).items():  # one copy: the references within kept
            setattr(self, name, value)
        parsers = getattr(self, "_subcommand_parsers", {})
        for name in {"validate", "test"} & parsers.keys():
            parsers[name].set_defaults(verbose=False)


# Lightning's help where gpt-ft does otherwise (its parser copies it from the Trainer's docstring).
UNSET = "; with none of max_epochs, max_steps and max_time, fine-tuning runs GPT-1's 3 epochs (pretraining: "
READ = "its path, or `last` (the newest last.ckpt of this task's runs under the logger's folder)"
HELP = {
    "--trainer.max_epochs": f"Stop training once this number of epochs is reached (-1: never){UNSET}1000).",
    "--trainer.max_steps": f"Stop after this number of optimizer steps (-1: no limit){UNSET}1000 epochs).",
    "--seed_everything": "The seed of every random generator, and of the training data's order (unless "
    "--data.seed): an int, recorded in the run's config.yaml; true, or none given: 0.",
    "--ckpt_path": {"fit": f"Resume from a checkpoint: {READ}; none: start afresh.",
                    **dict.fromkeys(("validate", "test", "predict"), f"The checkpoint to read: {READ}.")},
    "--verbose": dict.fromkeys(("validate", "test"), "Also print Lightning's table of the results (a line "
                               "of them is printed either way)."),
    "--trainer.default_root_dir": "The folder of a run's logs and checkpoints (default runs/: the default "
    "logger's folder, which this moves).",
    "--trainer.logger": "Where the metrics go: a logger, a list of them, or false (default: a CSVLogger in "
    "runs/lightning_logs/version_N, checkpoints beside it).",
}  # fmt: skip
DATA = "its options: --data.help TaskDataModule; a task card's fields: docs/tasks.md"
DESCRIPTIONS = {  # each command's, and the title of its data options (Lightning's: the Trainer's and
    "fit": "Train a model: fine-tune it on a task card (--data.task CARD) with GPT-1's objective, or "
    "pretrain it on gpt-ft prepare's token files (--data LMDataModule --data.token_dir DIR).",
    "validate": "Score a checkpoint (--ckpt_path) on its task's validation splits, or a language model on "
    "its token files' validation split.",
    "test": "Score a checkpoint (--ckpt_path) on its task's labelled test splits.",
    "predict": "Write a checkpoint's predictions for its task's test splits as submission files (GLUE's "
    "`index<TAB>prediction`) into --model.predictions_dir.",
    "data": f"The data: a task's (the default, TaskDataModule: {DATA}), or pretraining's token files (--data "
    "LMDataModule: --data.help LMDataModule)",
}  # LightningDataModule's docstrings, cut off at their first line)


OPTIONS: dict[str, list[str]] = {}
"""Each command's options, as its parser was built (a misspelt one is answered with the nearest)."""


def remember_options(parser, command: str) -> None:
    """`command`'s options in `OPTIONS`, read from argparse's private `_option_string_actions` (it
    has no public list); if argparse renames it, misspelt options get no suggestion."""
    OPTIONS[command] = [o for o in getattr(parser, "_option_string_actions", {}) if o.startswith("--")]


def reword_help(parser, subcommand: str) -> None:
    """`HELP` in place of the help LightningCLI gives these options of `subcommand`'s parser, found by
    their option strings (argparse's `_option_string_actions`: no public way reaches an action to
    change its help). If argparse renames it, look the actions up in `parser._actions`."""
    remember_options(parser, subcommand)
    for option, text in HELP.items():
        text = text.get(subcommand) if isinstance(text, dict) else text
        if text and (action := parser._option_string_actions.get(option)) is not None:
            action.help = text
    if subcommand in DESCRIPTIONS:
        said, parser.description = parser.description, DESCRIPTIONS[subcommand]
        for group in parser._action_groups:  # (argparse's groups: no public list of them)
            if group.title and group.title.startswith("A DataModule standardizes"):
                group.title = DESCRIPTIONS["data"]
            elif said and group.title and group.title.rstrip(":") == said.strip().rstrip(".:"):
                group.title = "The checkpoint"


# The keys LightningCLI adds to a module's saved hyper-parameters: `_instantiator` (how to create the
# module again, Lightning-AI/pytorch-lightning#18105) and `_class_path` (its class where the CLI
# picks one, src/lightning/pytorch/cli.py); they are not the module's arguments. #20777 (open) adds
# a public switch to leave them out: once released, use it; if the keys are renamed, rename them here.
CLI_HPARAMS: tuple[str, ...] = ("_instantiator", "_class_path")


def config_file_being_read(text: str) -> str | None:
    """The config file (as named, where that is relative to here) whose whole text jsonargparse is
    loading as `text`, if it is loading one: a sub-config file (a card given as a path), a `--config`.

    jsonargparse keeps the files it is reading on a private context stack (`_util.config_load_stack`,
    for its loop check), and calls the loader with the text alone; it has no public way to ask. If the
    stack is renamed or changes shape, this answers None and a file's problem is named by the parser
    (without its line) instead."""
    from pathlib import Path

    try:
        from jsonargparse._util import config_load_stack

        real, shown = config_load_stack.get()[-1]
        # The loader sees every value parsed while a file is open (hundreds a parse): the file's
        # size rules most out without reading it.
        if (
            Path(real).stat().st_size != len(text.encode("utf-8"))
            or Path(real).read_text(encoding="utf-8") != text
        ):
            return None
        return shown if Path(shown).resolve() == Path(real) else real  # as named, where that is here
    except (ImportError, LookupError, IndexError, ValueError, TypeError, OSError):
        return None


def config_pipe_being_read() -> str | None:
    """The name of the file jsonargparse is reading (`config_file_being_read`'s stack) where it is a
    pipe, `--config <(...)`, which holds its text for one read only; None elsewhere."""
    import os
    import stat

    try:
        from jsonargparse._util import config_load_stack

        shown = config_load_stack.get()[-1][1]  # (its resolved name, /proc/PID/fd/pipe:[N], is none)
        return str(shown) if stat.S_ISFIFO(os.stat(shown).st_mode) else None
    except (ImportError, LookupError, IndexError, ValueError, TypeError, OSError):
        return None


def file_not_decoded(exc: BaseException) -> str | None:
    """The file jsonargparse was reading (a `--config` file, or a task card given as a path) when
    `exc` or an exception it was raised from met text that is not UTF-8: the UnicodeDecodeError names
    none. Read off its traceback, from the innermost frame that holds a `jsonargparse.Path` (its
    reader's `self`); if jsonargparse comes to name the file itself, drop this. None elsewhere."""
    import jsonargparse

    while exc is not None and not isinstance(exc, UnicodeDecodeError):
        exc = exc.__cause__ or exc.__context__
    tb, found = exc.__traceback__ if exc is not None else None, None
    while tb is not None:
        held = [v for v in tb.tb_frame.f_locals.values() if isinstance(v, jsonargparse.Path)]
        found, tb = str(held[-1]) if held else found, tb.tb_next
    return found


def parse_unchecked(parser, args: list[str], *, or_with: dict | None = None):
    """`args` parsed unchecked and unprinted (`--print_config` waits for the full parse): to read one
    option ahead. Where they do not parse, `or_with`'s defaults are set and they are parsed again
    (the defaults stay; where that fails too, the parser's are set back and the first error raised).
    jsonargparse's `_skip_validation` and `_ActionPrintConfig` are private (its parse_env and dump use
    them); if they go, drop the keyword, catch the parse's error, let it print."""
    import argparse

    from jsonargparse._actions import _ActionPrintConfig

    with _ActionPrintConfig.skip_print_config():
        try:
            return parser.parse_args(args, _skip_validation=True)
        except argparse.ArgumentError:
            if not or_with:
                raise
            before = {key: parser.get_default(key) for key in or_with}
            before = {key: v.as_dict() if hasattr(v, "as_dict") else v for key, v in before.items()}
            parser.set_defaults(or_with)
            try:
                return parser.parse_args(args, _skip_validation=True)
            except argparse.ArgumentError:
                parser.set_defaults(before)
            raise


def subcommand_parser(cli, name: str):
    """The parser of LightningCLI's subcommand `name`, kept in private `_subcommand_parsers`."""
    return cli._subcommand_parsers[name]


def parse_subcommand(cli, parser, args: list[str]):
    """What `parser.parse_args(args)` gives (`subcommand`, `config` and the subcommand's namespace),
    `args[0]` a subcommand of LightningCLI's `parser`, in about half the time: its own parser parses
    the rest. jsonargparse's parser with subcommands has the subcommand's parse them, then adds its
    class defaults and validates it all again (handle_subcommands, _parse_common in
    jsonargparse/_core.py), each class argument (the data module, its task card) adapted twice more.
    `--print_config` is left to `parser` (jsonargparse keeps the request there, and prints before it
    validates), and so are errors (its messages name the option as given, and the file that gave it).
    tests/test_workarounds.py compares both ways; if they part, parse with `parser`."""
    from contextlib import suppress

    from jsonargparse import Namespace

    config = None
    if not any(a.split("=", 1)[0] == "--print_config" for a in args):  # (else `parser` at once)
        with suppress(Exception):
            config = subcommand_parser(cli, args[0]).parse_args(args[1:])
    if print_config_asked(parser) or config is None:
        return parser.parse_args(args)
    parsed = Namespace(subcommand=args[0], config=None)
    parsed[args[0]] = config
    return parsed


def print_config_asked(parser) -> bool:
    """Whether a parse (`parse_unchecked`'s, a subcommand's parser's) met `--print_config`; the
    request jsonargparse keeps on the parser is taken off (the full parse would print at its first
    `--config` file, that file's values alone)."""
    return vars(parser).pop("print_config", ...) is not ...  # (its value may be None)


def required_arguments(parser) -> tuple[str, ...]:
    """The destinations a jsonargparse parser requires, from argparse's private `_actions` (no public
    accessor; `get_defaults` lists them with None too). If it goes, read the class's signature."""
    return tuple(a.dest for a in parser._actions if a.required)


def dump_header_in_mode(mode: str) -> None:
    """jsonargparse writes a parser's `dump_header` (LightningCLI's `# lightning.pytorch==VERSION`
    atop every config.yaml a run saves) only in the formats its `comment_prefix` table knows
    (`dump_using_format`, jsonargparse/_loaders_dumpers.py); a mode of one's own given a dumper with
    `set_dumper` is not in it, and the header was dropped. No public way to register a prefix; if the
    table moves, find where `dump_using_format` reads the prefix now (tests/test_workarounds.py)."""
    from jsonargparse import _loaders_dumpers

    _loaders_dumpers.comment_prefix.setdefault(mode, "# ")


@contextmanager
def nested_help_named_whole(args: list[str]) -> Iterator[None]:
    """`--data.task.help CLASS` printed the class's options as jsonargparse's inner parser names them,
    relative to the data module (`--task.text`), which no command line takes: the help is caught
    and printed with the options' whole names (`--data.task.text`). jsonargparse builds that help
    from the option's own parser (`_ActionHelpClassPath.print_help`, no hook for the outer prefix);
    drop this once it names the options whole."""
    nested = next((m for a in args if (m := re.match(r"--((?:\w+\.)+)(\w+)\.help(?:=|$)", a))), None)
    if nested is None:
        yield
        return
    caught = io.StringIO()
    try:
        with redirect_stdout(caught):
            yield
    finally:
        text = caught.getvalue().replace(f"--{nested[2]}.", f"--{nested[1]}{nested[2]}.")
        sys.stdout.write(text)
