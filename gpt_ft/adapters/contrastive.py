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
KEY_BYTES = 6
NO_TEXT = (-1,) * KEY_BYTES  # the key of a text a row does not have (fewer hard negatives than others)


def text_key(ids: list[int]) -> tuple[int, ...]:
    """Which text a token sequence is, for the losses and metrics that must tell copies of one text
    from different texts (their vectors cannot: a collapsed model gives every text the same one):
    48 bits of a BLAKE2b digest of its ids, as six bytes, integers below 256 that a label row of
    scores holds exactly in float32 and in any narrower float type it may be cast to. Two
    different texts share a key about once in 2**48 pairs."""
    return tuple(hashlib.blake2b(array("q", ids).tobytes(), digest_size=KEY_BYTES).digest())


def info_nce(
    anchors: Tensor, candidates: Tensor, positive: Tensor, masked: Tensor, temperature: float = TEMPERATURE
) -> Tensor:
    """Each anchor's cross-entropy over its cosines with every candidate, divided by τ, its own
    positive (`positive[i]`, an index into `candidates`) right; (A,). Vectors are unit length;
    `masked` (A, N) marks the candidates out of anchor i's softmax (`left_out`)."""
    logits = anchors.float() @ candidates.float().T / temperature  # (A, N)
    return F.cross_entropy(logits.masked_fill(masked, -math.inf), positive, reduction="none")


@torch.no_grad()
def left_out(texts: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """What InfoNCE leaves out of each softmax: the texts that match, which would otherwise be
    negatives as right as the one counted right. `texts` (N, 1 + C, K) says which text each of the
    batch's texts is (every process's rows, each its anchor, positive and hard negatives, `NO_TEXT`
    for one it lacks); `rows` (A,) are this process's. Forward, (A, N * C) over the candidates: a
    text the row lacks, and every other copy of a positive of row i's anchor's text (its own, or
    another row's with the same anchor). Backward (positives against anchors), (A, N): every other
    anchor whose text is an anchor of row i's positive's text."""
    N, C = texts.shape[0], texts.shape[1] - 1
    candidate = first_copies(texts[:, 1:].flatten(0, 1))  # each text by its first copy: (N * C,)
    anchor, positive = first_copies(texts[:, 0]), candidate.view(N, C)[:, 0]
    positives_of = torch.zeros(N, N * C, dtype=torch.bool, device=texts.device)  # anchor -> positives
    positives_of[anchor, positive] = True
    anchors_of = torch.zeros(N * C, N, dtype=torch.bool, device=texts.device)  # positive -> anchors
    anchors_of[positive, anchor] = True
    a = torch.arange(len(rows), device=rows.device)
    forward = positives_of[anchor[rows]][:, candidate] | (texts[:, 1:, 0] < 0).flatten()[None, :]
    forward[a, rows * C] = False  # the one counted right
    backward = anchors_of[positive[rows]][:, anchor]
    backward[a, rows] = False
    return forward, backward


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
