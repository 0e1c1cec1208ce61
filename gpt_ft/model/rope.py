"""Rotary position embeddings (Su et al. 2021) as Llama, Qwen, Mistral, Phi-3, Gemma 3 and GPT-NeoX
use them.

A query or key vector of head size hs is rotated, pair by pair, by angles `position * inv_freq`;
the pairs are (i, i + hs/2), the "rotate half" layout of the transformers checkpoints, so their
weights load unpermuted. GPT-NeoX rotates the first `rotary_dim` features of each head alone, its
pairs (i, i + rotary_dim/2), and passes the rest as they are. Scaled frequencies: linear
(positions divided by a factor) and Llama 3's (long wavelengths divided by a factor, short ones
kept, a smooth blend between).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpt_ft.model.config import GPTConfig


def inverse_frequencies(config: GPTConfig, device: torch.device | None = None, local: bool = False) -> Tensor:
    """The rotary_dims/2 rotation frequencies (fp32), scaled as `config.rope_scaling` says; `local`: those
    of the sliding-window layers, from `config.rope_local_theta` and unscaled."""
    dim = config.rotary_dims
    theta = config.rope_local_theta if local else config.rope_theta
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    if local:
        return inv_freq
    scaling = config.rope_scaling or {}
    if config.rope_type == "linear":
        return inv_freq / scaling["factor"]
    if config.rope_type == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        context = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
        smooth = (context / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= context / high) & (wavelength <= context / low)
        return torch.where(medium, blended, scaled)
    return inv_freq


def cos_sin(
    config: GPTConfig, position_ids: Tensor, dtype: torch.dtype, local: bool = False
) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles at `position_ids` (T,) or (B, T): (1 or B, 1, T, rotary_dims), for every head
    (`local`: of the sliding-window layers, see `inverse_frequencies`)."""
    inv_freq = inverse_frequencies(config, position_ids.device, local)
    freqs = position_ids[..., None].float() * inv_freq  # (.., T, hs/2)
    angles = torch.cat([freqs, freqs], dim=-1)  # (.., T, rotary_dims)
    if angles.ndim == 2:
        angles = angles[None]
    return angles.cos()[:, None].to(dtype), angles.sin()[:, None].to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, nh, T, hs) rotated: x * cos + rotate_half(x) * sin; where cos and sin are narrower than
    the head (GPT-NeoX's partial rotary), its first features only, the rest kept."""
    if cos.shape[-1] != x.shape[-1]:
        turned = cos.shape[-1]
        return torch.cat([rotate(x[..., :turned], cos, sin), x[..., turned:]], dim=-1)
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin
