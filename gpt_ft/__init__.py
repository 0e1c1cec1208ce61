"""gpt_ft: pretrain a from-scratch GPT and fine-tune it the way GPT-1 did."""

from gpt_ft.model import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
__version__ = "0.1.0"
