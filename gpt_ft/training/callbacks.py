"""The callbacks every `gpt-ft fit|validate|test|predict` run gets beside those its configuration
names, and the suite's record of a run's validations."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import (
    Callback,
    Checkpoint,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    Timer,
    TQDMProgressBar,
)
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from gpt_ft.data.folders import LogLines
from gpt_ft.data.samplers import ResumableTrainData
from gpt_ft.training.checkpointing import Provenance, ResumeState, SaveLast, WholeStepTimer
from gpt_ft.training.run_folders import RunFolder
from gpt_ft.training.stopping import MonitorsLogged, main_monitor
from gpt_ft.training.throughput import ParameterSummary, Throughput
from gpt_ft.workarounds.trainer import loggers_write_this_step, logging_as, uncount_step_not_taken


def run_callbacks(config, model, data_config: dict[str, Any] | None) -> list[Callback]:
    """The configuration's callbacks, and each of ours it does not replace or turn off: the best
    checkpoint by the task's main metric, throughput, a progress bar, last.ckpt, a whole-step timer
    for `--trainer.max_time`, the parameter summary, the metrics line, the run's provenance and the
    resume state."""
    trainer_config = config.get("trainer", {})
    given = trainer_config.get("callbacks") or []
    callbacks = list(given) if isinstance(given, (list, tuple)) else [given]  # (`--trainer.callbacks=X`: one)

    def lacks(kind: type) -> bool:
        return not any(isinstance(c, kind) for c in callbacks)

    if trainer_config.get("enable_checkpointing") is not False and lacks(ModelCheckpoint):
        callbacks.append(best_checkpoint(model))
    callbacks += [kind() for kind in (Throughput, SaveLast) if lacks(kind)]  # (SaveLast: sorted last below)
    if trainer_config.get("enable_progress_bar") is not False and lacks(ProgressBar):
        # Refreshing reads the logged loss back from the device: every 10 steps, not every step.
        callbacks.append(StepsProgressBar(refresh_rate=10))
    if trainer_config.get("max_time") is not None and lacks(Timer):
        callbacks.append(WholeStepTimer(duration=trainer_config.max_time, interval="step"))
        trainer_config.max_time = None  # the Timer above is the one
    if trainer_config.get("enable_model_summary") is not False and lacks(ModelSummary):
        callbacks.append(ParameterSummary())
    # last.ckpt's final save after stochastic weight averaging has put its average in (both at the end)
    callbacks.sort(key=lambda c: isinstance(c, SaveLast))
    last = [LastAfterBest(c) for c in callbacks if isinstance(c, SaveLast)]
    after_best = last if trainer_config.get("enable_checkpointing") is not False else []
    return [
        *callbacks,
        RunFolder(resumes=config.get("ckpt_path")),  # (its checks at fit start: before the tokenizer's copy)
        PrintMetrics(),
        Provenance(data_config),
        ResumeState(),
        StoppedEpochResumes(),
        MonitorsLogged(),
        *after_best,
    ]


class LogBar(Tqdm):
    """A bar in a log or a pipe: a line of its own every `every` seconds of a pass, and the pass's
    last (a terminal's carriage returns there ran a run's every redraw into one line)."""

    every = 30.0
    _said: tuple[float, int] | None = None  # when, and at which count, this pass last wrote a line

    def reset(self, total=None):
        self._over()
        self._said = None
        super().reset(total)

    def close(self) -> None:
        self._over()
        super().close()

    def _over(self) -> None:
        """A pass's last count, where no line said it yet (its total unknown: a pass resumed mid-way,
        data of no length)."""
        if self.leave and not self.disable and self._said and self.n > self._said[1]:
            self._line()

    def _line(self) -> None:
        self._said = (time.monotonic(), self.n)
        self.fp.write(self.__str__())

    def display(self, msg=None, pos=None) -> bool:
        now, n = time.monotonic(), self.n
        self._said = self._said or (now, 0)  # (a pass starts)
        ended = self.leave and self.total and n >= self.total
        if msg is None and n > self._said[1] and (ended or now - self._said[0] >= self.every):
            self._line()
        return True


class StepsProgressBar(TQDMProgressBar):
    """Lightning's bar, whose epoch under `max_steps` holds as many batches as the steps left take:
    Lightning counted one batch a step, so with gradient accumulation the bar passed its total; and
    under `max_epochs` too it counted the whole epoch, so a run that `max_steps` stopped within it
    left its bar short of the end, at its last refresh (20/32 for 24 steps). Off a terminal, its
    bars write lines (`LogBar`), and the sanity check's none."""

    def _in_lines(self, desc: str, leave: bool = True) -> Tqdm:
        lines = LogLines(sys.stdout)
        return LogBar(desc=desc, disable=self.is_disabled, leave=leave, file=lines, smoothing=0,
                      bar_format=self.BAR_FORMAT)  # fmt: skip

    def init_sanity_tqdm(self) -> Tqdm:
        return super().init_sanity_tqdm() if sys.stdout.isatty() else Tqdm(disable=True)

    def init_train_tqdm(self) -> Tqdm:
        return super().init_train_tqdm() if sys.stdout.isatty() else self._in_lines(self.train_description)

    def init_validation_tqdm(self) -> Tqdm:
        alone = self.trainer.state.fn == "validate"  # (left, as Lightning leaves it)
        return super().init_validation_tqdm() if sys.stdout.isatty() else self._in_lines("Validation", alone)

    def init_test_tqdm(self) -> Tqdm:
        return super().init_test_tqdm() if sys.stdout.isatty() else self._in_lines("Testing")

    def init_predict_tqdm(self) -> Tqdm:
        return super().init_predict_tqdm() if sys.stdout.isatty() else self._in_lines("Predicting")

    _done = 0  # the batches a run resumed mid-epoch finds done in that epoch

    @property
    def total_train_batches(self) -> int | float:
        trainer = self.trainer
        if trainer.max_steps is not None and trainer.max_steps > 0:
            left = (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
            return min(trainer.num_training_batches, self._done + left)
        return trainer.num_training_batches

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        if getattr(trainer.fit_loop, "restarted_mid_epoch", False):  # no epoch started: no total, no epoch
            self._done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            self.on_train_epoch_start(trainer)
            self.train_progress_bar.n = self.train_progress_bar.initial = self._done  # (its rate: this run's)
            self._done = 0


class LastAfterBest(Checkpoint):
    """`SaveLast`'s save after each validation, run where Lightning runs checkpoint callbacks (after
    every other, in their order): after the best checkpoint's, so that last.ckpt holds the best the
    validation leaves, and a run resumed from it keeps that best. A validation at an epoch's end is
    saved at the epoch's end, where ModelCheckpoint records its score then."""

    def __init__(self, last: SaveLast) -> None:
        self.last, self.at_epoch_end = last, False

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self.at_epoch_end = not trainer.sanity_checking
        else:
            self.last.after_validation(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.at_epoch_end:
            self.at_epoch_end = False
            self.last.after_validation(trainer)


class StoppedEpochResumes(Callback):
    """A run that `max_steps` stopped mid-epoch and is resumed to go further carries on with the rest
    of that epoch (stopped on its last batch, with the next epoch), as the longer run would have.

    Lightning counts the stopped epoch as done, yet restores its batch count: it would start the
    next epoch at that batch, and train that epoch short. On load, such a checkpoint's loops are
    made those of a save mid-epoch, and the data resumes at the stopped batch."""

    next_epoch = False  # the checkpoint's epoch was over: the run starts the next

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.next_epoch:
            self.next_epoch = False
            uncount_step_not_taken(trainer)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        loops = checkpoint.get("loops", {}).get("fit_loop", {})
        epochs, batches = loops.get("epoch_progress"), loops.get("epoch_loop.batch_progress")
        if epochs and batches and batches["is_last_batch"]:  # saved in the epoch's end hooks: it is over
            for counts in (epochs["current"], epochs["total"]):  # (the validation at its end saves there)
                if counts["ready"] == counts["started"] == counts["processed"] == counts["completed"] + 1:
                    counts["completed"] = counts["processed"]
        if epochs and batches and batches["is_last_batch"] and len(set(epochs["current"].values())) == 1:
            # Stopped on the epoch's last batch, the epoch counted done: Lightning would end it again
            # (no batch left) and count it twice. The next epoch starts at its first batch instead.
            batches["is_last_batch"] = False
            batches["current"] = dict.fromkeys(batches["current"], 0)
            self.next_epoch = True
            return
        if not epochs or not batches or batches["is_last_batch"] or not batches["current"]["processed"]:
            return
        if epochs["current"]["processed"] != epochs["current"]["started"]:
            return  # a save mid-epoch: resumed as it stands
        for counts in (epochs["current"], epochs["total"]):
            counts["processed"] = counts["completed"] = counts["started"] - 1
        data = trainer.datamodule
        if isinstance(data, ResumableTrainData):
            saved = checkpoint.get(type(data).__name__) or {}  # (one from before records no seed)
            at = {"epoch": epochs["current"]["processed"], "batches": batches["current"]["processed"]}
            data.load_state_dict({"seed": None, **saved, **at})


class PrintMetrics(Callback):
    """One line of validation metrics per evaluation, so a run's result is visible without a logger
    (`validate` and `test` print it in place of Lightning's table, which shows several validation
    splits' metrics under every split's column)."""

    def __init__(self) -> None:
        self.epoch_start = None
        self.printed: dict[str, float] = {}

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.epoch_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        terms = ("/task_loss", "/lm_loss")  # the objective's two terms, where λ > 0: the logs hold them
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if not k.endswith(terms)}
        metrics = {k: v for k, v in metrics.items() if not k.startswith("train/")}
        # A throughput window's figures once: the trainer keeps them until the next window's.
        shown = {k: v for k, v in metrics.items() if not k.startswith("perf/") or self.printed.get(k) != v}
        self.printed = metrics
        if shown:
            text = ", ".join(f"{k} {metric_text(v)}" for k, v in sorted(shown.items()))
            took = f" ({time.perf_counter() - self.epoch_start:.1f} s)" if self.epoch_start else ""
            # outside fit the trainer counts no steps: the line names the command (`validate`)
            stage = getattr(trainer.state.fn, "value", trainer.state.fn)
            at = f"epoch {trainer.current_epoch} step {trainer.global_step}" if stage == "fit" else stage
            line = f"{at}: {text}{took}"
            bar = trainer.progress_bar_callback
            if stage == "fit" and isinstance(bar, TQDMProgressBar) and bar.is_enabled:
                bar.print(line)  # on its own line, above the bars (outside fit they are closed by now)
            else:
                print(line, flush=True)

    on_test_end = on_validation_end  # `gpt-ft test`'s line


def step_values_read(trainer, batch_idx: int, *, bar: bool = True) -> bool:
    """Whether anything is known, during a training step, to read the values it logs: the loggers
    write after it, it is the epoch's last batch or the run's last step (callbacks monitoring a
    training value read it there), or a progress bar shows it. Lightning's `log` costs 0.5-1 ms of
    host time a value (its result collection moves and copies the value's record), most of `fit`'s
    overhead over a hand-written loop on a small model; the other steps skip it.
    Lightning's TQDM bar reads every `refresh_rate` batches; any other bar is taken to read every
    step. A stop decided after the step (a time limit) is the module's to catch. `bar=False`: the
    reasons every rank shares (Lightning shows the bar on rank 0 only)."""
    if trainer is None or loggers_write_this_step(trainer):
        return True
    if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:  # known ahead, iterable data too
        return True
    if trainer.max_steps > 0 and trainer.global_step + 1 >= trainer.max_steps:
        return True
    shown = trainer.progress_bar_callback
    if not bar or shown is None or not shown.is_enabled:
        return False
    return not isinstance(shown, TQDMProgressBar) or (batch_idx + 1) % shown.refresh_rate == 0


class StepValues:
    """A training step's values for Lightning's `log` (`train/loss` on the progress bar): logged in
    the step where `step_values_read` says they are read, or after it (`after_step`, from the
    module's `on_train_batch_end`, which runs after every callback's) when a callback stopped the
    run there, as the step's own values, so that the loggers' last row is the last step's."""

    def __init__(self) -> None:
        self.values: dict = {}
        self.batch_size, self.logged = 0, True

    def step(self, module, trainer, batch_idx: int, values: dict, batch_size: int) -> None:
        """`values`: the loss and its parts by name, logged as `train/NAME`."""
        self.values, self.batch_size = {f"train/{name}": value for name, value in values.items()}, batch_size
        self.logged = step_values_read(trainer, batch_idx)
        if self.logged:  # averaged over the ranks where every rank logs (a collective all must make;
            # a stop, which the loggers write at too, may come to one rank first: not averaged there)
            ranks = trainer is not None and trainer.world_size > 1 and not trainer.should_stop
            self.log(module, synced=ranks and step_values_read(trainer, batch_idx, bar=False))

    def after_step(self, module) -> None:
        if not self.logged and module.trainer.should_stop:  # (a stop one rank may see first: not averaged)
            with logging_as(module, "training_step"):
                self.log(module, synced=False)

    def log(self, module, synced: bool) -> None:
        # On the bar only where one shows it: Lightning turns a bar's values into Python numbers
        # after every step that logs them, a read back that makes the host wait for a GPU.
        bar = module.trainer.progress_bar_callback
        shown = bar is not None and bar.is_enabled
        # Each rank's parts are its sums over the mean count (`normalised`): their mean over the
        # ranks (`synced`: where every rank logs) is the global batch's, as one process would log it;
        # the bar's own steps (rank 0's alone) show rank 0's share. (Reduced here: Lightning's
        # sync_dist must be the same at every step of an epoch.)
        for name, value in self.values.items():
            value = module.trainer.strategy.reduce(value.detach(), reduce_op="mean") if synced else value
            module.log(name, value, prog_bar=shown and name == "train/loss", batch_size=self.batch_size)


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, which a resumed run's best carries on from the run it resumes.

    Each run writes into a version folder of its own, and Lightning restores the best score only
    when the folder is unchanged: the resumed run would take its first model for the best, however
    far below the earlier best it scored. The earlier best stays the best (its file where it is)
    until a better one replaces it."""

    @property
    def state_key(self) -> str:  # Lightning's own, so that checkpoints from before it still resume
        return super().state_key.replace(type(self).__qualname__, "ModelCheckpoint", 1)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # An epoch `max_steps` ends before a validation has no score to keep a best by: said at the end
        if self.monitor in trainer.callback_metrics:
            super().on_train_epoch_end(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        at = next((c.path(trainer) for c in trainer.callbacks if isinstance(c, SaveLast)), None)  # last's
        if trainer.is_global_zero and self.best_model_path:  # where the weights are (as a stop says)
            print(f"best: {self.best_model_path}" + f"; last: {at}" * bool(at and at.is_file()), flush=True)
        elif trainer.is_global_zero:  # (fast_dev_run: a check of the code, nothing saved)
            last = "last.ckpt holds the weights" if trainer.global_step else "nor any other: no step trained"
            said = f"the run ended before any validation gave {self.monitor}: no best checkpoint was kept"
            said = "fast_dev_run saves no checkpoint" if trainer.fast_dev_run else f"{said} ({last})"
            print(f"note: {said}.", file=sys.stderr, flush=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kept = {p: score for p, score in state_dict.get("best_k_models", {}).items() if Path(p).is_file()}
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)
        elif kept:
            super().load_state_dict({**state_dict, "dirpath": self.dirpath, "best_k_models": kept})
        else:  # no best to carry on (none kept, or its file gone): this run's first becomes the best
            self.best_model_path = ""


def best_checkpoint(model) -> ModelCheckpoint:
    """Keep the best checkpoint by the task's main metric (or the validation loss)."""
    monitor, mode = main_monitor(model)
    return BestCheckpoint(
        monitor=monitor,
        mode=mode,
        save_top_k=1,
        filename="best-{epoch}-{step}",
        auto_insert_metric_name=False,
    )


class History(Callback):
    """Every validation's metrics of the task's validation splits, with its epoch (and, in `steps`,
    the optimizer steps taken before it)."""

    def __init__(self) -> None:
        self.evaluations: list[tuple[int, dict[str, float | None]]] = []
        self.steps: list[int] = []
        self.trained_epoch = 0  # the epoch of the last training batch (`max_steps` may stop inside it)

    def on_train_batch_end(self, trainer, *args) -> None:
        self.trained_epoch = trainer.current_epoch

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        splits = pl_module.task.validation_splits
        metrics = {
            k: finite(float(v)) for k, v in trainer.callback_metrics.items() if k.split("/")[0] in splits
        }
        self.evaluations.append((trainer.current_epoch, metrics))
        self.steps.append(trainer.global_step)

    @classmethod
    def of(cls, trainer) -> History:
        """The History the trainer was built with (`gpt_ft.training.runs.build_fit` gives it one)."""
        found = [c for c in trainer.callbacks if isinstance(c, cls)]
        if not found:
            raise ValueError("A suite run's trainer is built with a History callback; this one has none.")
        return found[0]


def metric_text(value: float) -> str:
    """A metric as the metrics line shows it: four decimals, or where they would show a value below
    0.001 (a learning rate late in its schedule) as 0.0000, four significant digits."""
    return f"{value:.4f}" if value == 0 or not abs(value) < 1e-3 else f"{value:.3e}"


def finite(value: float) -> float | None:
    """A metric as a number, or None where it is undefined (NaN, inf)."""
    return value if math.isfinite(value) else None
