"""Task cards: YAML files naming a TaskAdapter class and its arguments (tasks/*.yaml); and YAML as
every `gpt-ft` parser reads it (`PARSER_MODE`): a file that cannot be used named with its line and
column, and every task card in a value taken whole."""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from dataclasses import MISSING, fields
from functools import cache
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentParser, get_loader, set_dumper, set_loader

from gpt_ft.adapters.base import TaskAdapter
from gpt_ft.adapters.sources import SOURCE_KINDS, HubDataset, LocalFiles, source_problem
from gpt_ft.errors import CardError, FileProblem, absent
from gpt_ft.errors.parsing import (
    UNFOLDED_LIMIT,
    parse_error_message,
    repeated_key,
    unfolds_too_far,
    untyped_parameter,
    yaml_file_problem,
    yaml_problem,
)
from gpt_ft.workarounds.cli import (
    config_file_being_read,
    config_pipe_being_read,
    dump_header_in_mode,
    required_arguments,
)
from gpt_ft.workarounds.parsing import index_action_lookups, remember_class_parses, remember_key_splits

UNFOLDS = (
    f"unfolds to more than {UNFOLDED_LIMIT:,} values (YAML aliases repeated inside aliases): write them out"
)


def load_card(path: str | Path) -> TaskAdapter:
    """The TaskAdapter of a card file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"Task card {path} {absent(path)}.")
    try:
        raw = yaml.safe_load(text := Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"Task card {path} is not valid YAML: {yaml_problem(exc)}") from None
    if unfolds_too_far(raw):
        raise ValueError(f"Task card {path} {UNFOLDS}.")
    if twice := repeated_key(text):
        raise ValueError(f"Task card {path}, {twice}.")
    if problem := card_problem(raw, f"Task card {path}"):
        raise ValueError(problem)
    return card_from_value(raw, f"Task card {path}")


def card_from_value(value, where: str) -> TaskAdapter:
    """The TaskAdapter of a card's parsed value (`class_path` + `init_args`), e.g. as a checkpoint
    records it; errors start with `where`."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=TaskAdapter)
    try:
        return parser.instantiate_classes(parser.parse_object({"task": value})).task
    except Exception as exc:  # jsonargparse's validation errors
        reason = parse_error_message(str(exc), untyped_parameter(exc)).removeprefix("--task: ")
        raise ValueError(f"{where}: {reason}") from None


def complete_card(value: Any) -> Any:
    """`value` with every task card in it whole: each field a card leaves out set to the field's
    default, so a card given over an earlier one replaces it instead of inheriting its fields.

    jsonargparse keeps the fields of an earlier value of the same class that a newly given one
    leaves out, by design (omni-us/jsonargparse#460: "only what gets specified is changed"): an
    SST-2 config's `submission_labels` would reach a 3-label card given after it. The command line's
    YAML loader passes every value it reads through here; `--data.task.init_args.FIELD VALUE` still
    changes one field of the card before it.
    """
    if isinstance(value, list):
        return [complete_card(v) for v in value]
    if not isinstance(value, dict):
        return value
    value = {k: complete_card(v) for k, v in value.items()}
    cls = _adapter_class(value.get("class_path"))
    if cls is not None and isinstance(value.get("init_args", {}), dict):
        value["init_args"] = init_args = {**card_fields(cls)[0], **value.get("init_args", {})}
        for key, source in (("local", LocalFiles), ("hub", HubDataset)):  # whole too: merged field by field
            if isinstance(init_args.get(key), dict):
                unset = {f.name: f.default for f in fields(source) if f.default is not MISSING}
                init_args[key] = {**unset, **init_args[key]}
    return value


