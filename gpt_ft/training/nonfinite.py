"""Training stops at the first non-finite loss, keeping the last good state in `last.ckpt`."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt_ft.training.checkpointing import LAST
from gpt_ft.training.ranks import finite_everywhere


def stop_on_nonfinite(
    trainer, loss: float, where: tuple[int, int, int], skipped: bool = False, rewind: bool = True
) -> None:
    """Keep the last good state, then stop: the bad step's update has not reached the weights
    (the step has not run, or, `skipped`, fused AdamW skipped it). `where`: step, epoch, batch.
    `rewind`: stopped inside a training step, whose window goes back to its start."""
    kept = ""
    ckpt = trainer.checkpoint_callback
    if ckpt is not None and ckpt.dirpath and not trainer.fast_dev_run:  # (a dev run saves nothing)
        if rewind:
            rewind_window(trainer)
        path = Path(ckpt.dirpath) / LAST
        trainer.save_checkpoint(path, weights_only=False)
        good = "the state with its update skipped" if skipped else "the state before it"
        kept = (
            f"; {good} (step {trainer.global_step}) is in {path}, but its weights give this loss on this "
            "batch: resumed at this precision, the run stops here again"
        )
    step, epoch, batch = where
    became = (
        f"{loss}" if not math.isfinite(loss) else f"non-finite on another process (this one's: {loss:.4g})"
    )
    raise FloatingPointError(
        f"The training loss became {became} at step {step} (epoch {epoch}, batch {batch}){kept}. "
        f"Try {remedies(trainer, first=step == 0)}."
    )


def remedies(trainer, first: bool = False) -> str:
    """What to try after a non-finite loss, among what the run does not already do; at the `first`
    step, before any update, the data rather than the learning rate."""
    if first:
        tries = "checking the data (no update has run yet: a value too large for the loss?)"
    else:  # the kept weights give the loss again: a lower rate or clipping helps a run started again
        clipping = " or gradient clipping (--trainer.gradient_clip_val 1.0)"
        tries = (
            f"a lower --model.lr{clipping * (not getattr(trainer, 'gradient_clip_val', None))} from the start"
        )
    precision = str(getattr(trainer, "precision", "32-true"))
    if precision.startswith(("16", "bf16")):  # fp16's range overflows first; any 16-bit, less precise
        other = "bf16-mixed (or 32-true)" if precision.startswith("16") else "32-true"
        tries += f", or --trainer.precision {other}"
    return tries


def rewind_window(trainer) -> None:
    """Inside a gradient-accumulation window, the loop's position back to the window's start (the
    run stops next): its earlier micro-batches' gradients reach no checkpoint, so a run resumed
    from it trains them again instead of skipping them."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    done = progress.current.completed % trainer.accumulate_grad_batches
    for counts in (progress.current, progress.total) if done else ():
        counts.ready, counts.started = counts.ready - done, counts.started - done
        counts.processed, counts.completed = counts.processed - done, counts.completed - done


def defers_nonfinite_check(device: torch.device, optimizer: Any) -> bool:
    """Whether `NonfiniteWatch` reads the loss back late: on CUDA, under fused AdamW."""
    fused = isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults.get("fused")
    return device.type == "cuda" and bool(fused)


class NonfiniteWatch:
    """Stops training at the first non-finite loss (on any rank), the weights untouched by it.

    Where reading the loss back costs nothing (the CPU), each step's is read before its backward
    and the run stops there. On CUDA that read would hold the host until the GPU has finished the
    forward, every step, so the backward could not be queued ahead (an idle GPU between the two).
    There, under fused AdamW, the flag goes to the optimizer as `found_inf`, which skips the update
    on the device (as under a GradScaler), and comes back to the host without waiting: it is read
    once the GPU has got that far, at the latest two steps on, when the run stops.
    """

    def __init__(self) -> None:
        self.pending: deque[tuple[Tensor, Any, tuple[int, int, int]]] = deque()
        self.bad: Tensor | None = None  # any non-finite micro-batch of the step being accumulated
        self.step = -1

    def check(self, trainer, loss: Tensor, batch_idx: int, optimizer: Any) -> None:
        finite = finite_everywhere(loss, trainer.world_size)
        where = (trainer.global_step, trainer.current_epoch, batch_idx + 1)
        if not defers_nonfinite_check(loss.device, optimizer):
            if not bool(finite):
                stop_on_nonfinite(trainer, float(loss.detach()), where)
            return
        self.poll(trainer, keep=2)
        first = trainer.global_step != self.step  # the first micro-batch of this optimizer step
        self.bad = 1.0 - finite if first else torch.maximum(self.bad, 1.0 - finite)
        self.step = trainer.global_step
        optimizer.found_inf = self.bad
        host = torch.stack([finite, loss.detach().float()]).to("cpu", non_blocking=True)
        event = None
        if loss.is_cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending.append((host, event, where))

    def poll(self, trainer, keep: int = 0) -> None:
        """Reads the flags the device has written; waits for those beyond the newest `keep`."""
        while self.pending:
            host, event, where = self.pending[0]
            if event is not None and not event.query():
                if len(self.pending) <= keep:
                    return
                event.synchronize()
            self.pending.popleft()
            if host[0] == 0:
                self.pending.clear()
                # from a training step (keep > 0) inside a window; at the run's end, after its last step
                stop_on_nonfinite(trainer, float(host[1]), where, skipped=True, rewind=keep > 0)
