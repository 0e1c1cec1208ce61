"""Loader workers: batches in page-locked memory on CUDA, and stop signals left to the main process.

Lightning copies a batch to the GPU with `non_blocking=True`. From ordinary (pageable) host memory
the CUDA driver may first wait for the device's queue and stages the copy through a buffer of its
own while the host waits; from page-locked memory the copy joins the device's queue and the host
goes on to the next step. The loaders
ask for it (`DataLoader(pin_memory=True)`) when the run's device is a GPU, and the loader's
worker calls each batch's `pin_memory`.

And the model a loader's batches go to, checked as a call reads them (`check_model_fits`).
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from torch import Tensor

from gpt_ft.adapters.cards import card_key
from gpt_ft.errors import check_context


class Pinnable:
    """Mixin for dataclass batches: `pin_memory()` gives the batch with every tensor page-locked."""

    def pin_memory(self):
        return self._each_tensor(Tensor.pin_memory)

    def to_device(self, device):
        """The batch with every tensor on `device`, outside a trainer (not named `to`: Lightning
        would then move the batch with it, not each tensor, non-blocking, as it does)."""
        return self._each_tensor(lambda t: t.to(device))

    def _each_tensor(self, fn):
        return dataclasses.replace(
            self,
            **{
                f.name: fn(v)
                for f in dataclasses.fields(self)
                if isinstance(v := getattr(self, f.name), Tensor)
            },
        )


def pins(data: Any) -> bool:
    """Whether a data module's loaders should pin their batches: when its trainer's device is a GPU."""
    trainer = getattr(data, "trainer", None)
    return trainer is not None and trainer.strategy.root_device.type == "cuda"


def leave_stops_to_the_main_process(worker_id: int) -> None:
    """A loader worker's `worker_init_fn`: SIGTERM and Ctrl-C (SIGINT) ignored. torch's workers die
    on SIGTERM, and a scheduler's kill of a job, which reaches every process of it, failed the run
    ("worker killed by signal") before it saved; the main process stops the run at the step's end
    (`gpt_ft.training.stop_signals`) and ends its workers."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def model_context(data) -> int | None:
    """The context (n_positions) of the GPTModule the data module's trainer runs; None without one."""
    model = getattr(getattr(data, "trainer", None), "lightning_module", None)
    return getattr(getattr(getattr(model, "gpt", None), "config", None), "n_positions", None)


def check_model_fits(data) -> None:
    """What the command line links and checks, for a model and a data module wired in Python, as a
    call reads its batches (Lightning sets up a trainer's earlier data module too): the sequences
    fit the model's context, the tokenizer's ids its embedding table, the data's task the model's."""
    trainer = data.trainer
    if getattr(getattr(trainer, "state", None), "status", None) != "running":  # (loaders of one's own)
        return
    model = trainer.lightning_module
    config = getattr(getattr(model, "gpt", None), "config", None)
    if config is None:  # not a GPTModule
        return
    check_context(data, config.n_positions)
    if getattr(data, "vocab_size", 0) > config.vocab_size:
        raise ValueError(
            f"The data module's tokenizer has {data.vocab_size} tokens and the model's embedding table "
            f"{config.vocab_size} rows: build the model with GPTModule(vocab_size=data.vocab_size, ...)."
        )
    ours, theirs = getattr(data, "task", None), getattr(model, "task", None)
    if ours is theirs or (ours is not None and theirs is not None and card_key(ours) == card_key(theirs)):
        return
    reads = f"task {ours.name!r}" if ours is not None else "a language model's tokens"
    has = f"task {theirs.name!r}" if theirs is not None else "no task (a language model)"
    if ours is not None and theirs is not None and ours.name == theirs.name:
        has = f"another card of task {theirs.name!r}"
    raise ValueError(
        f"The data module reads {reads} and the model has {has}: build the model with "
        "GPTModule(task=data.task, ...) (None for a language model)."
    )
