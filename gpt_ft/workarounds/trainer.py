"""Lightning's trainer, loops and callbacks: what they decide privately."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer


def no_tips(record: logging.LogRecord) -> bool:
    """A logging filter for `lightning.pytorch.utilities.rank_zero` that leaves out two notes Lightning
    2.6 logs at every trainer's start and that tell a run's user nothing: an advertisement ("💡 Tip:
    For seamless cloud logging ... install litlogger", `_LoggerConnector.configure_logger`), and that
    the toolkit's own summary callback stands in for Lightning's ("Trainer already configured with
    model summary callbacks: [<class ...ParameterSummary>]", `_CallbackConnector`); its other notes
    pass. Nothing to do if the wording changes: the notes show again (tests/test_workarounds.py)."""
    return not str(record.msg).startswith(("💡 Tip:", "Trainer already configured with model summary"))


@contextmanager
def process_kept() -> Iterator[None]:
    """What a command changes in its process, put back as it returns, so that a Python caller's next
    run, or its own code, finds the process as it was: Lightning's seed left in the environment
    (`seed_everything` writes `PL_GLOBAL_SEED`, which the next `seed_everything(None)` reads back: a
    run given no seed took the last run's, not 0), the warnings' filters and their one-line format
    (`quiet_misleading_warnings`), the levels of `torchao_import_loggers`, the `gpt_ft` logger's
    level and handlers (its notes shown on stderr while a command runs). The `no_tips` filter
    stays on Lightning's logger: it drops two notes of Lightning's own and nothing else."""
    import os
    import warnings

    from gpt_ft.workarounds.kernels import torchao_import_loggers

    environment = {name: os.environ.get(name) for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    own = logging.getLogger("gpt_ft")
    levels = {logger: logger.level for logger in [*torchao_import_loggers(), own]}
    handlers = list(own.handlers)
    shown = warnings.formatwarning
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for logger, level in levels.items():
            logger.setLevel(level)
        own.handlers[:] = handlers
        warnings.formatwarning = shown


def quiet_misleading_warnings() -> None:
    """Lightning's warnings that would mislead a gpt_ft run's user, ignored (a warning reworded
    shows again):

    - a resume mid-epoch: the data modules resume mid-epoch themselves (gpt_ft/data/samplers.py);
    - syncing validation and test metrics, or `devices=1` advised for them: they are computed over
      every rank's examples, gathered by example and the distributed sampler's repeats dropped
      (gpt_ft/training/eval_metrics.py), before they are logged;
    - an empty list of loaders: a token folder without a validation block, which its data module
      has said;
    - a checkpoint folder not empty: it holds the run's lock when Lightning looks, and earlier
      checkpoints there are refused unless resumed (`run_folders.no_earlier_checkpoints`);
    - `args` given beside sys.argv: arguments always come as `args`, and sys.argv is left as it is
      (DDP launches its other processes with it);
    - the module's `on_after_batch_transfer` used beside a data module: the data modules define none,
      and the module's (scores back to float32, gpt_ft/training/module.py) is the one meant to run;
    - the model summary's size "not accurate" under mixed precision: its weights are float32, as
      the 32 bits it counts;
    - torch's deprecation of `isinstance(treespec, LeafSpec)`: Lightning's own call
      (lightning/pytorch/utilities/_pytree.py), nothing a run's user can change;
    - "No seed found, seed set to 0": `--seed_everything` given as true or not at all is 0, as
      documented (gpt_ft/workarounds/cli.py), and recorded so in the run's config.yaml.

    And the toolkit's own warnings are shown as Lightning shows its own: on one line, without the
    line of source that raised them (a log read `rank_zero_warn(f"{given} is {than} the run's ...`).
    """
    import warnings

    if getattr(warnings.formatwarning, "__name__", "") != "one_line":
        package, shown = str(Path(__file__).resolve().parents[1]), warnings.formatwarning

        def one_line(message, category, filename, lineno, line=None) -> str:
            if str(filename).startswith(package):
                return f"{filename}:{lineno}: {message}\n"
            return shown(message, category, filename, lineno, line)

        warnings.formatwarning = one_line

    for message in (
        "You're resuming from a checkpoint that ended before",
        r"It is recommended to use `self.log\('(validation|test)",
        r"Using `DistributedSampler` with the dataloaders\. During `trainer\.(validate|test)\(\)`",
        "Total length of `list` across ranks is zero",
        "Checkpoint directory .* exists and is not empty",
        "LightningCLI's args parameter is intended",
        "You have overridden `on_after_batch_transfer` in `LightningModule` but have passed in a",
        r"Precision (bf)?16-mixed is not supported by the model summary",
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "No seed found, seed set to 0",
    ):
        warnings.filterwarnings("ignore", message=message)


def should_accumulate(trainer: Trainer) -> bool:
    """Whether the training batch under way only accumulates gradients (no optimizer step follows it).

    Lightning-AI/pytorch-lightning#11688 asks for a callback hook after the optimizer step; until
    there is one, a callback asks the training epoch loop (`TrainingEpochLoop._should_accumulate`,
    src/lightning/pytorch/loops/training_epoch_loop.py), which also knows that the epoch's last batch
    steps and that some strategies accumulate themselves. If it is renamed or removed, move to the
    hook where there is one; otherwise follow what the loop's `advance` now calls.
    """
    return trainer.fit_loop.epoch_loop._should_accumulate()


def loggers_write_this_step(trainer: Trainer) -> bool:
    """Whether the loggers write the values logged in the training step under way.

    Lightning decides it in `_LoggerConnector.should_update_logs` (every `log_every_n_steps` optimizer
    steps, counted by the epoch loop's `_batches_that_stepped`, or when the trainer should stop;
    src/lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py), on a private
    connector, and again after the step with the same answer (the count moves after it). No public
    API says it ahead. If the connector or the property changes, ask whatever `update_train_step_metrics`
    now asks; were it gone, compute `(trainer.global_step + 1) % trainer.log_every_n_steps == 0`.
    """
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


@contextmanager
def logging_as(module: LightningModule, hook: str) -> Iterator[None]:
    """`module.log` calls inside are recorded as made in `hook` (e.g. a training step's values logged
    from `on_train_batch_end`, once a callback's decision shows they will be read).

    `LightningModule.log` files a value under the hook running (`_current_fx_name`, which
    src/lightning/pytorch/trainer/call.py sets around each hook); the same name logged from two
    hooks would be two records, the stale one shadowing the fresh one. No public API logs on behalf
    of another hook. If the attribute is renamed, set whatever `call._call_lightning_module_hook`
    now sets; if logging ever takes the hook as an argument, pass it instead.
    """
    previous = module._current_fx_name
    module._current_fx_name = hook
    try:
        yield
    finally:
        module._current_fx_name = previous


def request_graceful_stop(trainer: Trainer) -> None:
    """Stop training as Lightning does on SIGTERM: after the batch under way, with `SIGTERMException`.

    No public API sets it: `Trainer.received_sigterm` (Lightning-AI/pytorch-lightning#16501) is a
    read-only property over the flag that Lightning's SIGTERM handler sets on the trainer's private
    signal connector (src/lightning/pytorch/trainer/connectors/signal_connector.py). The public
    `trainer.should_stop` ends `fit` normally instead: no `SIGTERMException` (so no exit code naming
    the signal) and not before `min_steps`/`min_epochs`. If the connector or its flag changes, set
    whatever the handler now sets; if Lightning adds a public request to stop, use it.
    """
    trainer._signal_connector.received_sigterm = True


def validation_follows(trainer: Trainer) -> bool:
    """Whether Lightning validates after the training batch just ended: its epoch loop's own test
    (private), asked in `on_train_batch_end`; False where that test is not there to ask."""
    try:
        loop = trainer.fit_loop.epoch_loop
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)) and not loop._skip_next_val
    except (AttributeError, TypeError):
        return False


def skip_next_validation(trainer: Trainer) -> None:
    """No validation after the training batch just ended. Lightning validates at a step where
    `trainer.should_stop` was set (so that a stop by early stopping is judged), which a run stopped
    by a time limit would have made only then: its resumed run would differ from the uninterrupted
    one (early stopping's count, the best checkpoint). The epoch loop's own flag (private; set by it
    when resuming from a checkpoint saved after a validation) is the one way to ask; if it goes,
    find what the loop now reads before its `_should_check_val_fx` verdict."""
    trainer.fit_loop.epoch_loop._skip_next_val = True


def clear_graceful_stop(trainer: Trainer) -> None:
    """Withdraw a stop requested by SIGTERM or `request_graceful_stop` (see there)."""
    trainer._signal_connector.received_sigterm = False


def judge_after_every_validation(trainer: Trainer) -> None:
    """`--trainer.val_check_interval 1` validates after every batch; the best checkpoint and early
    stopping then judge every validation, not only each epoch's last.

    ModelCheckpoint and EarlyStopping choose between judging at a training epoch's end and after each
    validation by testing `trainer.val_check_interval == 1.0`, which the int 1 passes too
    (src/lightning/pytorch/callbacks/model_checkpoint.py, `_should_save_on_train_epoch_end`;
    early_stopping.py, `setup`): a run validating after every batch kept the best of the epochs'
    ends alone. Their own arguments (`save_on_train_epoch_end`, `check_on_train_epoch_end`), where
    left unset, are set here before the callbacks' setup; a public setter does not exist. Once
    Lightning tells the int apart, drop this.
    """
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    if type(trainer.val_check_interval) is not int or trainer.val_check_interval != 1:
        return
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback._save_on_train_epoch_end is None:
            callback._save_on_train_epoch_end = False
        elif isinstance(callback, EarlyStopping) and callback._check_on_train_epoch_end is None:
            callback._check_on_train_epoch_end = False


def summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *columns: tuple[str, list[str]],
) -> str:
    """Lightning's model summary table of `columns` (each a name and its rows) with its totals.

    `ModelSummary.summarize`, the public hook to override, receives the columns but no public
    formatter: Lightning's own `summarize` calls the private `_format_summary_table`
    (src/lightning/pytorch/utilities/model_summary/model_summary.py); we found no upstream issue
    asking for a public one. If its signature changes, call it as `ModelSummary.summarize` then does
    (src/lightning/pytorch/callbacks/model_summary.py).
    """
    from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

    return _format_summary_table(
        total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
    )


def uncount_step_not_taken(trainer: Trainer) -> None:
    """A run resumed where a finished epoch's checkpoint left it (its batch counts made the next
    epoch's start: `StoppedEpochResumes`) will count one logging step it does not take.

    The training epoch loop, restarted "on last" (`_TrainingEpochLoop.advance`,
    src/lightning/pytorch/loops/training_epoch_loop.py), skips the validation that batch -1 seems due
    for without training a batch, yet `on_advance_end` adds one to `_batches_that_stepped`, the step
    the loggers write under: every later row one step late, and `log_every_n_steps` one off. Called
    at that epoch's start, this takes the one back where the loop will skip. If the loop stops
    skipping there, or counts otherwise, check the steps metrics.csv writes after such a resume.
    """
    loop = trainer.fit_loop.epoch_loop
    if (
        loop.restarting
        and loop.restarted_on_last
        and loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
    ):
        loop._batches_that_stepped -= 1
