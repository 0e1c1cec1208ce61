"""A callback that interrupts a run (used by tests through the CLI, in a subprocess or in-process)."""

import os
import signal

from lightning.pytorch.callbacks import Callback


class InterruptAt(Callback):
    """Sends `signum` to this process at the end of training batch number `batch` (1-based, over
    all epochs), whether or not that batch ended an optimizer step; with `rank`, on that rank only;
    with `validation`, at the end of the first batch of the validation after that training batch;
    with `validation_end`, once that validation has ended; with `setup`, as the run is set up
    (before Lightning's own signal handlers)."""

    def __init__(
        self,
        batch: int,
        signum: int = int(signal.SIGKILL),
        rank: int | None = None,
        validation: bool = False,
        validation_end: bool = False,
        setup: bool = False,
    ) -> None:
        self.batch, self.signum, self.rank, self.validation = batch, signum, rank, validation
        self.validation_end, self.at_setup = validation_end, setup

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.at_setup:
            os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.validation and not self.validation_end and not self.at_setup:
            self._interrupt(trainer)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        if self.validation and batch_idx == 0 and not trainer.sanity_checking:
            self._interrupt(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.validation_end and not trainer.sanity_checking:
            self._interrupt(trainer)

    def _interrupt(self, trainer) -> None:
        if self.rank is not None and trainer.global_rank != self.rank:
            return
        if trainer.fit_loop.total_batch_idx + 1 == self.batch:
            os.kill(os.getpid(), self.signum)
