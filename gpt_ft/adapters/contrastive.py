"""The contrastive losses of embedding models, over the whole batch (every process's under DDP,
gathered with their gradients, so that two processes compute the loss of one with both halves):
InfoNCE with a recurring text's copies out of its negatives, and CoSENT; and `text_key`, which
says which texts are copies of one (`gpt_ft.adapters.embedding`
says when each applies)."""

from __future__ import annotations

import hashlib
import math
from array import array

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

TEMPERATURE = 0.05  # SimCSE's and E5's; sentence-transformers' MultipleNegativesRankingLoss: scale 20
COSENT_SCALE = 20.0  # CoSENT's λ, as sentence-transformers' CoSENTLoss
NO_TEXT = (-1, -1)  # the key of a text a row does not have (fewer hard negatives than others)


def text_key(ids: list[int]) -> tuple[int, int]:
    """Which text a token sequence is, for the losses and metrics that must tell copies of one text
    from different texts (their vectors cannot: a collapsed model gives every text the same one):
    48 bits of a BLAKE2b digest of its ids, as two integers below 2**24, which a float32 label
    row holds exactly. Two different texts share a key about once in 2**48 pairs."""
    value = int.from_bytes(hashlib.blake2b(array("q", ids).tobytes(), digest_size=6).digest(), "big")
    return value >> 24, value & 0xFFFFFF


def info_nce(
    anchors: Tensor, candidates: Tensor, texts: Tensor, positive: Tensor, temperature: float = TEMPERATURE
) -> Tensor:
    """Each anchor's cross-entropy over its cosines with every candidate, divided by τ, its own
    positive (`positive[i]`, an index into `candidates`) right; (A,). Vectors are unit length;
    `texts` (N, K) says which text each candidate is (`text_key`; negative: a text its row does not
    have, out of the softmax). Another copy of an anchor's own positive (the same text: rows may
    share one) is out of its softmax too, where it would be a negative identical to the positive."""
    logits = anchors.float() @ candidates.float().T / temperature  # (A, N)
    absent = texts[:, 0] < 0
    logits = logits.masked_fill(absent[None, :] | copies_of_positives(texts, positive), -math.inf)
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
def copies_of_positives(texts: Tensor, positive: Tensor) -> Tensor:
    """(A, N): True where candidate j is the same text (`texts`, (N, K)) as anchor i's positive but
    is not it."""
    first = first_copies(texts)
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
