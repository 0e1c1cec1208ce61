"""torch's attention kernels beyond SDPA, imported on first use (`load`): FlashAttention-2's
variable-length kernel (`varlen_attn`, torch >= 2.9, CUDA, bf16/fp16), with attention dropout
(`FlashVarlenDropout`), and FlexAttention (torch >= 2.5). Their modules load TorchDynamo, over a
second that a command on a CPU, or one that only decodes, never needs. Pure torch."""

from __future__ import annotations

import inspect

import torch

from gpt_ft.workarounds.kernels import flash_varlen_backward, flash_varlen_forward

UNLOADED = object()
varlen_attn = create_block_mask = flex_attention = UNLOADED  # None where torch lacks them
VARLEN: set[str] = set()
"""The keywords `varlen_attn` takes (they moved between releases)."""


def load() -> None:
    """Imports the kernels that are not yet (a test's stand-in, set before, stays)."""
    global varlen_attn, VARLEN, create_block_mask, flex_attention
    if varlen_attn is UNLOADED:
        try:
            from torch.nn.attention.varlen import varlen_attn

            VARLEN = set(inspect.signature(varlen_attn).parameters)
        except ImportError:
            varlen_attn = None
    if flex_attention is UNLOADED:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError:
            create_block_mask = flex_attention = None


class FlashVarlenDropout(torch.autograd.Function):
    """FlashAttention-2's variable-length causal kernel with attention dropout, which `varlen_attn`
    does not draw: the forward and backward ops SDPA's own flash path runs, on packed (N, heads, hs)
    queries, keys and values. The forward's random state goes to the backward, which redraws the
    same mask. `left`: keys a query sees behind it (-1: all)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, dropout_p, scale, left):
        out, lse, rng, unused = flash_varlen_forward(q, k, v, cu_seqlens, max_seqlen, dropout_p, scale, left)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, rng, unused)
        ctx.options = (max_seqlen, dropout_p, scale, left)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, cu_seqlens, rng, unused = ctx.saved_tensors
        max_seqlen, dropout_p, scale, left = ctx.options
        dq, dk, dv = flash_varlen_backward(
            grad.contiguous(), q, k, v, out, lse, cu_seqlens, max_seqlen, dropout_p, rng, unused, scale, left
        )
        return dq, dk, dv, None, None, None, None, None


_compiled_flex = None


def flex(device: torch.device):
    """FlexAttention as it runs fast: compiled on a GPU (eager it is a reference implementation)."""
    global _compiled_flex
    if device.type != "cuda":
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex
