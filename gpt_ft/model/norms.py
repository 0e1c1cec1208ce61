"""The normalisations of a block: LayerNorm (GPT-1, GPT-2), RMSNorm (Llama, Qwen, Mistral, Phi-3),
Gemma's RMSNorm and OLMo's; `norm(config, dim)` builds the one a config names."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gpt_ft.model import fused
from gpt_ft.model.config import GPTConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight, normalised in fp32 (Llama's LayerNorm without mean or bias).

    `offset`: Gemma's form, x / sqrt(mean(x²) + eps) * (1 + weight), all in fp32 before the cast
    back; its weight starts at zero. `weight_fp32`: OLMo's, weight * (x / sqrt(mean(x²) + eps)) in
    fp32 (the weight's dtype promoted), cast to x's dtype last.

    `feeds_matmul`: its output only goes into a matmul (a block's ln_1, ln_2), so under autocast
    the fused form (`fused.rms_norm`) may hand it over already cast, as the matmul would cast it.
    """

    def __init__(self, dim: int, eps: float, offset: bool = False, weight_fp32: bool = False) -> None:
        super().__init__()
        self.eps, self.offset, self.weight_fp32 = eps, offset, weight_fp32
        self.feeds_matmul = False
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, 0.0 if self.offset else 1.0)

    def forward(self, x: Tensor) -> Tensor:
        kind = x.device.type
        kept = self.offset or self.weight_fp32  # their output: x's dtype
        dtype = x.dtype if kept else torch.promote_types(self.weight.dtype, x.dtype)
        if not fused.wanted(x):
            return fused.rms_norm(x, self.weight, self.eps, self.offset, dtype, self.weight_fp32)
        if self.feeds_matmul and torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
        norm = fused.compiled("rms_norm", fused.rms_norm)
        return norm(x, self.weight, self.eps, self.offset, dtype, self.weight_fp32)


def norm(config: GPTConfig, dim: int | None = None) -> nn.Module:
    """The config's normalisation over `dim` features (default n_embd)."""
    dim = config.n_embd if dim is None else dim
    if config.norm == "layernorm":
        return nn.LayerNorm(dim, eps=config.layer_norm_epsilon)
    kind = config.norm
    return RMSNorm(dim, config.layer_norm_epsilon, kind == "gemma_rmsnorm", kind == "rmsnorm_fp32")
