"""Collectives over the DDP ranks that are the identity in one process."""

from __future__ import annotations

import torch
from torch import Tensor


def _distributed(world_size: int) -> bool:
    return world_size > 1 and torch.distributed.is_initialized()


def mean_over_ranks(value: Tensor, world_size: int) -> Tensor:
    """Mean of a scalar over the ranks; no gradient flows through."""
    value = value.detach().float()
    if not _distributed(world_size):
        return value
    total = value.clone()
    torch.distributed.all_reduce(total)
    return total / world_size


def divisor_over_ranks(count: Tensor, world_size: int) -> Tensor:
    """A count's mean over the ranks as a loss's divisor: 1 where it is 0 (the sum it divides, over
    no term, is then 0, and stays 0 rather than 0/0's NaN). On the device, not read back."""
    mean = mean_over_ranks(count, world_size)
    return torch.where(mean > 0, mean, torch.ones_like(mean))


def finite_everywhere(loss: Tensor, world_size: int) -> Tensor:
    """1.0 where the loss is finite on every rank, else 0.0: a tensor on the loss's device, not
    read back (the caller chooses when to wait for it)."""
    finite = torch.isfinite(loss.detach()).float()
    if _distributed(world_size):
        torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
    return finite


def gather(values: Tensor, world_size: int, device: torch.device) -> Tensor:
    """All ranks' tensors (of any lengths along dim 0) concatenated, on the CPU; the collective
    runs on `device` (NCCL needs GPU tensors)."""
    if not _distributed(world_size):
        return values.cpu()
    from torchmetrics.utilities.distributed import gather_all_tensors

    return torch.cat([t.cpu() for t in gather_all_tensors(values.to(device))])
