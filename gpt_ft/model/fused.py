"""A block's elementwise work fused into compiled kernels, where it costs more than its matmuls.

In a training step on a CPU, a Llama-family block's matmuls run near the chip's speed, while its
elementwise work (RMSNorm's powers, means and products; rotary positions, casts to bf16; SwiGLU's
product) runs as one pass over memory per op, forward and backward, each op writing a fresh
activation-sized tensor. Compiled (`torch.compile`, TorchInductor), each group is one kernel forward
and one backward, with the same arithmetic: in a training step of SmolLM2-135M on PRMBench's
solutions (2 cores, bf16-mixed), RMSNorm's forward and backward take 4-5 ms a call instead of 21,
the attention's inputs 11-14 ms a layer instead of 46, and a whole step is 1.22x faster
(benchmarks/bench_flat_rows.py).

Fused only where it pays: on a CPU with a C++ compiler (TorchInductor's CPU kernels are C++),
with gradients (training), tensors of `MIN_ELEMENTS` or more (a batch's thousands of tokens at a
width of hundreds), and not inside a graph being compiled already. Compiling costs 10-25 s a
graph on first use (dynamic in the number of tokens: one graph per function for rows laid flat,
one for whole rows, one per output dtype; TorchInductor's on-disk cache serves later processes),
so smaller work, inference and tests' tiny models keep the eager ops. The fused outputs equal the
eager ones in fp32 to rounding (tests/model/test_fused.py), and in bf16 their gradients are as
close to fp32's as the eager ones. `GPT_FT_FUSED=0` in the environment (or `ENABLED = False`)
turns fusion off.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable
from functools import cache

import torch
from torch import Tensor

ENABLED = os.environ.get("GPT_FT_FUSED", "1") != "0"
"""Fuse elementwise work where `wanted` says it pays; False: always the eager ops."""
MIN_ELEMENTS = 1 << 20
"""The smallest tensor (elements) whose elementwise work is fused."""
BACKEND = "inductor"
"""`torch.compile`'s backend for the fused functions."""

_compiled: dict[object, Callable] = {}
log = logging.getLogger(__name__)


@cache
def has_compiler() -> bool:
    """Whether the C++ compiler TorchInductor's CPU kernels take is there: `$CXX` where it is set,
    else g++ (clang++ on macOS), as TorchInductor chooses; a compiler of another name is not taken."""
    return bool(shutil.which(os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")))


def wanted(x: Tensor) -> bool:
    """Whether the elementwise work on `x` runs fused (see the module's docstring)."""
    return (
        ENABLED
        and x.device.type == "cpu"
        and torch.is_grad_enabled()
        and x.numel() >= MIN_ELEMENTS
        and not torch.compiler.is_compiling()
        and (BACKEND != "inductor" or has_compiler())
    )


def compiled(key: str, fn: Callable) -> Callable:
    """`fn` compiled once per process (dynamic shapes) on `BACKEND`."""
    if (key, BACKEND) not in _compiled:
        if not _compiled:
            log.info("Compiling fused kernels for the blocks' elementwise ops (about a minute, once).")
        _compiled[key, BACKEND] = torch.compile(fn, dynamic=True, backend=BACKEND)
    return _compiled[key, BACKEND]


def rms_norm(
    x: Tensor, weight: Tensor, eps: float, offset: bool, dtype: torch.dtype, weight_fp32: bool = False
) -> Tensor:
    """`norms.RMSNorm`'s arithmetic (fp32), its output in `dtype`."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (h * (1.0 + weight.float())).to(dtype)
    if weight_fp32:  # OLMo's: the weight's product in fp32 too
        return (weight * h).to(dtype)
    return (weight * h.to(x.dtype)).to(dtype)


def gated(act: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """SwiGLU's act(gate) * up of the stacked gate and up (..., 2F)."""

    def swiglu(h: Tensor) -> Tensor:
        gate, up = h.chunk(2, dim=-1)
        return act(gate) * up

    return swiglu


def in_autocast_dtype(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The tensors in autocast's dtype where it is on, as SDPA casts its inputs (rotary positions
    leave q and k in fp32, a KV cache keeps its own dtype): for kernels that do not cast them."""
    kind = tensors[0].device.type
    if not torch.is_autocast_enabled(kind):
        return tensors
    return tuple(t.to(torch.get_autocast_dtype(kind)) for t in tensors)


def attention_inputs(qkv: Tensor, heads: tuple[int, int, int], rotary: tuple[Tensor, Tensor]):
    """`split_heads` compiled, in the compute dtype (autocast's, or `qkv`'s)."""
    kind = qkv.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else qkv.dtype
    return compiled("split_heads", split_heads)(qkv, heads, *rotary, dtype)


def split_heads(
    qkv: Tensor, heads: tuple[int, int, int], cos: Tensor, sin: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, keys and values (B, nh, T, hs), each contiguous in `dtype`, from `c_attn`'s output
    (B, T, (nh + 2 nkv) hs): queries and keys rotated (`rope.rotate`'s arithmetic, in fp32 as the
    eager ops under autocast; where cos and sin are narrower than the head, its first features only);
    keys and values (B, nkv, T, hs), grouped as they are."""
    nh, nkv, hs = heads
    B, T, _ = qkv.shape
    q, k, v = qkv.split([nh * hs, nkv * hs, nkv * hs], dim=2)
    q, k, v = (t.view(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))
    turned = cos.shape[-1]
    half = turned // 2

    def rotate(x: Tensor) -> Tensor:
        x = x.to(cos.dtype)
        if x.shape[-1] != turned:  # GPT-NeoX: the first features of each head turn, the rest pass
            return torch.cat([rotate(x[..., :turned]), x[..., turned:]], dim=-1)
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    q, k, v = rotate(q).to(dtype), rotate(k).to(dtype), v.to(dtype)
    return q.contiguous(), k.contiguous(), v.contiguous()