@cache
def card_fields(cls: type[TaskAdapter]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The fields of an adapter class, as jsonargparse reads the class (its base's fields too where
    it passes **kwargs up): those with defaults, with them; and those a card must give."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls)
    required = required_arguments(parser)
    defaults = parser.get_defaults().as_dict()
    return {k: v for k, v in defaults.items() if k != "__path__" and k not in required}, required


def _adapter_class(class_path: Any) -> type[TaskAdapter] | None:
    if not isinstance(class_path, str):
        return None
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(import_module(module or "gpt_ft.adapters"), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, TaskAdapter) else None


PARSER_MODE = "gpt_ft"
NO_CLASS_PATH = (
    "names no class_path: a task card is class_path (e.g. gpt_ft.adapters.SingleText) "
    "and init_args (see tasks/)."
)


def load_yaml(text: str, path: str = "") -> object:
    """A value, or a file's text (`path`: a `--config` file), as jsonargparse's YAML loader reads it,
    with its task cards complete (`complete_card`)."""
    file = config_file_being_read(text) or path
    try:
        value = get_loader("yaml")(text)
    except yaml.YAMLError as exc:
        if not file:
            raise
        raise FileProblem(f"{yaml_file_problem(file) or f'{file} is not valid YAML'}.") from exc
    if unfolds_too_far(value):
        raise FileProblem(f"{file or 'The value'} {UNFOLDS}.")
    if file and (twice := repeated_key(text)):
        raise FileProblem(f"{file}, {twice}.")
    if path and not text and (pipe := config_pipe_being_read()):
        raise FileProblem(f"--config {pipe} is a pipe that gave no text.")  # (the others are read first)
    if path and not isinstance(value, dict) and isinstance(plain := yaml.safe_load(text), dict):
        value = plain  # ("model:" alone: jsonargparse's loader gives a one-key mapping to null as its text)
    if path and not isinstance(value, dict):
        holds = "a config file is a mapping with sections (trainer, model, data, ...)"
        raise FileProblem(f"{file} is {_not_a_mapping(value)}: {holds}.")
    for section in ("trainer", "model"):  # (a null or a list in their place dropped every setting before)
        if path and section in value and not isinstance(value[section], dict):
            raise FileProblem(
                f"{file}: section {section!r} is {_not_a_mapping(value[section])}: give its settings as "
                "a mapping (key: value), or leave the section out."
            )
    if (
        file
        and not path
        and Path(file).suffix.lower() in (".tsv", ".csv", ".jsonl", ".parquet", ".txt", ".gz")
    ):
        raise FileProblem(
            f"{file} is no card file: a card's local files are `local: {{splits: {{train: FILE, ...}}}}` "
            "(see tasks/), not a file's name."
        )
    if file and not path and (problem := card_problem(value, file, init_args_only=True)):
        raise FileProblem(problem)
    return complete_card(value)


def _not_a_mapping(value) -> str:
    name = type(value).__name__
    return "empty" if value is None or value == "" else f"a{'n' * (name[0] in 'aeiou')} {name}, not a mapping"


def card_problem(value, file, *, init_args_only: bool = False) -> str | None:
    """What makes a card file's value no card, in one sentence naming `file`: not a mapping, no
    class_path (where it has init_args, with `init_args_only`: the command line may give the class
    apart), or a required field missing."""
    if not isinstance(value, dict):
        holds = "a task card is a mapping with class_path and init_args (see tasks/)"
        return f"{file} is {_not_a_mapping(value)}: {holds}."
    if "class_path" not in value and ("init_args" in value or not init_args_only):
        return f"{file} {NO_CLASS_PATH}"
    if "class_path" in value and (other := [str(k) for k in value if k not in ("class_path", "init_args")]):
        return (f"{file}: {', '.join(map(repr, other))} is no key of a card, which holds class_path and "
                "init_args only: the card's fields go under init_args.")  # fmt: skip
    if problem := unquoted_names(value.get("init_args"), file):
        return problem
    init_args = value.get("init_args") if isinstance(value.get("init_args"), dict) else {}
    for name, source in init_args.items():
        if name in SOURCE_KINDS and isinstance(source, dict) and (problem := source_problem(name, source)):
            return f"{file}: {problem}"
    cls = _adapter_class(value.get("class_path"))
    known = [*card_fields(cls)[0], *card_fields(cls)[1]] if cls else []
    unknown = [str(k) for k in init_args if k not in known] if cls else []
    if unknown:  # a typo, most often: jsonargparse named the key alone
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"the closest is {close[0]!r}." if close else f"its fields: {', '.join(known)}."
        return f"{file}: {cls.__name__} has no field {unknown[0]!r}; {hint}"
    missing = [f for f in card_fields(cls)[1] if init_args.get(f) is None] if cls else []  # (null: none)
    return f"{file}: the card names no {', '.join(missing)}; {cls.__name__} needs it." if missing else None


def unquoted_names(init_args, file) -> str | None:
    """Class names YAML read as numbers or booleans (`labels: [0, 1]`, `[no, yes]`), named in one
    sentence saying to quote them (jsonargparse said "expected str, got '0'", or 'False')."""
    for key in ("labels", "submission_labels", "ignore_labels"):
        names = init_args.get(key) if isinstance(init_args, dict) else None
        read = [x for x in names if isinstance(x, bool | int | float)] if isinstance(names, list) else []
        if read and isinstance(read[0], bool):
            return (f"{file}: {key} {names}: YAML reads yes, no, on, off, true and false as booleans: quote "
                    "each class name (e.g. ['no', 'yes']).")  # fmt: skip
        if read:
            quoted = ", ".join(repr(str(x)) for x in names)
            return f"{file}: {key} {names}: YAML reads {read[0]} as a number: quote each name ([{quoted}])."
    return None


def dump_yaml(value: object) -> str:
    """YAML as jsonargparse writes it, by libyaml's emitter where PyYAML has it (4x faster; the same
    values, a long quoted string folded at other places)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(value, Dumper=dumper, default_flow_style=False, allow_unicode=True, sort_keys=False)


set_loader(PARSER_MODE, load_yaml, exceptions=(yaml.YAMLError, FileProblem))
set_dumper(PARSER_MODE, dump_yaml)
dump_header_in_mode(PARSER_MODE)  # a run's config.yaml opens with Lightning's version, as Lightning's
index_action_lookups()  # every parser's keys found by index, not by walking its actions
remember_key_splits()  # a namespace's dotted keys split once
remember_class_parses(TaskAdapter, HubDataset, LocalFiles)  # a card parsed once for each time met


def as_task(task):
    """A task card's adapter; from Python, a card's file (as the command line reads it) or its
    class_path and init_args too."""
    if isinstance(task, (str, os.PathLike)):
        task = load_card(task)
    task = card_from_value(task, "task") if isinstance(task, dict) else task
    kind = type(task)
    if missing := [m for m in ("text_fields", "encode") if getattr(kind, m, None) is getattr(TaskAdapter, m)]:
        raise CardError(
            f"Task {task.name!r} ({kind.__module__}.{kind.__qualname__}) does not implement {missing[0]}(), "
            "which every adapter must (docs/tasks.md, A new input shape)."
        )
    return task


def card_key(task) -> str:
    """A card by value: its class and settings (two reads of one card file are one card)."""
    return f"{type(task).__qualname__} {sorted(vars(task).items(), key=lambda kv: kv[0])!r}"


def adapter_code(cls: type) -> str:
    """An adapter class as the encoding cache knows it: its full name and those of its bases, and
    the source of each that is not the toolkit's or Python's (a user's class, edited, encodes
    anew; the toolkit's own are covered by its version and `ENCODING`)."""
    parts = []
    for base in cls.__mro__:
        parts.append(f"{base.__module__}.{base.__qualname__}")
        package = base.__module__.partition(".")[0]
        if package != "gpt_ft" and package not in sys.stdlib_module_names and package != "builtins":
            try:
                parts.append(inspect.getsource(base))
            except (OSError, TypeError):  # defined where its source cannot be read (a REPL)
                pass
    return "\n".join(parts)
