"""The model layer: a GPT in pure PyTorch (no Lightning, no datasets, no files, no hub), its
caches, LoRA and generation. Weights in and out live beside it, in `gpt_ft.weights`."""

from gpt_ft.model.cache import KVCache, SharedPrefix
from gpt_ft.model.config import PRESETS, GPTConfig
from gpt_ft.model.gpt import GPT, Block

__all__ = ["GPT", "GPTConfig", "PRESETS", "Block", "KVCache", "SharedPrefix"]
