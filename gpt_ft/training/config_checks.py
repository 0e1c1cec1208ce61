"""The checks a run's configuration goes through before its classes are built, and errors about
its task card named by the card's file (`gpt-ft fit|validate|test|predict|explain`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpt_ft.adapters.cards import NO_CLASS_PATH
from gpt_ft.errors import CardError, causes, check_not_null


def refuse_nulls(config, model_class: type | None = None) -> None:
    """No null from a config file where the model, the data module, its task card or the trainer
    takes none (see `check_not_null`)."""
    from importlib import import_module

    from lightning import Trainer

    def plain(section) -> dict:
        return section.as_dict() if hasattr(section, "as_dict") else dict(section or {})

    def of(path: str) -> type | None:
        module, _, name = path.rpartition(".")
        try:
            return getattr(import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return None  # the parser names a class that cannot be found

    sections = [("--trainer", config.get("trainer"), Trainer), ("--model", config.get("model"), model_class)]
    data = config.get("data")
    if data is not None and data.get("class_path"):
        sections.append(("--data", data.get("init_args"), of(data.class_path)))
        task = (data.get("init_args") or {}).get("task")
        if task is not None and hasattr(task, "get") and task.get("class_path"):
            sections.append(("--data.task", task.get("init_args"), of(task.class_path)))
    for option, values, cls in sections:
        if values is not None and cls is not None:
            check_not_null(plain(values), cls, option)


def replaced_overrides(config) -> str | None:
    """The note saying which of a config file's `model.overrides` the run no longer has: a later
    file's or the command line's `--model.overrides` replaces the mapping whole (not key by key),
    so `{n_positions: 256}` after configs/pretrain/cpu.yaml dropped its `pre_ln: true` unsaid."""
    import yaml

    given = (config.get("model") or {}).get("overrides") or {}
    for path in config.get("config") or []:
        try:
            read = yaml.safe_load(Path(getattr(path, "absolute", path)).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # (a piped config: its text, read before)
        theirs = ((read if isinstance(read, dict) else {}).get("model") or {}).get("overrides")
        if isinstance(theirs, dict) and (dropped := {k: v for k, v in theirs.items() if k not in given}):
            fields = ", ".join(f"{k}: {json.dumps(v)}" for k, v in dropped.items())
            return (f"note: --model.overrides replaces {path}'s whole mapping, not key by key: it drops "
                    f"{fields} (give them again to keep them).")  # fmt: skip
    return None


def refuse_bad_config(config, model_class: type | None) -> None:
    """A null where none is taken, a task card of fields alone, or a barebones trainer, in one
    sentence (barebones refused gpt-ft's own logger and callbacks, each named as if given)."""
    if (config.get("trainer") or {}).get("barebones"):
        raise ValueError("--trainer.barebones true is not supported: a gpt-ft run logs its losses and "
                         "metrics and keeps checkpoints, which barebones forbids.")  # fmt: skip
    with card_named(config):
        refuse_nulls(config, model_class)
    refuse_fields_alone(config)


def refuse_fields_alone(config) -> None:
    """A task card of fields alone, without its class_path, in one sentence: the parser would build
    the abstract `TaskAdapter` from it, which fails deep inside the first example."""
    from importlib import import_module

    from gpt_ft.adapters import TaskAdapter

    task = ((config.get("data") or {}).get("init_args") or {}).get("task")
    module, _, name = (task.get("class_path") or "").rpartition(".") if hasattr(task, "get") else ("", "", "")
    if module and getattr(import_module(module), name, None) is TaskAdapter:
        raise ValueError(f"{task.get('__path__') or '--data.task'} {NO_CLASS_PATH}")


@contextmanager
def card_named(config) -> Iterator[None]:
    """Errors about the task card, while `config`'s classes are checked and built, name the card's
    file (where the card came from one)."""
    task = ((config.get("data") or {}).get("init_args") or {}).get("task")
    card = task.get("__path__") if hasattr(task, "get") else None
    if card is not None:  # as it opens from here (jsonargparse's is relative to the config that named it)
        whole = os.path.normpath(getattr(card, "absolute", None) or str(card))
        card = whole if (near := os.path.relpath(whole)).startswith("..") else near
    try:
        yield
    except (ValueError, TypeError) as exc:
        if card is None:
            raise
        inner = next((e for e in causes(exc) if isinstance(e, CardError)), None)
        if inner is not None:
            raise CardError(f"{card}: {inner}") from None
        if str(exc).startswith("--data.task") and str(card) not in str(exc):
            raise ValueError(f"{str(exc).removesuffix('.')} (in {card}).") from None
        raise


def check_token_folder(token_dir: str, init_from: str) -> None:
    """Token files read by a gpt_ft checkpoint's model (`--model.init_from`; a scored run's
    `--ckpt_path`) were prepared with the tokenizer saved beside it, named as the folder's fault
    before a model is built of the weights' size (a tokenizer of another size would be blamed)."""
    from gpt_ft.data.lm_data import read_meta
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.training.saved import not_its_tokenizer
    from gpt_ft.weights.pretrained import locate, weights_tokenizer

    try:
        saved = weights_tokenizer(init_from) if locate(init_from)[0] == "checkpoint" else None
        path = Path(token_dir).expanduser() / read_meta(token_dir)["tokenizer"]
    except (OSError, ValueError):  # the data module or the weights say why
        return
    if saved is None or path.resolve() == Path(saved).resolve():
        return
    given, own = load_tokenizer(path).get_vocab(), load_tokenizer(saved).get_vocab()
    if given != own:
        raise ValueError(not_its_tokenizer(str(path), init_from, saved, "--data.token_dir", given, own))
