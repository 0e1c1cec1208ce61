"""LMDataModule: contiguous blocks of a token file for pretraining.

GPT-1 §4.1 trains on "minibatches of 64 randomly sampled, contiguous sequences of 512 tokens".
The token file is cut into blocks of block_size + 1 tokens (inputs and next-token targets) at a
stride of block_size; an epoch visits the blocks in a fresh random permutation, and each DDP rank
reads a disjoint share of it (DistributedSampler, reseeded every epoch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from gpt_ft.data.batches import collate_blocks
from gpt_ft.data.folders import tokenizer_digests
from gpt_ft.data.pinning import check_model_fits, leave_stops_to_the_main_process, pins
from gpt_ft.data.prepare import META, SPLIT_FILES
from gpt_ft.data.samplers import EpochSampler, ResumableTrainData, run_seed
from gpt_ft.errors import absent, check_counts


class TokenBlocks(Dataset):
    """Block i of a flat token file: tokens[i * block_size : (i + 1) * block_size + 1]."""

    def __init__(self, path: Path, dtype: str, block_size: int) -> None:
        self.path, self.dtype, self.block_size = path, dtype, block_size
        n_tokens = path.stat().st_size // np.dtype(dtype).itemsize
        if n_tokens < block_size + 1:
            raise ValueError(
                f"{path} holds {n_tokens} tokens, fewer than one block of block_size + 1 = {block_size + 1}; "
                "use a smaller block_size or more text."
            )
        self.n_blocks = (n_tokens - 1) // block_size
        self._tokens = None  # opened lazily, once per DataLoader worker

    def __len__(self) -> int:
        return self.n_blocks

    def __getstate__(self) -> dict:
        """Without the open file: a loader worker started afresh (spawn, forkserver) opens its own;
        a pickled memmap is a copy of the whole file."""
        return {**self.__dict__, "_tokens": None}

    def __getitem__(self, i: int) -> tuple[int, Tensor]:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = i * self.block_size
        return i, torch.from_numpy(self._tokens[start : start + self.block_size + 1].astype(np.int64))


class LMDataModule(ResumableTrainData, LightningDataModule):
    """Pretraining batches from a `gpt-ft prepare` folder.

    Exposes `vocab_size` and `tokenizer_path` (the folder's tokenizer) right after construction.
    """

    task = None  # a language model has no task head

    def __init__(
        self,
        token_dir: str,
        *,
        block_size: int = 512,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int | None = None,
    ) -> None:
        """
        Args:
            token_dir: Folder written by `gpt-ft prepare` (train.bin, validation.bin, meta.json).
            block_size: Tokens per training sequence (GPT-1: 512); at most the model's context.
            batch_size: Sequences per batch on each device (with gradient accumulation, per micro-batch).
            eval_batch_size: Sequences per validation batch; default batch_size.
            num_workers: DataLoader worker processes.
            shuffle: Visit the training blocks in a fresh random permutation each epoch (GPT-1);
                False reads them in file order.
            seed: Seed of the per-epoch block permutation; default the run's seed_everything.
        """
        super().__init__()
        check_counts(("block_size", block_size, 1), ("batch_size", batch_size, 1),
                     ("eval_batch_size", eval_batch_size, 1), ("num_workers", num_workers, 0))  # fmt: skip
        self.token_dir = Path(token_dir).expanduser()
        self.meta = read_meta(self.token_dir)
        self.block_size, self.batch_size = block_size, batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers, self.shuffle, self.seed = num_workers, shuffle, run_seed(seed)
        self.vocab_size = self.meta["vocab_size"]
        self.tokenizer_path = str(self.token_dir / self.meta["tokenizer"])
        self.blocks = {split: self._blocks(split) for split in SPLIT_FILES if self._has_blocks(split)}

    def _has_blocks(self, split: str) -> bool:
        """Whether `split` holds a block; a validation split too short for one is left out (said
        by its loader: `fit` trains on, `validate` stops)."""
        n = self.meta["tokens"][split]
        if split == "validation" and n <= self.block_size:
            return False
        return n > 0 or split == "train"  # too short a train split is named by `TokenBlocks`

    def _no_validation(self, so: str) -> str:
        return (
            f"{self.token_dir}: the validation split holds {self.meta['tokens']['validation']} tokens, "
            f"fewer than one block of block_size + 1 = {self.block_size + 1}: {so} (prepare the corpus "
            "with a larger --validation_fraction, or use a smaller block_size)."
        )

    _resumed_blocks: int | None = None  # the block_size of the checkpoint's run

    def state_dict(self) -> dict:
        state = super().state_dict()
        return {**state, "block_size": self.block_size} if state else state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._resumed_blocks = (state or {}).get("block_size")

    def _check_resumed_blocks(self) -> None:
        """A run resumed mid-epoch with another block_size: its epoch's order is of other blocks."""
        then, at = self._resumed_blocks, self._resume
        if at is not None and at[1] and then not in (None, self.block_size):
            rank_zero_warn(
                f"The checkpoint stopped {at[1]} batches into epoch {at[0]} of blocks of {then} tokens, and "
                f"this run reads blocks of {self.block_size}: the rest of that epoch follows the new blocks' "
                f"order (some text twice, some not at all); the next epochs are whole. --data.block_size "
                f"{then} resumes it exactly."
            )

    def training_size(self, sampler) -> tuple[int, str, str]:
        return self.meta["tokens"]["train"], "training tokens", f", in {self.token_dir},"

    def _blocks(self, split: str) -> TokenBlocks:
        return TokenBlocks(self.token_dir / SPLIT_FILES[split], self.meta["dtype"], self.block_size)

    def _sampler(self, dataset: Dataset, train: bool) -> EpochSampler:
        # A DistributedSampler in one process too: Lightning reseeds it every epoch (set_epoch),
        # and under DDP each rank takes every world_size-th block of the same permutation. Training
        # drops the last few blocks so that ranks take equal shares; evaluation repeats a few
        # instead, and the metrics drop the repeats by block number.
        trainer = getattr(self, "trainer", None)
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        return EpochSampler(
            dataset,
            num_replicas=world,
            rank=rank,
            shuffle=train and self.shuffle,
            seed=self.seed,
            drop_last=train,
        )

    _train_order: EpochSampler | None = None

    def window_counts(self, batch_idx: int, accumulate: int, batches: int, sampler) -> tuple[int, int] | None:
        """(blocks, LM targets) on this rank in the gradient-accumulation window of `accumulate`
        training batches that holds batch `batch_idx` of the current epoch (of `batches`): fewer in
        an epoch's last window, and in its last batch. None where the loader's `sampler` is not ours."""
        if sampler is None or sampler is not self._train_order:
            return None
        n, size, first = len(sampler), self.batch_size, batch_idx // accumulate * accumulate
        blocks = sum(max(0, min(size, n - i * size)) for i in range(first, min(first + accumulate, batches)))
        return blocks, blocks * self.block_size

    def train_dataloader(self) -> DataLoader:
        check_model_fits(self)  # with the model of the call that reads it (Python's wiring)
        blocks = self.blocks["train"]
        self._check_resumed_blocks()
        self._train_order = self._sampler(blocks, train=True)
        return DataLoader(
            blocks,
            batch_size=self.batch_size,
            sampler=self._resumed(self._train_order, self.batch_size),
            num_workers=self.num_workers,
            worker_init_fn=leave_stops_to_the_main_process,
            collate_fn=collate_blocks,
            pin_memory=pins(self),
            generator=self._generator(),
        )

    def _generator(self) -> torch.Generator:
        # The loader's own seeds (for workers) come from here, not from the global RNG, whose
        # state a resumed run restores exactly (dropout draws from it).
        return torch.Generator().manual_seed(self.seed)

    def val_dataloader(self) -> list[DataLoader]:
        check_model_fits(self)
        if "validation" not in self.blocks:
            if getattr(getattr(self.trainer, "state", None), "fn", None) == "validate":  # (not fit)
                raise ValueError(self._no_validation("there is nothing to validate"))
            rank_zero_warn(self._no_validation("training will not validate"))
            return []
        blocks = self.blocks["validation"]
        return [
            DataLoader(
                blocks,
                batch_size=self.eval_batch_size,
                sampler=self._sampler(blocks, train=False),
                num_workers=self.num_workers,
                worker_init_fn=leave_stops_to_the_main_process,
                collate_fn=collate_blocks,
                pin_memory=pins(self),
                generator=self._generator(),
            )
        ]


def read_meta(token_dir: str | os.PathLike) -> dict:
    """meta.json of a token folder, checked against the token files beside it."""
    folder = Path(token_dir).expanduser()
    path = folder / META
    if not path.is_file():
        missing = (
            f"holds no {META}"
            if folder.is_dir()
            else "is a file, not a folder"
            if folder.exists()
            else absent(folder)
        )
        raise FileNotFoundError(f"{folder} {missing}: prepare it with `gpt-ft prepare`.")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        itemsize = np.dtype(meta["dtype"]).itemsize
        counts = {split: meta["tokens"][split] for split in SPLIT_FILES}
        fields = {
            **{f"tokens.{k}": (v, int) for k, v in counts.items()},
            "vocab_size": (meta["vocab_size"], int),
        }
        for name, (value, kind) in {**fields, "tokenizer": (meta["tokenizer"], str)}.items():
            if not isinstance(value, kind) or isinstance(value, bool):
                raise TypeError(f"{name} is {value!r}, not {'an integer' if kind is int else 'a text'}")
        if not np.issubdtype(np.dtype(meta["dtype"]), np.unsignedinteger):
            raise TypeError(f"dtype is {meta['dtype']!r}, not an unsigned integer type")
        if not isinstance(digests := meta.get("tokenizer_files", {}), dict):
            raise TypeError(f"tokenizer_files is {digests!r}, not a mapping of file names to SHA-256 digests")
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, a field missing or of another type
        why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyError) else f"it has no field {exc}"
        raise ValueError(f"{path} is damaged ({why}); prepare the folder again.") from None
    for split, name in SPLIT_FILES.items():
        if not (file := folder / name).is_file():
            raise ValueError(f"{file} is missing; the folder is incomplete, prepare it again.")
        if file.stat().st_size != (expected := counts[split] * itemsize):
            raise ValueError(
                f"{file} holds {file.stat().st_size} bytes but {META} says {counts[split]} {meta['dtype']} "
                f"tokens ({expected} bytes); the folder is inconsistent, prepare it again."
            )
    if not (tokenizer := folder / meta["tokenizer"]).is_dir():  # read at once, never looked up on the hub
        raise ValueError(f"{tokenizer} is missing; the folder is incomplete, prepare it again.")
    check_prepared_tokenizer(tokenizer, meta, path)
    if meta["vocab_size"] > np.iinfo(meta["dtype"]).max + 1:
        raise ValueError(f"{path}: a vocabulary of {meta['vocab_size']} does not fit dtype {meta['dtype']}.")
    return meta


def check_prepared_tokenizer(tokenizer: Path, meta: dict, path: Path) -> None:
    """The token ids are the tokenizer's beside them: one replaced since (retrained, or another
    saved there) would read them as other tokens, and the run's checkpoints would carry it."""
    if (recorded := meta.get("tokenizer_files")) is None:  # an earlier version's folder: its size at least
        from gpt_ft.data.tokenizer import embedding_size, load_tokenizer

        if (rows := embedding_size(load_tokenizer(tokenizer))) != meta["vocab_size"]:
            raise ValueError(
                f"{tokenizer} has {rows} tokens and {path} says the token files were written by one of "
                f"{meta['vocab_size']}: put the prepared tokenizer back, or prepare the folder again."
            )
        return
    now = tokenizer_digests(tokenizer)
    for name in sorted(recorded.keys() | now.keys()):
        if recorded.get(name) != now.get(name):
            how = "removed" if name not in now else "added" if name not in recorded else "changed"
            raise ValueError(
                f"{tokenizer / name} was {how} after `gpt-ft prepare` wrote the token files ({path} holds "
                "the SHA-256 of each tokenizer file): their ids would read as another tokenizer's tokens. "
                "Put the prepared tokenizer back, or prepare the folder again."
            )
