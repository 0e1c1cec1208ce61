"""The contrastive losses of embedding models, over the whole batch (every process's under DDP,
gathered with their gradients, so that two processes compute the loss of one with both halves):
InfoNCE with a recurring text's copies out of its negatives, and CoSENT (`gpt_ft.adapters.embedding`
says when each applies)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

TEMPERATURE = 0.05  # SimCSE's and E5's; sentence-transformers' MultipleNegativesRankingLoss: scale 20
COSENT_SCALE = 20.0  # CoSENT's λ, as sentence-transformers' CoSENTLoss


def info_nce(
    anchors: Tensor, candidates: Tensor, positive: Tensor, temperature: float = TEMPERATURE
) -> Tensor:
    """Each anchor's cross-entropy over its cosines with every candidate, divided by τ, its own
    positive (`positive[i]`, an index into `candidates`) right; (A,). Vectors are unit length; a
    zero vector is a candidate that is not there (masked out), and so is another copy of an
    anchor's own positive (the same vector: the same text, as packed batches compute a recurring
    text once), which would otherwise count as a negative identical to the positive."""
    logits = anchors.float() @ candidates.float().T / temperature  # (A, N)
    absent = candidates.float().norm(dim=-1) == 0
    logits = logits.masked_fill(absent[None, :] | copies_of_positives(candidates, positive), -math.inf)
    return F.cross_entropy(logits, positive, reduction="none")


@torch.no_grad()
def first_copies(rows: Tensor) -> Tensor:
    """(N,): for each of `rows` (N, D), the index of the first row equal to it (its own, where none
    comes before). Compared a block of rows at a time (at most 2**26 elements), with no read back
    to the host (`torch.unique` waits for the device to learn its output's size)."""
    block = max(1, (1 << 26) // max(1, rows.numel()))
    if len(rows) == 0:
        return torch.zeros(0, dtype=torch.long, device=rows.device)
    equal = ((rows[None] == rows[k : k + block, None]).all(dim=-1) for k in range(0, len(rows), block))
    return torch.cat([e.int().argmax(dim=1) for e in equal])  # argmax: the first of the ties


@torch.no_grad()
def copies_of_positives(candidates: Tensor, positive: Tensor) -> Tensor:
    """(A, N): True where candidate j equals anchor i's positive but is not it."""
    first = first_copies(candidates)
    copy = first[None, :] == first[positive][:, None]
    copy[torch.arange(len(positive), device=copy.device), positive] = False
    return copy


def cosent(cosines: Tensor, scores: Tensor, scale: float = COSENT_SCALE) -> Tensor:
    """CoSENT's loss of a batch: log(1 + Σ_{s_i > s_j} exp(λ(cos_j - cos_i)))."""
    gaps = scale * (cosines.float()[None, :] - cosines.float()[:, None])  # [i, j]: λ(cos_j - cos_i)
    ranked = scores[:, None] > scores[None, :]
    gaps = gaps.masked_fill(~ranked, -math.inf).flatten()
    return torch.logsumexp(torch.cat([gaps.new_zeros(1), gaps]), dim=0)


def gather_rows(x: Tensor) -> tuple[Tensor, int]:
    """`x` (rows, ...) of every process, in rank order, with their gradients (each process's
    backward reaches the rows of the others), and where this process's rows start. One process:
    `x` itself and 0."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(x)], device=x.device))
    counts = [int(s) for s in sizes]
    padded = F.pad(x, (0, 0) * (x.dim() - 1) + (0, max(counts) - len(x)))
    parts = _GatherRows.apply(padded).split(max(counts))
    return torch.cat([p[:n] for p, n in zip(parts, counts)]), sum(counts[:rank])


class _GatherRows(torch.autograd.Function):
    """All processes' rows (of one count) stacked; backward: the gradient every process's loss
    sends to this process's rows (summed over processes), as DDP's averaging then expects."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        ctx.rows = slice(dist.get_rank() * len(x), (dist.get_rank() + 1) * len(x))
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rows]
