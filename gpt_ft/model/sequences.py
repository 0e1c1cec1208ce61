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

from contextlib import contextmanager
from functools import cache
from itertools import accumulate

import torch
from torch import Tensor

from gpt_ft.model import fused
from gpt_ft.model.attention import PackedRows, segment_offsets
from gpt_ft.workarounds.kernels import cpu_flash_backward, cpu_flash_forward, mkldnn_bf16_supported

ATTENTION_COST = 1 / 4096
"""A position's attention work per key, relative to the rest of its work in a layer (the dense
mask's kernel computes all L keys of a row; the flash kernel's backward, ~all n of a sequence)."""
SEQUENCE_COST = 64
"""A sequence's fixed cost on its own kernel calls, in positions of work (~2 ms a layer, forward
and backward, against ~70 µs a position at SmolLM2-135M's width on 2 cores)."""
SCORES_LONGEST = 640
"""bf16 sequences up to this long take their attention backward as matmuls over their whole scores
(`scores_backward`), longer ones SDPA's CPU flash backward (at 9 heads of 64 on 2 cores with AMX:
1.3-2.1x faster up to 410 positions, about even from 550 to 700, slower at 1,024:
benchmarks/bench_flat_rows.py --backward)."""
_causal_bias: dict[torch.device, Tensor] = {}


class SequenceAttention(torch.autograd.Function):
    """Causal attention of each sequence of a flat row on its own: queries (1, nh, N, hs), keys and
    values (1, nkv, N, hs), `bounds` the sequences' (start, end), which cover the row. Forward on
    SDPA's CPU flash kernel (grouped key/value heads as they are); backward on `scores_backward`
    where it is faster, else on the flash kernel's backward (key/value heads repeated for it: ~15%
    faster so than grouped)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bounds: list[tuple[int, int]], scale: float | None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # each head's sequence in one piece
        parts = [cpu_flash_forward(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], scale) for s, e in bounds]
        ctx.save_for_backward(q, k, v, *(t for part in parts for t in part))
        ctx.bounds, ctx.scale = bounds, q.shape[-1] ** -0.5 if scale is None else scale
        return torch.cat([out for out, _ in parts], dim=2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, *saved = ctx.saved_tensors
        scores = scores_backward_runs(q)
        groups = q.shape[1] // k.shape[1]
        grads = []
        for (s, e), out, lse in zip(ctx.bounds, saved[::2], saved[1::2]):
            part = [t[:, :, s:e] for t in (grad, q, k, v)]
            if scores and e - s <= SCORES_LONGEST:
                grads.append(scores_backward(*part, out, lse, ctx.scale))
                continue
            g, q_i, k_i, v_i = part
            if groups > 1:
                k_i, v_i = k_i.repeat_interleave(groups, dim=1), v_i.repeat_interleave(groups, dim=1)
            dq, dk, dv = cpu_flash_backward(g, q_i, k_i, v_i, out, lse, ctx.scale)
            if groups > 1:  # each key/value head's gradient: the sum over the query heads it served
                dk, dv = (t.unflatten(1, (-1, groups)).sum(2) for t in (dk, dv))
            grads.append((dq, dk, dv))
        dq, dk, dv = (torch.cat(g, dim=2) for g in zip(*grads))
        return dq, dk, dv, None, None


def scores_backward_runs(q: Tensor) -> bool:
    """Whether `scores_backward` takes the backward of bf16 queries `q`: with fused kernels (a C++
    compiler), bf16 matmul units (AVX-512 BF16 or AMX) and oneDNN's fp32 matmuls on them."""
    return (
        q.dtype == torch.bfloat16
        and fused.ENABLED
        and fused.has_compiler()
        and not torch.compiler.is_compiling()
        and hasattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision")
        and bf16_units()
    )


@cache
def bf16_units() -> bool:
    """Whether this CPU has bf16 matrix units (asked once a process)."""
    return mkldnn_bf16_supported()


@contextmanager
def bf16_products():
    """fp32 matmuls on oneDNN's bf16 units (bf16 products, fp32 sums): exact for bf16 inputs."""
    settings = torch.backends.mkldnn.matmul
    before, settings.fp32_precision = settings.fp32_precision, "bf16"
    try:
        yield
    finally:
        settings.fp32_precision = before


def scores_backward(grad, q, k, v, out, lse, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The flash backward of one causal sequence as five batched matmuls: queries (1, nh, n, hs),
    keys and values (1, nkv, n, hs), bf16; `out` and `lse` the flash forward's. Each key/value head
    with its query heads in one matmul (nh / nkv · n rows). The scores and the gradient of the
    probabilities are recomputed in fp32 (bf16 products summed in fp32, as the flash kernel's), the
    probabilities and the scores' gradient rounded to bf16 for the other three (as FlashAttention-2's
    backward); dk and dv summed over each group in fp32. Gradients as close to fp64's as the flash
    kernel's or closer (tests/model/test_packed_kernels.py)."""
    _, nh, n, hs = q.shape
    nkv = k.shape[1]
    rows = lambda t: t.reshape(nkv, nh // nkv * n, -1)  # noqa: E731  (nkv, g n, ...)
    q, do, k, v = rows(q), rows(grad), k[0], v[0]
    delta = (do.float() * rows(out).float()).sum(-1, keepdim=True)
    with bf16_products():
        s = torch.bmm(q.float(), k.float().transpose(1, 2))  # (nkv, g n, n)
        dp = torch.bmm(do.float(), v.float().transpose(1, 2))
    if (bias := _causal_bias.get(q.device)) is None or len(bias) < n:
        side = max(n, SCORES_LONGEST)
        bias = _causal_bias[q.device] = torch.full((side, side), float("-inf"), device=q.device).triu_(1)
    groups = lambda t: t.unflatten(1, (-1, n))  # noqa: E731  (nkv, g, n, ...)
    p, ds = fused.compiled("score_grads", score_grads)(
        groups(s), bias[:n, :n], groups(rows(lse[..., None])), groups(dp), groups(delta), scale
    )
    p, ds = p.flatten(1, 2), ds.flatten(1, 2)
    dq = torch.bmm(ds, k).view(1, nh, n, hs)
    dk, dv = torch.bmm(ds.transpose(1, 2), q), torch.bmm(p.transpose(1, 2), do)
    return dq, dk[None], dv[None]


def score_grads(s: Tensor, bias: Tensor, lse: Tensor, dp: Tensor, delta: Tensor, scale: float):
    """The probabilities exp(scale s + bias - lse) and the scores' gradient p (dp - delta) scale,
    both bf16, of fp32 scores s and their probabilities' gradient dp (nkv, g, n, n); `bias` the
    causal mask (n, n: 0 or -inf), `lse` and `delta` (nkv, g, n, 1)."""
    p = torch.exp(s * scale + bias - lse)
    return p.to(torch.bfloat16), (p * (dp - delta) * scale).to(torch.bfloat16)


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
