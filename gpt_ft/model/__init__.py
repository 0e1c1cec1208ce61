"""The model layer: a GPT in pure PyTorch (no Lightning, no datasets), its caches, generation,
weight conversion to and from transformers, and loading weights from disk."""

from gpt_ft.model.cache import KVCache, SharedPrefix
from gpt_ft.model.config import PRESETS, GPTConfig
from gpt_ft.model.gpt import GPT, Block

__all__ = ["GPT", "GPTConfig", "PRESETS", "Block", "KVCache", "SharedPrefix"]
