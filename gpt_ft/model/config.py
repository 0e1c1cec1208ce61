"""GPTConfig: the shape and regularisation of a GPT, and the named presets."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import torch.nn.functional as F

Activation = Literal["gelu_tanh", "gelu", "relu", "silu"]

ACTIVATIONS = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-1 and GPT-2 both use the tanh form
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


@dataclass
class GPTConfig:
    """Shape and regularisation of a GPT. The defaults are GPT-1 (Radford et al. 2018)."""

    vocab_size: int = 40478
    """Number of token embeddings: the BPE vocabulary plus any special tokens."""
    n_positions: int = 512
    """Context length: the number of learned position embeddings."""
    n_embd: int = 768
    """Width of the residual stream."""
    n_layer: int = 12
    """Number of transformer blocks."""
    n_head: int = 12
    """Number of attention heads; must divide n_embd."""
    n_inner: int | None = None
    """Width of the feed-forward layer; None means 4 * n_embd."""
    pre_ln: bool = False
    """False: GPT-1's post-LN blocks, no final LayerNorm. True: GPT-2's pre-LN blocks plus a final LN."""
    activation: Activation = "gelu_tanh"
    """Feed-forward nonlinearity; GPT-1 and GPT-2 use GELU in its tanh form."""
    embd_pdrop: float = 0.1
    """Dropout on the sum of token and position embeddings."""
    attn_pdrop: float = 0.1
    """Dropout on the attention probabilities."""
    resid_pdrop: float = 0.1
    """Dropout on the output of each attention and feed-forward sublayer."""
    layer_norm_epsilon: float = 1e-5
    """Epsilon of every LayerNorm."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weights and embeddings."""
    vocab_multiple: int = 64
    """The token embedding gets a multiple of this many rows, for faster kernels; the extra rows
    are never looked up, predicted, sampled or counted in the loss (1: no padding)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_head", "vocab_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {getattr(self, name)}.")
        if self.n_layer < 0:
            raise ValueError(f"GPTConfig.n_layer must be >= 0, got {self.n_layer}.")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"choose n_head among the divisors of {self.n_embd}."
            )
        if self.n_inner is not None and self.n_inner < 1:
            raise ValueError(f"GPTConfig.n_inner must be a positive integer or None, got {self.n_inner}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"GPTConfig.activation={self.activation!r} is not supported; allowed: {sorted(ACTIVATIONS)}."
            )
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"GPTConfig.{name} must be in [0, 1), got {getattr(self, name)}.")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def from_name(cls, name: str, **overrides) -> GPTConfig:
        """A preset by name (see `PRESETS`), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"Unknown GPT preset {name!r}; available presets: {', '.join(PRESETS)}.")
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"Unknown GPTConfig field(s) {sorted(unknown)} given to from_name({name!r}).")
        return cls(**{**PRESETS[name], **overrides})


_GPT2 = dict(vocab_size=50257, n_positions=1024, pre_ln=True)

PRESETS: dict[str, dict] = {
    # GPT-1 (paper §4.1): 12 layers, 768 wide, 12 heads, FFN 3072, context 512, BPE vocab 40,478.
    "gpt1": {},
    # GPT-2 (Radford et al. 2019), the four released sizes.
    "gpt2": dict(_GPT2),
    "gpt2-medium": dict(_GPT2, n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": dict(_GPT2, n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": dict(_GPT2, n_embd=1600, n_layer=48, n_head=25),
    # GPT-1-shaped models small enough to train on a laptop CPU.
    "gpt-mini": dict(n_embd=256, n_layer=4, n_head=4),
    "gpt-micro": dict(n_positions=128, n_embd=64, n_layer=2, n_head=2),
}
