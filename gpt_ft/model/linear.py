"""`Linear`: `nn.Linear` whose product of a few rows, on a CPU, uses every thread.

A decode step multiplies one row a sequence by each weight matrix. On a CPU, torch hands such a
product of one to a few dozen rows to MKL, which runs it on one thread on AMD processors
(pytorch/pytorch#96643): the LM head of a batch-1 decode step reads its weights at 10 GB/s where two
threads read memory at 26 GB/s (2 cores). Here the weight's output features are cut into one slice
a thread, multiplied as one batched product (`torch.bmm`, whose slices run in parallel) and put back
side by side: each output is the same dot product, summed the same way, equal to `F.linear`'s bit
for bit on the machines measured (tests/model/test_linear.py allows rounding). SmolLM2-135M's
greedy decoding on 2 cores: 1.46x faster at batch 1, 1.28x at batch 16 (benchmarks/bench_generate.py).

Only where it pays and changes nothing else: float32 on a CPU, without autograd or autocast, not
under torch.compile, a few rows (`ROWS`) and a weight of at least `WEIGHT` elements. Pure torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROWS = 64
"""Products of at most this many rows are split (2 cores, one matrix: 1.5-2.4x at 1 to 16 rows,
1.1-1.4x at 64, none from about 256)."""
WEIGHT = 1 << 18
"""...and weights of at least this many elements: smaller ones, read from the cache, gain nothing (a
decode step reads each weight from memory, where 576 x 576 still gains)."""
SLICE = 32
"""Each thread's slice of output features is a multiple of this (the rest, fewer than this a thread,
goes to `F.linear`): slices aligned so that MKL runs the same kernel, and the same sums, as on the
whole weight."""


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, a few rows on a CPU split over its threads (see the module)."""
    if torch.is_grad_enabled() or not x.is_cpu or not split_pays(x, weight):
        return F.linear(x, weight, bias)
    n, c = weight.shape
    slices = min(torch.get_num_threads(), n // SLICE)
    size = n // slices // SLICE * SLICE
    split = size * slices
    rows = x.reshape(1, -1, c).expand(slices, -1, c)
    sliced = weight[:split].view(slices, size, c).transpose(1, 2)  # (slices, c, size)
    if bias is None:
        y = torch.bmm(rows, sliced)
    else:  # the bias as the product's starting value, as F.linear's addmm adds it
        y = torch.baddbmm(bias[:split].view(slices, 1, size), rows, sliced)
    y = y.transpose(0, 1).reshape(-1, split)  # (rows, split): the slices side by side again
    if split < n:  # the last features, fewer than SLICE a thread
        rest = F.linear(x.reshape(-1, c), weight[split:], None if bias is None else bias[split:])
        y = torch.cat([y, rest], 1)
    return y.view(*x.shape[:-1], n)


def split_pays(x: Tensor, weight: Tensor) -> bool:
    """Whether `linear` splits the product of `x` (its rows) and `weight` over the CPU's threads."""
    return (
        x.dtype == weight.dtype == torch.float32
        and type(weight) in (Tensor, nn.Parameter)  # not a quantized tensor subclass (QLoRA's NF4)
        and weight.is_cpu
        and weight.dim() == 2
        and weight.numel() >= WEIGHT
        and x.numel() <= ROWS * x.shape[-1]
        and x.numel() > 0
        and torch.get_num_threads() > 1
        and weight.shape[0] >= 2 * SLICE
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


class Linear(nn.Linear):
    """`nn.Linear` (the same parameters and state dict) whose forward is `linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
