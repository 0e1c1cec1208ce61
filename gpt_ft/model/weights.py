"""Weights from disk or the hub, and the tokenizer that goes with them: the one place both are
resolved.

Anything that names weights (`GPT.from_pretrained`, and every option of the toolkit that names
weights) takes a gpt_ft checkpoint file, a local transformers directory or a hub id
(`ORG/NAME[@revision]`, see `hub.py`); the tokenizer saved with them is used unless one is given.

A gpt_ft checkpoint file is a dict saved with `torch.save`, read with `weights_only=True`:

- `CONFIG` ("gpt_config"): the `GPTConfig`'s fields, as plain values;
- `STATE` ("state_dict"): tensors; the GPT's are those named `PREFIX` ("gpt.") followed by their
  name in `GPT.state_dict()`;
- `ADAPTERS` ("lora"), optional: the file then holds only the GPT's trained tensors (LoRA's
  adapters and the new tokens' rows), to be loaded onto the weights it names as `base` (any name
  this module loads) and merged; see `adapters_entry`;
- `TOKENIZER` ("tokenizer"), optional: the tokenizer's folder, relative to the file's.

Anything else in the file is not the model's business: a training run's checkpoint is such a file
with more in it (see `gpt_ft/training/saved.py`).
"""

from __future__ import annotations

import pickle
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gpt_ft.model import hub
from gpt_ft.model.config import GPTConfig
from gpt_ft.model.gpt import GPT
from gpt_ft.model.lora import LoRA, add_lora, merge_lora

CONFIG = "gpt_config"
STATE = "state_dict"
PREFIX = "gpt."
ADAPTERS = "lora"
TOKENIZER = "tokenizer"
# What makes a folder a tokenizer: any one of a `save_pretrained` output's files, or both files of
# a BPE as OpenAI published it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
BPE_FILES = ("vocab.json", "merges.txt")

UNREADABLE_CHECKPOINT = (
    "{path} is not a readable checkpoint: the file is truncated, corrupt or of another kind."
)
UNSAFE_CHECKPOINT = (
    "{path} holds objects other than tensors and plain values; checkpoints are read with "
    "torch.load(weights_only=True), which never runs code from a file."
)


def safe_load(path: str | Path, load=None) -> dict[str, Any]:
    """A checkpoint read with `torch.load(weights_only=True)`, on the CPU (or with `load(path)`).

    A file that would run code, or that is truncated, empty or not a checkpoint at all, is one
    sentence naming it.
    """
    try:
        if load is not None:
            return load(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" in str(exc):  # the weights-only unpickler refused to import something
            raise ValueError(UNSAFE_CHECKPOINT.format(path=path)) from None
        raise ValueError(UNREADABLE_CHECKPOINT.format(path=path)) from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise FileNotFoundError(f"Checkpoint {path} does not exist.") from None
        raise ValueError(UNREADABLE_CHECKPOINT.format(path=path)) from None


def load_weights(path: str | Path) -> GPT:
    """A GPT from a gpt_ft checkpoint file, a transformers directory or a hub id."""
    path = hub.local(path)
    if path.is_dir():
        from gpt_ft.model import hf

        return hf.from_pretrained(path)
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    return gpt_from_checkpoint(safe_load(path), path)


def gpt_from_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> GPT:
    """The GPT of a gpt_ft checkpoint already read (`safe_load`); LoRA adapters are loaded onto
    their base weights and merged."""
    config = checkpoint.get(CONFIG)
    if config is None:
        raise ValueError(f"{path} is not a gpt_ft checkpoint: it records no model config ({CONFIG}).")
    adapters = checkpoint.get(ADAPTERS)
    if adapters is None:
        gpt = GPT(GPTConfig(**config))
        gpt.load_state_dict(gpt_state(checkpoint))
        return gpt
    settings = {k: v for k, v in adapters.items() if k not in ("base", "new_tokens_from")}
    gpt = load_weights(adapters["base"])
    if config["vocab_size"] > gpt.config.vocab_size:
        gpt.resize_token_embeddings(config["vocab_size"])
    add_lora(gpt, LoRA(**settings), new_tokens_from=adapters["new_tokens_from"])
    trained = gpt_state(checkpoint)
    missing = sorted({n for n, p in gpt.named_parameters() if p.requires_grad} - set(trained))
    if missing:
        raise ValueError(
            f"{path} lacks LoRA weights {missing[:3]}: the file is not a complete LoRA checkpoint."
        )
    gpt.load_state_dict(trained, strict=False)
    return merge_lora(gpt)


def gpt_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The GPT's tensors of a checkpoint, under their names in `GPT.state_dict()`."""
    return {k.removeprefix(PREFIX): v for k, v in checkpoint[STATE].items() if k.startswith(PREFIX)}


def adapters_entry(lora: LoRA, *, base: str, new_tokens_from: int) -> dict[str, Any]:
    """The `ADAPTERS` entry of a file holding `lora`'s trained tensors: the weights they adapt
    (`base`), the first token row they train (`new_tokens_from`) and the adapters' settings."""
    return {"base": base, "new_tokens_from": new_tokens_from, **asdict(lora)}


def is_tokenizer_dir(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer (see `TOKENIZER_FILES`, `BPE_FILES`)."""
    return any((directory / f).is_file() for f in TOKENIZER_FILES) or all(
        (directory / f).is_file() for f in BPE_FILES
    )


def weights_tokenizer(path: str | Path) -> str | None:
    """The tokenizer of these weights: saved beside a gpt_ft checkpoint, or in a transformers
    directory or hub snapshot."""
    path = hub.local(path)
    if path.is_dir():
        return str(path) if is_tokenizer_dir(path) else None
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    recorded = safe_load(path).get(TOKENIZER)
    return str(path.parent / recorded) if recorded else None


def resolve_tokenizer(
    tokenizer: str | None, weights: str | None, *, option: str | None = "--tokenizer"
) -> str | None:
    """The tokenizer to use: the one given, else the one saved with `weights`.

    When neither has one, the error names `option` (the argument that gives a tokenizer); with
    `option=None` the answer is then None and the caller decides.
    """
    if tokenizer is None and weights:
        tokenizer = weights_tokenizer(weights)
    if tokenizer is None and option is not None:
        carries = f"{weights} carries no tokenizer" if weights else "no tokenizer"
        raise ValueError(f"{carries}; give {option} DIR.")
    return tokenizer
