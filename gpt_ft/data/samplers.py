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
import os
from collections.abc import Iterator, Sequence

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DistributedSampler


def run_seed(seed: int | None) -> int:
    """`seed`, or where it is None the run's (`--seed_everything`, which Lightning's seed_everything
    keeps in PL_GLOBAL_SEED before the data module is built; 0 where none was set)."""
    return seed if seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The random stream of an epoch's order, one of its own for every (seed, epoch). DistributedSampler's
    seed + epoch gave seed s, epoch e + 1 the order of seed s + 1, epoch e: runs over seeds 0, 1, 2
    shared most of their orders. Seeds a golden-ratio step apart in the generator's 32 bits (which it
    keeps of a seed) meet only a million epochs apart or more, for seeds under a thousand apart; seed
    0's orders are those seed + epoch gave."""
    return torch.Generator().manual_seed((epoch + seed * 0x9E3779B1) % 2**32)


class EpochSampler(DistributedSampler):
    """A DistributedSampler (in one process too) whose order is a function of (seed, epoch) only,
    and whose epoch can start part-way: where a checkpoint taken in it left off.

    Lightning calls `set_epoch` every epoch; a resumed run calls `skip` once, before iterating.
    """

    _skip: tuple[int, int, int, int] | None = None
    _skipped: tuple[int, int, int, int] | None = None  # the skip the current epoch was iterated with

    def skip(self, epoch: int, samples: int, world: int | None = None, batches: int = 0) -> None:
        """In epoch `epoch`, leave out the first `samples` indices of each of `world` ranks (by
        default this run's number): those a run of that many processes trained on already, in
        `batches` batches (Lightning's count of the epoch's batches done), the rest dealt out to this
        run's ranks. The epoch is set here too: with worker processes, Lightning draws the indices
        before it calls `set_epoch`, which would give the resumed epoch the first epoch's order."""
        self._skip = (epoch, samples, world or self.num_replicas, batches) if samples > 0 else None
        self.set_epoch(epoch)

    def indices(self) -> Iterator[int]:
        """This rank's indices for the current epoch, in order (DistributedSampler's)."""
        return iter(self.dealt(self.order()))

    def order(self) -> list[int]:
        """The epoch's indices over all ranks, in the order they are dealt out (DistributedSampler's)."""
        n = len(self.dataset)
        return torch.randperm(n, generator=epoch_generator(self.seed, self.epoch)).tolist() \
            if self.shuffle else list(range(n))  # fmt: skip

    def dealt(self, order: list[int]) -> list[int]:
        """This rank's share of `order`: every num_replicas-th, the ranks evened out as
        DistributedSampler evens them (the last few dropped, or the first few repeated)."""
        world = self.num_replicas
        if self.drop_last:
            order = order[: len(order) // world * world]
        elif order:
            order = (order * math.ceil(world / len(order) + 1))[: math.ceil(len(order) / world) * world]
        return order[self.rank :: world]

    def __iter__(self) -> Iterator[int]:
        skip = self._skip if self._skip is not None and self._skip[0] == self.epoch else None
        if skip is not None:
            self._skipped, self._skip = skip, None
        return iter(self._epoch_indices(skip))

    def _epoch_indices(self, skip: tuple[int, int, int, int] | None) -> list[int]:
        """This rank's indices of the current epoch, past a resumed epoch's `skip` where one is given."""
        if skip is None or skip[0] != self.epoch:
            return list(self.indices())
        epoch, samples, world, _ = skip
        if world == self.num_replicas:
            return list(self.indices())[samples:]
        return self.dealt(self.order()[samples * world :])  # what the other number of ranks left, dealt

    def _epoch_skip(self) -> tuple[int, int, int, int] | None:
        return next((s for s in (self._skip, self._skipped) if s is not None and s[0] == self.epoch), None)

    def batches_done(self) -> int:
        """Lightning's count of the current epoch's batches before its first here: those a resumed
        epoch had done (0 otherwise)."""
        skip = self._epoch_skip()
        return skip[3] if skip else 0

    def epoch_batches(self, size: int) -> list[list[int]]:
        """The current epoch's batches of `size` on this rank, as `__iter__` gives them."""
        indices = self._epoch_indices(self._epoch_skip())
        return [indices[i : i + size] for i in range(0, len(indices), size)]


class LengthGroupedSampler(EpochSampler):
    """Indices of this rank, `batch_size` after `batch_size` forming batches of similar length.

    A DistributedSampler, so Lightning keeps it under DDP and calls `set_epoch` every epoch.
    Every rank gets ceil(n / world) indices (a last, short step's shares evened out with its own
    first examples again: its lengths' neighbours).
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

    def order(self) -> list[int]:
        """The epoch's global batches, one after another, each dealt out to the ranks in equal,
        contiguous shares (`dealt`): the same order for every number of ranks of one step's size."""
        n = len(self.lengths)
        g = epoch_generator(self.seed, self.epoch)
        order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
        step = self.batch_size * self.num_replicas  # one optimizer step's examples over all ranks
        chunk = step * self.window
        groups = []
        for start in range(0, n, chunk):
            window = order[start : start + chunk]
            window = window[torch.argsort(self.lengths[window], descending=True, stable=True)]
            groups += list(window.split(step))
        if self.shuffle:
            groups = [groups[i] for i in torch.randperm(len(groups), generator=g).tolist()]
            groups.sort(key=lambda group: len(group) < step)  # a short last group stays last
        return torch.cat(groups).tolist() if groups else []

    def dealt(self, order: list[int]) -> list[int]:
        mine, world = [], self.num_replicas
        step = self.batch_size * world
        for start in range(0, len(order), step):  # each rank takes an equal, contiguous slice of it
            group = order[start : start + step]
            group = (group * (world + 1))[: math.ceil(len(group) / world) * world]  # a short one evened out
            share = len(group) // world
            mine += group[self.rank * share : (self.rank + 1) * share]
        return mine

    def indices(self) -> Iterator[int]:
        return iter(self.dealt(self.order()))


def order_kind(sampler: EpochSampler) -> str:
    """How `sampler` orders an epoch, as a message says it (a checkpoint records it)."""
    grouped = ", in length-grouped batches" if isinstance(sampler, LengthGroupedSampler) else ""
    return ("shuffled" if sampler.shuffle else "in order") + grouped


class ResumableTrainData:
    """LightningDataModule mixin: where the training data stood goes into checkpoints, so that a run
    resumed from one taken mid-epoch goes on with the very next batch (Lightning saves `state_dict`
    and hands it back to `load_state_dict` before the data loaders are built)."""

    _resume: tuple[int, int, int | None, int | None, int | None, int | None] | None = None
    """(epoch, batches, their size, ranks, the order's seed, the data's size) of the checkpoint's data."""
    seed: int | None = None  # the data module's own
    _size: int | None = None  # of this run's training data, once its loader is built
    _order: str | None = None  # how this run's epochs are ordered (`order_kind`), once its loader is built
    _resumed_order: str | None = None  # the checkpoint's

    def training_size(self, sampler: EpochSampler) -> tuple[int, str, str]:
        """How much training data the run reads, in what, and where (", in FOLDER,": a checkpoint
        records the size, and a run resumed on data of another size is told)."""
        return len(sampler.dataset), "training examples", ""

    def state_dict(self) -> dict[str, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return {}
        loop = trainer.fit_loop
        batches = loop.epoch_loop.batch_progress.current.processed
        epochs = loop.epoch_progress.current
        epoch = epochs.processed  # the current one's index, mid-epoch
        # The epoch is over (all its batches, or `max_steps` stopped it: Lightning then counts it as
        # processed and resumes with the next, from its start): the next starts afresh. All its
        # batches done but the epoch not yet counted (a save at its last batch): the next is named
        # here, as a loader with workers draws its order before Lightning sets the epoch.
        if batches >= trainer.num_training_batches and epochs.processed < epochs.started:
            epoch, batches = epoch + 1, 0
        elif epochs.processed == epochs.started:
            batches = 0
        return {
            "epoch": epoch,
            "batches": batches,
            "batch_size": self.batch_size,
            "world": trainer.world_size,
            "seed": self.seed,
            "size": self._size,
            "order": self._order,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resumed_order = (state or {}).get("order")
        if state:
            self._resume = (
                int(state["epoch"]),
                int(state["batches"]),
                state.get("batch_size"),
                state.get("world"),
                state.get("seed"),
                state.get("size"),
            )

    def _resumed(self, sampler: EpochSampler, batch_size: int) -> EpochSampler:
        """`sampler` past the examples the checkpoint's epoch trained on: its batches, of the size
        they had, on the number of processes it had (a run resumed with another batch size, or on
        another number of processes, goes on where that epoch's order stood)."""
        (self._size, unit, where), self._order = self.training_size(sampler), order_kind(sampler)
        if self._resume is not None:
            epoch, batches, size, world, seed, then = self._resume
            if then is not None and then != self._size:
                rest = f"epoch {epoch} goes on {batches} batches in, in the new data's order, and "
                rank_zero_warn(
                    f"The checkpoint's run trained on {then:,} {unit} and this run's{where} hold "
                    f"{self._size:,}: the data changed since it was saved (prepared again, edited, or "
                    "another subset); "
                    f"{rest * bool(batches)}the run goes on from the checkpoint's weights on the data as it "
                    "is now."
                )
            if seed is None and (self.seed or 0) % 2**32:  # a checkpoint from before `epoch_generator`
                twice = "(some examples twice, others not at all)"
                rest = (
                    f"the rest of epoch {epoch} follows this version's order {twice}, and " if batches else ""
                )
                rank_zero_warn(
                    f"The checkpoint is from before each seed drew epoch orders of its own (it records no "
                    f"seed): with seed {self.seed}, {rest}the later epochs follow this version's orders, not "
                    "those its run would have taken (seed 0's are unchanged)."
                )
            if batches and seed is not None and seed != self.seed:
                rank_zero_warn(
                    f"The checkpoint stopped {batches} batches into epoch {epoch} of seed {seed}'s order, "
                    f"and this run orders its data by seed {self.seed}: the rest of that epoch trains some "
                    "examples a second time and leaves others out"
                    f"{', from another training subset' if getattr(self, 'train_size', None) else ''}. "
                    f"--seed_everything {seed} (or --data.seed {seed}) resumes it exactly."
                )
            if batches and (then := self._resumed_order) not in (None, self._order):  # --data.shuffle, ...
                rank_zero_warn(
                    f"The checkpoint stopped {batches} batches into epoch {epoch}, its data {then}, and this "
                    f"run takes it {self._order}: the rest of that epoch trains some examples a second time "
                    "and leaves others out; the next epochs are whole. The checkpoint's --data.shuffle and "
                    "--data.length_grouped resume it exactly."
                )
            size, world = size or batch_size, world or sampler.num_replicas  # (an earlier version's: now's)
            steps = (size * world, batch_size * sampler.num_replicas)  # examples a step, then and now
            if batches and steps[0] != steps[1]:
                order = ", and length-grouped batches of another size come in another order"
                rank_zero_warn(
                    f"The checkpoint stopped {batches} batches of {steps[0]} examples into epoch {epoch} and "
                    f"this run's batches hold {steps[1]}: Lightning counts that epoch's {batches} batches "
                    "done in the new size, so the rest of it ends early or late (before its validation)"
                    f"{order if isinstance(sampler, LengthGroupedSampler) else ''}; the next epochs are "
                    "whole. The same --data.batch_size x processes resumes it exactly."
                )
            sampler.skip(epoch, batches * size, world, batches)
            self._resume = None
        return sampler
