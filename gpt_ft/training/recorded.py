"""What a run's checkpoint records of its run, read back: the arguments that evaluate it, reload
it in Python (`GPTModule.load_from_checkpoint`) or serve it with no others, on its own weights and
the tokenizer saved beside it; and the run's data section as the checkpoints record it."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from gpt_ft.adapters.cards import as_task
from gpt_ft.errors import input_file
from gpt_ft.model.config import check_known_fields
from gpt_ft.weights.checkpoint import Checkpoint
from gpt_ft.workarounds.cli import CLI_HPARAMS

LOCAL_PATHS = ("token_dir", "data_dir", "tokenizer")


def with_absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """A run's data section as its checkpoints record it: its local folders (`LOCAL_PATHS`) made
    absolute, so that `--ckpt_path` alone serves from any working folder (a hub id is kept)."""
    args = data.get("init_args") or {}
    for key in LOCAL_PATHS:
        if isinstance(value := args.get(key), str) and Path(value).expanduser().exists():
            args[key] = str(Path(value).expanduser().resolve())
    return data


def recorded_run(checkpoint: Checkpoint, known: Collection[str] | None = None) -> dict[str, Any]:
    """The arguments a run's checkpoint records, to evaluate it with no others: `model` (built from
    its own weights whatever the run's preset, overrides or transfer; LoRA adapters on their base
    weights again) and `data` (the task card included); none for a file gpt_ft did not write. `known`:
    the model's arguments (the others are a newer version's, refused)."""
    if not checkpoint.is_gpt_ft:
        return {}
    linked = ("vocab_size", "tokenizer", "task", *CLI_HPARAMS)  # set from the data, or by LightningCLI
    model = {k: v for k, v in checkpoint.hyper_parameters.items() if k not in linked}
    if known is not None:  # a newer version's argument named
        check_known_fields(
            model, checkpoint.where, checkpoint.provenance.get("version"), known, "model arguments"
        )
    adapters = checkpoint.adapters
    model.update(init_from=adapters.base if adapters else str(checkpoint.path),
                 overrides=None, transfer_layers=None)  # fmt: skip
    recorded = {"model": model}
    if checkpoint.data:
        recorded["data"] = checkpoint.data
    return recorded


def built_on_its_own(config, recorded: dict[str, Any], ckpt: str | None) -> None:
    """A run's checkpoint `ckpt` evaluated with a configuration (its run's saved config.yaml) is built
    on its own weights as `recorded_run` records them, not on those the configuration's run started
    from (`--model.init_from`, which may be gone since), nor with that run's overrides or transfer.
    (LoRA adapters' base weights are whichever given: they may have moved.)"""
    own = recorded.get("model.init_from")  # (`recorded_configuration`'s)
    if (
        own
        and Path(own).resolve() == Path(str(ckpt)).expanduser().resolve()
        and config.get("model") is not None
    ):
        for key in ("init_from", "overrides", "transfer_layers"):
            setattr(config.model, key, recorded[f"model.{key}"])


def standalone(checkpoint_path: Any, given: dict[str, Any]) -> dict[str, Any]:
    """`GPTModule.load_from_checkpoint`'s arguments (`given`, and those it lacks): the model on the
    checkpoint's own weights, as `gpt-ft validate --ckpt_path` builds it (`recorded_run`), not on
    those its run started from (`init_from`, which may be gone since), with the tokenizer saved
    beside it (the run's path may be relative to where it ran); LoRA adapters on their base. Its
    task may be a card's file, as `GPTModule` takes (a run's record checks arguments by their types)."""
    if "task" in given:
        given = {**given, "task": as_task(given["task"])}
    if not isinstance(checkpoint_path, str | Path) or "://" in str(checkpoint_path):
        return given  # (a URL or an open file: Lightning's to read)
    checkpoint = Checkpoint.read(input_file(checkpoint_path, "checkpoint_path"))
    model = recorded_run(checkpoint).get("model", {})
    found = {key: model[key] for key in ("init_from", "overrides", "transfer_layers") if key in model}
    saved = checkpoint.tokenizer  # (a file copied without it: the run's own, where it still is)
    if (
        model
        and saved
        and saved.is_dir()
        and "tokenizer" not in given
        and checkpoint.hyper_parameters.get("tokenizer")
    ):
        found["tokenizer"] = str(saved)
    return {**found, **given}


def plain_config(value: Any) -> Any:
    """A parsed config as plain dicts, lists and scalars (what a weights-only checkpoint may hold)."""
    if isinstance(value, dict):
        return {str(k): plain_config(v) for k, v in value.items() if k != "__path__"}
    if isinstance(value, list | tuple):
        return [plain_config(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def recorded_configuration(ckpt: str, unchecked=None, known: Collection[str] | None = None) -> dict[str, Any]:
    """What a gpt_ft checkpoint records of its run (its model, its data section and task card, the
    tokenizer saved beside it unless the `unchecked` arguments give one), as parser defaults;
    nothing for a URL (Lightning's to read) or a file gpt_ft did not write, one sentence for a path
    that is missing or a folder."""
    if "://" in str(ckpt):
        return {}
    checkpoint = Checkpoint.read(input_file(ckpt, "--ckpt_path", give="a checkpoint file (last.ckpt)"))
    recorded = recorded_run(checkpoint, known)
    model = plain_config(recorded.get("model", {}))
    model.pop("predictions_dir", None)  # where this command says (default ./predictions), not the run
    defaults = {f"model.{key}": value for key, value in model.items()}
    data = recorded.get("data")
    if data:
        if "tokenizer" in data.get("init_args", {}):  # the copy beside the checkpoint
            given = (((unchecked or {}).get("data") or {}).get("init_args") or {}).get("tokenizer")
            saved = (
                checkpoint.tokenizer if given else checkpoint.saved_tokenizer(", or give --data.tokenizer")
            )
            data["init_args"]["tokenizer"] = str(saved) if saved else None
        defaults["data"] = data
    return defaults


def refuse_untrained(command: str, init_from: str | None, head=None) -> None:
    """Without `--ckpt_path`, scoring takes `--model.init_from`'s weights alone: never with a task
    `head` of weights of its own (they would start untrained), as a language model or embedding is."""
    if not init_from:
        raise ValueError(
            f"gpt-ft {command} needs trained weights: give --ckpt_path CKPT (a checkpoint of gpt-ft fit) "
            "or --model.init_from WEIGHTS; it does not score a randomly initialised model."
        )
    if head is not None and any(p.requires_grad for p in head.parameters()):
        raise ValueError(
            f"gpt-ft {command} --model.init_from {init_from} would score a task head that was never "
            "trained (--model.init_from gives a run its starting weights): give the fine-tuned checkpoint "
            "with --ckpt_path CKPT."
        )


def without_nulls(value: Any) -> Any:
    """A recorded configuration with its null (and emptied) entries left out, at every depth: a field
    a later version added reads as null in what an earlier one recorded, and is no change to it."""
    if not isinstance(value, dict):
        return value
    kept = {k: without_nulls(v) for k, v in value.items()}
    return {k: v for k, v in kept.items() if v is not None and v != {}}
