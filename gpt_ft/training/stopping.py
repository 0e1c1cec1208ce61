"""Early stopping on the task's own main metric (the one its best checkpoint is chosen by), so a
config can switch it on without naming the metric of each task:

    trainer:
      callbacks:
        - class_path: gpt_ft.training.stopping.EarlyStopping
          init_args: {patience: 2}
"""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, early_stopping


def main_monitor(model) -> tuple[str, str]:
    """What a run is judged by, and which way is better: the first validation split's main metric
    (max) for a task, the validation loss (min) for a language model."""
    task = getattr(model, "task", None)
    if task is not None:
        return f"{task.validation_splits[0]}/{task.main_metric}", "max"
    return "validation/loss", "min"


LOWER_IS_BETTER = ("loss", "perplexity", "ece")


def direction_of(metric: str, model) -> str | None:
    """Which way `metric` improves: min for losses, perplexity and calibration error, max for the
    task's own metrics; None for a metric of neither kind."""
    name = metric.rsplit("/", 1)[-1]
    if name in LOWER_IS_BETTER or name.endswith("loss"):  # lm_loss, task_loss too
        return "min"
    task = getattr(model, "task", None)
    return "max" if task is not None and name in task.metrics else None


class EarlyStopping(early_stopping.EarlyStopping):
    """Lightning's EarlyStopping, watching `main_monitor(model)` unless `monitor` is given."""

    def __init__(
        self,
        monitor: str | None = None,
        *,
        patience: int = 3,
        min_delta: float = 0.0,
        mode: str | None = None,
        verbose: bool = True,
    ) -> None:
        """
        Args:
            monitor: The logged metric to watch; default the task's main metric on its first
                validation split (a language model: validation/loss).
            patience: Evaluations without improvement before the run stops.
            min_delta: The least change that counts as an improvement.
            mode: max or min; default the direction of the watched metric.
            verbose: Say when and why the run stops.
        """
        if mode not in (None, "max", "min"):
            raise ValueError(f"EarlyStopping mode {mode!r}: give max or min.")
        # A NaN score (a correlation over constant predictions) counts as no improvement, toward
        # `patience`: Lightning's check_finite would stop the run at the first one.
        super().__init__(
            monitor=monitor or "", patience=patience, min_delta=min_delta, mode=mode or "max",
            verbose=verbose, check_finite=False, log_rank_zero_only=True,  # said once, not once per rank
        )  # fmt: skip
        self._given = (monitor, mode)

    def setup(self, trainer, pl_module, stage: str) -> None:
        monitor, mode = self._given
        found, direction = main_monitor(pl_module)
        if monitor is not None and mode is None:
            direction = direction_of(monitor, pl_module)
            if direction is None:
                raise ValueError(
                    f"EarlyStopping(monitor={monitor!r}): give its mode (max or min); the direction is known "
                    "for the task's metrics and for losses, perplexity and ece."
                )
        self.monitor, self.mode = monitor or found, mode or direction
        self.min_delta = abs(self.min_delta) * (1 if self.mode == "max" else -1)
        self.best_score = torch.tensor(-torch.inf if self.mode == "max" else torch.inf)
        super().setup(trainer, pl_module, stage)

    def load_state_dict(self, state_dict) -> None:
        patience = self.patience  # the one given now (Lightning would put the checkpoint's back)
        super().load_state_dict(state_dict)
        self.patience = patience

    def on_train_start(self, trainer, pl_module) -> None:
        refuse_unvalidated(self, trainer)
        # A run resumed from the checkpoint of one this callback stopped stays stopped (a requeued
        # job would train an epoch more at each start), one stopped in its first epoch too (a
        # pretraining run validating every N steps); a larger patience goes on.
        if self.wait_count >= self.patience:
            trainer.should_stop = True
            if trainer.is_global_zero:
                print(f"The run stopped early at epoch {self.stopped_epoch}: {self.monitor} did not improve "
                      f"in the last {self.wait_count} records (a larger patience goes on).")  # fmt: skip

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # A run stopped (max_steps, max_time) before its first validation has nothing to judge at the
        # epoch's end, where Lightning's check raised that the metric was missing, after training; a
        # training metric no step logs (misspelt) is named.
        if self.monitor.startswith(("train/", "perf/")) and self.monitor not in trainer.callback_metrics:
            logged = ", ".join(
                sorted(k for k in trainer.callback_metrics if k.startswith(("train/", "perf/")))
            )
            said = f"EarlyStopping(monitor={self.monitor!r}): training logs no such metric"
            raise ValueError(f"{said}; it logs {logged}.")
        if self.monitor in trainer.callback_metrics:
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        # A metric validation does not log is named at the first validation (the sanity check's,
        # before training), with those it does log: Lightning's error came after an epoch.
        if trainer.state.fn == "fit" and not (trainer.sanity_checking and self.monitor.startswith("train/")):
            refuse_unlogged(self, trainer.callback_metrics)
        super().on_validation_end(trainer, pl_module)


def refuse_unvalidated(callback, trainer) -> None:
    """A `callback`'s validation metric where no validation runs, before training (Lightning's
    error came at the first epoch's end, a traceback)."""
    watched = getattr(callback, "monitor", None)
    if watched and not watched.startswith(("train/", "perf/")) and trainer.limit_val_batches == 0:
        raise ValueError(
            f"{type(callback).__name__}(monitor={watched!r}) watches validation, and none runs "
            "(--trainer.limit_val_batches 0): let validation run, or watch a train/ metric."
        )


def refuse_unlogged(callback, logged, also: tuple[str, ...] = ()) -> None:
    """A `callback`'s monitor that validation does not log (nor `also` gives), in one sentence
    naming those it does."""
    if callback.monitor not in (*logged, *also):
        validation = ", ".join(sorted(name for name in logged if not name.startswith("train/")))
        raise ValueError(
            f"{type(callback).__name__}(monitor={callback.monitor!r}): validation logs no such metric; it "
            f"logs {validation}."
        )


class MonitorsLogged(Callback):
    """A metric that another callback watches (Lightning's own EarlyStopping, a ModelCheckpoint's
    `monitor`) and validation does not log, named at the first validation, as `EarlyStopping`
    names its own: Lightning's error came after a whole epoch, as a traceback. Where no validation
    runs, Lightning's EarlyStopping is refused before training."""

    checked = False

    def on_train_start(self, trainer, pl_module) -> None:
        for c in trainer.callbacks:  # (a checkpoint watching what is never logged saves only last.ckpt)
            if isinstance(c, early_stopping.EarlyStopping) and not isinstance(c, EarlyStopping):
                refuse_unvalidated(c, trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.checked or trainer.state.fn != "fit":
            return
        self.checked, logged = True, trainer.callback_metrics
        for c in trainer.callbacks:  # (ours checks its own; a checkpoint's candidates add epoch and step)
            watched = isinstance(c, (early_stopping.EarlyStopping, ModelCheckpoint)) and not isinstance(
                c, EarlyStopping
            )
            if watched and c.monitor and not c.monitor.startswith(("train/", "perf/")):
                refuse_unlogged(c, logged, also=("epoch", "step"))
