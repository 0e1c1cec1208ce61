"""Rotary position embeddings (Su et al. 2021) as Llama, Qwen, Mistral, Phi-3, Gemma 3 and GPT-NeoX
use them.

A query or key vector of head size hs is rotated, pair by pair, by angles `position * inv_freq`;
the pairs are (i, i + hs/2), the "rotate half" layout of the transformers checkpoints, so their
weights load unpermuted. GPT-NeoX rotates the first `rotary_dim` features of each head alone, its
pairs (i, i + rotary_dim/2), and passes the rest as they are. Scaled frequencies: linear
(positions divided by a factor), Llama 3's (long wavelengths divided by a factor, short ones
kept, a smooth blend between), YaRN (Peng et al. 2023: the same split by how often each pair
turns over the original context, with a linear ramp between, and cos and sin scaled by its
attention factor) and LongRoPE (Ding et al. 2024; Phi-3.5, Phi-4-mini: each pair's frequency divided
by a factor of its own, from one list while the positions stay within the original context and
from another once they pass it, cos and sin scaled too), each as transformers computes it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gpt_ft.model.config import GPTConfig


def inverse_frequencies(
    config: GPTConfig, device: torch.device | None = None, local: bool = False, long: bool = False
) -> Tensor:
    """The rotary_dims/2 rotation frequencies (fp32), scaled as `config.rope_scaling` says; `local`: those
    of the sliding-window layers, from `config.rope_local_theta` and unscaled; `long`: LongRoPE's for
    positions past the original context (its short factors otherwise)."""
    dim = config.rotary_dims
    theta = config.rope_local_theta if local else config.rope_theta
    powers = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    inv_freq = 1.0 / powers
    if local:
        return inv_freq
    scaling = config.rope_scaling or {}
    if config.rope_type == "longrope":
        return 1.0 / (_table(scaling["long_factor" if long else "short_factor"], device) * powers)
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
    if config.rope_type == "yarn":
        return _yarn(dim, theta, scaling, device)
    return inv_freq


_TABLES: dict[tuple, Tensor] = {}


def _table(values, device: torch.device | None) -> Tensor:
    """`values` (LongRoPE's factors) as an fp32 tensor on `device`, made there once: a decode step
    captured as a CUDA graph may copy nothing from the host (compiled, a constant of the graph)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=torch.float32, device=device)
    key = (str(device), tuple(float(v) for v in values))
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(key[1], dtype=torch.float32, device=device)
    return _TABLES[key]


def _yarn(dim: int, theta: float, scaling: dict, device: torch.device | None) -> Tensor:
    """YaRN's frequencies: a pair that turns more than `beta_fast` times over the original context
    kept, one that turns fewer than `beta_slow` times divided by the factor, a linear ramp between
    (over the pairs' indices, their bounds rounded outward unless `truncate` is false)."""
    factor, context = scaling["factor"], scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def index(turns: float) -> float:  # the pair index that turns `turns` times over the context
        return dim * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = index(fast), index(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    powers = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    return 1.0 / (factor * powers) * ramp + 1.0 / powers * (1 - ramp)


def attention_factor(config: GPTConfig) -> float:
    """What cos and sin are multiplied by: YaRN's or LongRoPE's attention factor (given, or from the
    factor by which the context grew: YaRN's 0.1 ln(factor) + 1, or the ratio of two such with
    `mscale` and `mscale_all_dim`; LongRoPE's sqrt(1 + ln(factor) / ln(original context)), its factor
    n_positions / original context where none is given); 1 for every other scaling."""
    scaling = config.rope_scaling or {}
    if config.rope_type not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    context = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or config.n_positions / context
    if config.rope_type == "longrope":
        return longrope_attention(factor, context)

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
    return mscale()


def longrope_attention(factor: float, context: int) -> float:
    """LongRoPE's attention factor for a context grown `factor` times from `context` positions."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(context))


def cos_sin(
    config: GPTConfig,
    position_ids: Tensor,
    dtype: torch.dtype,
    local: bool = False,
    lengths: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles at `position_ids` (T,) or (B, T): (1 or B, 1, T, rotary_dims), for every head
    (`local`: of the sliding-window layers, see `inverse_frequencies`). LongRoPE's factors are each
    sequence's own: the long ones where its length passes the original context, from `lengths` (each
    row's (B, 1), or each token's sequence's (B, T)) or else each row's largest position plus one."""
    inv_freq = inverse_frequencies(config, position_ids.device, local)
    if config.rope_type == "longrope" and not local:
        if lengths is None:
            lengths = position_ids.amax(dim=-1, keepdim=True) + 1
        past = (lengths > config.rope_scaling["original_max_position_embeddings"])[..., None]
        inv_freq = torch.where(past, inverse_frequencies(config, position_ids.device, long=True), inv_freq)
    freqs = position_ids[..., None].float() * inv_freq  # (.., T, hs/2)
    angles = torch.cat([freqs, freqs], dim=-1)  # (.., T, rotary_dims)
    if angles.ndim == 2:
        angles = angles[None]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    if not local and (scale := attention_factor(config)) != 1.0:  # YaRN's
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def sequence_lengths(documents: Tensor, position_ids: Tensor) -> Tensor:
    """Each token's packed sequence's length (B, T), its largest position plus one (a shared context
    with its continuations: the longest of them), from `documents` (B, T; -1 in a row's tail)."""
    ids, tail = documents.clamp(min=0), documents < 0  # (the tail's positions count for no sequence)
    counted = position_ids.masked_fill(tail, 0)
    most = torch.zeros_like(position_ids).scatter_reduce(1, ids, counted, "amax", include_self=False)
    return most.gather(1, ids) + 1


def real_lengths(config: GPTConfig, position_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
    """LongRoPE's: each row's length (B, 1), its real tokens' largest position plus one (the last T
    columns of `attention_mask` are this pass's tokens); None where there is no mask or no LongRoPE."""
    if config.rope_type != "longrope" or attention_mask is None:
        return None
    real = attention_mask[:, -position_ids.shape[-1] :].bool()
    return (position_ids.expand(real.shape) * real).amax(dim=-1, keepdim=True) + 1


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, nh, T, hs) rotated: x * cos + rotate_half(x) * sin; where cos and sin are narrower than
    the head (GPT-NeoX's partial rotary), its first features only, the rest kept."""
    if cos.shape[-1] != x.shape[-1]:
        turned = cos.shape[-1]
        return torch.cat([rotate(x[..., :turned], cos, sin), x[..., turned:]], dim=-1)
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin
