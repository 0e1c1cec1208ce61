"""Checkpoints that stand alone, are written atomically, and resume a run exactly.

- `SaveLast`: `last.ckpt`, the newest state: after every validation, every N steps if asked, at
  the end (with stochastic weight averaging's average), and on SIGTERM or Ctrl-C (at the next
  optimizer step, so no accumulated gradient is lost; a second Ctrl-C stops at once).
- `ResumeState`: the random number generators' states, so that dropout after a resume draws what
  it would have drawn. (The data's position is saved by the data modules, see gpt_ft/data/samplers.py;
  model, optimizer, scheduler and loop counters by Lightning.)
- `Provenance`: the tokenizer (saved beside), the run's data section (task card included) and the
  toolkit's version and commit, recorded inside every checkpoint: `validate`, `test` and
  `predict --ckpt_path X` need no other argument.
- `AtomicCheckpointIO`: every checkpoint is written to a temporary file and renamed into place
  (a crash while saving leaves the last good one whole); read with `weights_only=True`.
The checkpoint's format (its keys, reader and writer) is `gpt_ft/weights/checkpoint.py`'s.
"""

from __future__ import annotations

import functools
import random
import signal
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, StochasticWeightAveraging, Timer
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from gpt_ft.training.recorded import without_nulls
from gpt_ft.training.stop_signals import StopSignals
from gpt_ft.weights.checkpoint import Checkpoint, safe_load, save_file
from gpt_ft.workarounds.trainer import (
    clear_graceful_stop,
    request_graceful_stop,
    should_accumulate,
    skip_next_validation,
    validation_follows,
)

LAST = f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}.ckpt"


class WholeStepTimer(Timer):
    """`--trainer.max_time` that stops only between optimizer steps.

    Lightning's Timer may stop inside a gradient-accumulation window, and the checkpoint taken
    then cannot resume that window exactly (its first micro-batches' gradients are gone). This one
    lets the window finish first, as `SaveLast` does for SIGTERM. Its state is Lightning's Timer's,
    under the same key, so the training time already spent carries over on resume.
    """

    @property
    def state_key(self) -> str:
        return "Timer"

    def on_train_batch_end(self, trainer, *args: Any, **kwargs: Any) -> None:
        if not should_accumulate(trainer):
            due = validation_follows(trainer)  # a validation the run makes here anyway
            super().on_train_batch_end(trainer, *args, **kwargs)
            if trainer.should_stop and not due:  # none added at the cut (Lightning's for a stop)
                skip_next_validation(trainer)


FIT_RESUME = "resume with the same `gpt-ft fit` command and --ckpt_path last"
MERGED_NO_RESUME = (
    "it holds the merged model (--model.lora.checkpoint merged), which a LoRA run cannot resume from: "
    "start anew from it with --model.init_from, or keep adapters (the default) to resume"
)


