"""Length-grouped batching: batches of examples of similar length, to cut padding.

Fine-tuning pads every batch to its longest sequence; SST-2 sentences run from 2 to 60 tokens, so
random batches are mostly padding. `LengthGroupedSampler` draws a random permutation, sorts it by
length inside windows of `window` global batches, cuts the windows into global batches (the
`batch_size` examples of every rank in one step) and shuffles the batches. Randomness stays
(which examples meet, and the batch order, change every epoch), padding mostly goes, and ranks
in one step get examples of similar length, so none waits long for the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DistributedSampler


class LengthGroupedSampler(DistributedSampler):
    """Indices of this rank, `batch_size` after `batch_size` forming batches of similar length.

    A DistributedSampler, so Lightning keeps it under DDP and calls `set_epoch` every epoch.
    Every rank gets ceil(n / world) indices (the permutation wraps around to even them out).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        window: int = 50,
    ) -> None:
        super().__init__(
            range(len(lengths)), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed
        )
        self.lengths = torch.as_tensor(lengths)
        self.batch_size, self.window = batch_size, window

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        n, world = len(self.lengths), self.num_replicas
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
        total = len(self) * world
        order = torch.cat([order, order[: total - n]])  # wrap around so that every rank gets len(self)
        step = self.batch_size * world  # one optimizer step's examples over all ranks
        chunk = step * self.window
        groups = []
        for start in range(0, total, chunk):
            window = order[start : start + chunk]
            window = window[torch.argsort(self.lengths[window], descending=True, stable=True)]
            groups += list(window.split(step))
        if self.shuffle:
            groups = [groups[i] for i in torch.randperm(len(groups), generator=g).tolist()]
            groups.sort(key=lambda group: len(group) < step)  # a short last group stays last
        mine = []
        for group in groups:  # each rank takes an equal, contiguous slice of the step's examples
            share = len(group) // world
            mine += group[self.rank * share : (self.rank + 1) * share].tolist()
        return iter(mine)
