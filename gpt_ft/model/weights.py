"""Weights from disk or the hub, and the tokenizer that goes with them: the one place both are
resolved.

Anything that names weights (`--model.init_from`, `gpt-ft generate --ckpt_path`, `gpt-ft suite
--init_from`, `GPT.from_pretrained`) takes a gpt_ft `.ckpt`, a local transformers directory or a
hub id (`ORG/NAME[@revision]`, see `hub.py`); the tokenizer saved with them is used unless one is
given.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from gpt_ft.model import hub
from gpt_ft.model.config import GPTConfig
from gpt_ft.model.gpt import GPT
from gpt_ft.model.lora import LoRA, add_lora, merge_lora

SPECIAL_TOKEN_ROOM = 8  # start, delim, extract and pad (GPT-1 §3.3), with room to spare
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
    """A GPT from a checkpoint of this toolkit (.ckpt), a transformers directory or a hub id."""
    path = hub.local(path)
    if path.is_dir():
        return GPT.from_pretrained(path)
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    return gpt_from_checkpoint(safe_load(path), path)


def gpt_from_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> GPT:
    """The GPT of a gpt_ft checkpoint already read (`safe_load`); LoRA adapters are loaded onto
    their base weights and merged."""
    config = checkpoint.get("gpt_config")
    if config is None:
        raise ValueError(f"{path} is not a gpt_ft checkpoint: it records no model config (gpt_config).")
    adapters = checkpoint.get("lora")
    if adapters is None:
        gpt = GPT(GPTConfig(**config))
        gpt.load_state_dict(submodule_state(checkpoint, "gpt"))
        return gpt
    settings = {k: v for k, v in adapters.items() if k not in ("base", "new_tokens_from")}
    gpt = load_weights(adapters["base"])
    if config["vocab_size"] > gpt.config.vocab_size:
        gpt.resize_token_embeddings(config["vocab_size"])
    add_lora(gpt, LoRA(**settings), new_tokens_from=adapters["new_tokens_from"])
    trained = submodule_state(checkpoint, "gpt")
    missing = sorted({n for n, p in gpt.named_parameters() if p.requires_grad} - set(trained))
    if missing:
        raise ValueError(
            f"{path} lacks LoRA weights {missing[:3]}: the file is not a complete LoRA checkpoint."
        )
    gpt.load_state_dict(trained, strict=False)
    return merge_lora(gpt)


def base_reference(init_from: str) -> str:
    """How a LoRA checkpoint names its base weights: an absolute path, or the hub id as given."""
    local = Path(init_from).expanduser()
    return str(local.resolve()) if local.exists() else init_from


def submodule_state(checkpoint: dict[str, Any], name: str) -> dict[str, Any]:
    """The weights of the LightningModule's submodule `name` (gpt, head), their prefix dropped."""
    prefix = name + "."
    return {k.removeprefix(prefix): v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}


def weights_tokenizer(path: str | Path) -> str | None:
    """The tokenizer of these weights: saved beside a gpt_ft checkpoint, or in a transformers
    directory or hub snapshot."""
    path = hub.local(path)
    if path.is_dir():
        has_tokenizer = any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")
        )
        return str(path) if has_tokenizer else None
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    recorded = safe_load(path).get("tokenizer")
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


def build_gpt(
    *,
    preset: str,
    overrides: dict[str, Any] | None,
    init_from: str | None,
    transfer_layers: int | None,
    vocab_size: int | None,
    lora: LoRA | None = None,
) -> GPT:
    """The GPT a run starts from: loaded weights (only dropouts may change, the first
    `transfer_layers` blocks kept) or a fresh preset, grown to fit the tokenizer's special tokens;
    with `lora`, the loaded weights frozen and adapters added (only the new tokens' rows train)."""
    if init_from:
        gpt = load_weights(init_from)
        if overrides:
            for key, value in overrides.items():
                if key.endswith("pdrop"):
                    setattr(gpt.config, key, value)
                elif getattr(gpt.config, key, None) != value:
                    raise ValueError(
                        f"overrides.{key} cannot change a loaded model (it has {key}="
                        f"{getattr(gpt.config, key, None)}); only dropouts can."
                    )
            gpt = with_dropout(gpt)
        if transfer_layers is not None:
            gpt.reset_blocks(transfer_layers)
    else:
        if transfer_layers is not None:
            raise ValueError("transfer_layers needs pretrained weights: give --model.init_from.")
        gpt = GPT(GPTConfig.from_name(preset, **{**(overrides or {}), "vocab_size": vocab_size or 40478}))
    if init_from and vocab_size is not None:
        check_tokenizer_fits(vocab_size, gpt.config.vocab_size, init_from)
    loaded_vocab = gpt.config.vocab_size
    if vocab_size is not None and vocab_size > gpt.config.vocab_size:
        gpt.resize_token_embeddings(vocab_size)  # the special tokens the weights lack (GPT-1 §3.3)
    if lora is not None:
        if not init_from:
            raise ValueError("lora adapts pretrained weights: give --model.init_from.")
        add_lora(gpt, lora, new_tokens_from=loaded_vocab)
    return gpt


def check_tokenizer_fits(vocab_size: int, weights_vocab: int, init_from: str) -> None:
    """The tokenizer may add the few special tokens the weights lack, nothing else."""
    if not weights_vocab <= vocab_size <= weights_vocab + SPECIAL_TOKEN_ROOM:
        raise ValueError(
            f"The tokenizer has {vocab_size} tokens but the weights in {init_from} have {weights_vocab}: "
            "they were not made for each other; use the tokenizer saved with the weights."
        )


def with_dropout(gpt: GPT) -> GPT:
    """Apply the config's dropout rates to an existing model's modules."""
    c = gpt.config
    gpt.drop.p = c.embd_pdrop
    for block in gpt.h:
        block.attn.attn_pdrop = c.attn_pdrop
        block.attn.resid_dropout.p = c.resid_pdrop
        block.mlp.dropout.p = c.resid_pdrop
    return gpt
