"""Weights from disk or the hub, and the tokenizer that goes with them: the one place both are
resolved.

Anything that names weights (`GPT.from_pretrained`, and every option of the toolkit that names
weights) takes a gpt_ft checkpoint file (its format: `checkpoint.py`), a local transformers
directory, a GGUF file or a folder holding one (`gguf_file.py`), or a hub id (`ORG/NAME[@revision]`,
see `hub.py`); the tokenizer saved with them (or carried in the GGUF file) is used unless one is
given.

The model class is a parameter (`GPT.from_pretrained` passes itself), so that this module does not
import the model it loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpt_ft.model import gguf_file, hub
from gpt_ft.model.checkpoint import Checkpoint
from gpt_ft.model.config import GPTConfig
from gpt_ft.model.lora import LoRA, add_lora, merge_lora

if TYPE_CHECKING:
    from gpt_ft.model.gpt import GPT

# What makes a folder a tokenizer: any one of a `save_pretrained` output's files, or both files of
# a BPE as OpenAI published it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
BPE_FILES = ("vocab.json", "merges.txt")


def load_weights(path: str | Path, cls: type[GPT]) -> GPT:
    """A `cls` (GPT) from a gpt_ft checkpoint file, a transformers directory, a GGUF file (or a
    folder holding one) or a hub id."""
    path = hub.local(path)
    gguf = gguf_file.find(path)
    if gguf is not None:
        return gguf_file.load(gguf, cls)
    if path.is_dir():
        from gpt_ft.model import hf

        return hf.from_pretrained(path, cls)
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    return gpt_from_checkpoint(Checkpoint.read(path), cls)


def gpt_from_checkpoint(checkpoint: Checkpoint, cls: type[GPT]) -> GPT:
    """The GPT of a gpt_ft checkpoint already read; LoRA adapters are loaded onto their base
    weights and merged."""
    config = checkpoint.require_gpt_config()
    adapters = checkpoint.adapters
    if adapters is None:
        gpt = cls(GPTConfig(**config))
        gpt.load_state_dict(checkpoint.gpt_state)
        return gpt
    gpt = load_weights(adapters.base, cls)
    if config["vocab_size"] > gpt.config.vocab_size:
        gpt.resize_token_embeddings(config["vocab_size"])
    add_lora(gpt, LoRA(**adapters.settings), new_tokens_from=adapters.new_tokens_from)
    trained = checkpoint.gpt_state
    missing = sorted({n for n, p in gpt.named_parameters() if p.requires_grad} - set(trained))
    if missing:
        raise ValueError(
            f"{checkpoint.where} lacks LoRA weights {missing[:3]}: it is not a complete LoRA checkpoint."
        )
    gpt.load_state_dict(trained, strict=False)
    return merge_lora(gpt)


def is_tokenizer_dir(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer (see `TOKENIZER_FILES`, `BPE_FILES`)."""
    return any((directory / f).is_file() for f in TOKENIZER_FILES) or all(
        (directory / f).is_file() for f in BPE_FILES
    )


def weights_tokenizer(path: str | Path) -> str | None:
    """The tokenizer of these weights: saved beside a gpt_ft checkpoint, in a transformers
    directory or hub snapshot, or carried in a GGUF file."""
    path = hub.local(path)
    gguf = gguf_file.find(path)
    if gguf is not None:
        return str(gguf)
    if path.is_dir():
        return str(path) if is_tokenizer_dir(path) else None
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    recorded = Checkpoint.read(path).tokenizer
    return str(recorded) if recorded else None


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
