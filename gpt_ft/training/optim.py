"""AdamW with weight decay on matrices only, and the learning-rate schedules (GPT-1 §4.1)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn


def adamw(
    parameters: Iterable[nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    fused: bool = False,
) -> torch.optim.AdamW:
    """AdamW decaying weight matrices only: not biases or LayerNorm gains (GPT-1: 0.01)."""
    decay, no_decay = [], []
    for p in parameters:
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at each step: linear warmup from 0, then the decay."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return factor