class SaveLast(Callback):
    """`last.ckpt` beside the best one: always the newest state (Lightning's `save_last` follows
    the monitored checkpoint's saves), which `--ckpt_path last` resumes on every rank count.

    SIGTERM and Ctrl-C (SIGINT) stop training the same way: the optimizer step under way finishes,
    `last.ckpt` is saved and Lightning's `SIGTERMException` ends the run; its exit code tells the
    signal apart (128 + its number, set in `on_exception`). A validation due at that step, or under
    way, runs to its end first (Lightning would cut it short, and the resumed run would not run it
    again: its scores and best checkpoint would be lost), and `last.ckpt` is saved again after it.
    While training runs, the signals' handlers are `StopSignals`' (gpt_ft/training/stop_signals.py):
    a signal that reached any rank of a DDP run stops all of them at the same step, and a second
    Ctrl-C gives the previous handler back and stops at once with `KeyboardInterrupt`.
    """

    def __init__(self, every_n_steps: int | None = None) -> None:
        """
        Args:
            every_n_steps: Also save every this many optimizer steps (besides after each
                validation, at the end, and on SIGTERM or Ctrl-C).
        """
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}.")
        self.every_n_steps, self._saved_step, self._sigterm_pending = every_n_steps, -1, False
        self._save_pending = False  # a validation inside an accumulation window: saved at its end
        self._stop_after_validation = False  # a stop that waits for a validation
        self.rerun: str | None = None  # a suite's advice: it reruns a stopped run from its start (no save)
        self._said = False  # the stop said (once)
        self._stop_signal: signal.Signals | None = None  # the signal agreed on (SIGINT: Ctrl-C)
        self.signals = StopSignals()

    def path(self, trainer) -> Path | None:
        folder = checkpoint_folder(trainer)
        return None if folder is None else folder / LAST

    def _save(self, trainer, again: bool = False) -> Path | None:
        """Saves last.ckpt unless this step's state is saved already (`again`: it changed since)."""
        path = self.path(trainer)
        if path is None or (trainer.global_step == self._saved_step and not again):
            return None
        trainer.save_checkpoint(path, weights_only=False)
        self._saved_step = trainer.global_step
        return path

    def _stop(self, trainer) -> None:
        """As the run stops on a signal: last.ckpt saved, unless a suite reruns the run from its
        start (`rerun`), and the stop said once."""
        path = None if self.rerun else self._save(trainer) or self.path(trainer)
        if trainer.is_global_zero and not self._said:
            self._said, name, step = True, (self._stop_signal or signal.SIGTERM).name, trainer.global_step
            if self.rerun or path is None:  # (a requeue would start afresh: said so)
                why = self.rerun or "nothing saved: checkpointing is off (--trainer.enable_checkpointing)."
                return print(f"{name}: stopped at step {step}; {why}", flush=True)
            lora = getattr(trainer.lightning_module, "lora", None)
            advice = MERGED_NO_RESUME if lora is not None and lora.checkpoint == "merged" else FIT_RESUME
            print(f"{name}: saved step {step} to {path}; {advice}", flush=True)

    def on_train_start(self, trainer, pl_module) -> None:
        self._stop_signal, self._said, StopSignals.unheeded = None, False, None
        self.signals.install(trainer)

    def _signalled(self) -> bool:
        """Whether a stop signal reached any rank (a collective under DDP: every rank asks here)."""
        self._stop_signal = self.signals.agreed() or self._stop_signal
        return self._stop_signal is not None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        accumulating = should_accumulate(trainer)
        every = self.every_n_steps and trainer.global_step % self.every_n_steps == 0
        if not accumulating and (every or self._save_pending):
            # Saved after a validation due now (`after_validation`): a checkpoint of this step taken
            # before it would resume past it, the validation never run, its score and best lost.
            self._save_pending = validation_follows(trainer)
            if not self._save_pending:
                self._save(trainer)
        if self._signalled() or self._sigterm_pending:
            if accumulating:  # finish the optimizer step first: no accumulated gradient is lost
                self._sigterm_pending = True
                return
            self._sigterm_pending = False
            request_graceful_stop(trainer)  # Lightning stops after this hook
            if not validation_follows(trainer):  # one due now runs first: saved after it, then stopped
                self._stop(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validate_before_stopping(trainer)

    def on_validation_batch_end(self, trainer, *args: Any, **kwargs: Any) -> None:
        self._validate_before_stopping(trainer)  # a signal during the validation

    def _validate_before_stopping(self, trainer) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._signalled():
            clear_graceful_stop(trainer)  # asked again at the validation's end
            if not self._stop_after_validation and trainer.is_global_zero:
                name = (self._stop_signal or signal.SIGTERM).name
                print(f"{name}: validating step {trainer.global_step} before stopping", flush=True)
            self._stop_after_validation, self._said = True, False  # said again after it

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._stop_after_validation:
            self._stop_after_validation = False
            if should_accumulate(trainer):  # stops at the window's end, saving then
                self._sigterm_pending = True
            else:  # stops after the checkpoint callbacks, `after_validation`'s save included
                request_graceful_stop(trainer)

    def after_validation(self, trainer) -> None:
        """The save after a validation (`callbacks.LastAfterBest`'s call), again where this step's
        state was saved before it; inside an accumulation window (whose gradients no checkpoint
        holds) at the window's end."""
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._save_pending = should_accumulate(trainer)
            if not self._save_pending:
                self._save(trainer, again=True)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.signals.restore()
        if not isinstance(exception, SIGTERMException):
            return
        # The exit code that names the signal: gpt-ft's CLI exits with it (130 for Ctrl-C).
        exception.code = 128 + (self._stop_signal or signal.SIGTERM)
        # The signal noticed by Lightning after this callback's batch hook (or during validation);
        # validate, test and predict save nothing (no run to resume): they stop where they are.
        if trainer.state.fn == "fit" and not should_accumulate(trainer):
            self._stop(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        StopSignals.unheeded = self.signals.agreed() or self._stop_signal  # (every rank ends here)
        self.signals.restore()
        if any(
            isinstance(c, StochasticWeightAveraging) for c in trainer.callbacks
        ):  # its average, put in now
            self._saved_step = -1
        self._save(trainer)


class ResumeState(Callback):
    """Every process's random number generators' states in every checkpoint, each restored on its
    own rank when the run resumes.

    Data loaders draw their seeds from their own generators, so between a checkpoint and the next
    training step nothing else draws from these: the resumed run's dropout masks are the
    uninterrupted run's, on every rank.
    """

    def __init__(self) -> None:
        self.trainer = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        # Called on every rank as a checkpoint is made (rank 0 writes it): gather them all.
        state = rng_state()
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1 or not torch.distributed.is_initialized():
            return {"ranks": [state]}
        states: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(states, state)
        return {"ranks": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        states = state.get("ranks", [state])  # a checkpoint of one state for all ranks: as saved
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        fits = getattr(getattr(self.trainer, "state", None), "fn", "fit") == "fit"  # (validate: no dropout)
        if fits and len(states) != world and "ranks" in state:
            rank_zero_warn(
                f"The checkpoint holds the random states of {len(states)} processes and this run has "
                f"{world}: weights, optimizer, step and (at as many examples a step) data order are "
                "restored, but dropout masks (the processes' random draws) differ from those of the "
                "uninterrupted run."
            )
        set_rng_state(states[rank] if rank < len(states) else states[0])


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU (and CUDA) random states, as plain values and tensors."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos)}
        | {"has_gauss": int(has_gauss), "gauss": float(gauss)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():  # the devices this machine has of those saved
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


ANOTHER_CARD = {  # what a run with another card than its checkpoint's does, and what follows
    "fit": ("resuming", "The run goes on with the new one."),
    "validate": ("validating", "Its head's outputs are read as the new card's."),
    "test": ("testing", "Its head's outputs are read as the new card's."),
    "predict": ("predicting", "Its head's outputs are written as the new card's."),
}

DATA_FIELDS = ("hub", "local", "validation_splits", "test_splits", "index", "submission_files", "metrics",
               "main_metric", "ignore_labels")  # fmt: skip
"""A card's fields that say which data a model is scored on, and how: not what it learned."""


class Provenance(Callback):
    """Makes checkpoints stand alone: the tokenizer is saved beside them and recorded inside, with
    the run's data section (its task card included) and the toolkit's version and commit."""

    def __init__(self, data_config: dict[str, Any] | None = None) -> None:
        self.data_config = data_config

    def on_fit_start(self, trainer, pl_module) -> None:
        tokenizer, folder = pl_module.hparams.get("tokenizer"), checkpoint_folder(trainer)
        if tokenizer and folder is not None and trainer.is_global_zero:
            from gpt_ft.data.folders import save_tokenizer
            from gpt_ft.data.tokenizer import load_tokenizer

            save_tokenizer(load_tokenizer(tokenizer), folder / "tokenizer")

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """A run resumed, or a checkpoint scored, with another task card than the one it trained on
        is told what changed (swapped labels would flip what each class means, without an error;
        another task's model would write another task's submission)."""
        fn = getattr(trainer.state, "fn", None)
        before = (Checkpoint(checkpoint).data_args or {}).get("task") or {}
        now = ((self.data_config or {}).get("init_args") or {}).get("task") or {}
        if fn not in ANOTHER_CARD or not before or not now:
            return
        # (`without_nulls`: a field a later version added, null in the card, is no change)
        old = {"class": before.get("class_path"), **without_nulls(before.get("init_args") or {})}
        new = {"class": now.get("class_path"), **without_nulls(now.get("init_args") or {})}
        same = {"__path__"} if fn == "fit" else {"__path__", *DATA_FIELDS}  # scored on other data: its own
        held = [k for k in checkpoint.get("state_dict", {}) if k.endswith("head.threshold")]  # (validation's)
        if fn != "fit" and held and new.get("threshold", old.get("threshold")) != old.get("threshold"):
            old["threshold"] = float(checkpoint["state_dict"][held[0]])  # the card's replaces the one chosen
            pl_module.get_submodule(held[0].removesuffix(".threshold")).threshold = float(new["threshold"])
        changed = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in dict.fromkeys([*old, *new])
                   if k not in same and old.get(k) != new.get(k)]  # fmt: skip
        if changed:
            doing, so = ANOTHER_CARD[fn]
            told = f"another task card than {trainer.ckpt_path} trained on: {'; '.join(changed)}"
            rank_zero_warn(f"{doing} with {told}. {so}")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        saved = Checkpoint(checkpoint)
        if pl_module.hparams.get("tokenizer"):
            saved.tokenizer = "tokenizer"  # a folder beside the checkpoint file
        if self.data_config is not None:
            saved.data = self.data_config
        saved.provenance = {"version": version("gpt_ft"), "commit": source_commit()}


def checkpoint_folder(trainer) -> Path | None:
    """Where checkpoints go; None where none are saved (no checkpointing, `fast_dev_run`)."""
    ckpt = trainer.checkpoint_callback
    return None if ckpt is None or ckpt.dirpath is None or trainer.fast_dev_run else Path(ckpt.dirpath)


@functools.cache
def source_commit() -> str | None:
    """The git commit of the toolkit's source, when it runs from a checkout: asked of git once a
    process (the code running is the code imported), not at every checkpoint saved."""
    root = Path(__file__).resolve().parents[2]  # gpt_ft/training/checkpointing.py
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint to a temporary file in the same folder, then renames it into place; reads
    with `torch.load(weights_only=True)`: a checkpoint cannot run code (gpt_ft's hold only tensors
    and plain values)."""

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None):
        load = super().load_checkpoint
        return safe_load(path, lambda p: load(p, map_location, weights_only=weights_only is not False))

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        save_file(checkpoint, path)


def is_checkpoint(path: Path) -> bool:
    """A checkpoint file, or FSDP's sharded one (`state_dict_type: sharded`): shards and meta.pt."""
    return path.is_file() or (path / "meta.pt").is_file()


def find_last_checkpoint(root: str | Path | None, folders: list[str | Path] = ()) -> Path | None:
    """The newest `last.ckpt` of a logger's runs (`ROOT/version_*/checkpoints/last.ckpt`; None: no
    logger) and of the `folders` given (a checkpoint callback's `dirpath`): a file, or FSDP's shards."""
    found = (
        [p for p in Path(root).glob(f"*/checkpoints/{LAST}") if is_checkpoint(p)] if root is not None else []
    )
    found += [p for p in (Path(folder) / LAST for folder in folders) if is_checkpoint(p)]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def restore_class_weights(head, saved: list[float] | None, fitting: bool) -> None:
    """A checkpoint's class weights (`saved`) onto the head that evaluates it; a run that fits on
    from it keeps its own (`--model.class_weights`, as its own learning rate), and says so where
    they differ (the checkpoint's replaced them without a word, against `hparams.yaml`)."""
    if head is None:
        return
    own = None if head.class_weights is None else head.class_weights.tolist()
    if not fitting and saved is not None:
        head.class_weights = torch.tensor(saved, device=head.weight.device)
    elif fitting and saved != own:
        rank_zero_info(
            f"resumed with other class weights than the checkpoint's {saved}, which apply from here on: "
            f"{own}."
        )
