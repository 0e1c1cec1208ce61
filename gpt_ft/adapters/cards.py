"""Task cards: YAML files naming a TaskAdapter class and its arguments (tasks/*.yaml)."""

from __future__ import annotations

from pathlib import Path

import yaml
from jsonargparse import ArgumentParser

from gpt_ft.adapters.base import TaskAdapter
from gpt_ft.errors import parse_error_message, yaml_problem


def load_card(path: str | Path) -> TaskAdapter:
    """The TaskAdapter of a card file."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"Task card {path} is not valid YAML: {yaml_problem(exc)}") from None
    return card_from_value(raw, f"Task card {path}")


def card_from_value(value, where: str) -> TaskAdapter:
    """The TaskAdapter of a card's parsed value (`class_path` + `init_args`), e.g. as a checkpoint
    records it; errors start with `where`."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=TaskAdapter)
    try:
        return parser.instantiate_classes(parser.parse_object({"task": value})).task
    except Exception as exc:  # jsonargparse's validation errors
        reason = parse_error_message(str(exc)).removeprefix("--task: ")
        raise ValueError(f"{where}: {reason}") from None
