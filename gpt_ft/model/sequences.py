"""Packed rows laid flat on a CPU: the real tokens in one row, each sequence attended on its own.

On a CPU, PyTorch's attention kernels take packed rows only through a dense (R, 1, L, L) mask
(`PackedRows`): each row's every query against its every key, masked or not, and every layer's
matmuls over the rows' padded tails. `FlatRows` drops the tails (the batch's real tokens in one row
of N positions, their order kept) and runs SDPA's CPU flash kernel causally once per sequence
(`SequenceAttention`), which computes only each sequence's own scores. The layers see the same
tokens and positions, so the hidden states equal the dense mask's (tests/model/test_packed_kernels.py).

Per-sequence calls carry a fixed cost (the CPU flash backward's set-up, ~2 ms per call at 9 heads),
so rows of many short sequences (sentences) stay on the dense mask: `flat_rows` lays rows flat only
where the estimated work is less. On PRMBench's solutions (~420 tokens; rows of up to 1,024), a
training step of SmolLM2-135M in bf16 is 1.29x faster than on the dense mask
(benchmarks/bench_flat_rows.py).
"""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import Tensor

from gpt_ft.model.attention import PackedRows, segment_offsets
from gpt_ft.workarounds import cpu_flash_backward, cpu_flash_forward

ATTENTION_COST = 1 / 4096
"""A position's attention work per key, relative to the rest of its work in a layer (the dense
mask's kernel computes all L keys of a row; the flash kernel's backward, ~all n of a sequence)."""
SEQUENCE_COST = 64
"""A sequence's fixed cost on its own kernel calls, in positions of work (~2 ms a layer, forward
and backward, against ~70 µs a position at SmolLM2-135M's width on 2 cores)."""


class SequenceAttention(torch.autograd.Function):
    """Causal attention of each sequence of a flat row on its own: queries (1, nh, N, hs), keys and
    values (1, nkv, N, hs), `bounds` the sequences' (start, end), which cover the row. Grouped
    key/value heads are repeated for the kernel (its backward is ~15% faster so than grouped)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bounds: list[tuple[int, int]], scale: float | None):
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # each head's sequence in one piece
        parts = [cpu_flash_forward(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], scale) for s, e in bounds]
        ctx.save_for_backward(q, k, v, *(t for part in parts for t in part))
        ctx.bounds, ctx.scale, ctx.groups = bounds, scale, groups
        return torch.cat([out for out, _ in parts], dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, *saved = ctx.saved_tensors
        grads = []
        for (s, e), out, lse in zip(ctx.bounds, saved[::2], saved[1::2]):
            part = lambda t: t[:, :, s:e]  # noqa: E731
            grads.append(cpu_flash_backward(part(grad), part(q), part(k), part(v), out, lse, ctx.scale))
        dq, dk, dv = (torch.cat(g, dim=2) for g in zip(*grads))
        if ctx.groups > 1:  # each key/value head's gradient: the sum over the query heads it served
            B, nh, N, hs = dk.shape
            dk, dv = (t.view(B, nh // ctx.groups, ctx.groups, N, hs).sum(2) for t in (dk, dv))
        return dq, dk, dv, None, None


class FlatRows(PackedRows):
    """Rows of packed sequences (R, L) as one flat row (1, N) of their real tokens; attention runs
    each sequence on its own (`SequenceAttention`). `flatten` lays a row-shaped tensor flat,
    `unflatten` puts hidden states back in the rows (zero in the tails)."""

    fused_inputs = True

    def __init__(self, documents: Tensor, keep: Tensor, bounds: list[tuple[int, int]], positions: Tensor):
        self.rows, self.keep, self.bounds = documents.shape, keep, bounds
        flat = documents.flatten()[keep][None]
        super().__init__(flat, None, self.flatten(positions), None, None, max(e - s for s, e in bounds))

    def flatten(self, t: Tensor) -> Tensor:
        """(R, L, ...) -> (1, N, ...): the real tokens' entries, in order (a new tensor, not a view:
        compiled functions see the same kind of input at every layer)."""
        return t.flatten(0, 1)[None].index_select(1, self.keep)

    def unflatten(self, x: Tensor) -> Tensor:
        """(1, N, C) -> (R, L, C), zeros in the rows' tails."""
        R, L = self.rows
        return x.new_zeros(R * L, x.shape[-1]).index_copy(0, self.keep, x[0]).view(R, L, -1)

    def kernel(self, q: Tensor, dropout_p: float) -> str:
        return "sequences"

    def attend(self, kernel: str, q: Tensor, k: Tensor, v: Tensor, scale: float | None, dropout_p: float = 0):
        kind = q.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else q.dtype
        with torch.autocast(kind, enabled=False):
            q, k, v = (t.to(dtype) for t in (q, k, v))
            return SequenceAttention.apply(q, k, v, self.bounds, scale)


def flat_rows(
    documents: Tensor, cu_seqlens: Tensor | None, positions: Tensor, *, force: bool = False
) -> FlatRows | None:
    """Rows of packed sequences (`documents` (R, L) on a CPU, -1 in each row's tail) laid flat, or
    None where the dense mask costs less: R·L·(1 + L·ATTENTION_COST) positions of work against
    N + Σ n²·ATTENTION_COST + SEQUENCE_COST per sequence (`force`: laid flat regardless).
    `cu_seqlens`: where each sequence and each tail starts in the flattened rows (the collator's;
    computed when None)."""
    R, L = documents.shape
    flat = documents.flatten()
    cu = (segment_offsets(documents)[0] if cu_seqlens is None else cu_seqlens).tolist()
    lengths = [b - a for a, b, d in zip(cu, cu[1:], flat[cu[:-1]].tolist()) if d >= 0]
    N = sum(lengths)
    flat_cost = N + sum(n * n for n in lengths) * ATTENTION_COST + SEQUENCE_COST * len(lengths)
    if not lengths or (not force and flat_cost >= R * L * (1 + L * ATTENTION_COST)):
        return None
    ends = list(accumulate(lengths))
    bounds = list(zip([0] + ends[:-1], ends))
    return FlatRows(documents, (flat >= 0).nonzero().flatten(), bounds, positions)
