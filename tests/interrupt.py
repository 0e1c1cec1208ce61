"""A callback that interrupts a run (used by tests through the CLI, in a subprocess or in-process)."""

import os
import signal

from lightning.pytorch.callbacks import Callback


class InterruptAt(Callback):
    """Sends `signum` to this process at the end of training batch number `batch` (1-based, over
    all epochs), whether or not that batch ended an optimizer step; with `rank`, on that rank only."""

    def __init__(self, batch: int, signum: int = int(signal.SIGKILL), rank: int | None = None) -> None:
        self.batch, self.signum, self.rank = batch, signum, rank

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.rank is not None and trainer.global_rank != self.rank:
            return
        if trainer.fit_loop.total_batch_idx + 1 == self.batch:
            os.kill(os.getpid(), self.signum)
