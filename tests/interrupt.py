"""A callback that interrupts a run at a given optimizer step (used by tests through the CLI)."""

import os
import signal

from lightning.pytorch.callbacks import Callback


class InterruptAt(Callback):
    """Sends `signum` to this process after optimizer step `step` (once that step's hooks ran)."""

    def __init__(self, step: int, signum: int = int(signal.SIGKILL)) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and not trainer.fit_loop.epoch_loop._should_accumulate():
            os.kill(os.getpid(), self.signum)
