"""The `gpt-ft` command line.

`fit`, `validate`, `test`, `predict` are LightningCLI subcommands; this is the only place where
arguments are linked (data -> model). The other commands live in `gpt_ft/commands.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

import gpt_ft
from gpt_ft.checkpointing import (
    AtomicCheckpointIO,
    Provenance,
    ResumeState,
    SaveLast,
    find_last_checkpoint,
)
from gpt_ft.throughput import Throughput

LIGHTNING_COMMANDS = {
    "fit": "train (fine-tune or pretrain) a model",
    "validate": "evaluate on the validation splits",
    "test": "evaluate on the test splits",
    "predict": "write predictions for the test splits (GLUE submission files)",
}
COMMANDS = {
    **LIGHTNING_COMMANDS,
    "explain": "print one example of a task split as the model sees it",
    "prepare": "tokenize a text corpus into token files for pretraining",
    "tokenizer": "train a byte-level BPE tokenizer on text files",
    "generate": "continue a prompt with a trained model",
    "suite": "fine-tune and evaluate many tasks over seeds: results table, chart, GLUE submission",
}
USER_ERRORS = (ValueError, FileNotFoundError, KeyError, FloatingPointError)


class PrintMetrics(Callback):
    """One line of validation metrics per evaluation, so a run's result is visible without a logger."""

    def __init__(self) -> None:
        self.epoch_start = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.epoch_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        shown = {k: float(v) for k, v in trainer.callback_metrics.items() if not k.startswith("train/")}
        if shown:
            text = ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items()))
            took = f" ({time.perf_counter() - self.epoch_start:.1f} s)" if self.epoch_start else ""
            print(f"epoch {trainer.current_epoch} step {trainer.global_step}: {text}{took}", flush=True)


def best_checkpoint(model) -> ModelCheckpoint:
    """Keep the best checkpoint by the task's main metric (or the validation loss)."""
    if model.task is not None:
        monitor, mode = f"{model.task.validation_splits[0]}/{model.task.main_metric}", "max"
    else:
        monitor, mode = "validation/loss", "min"
    return ModelCheckpoint(
        monitor=monitor,
        mode=mode,
        save_top_k=1,
        filename="best-{epoch}-{step}",
        auto_insert_metric_name=False,
    )


class GPTCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # What the model needs from the data, stated once (DESIGN: links live here only).
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data", "model.task", compute_fn=lambda data: data.task, apply_on="instantiate")
        parser.link_arguments(
            "data", "model.tokenizer", compute_fn=lambda data: data.tokenizer_path, apply_on="instantiate"
        )
        parser.set_defaults({"data": {"class_path": "gpt_ft.task_data.TaskDataModule"}})

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        data = config.data.init_args
        # Fine-tuning from a checkpoint needs no tokenizer argument: the one saved with it is used.
        init_from = config.model.get("init_from")
        if "tokenizer" in data and data.tokenizer is None and init_from:
            from gpt_ft.module import checkpoint_tokenizer

            data.tokenizer = checkpoint_tokenizer(init_from)
        self.data_config = _plain(config.data.as_dict())

    def _parse_ckpt_path(self) -> None:
        # Lightning would apply the checkpoint's hyperparameters over the command line's; here the
        # checkpoint's configuration goes first instead, and the command line wins (see main).
        return

    def before_fit(self) -> None:
        # `--ckpt_path last`: the newest last.ckpt of this logger's runs (each run has its own
        # version folder, so Lightning alone would look only in the new, empty one).
        config = self.config_init["fit"]
        if config.get("ckpt_path") != "last" or self.trainer.logger is None:
            return
        root = Path(self.trainer.logger.root_dir)
        found = find_last_checkpoint(root)
        if found is None:
            print(
                f"no {root}/*/checkpoints/last.ckpt to resume from: starting from the beginning", flush=True
            )
            config.ckpt_path = None
        else:
            print(f"resuming from {found}", flush=True)
            config.ckpt_path = str(found)

    def instantiate_trainer(self, **kwargs: Any):
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = list(trainer_config.get("callbacks") or [])
        checkpointing = trainer_config.get("enable_checkpointing") is not False
        if checkpointing and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            callbacks.append(best_checkpoint(self.model))
        if not any(isinstance(c, Throughput) for c in callbacks):
            callbacks.append(Throughput())
        if trainer_config.get("enable_progress_bar") is not False and not any(
            isinstance(c, ProgressBar) for c in callbacks
        ):
            # Refreshing reads the logged loss back from the device: every 10 steps, not every step.
            callbacks.append(TQDMProgressBar(refresh_rate=10))
        if not any(isinstance(c, SaveLast) for c in callbacks):
            callbacks.append(SaveLast())
        callbacks += [PrintMetrics(), Provenance(getattr(self, "data_config", None)), ResumeState()]
        if not trainer_config.get("plugins"):
            kwargs["plugins"] = [AtomicCheckpointIO()]
        return super().instantiate_trainer(**kwargs, callbacks=callbacks)


def _plain(value: Any) -> Any:
    """A parsed config as plain dicts, lists and scalars (what a weights-only checkpoint may hold)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if k != "__path__"}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def lightning_main(argv: list[str] | None, *, run: bool = True) -> GPTCLI:
    """The LightningCLI: runs `fit ...` etc.; with run=False, builds model, data and trainer from
    `fit`'s arguments (no subcommand) and returns them unrun (`gpt-ft suite` uses this)."""
    import warnings

    from lightning import LightningDataModule

    # Our data modules resume mid-epoch themselves (gpt_ft/samplers.py), and a resumed run writes
    # its checkpoints into its own version folder: both of Lightning's warnings would mislead.
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before")
    warnings.filterwarnings("ignore", message="The dirpath has changed from")

    import gpt_ft.lm_data  # noqa: F401  (the data classes a config may name)
    import gpt_ft.task_data  # noqa: F401
    from gpt_ft.module import GPTModule

    shell_argv = sys.argv
    if argv is not None:  # called from Python: the process's own arguments are not this run's
        sys.argv = sys.argv[:1]
    try:
        return GPTCLI(
            GPTModule,
            LightningDataModule,
            subclass_mode_data=True,
            args=argv,
            run=run,
            trainer_defaults={
                "logger": {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": "runs"},
                },
            },
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"prog": "gpt-ft", "exit_on_error": False},
        )
    finally:
        sys.argv = shell_argv


@contextlib.contextmanager
def checkpoint_data(argv: list[str]):
    """validate/test/predict with a checkpoint of this toolkit: the configuration it records (its
    model, its data section and task card, the tokenizer saved beside it) goes first, so that the
    command needs no other argument and every argument given still wins."""
    command, ckpt = argv[0], None
    for i, arg in enumerate(argv):
        if arg.startswith("--ckpt_path="):
            ckpt = arg.split("=", 1)[1]
        elif arg == "--ckpt_path" and i + 1 < len(argv):
            ckpt = argv[i + 1]
    if command not in ("validate", "test", "predict") or not ckpt or not Path(ckpt).is_file():
        yield argv
        return
    import tempfile

    import yaml

    from gpt_ft.checkpointing import safe_load
    from gpt_ft.module import checkpoint_tokenizer

    stored = safe_load(ckpt)
    if "gpt_config" not in stored:
        yield argv
        return
    linked = ("vocab_size", "tokenizer", "task", "_instantiator", "_class_path")
    model = {k: v for k, v in stored.get("hyper_parameters", {}).items() if k not in linked}
    # The weights are the checkpoint's whatever the shape: no preset, overrides or transfer.
    model.update(init_from=str(ckpt), overrides=None, transfer_layers=None)
    config = {"model": _plain(model)}
    data = stored.get("data_config")
    if data:
        if "tokenizer" in data.get("init_args", {}):
            data["init_args"]["tokenizer"] = checkpoint_tokenizer(ckpt)  # the copy beside it
        config["data"] = data
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint_config.yaml"
        path.write_text(yaml.safe_dump(config))
        yield [command, f"--config={path}", *argv[1:]]


def user_message(exc: BaseException) -> str:
    """The sentence for the user: the innermost cause (jsonargparse wraps errors raised in __init__)."""
    while isinstance(exc.__cause__, USER_ERRORS):
        exc = exc.__cause__
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return str(text).strip()


def parse_error_message(text: str) -> str:
    """jsonargparse's nested report of a bad argument as one sentence: the argument and the reason."""
    keys = list(dict.fromkeys(re.findall(r'Parser key "([^"]+)"', text)))
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    values = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")]
    nested = re.search(r"NestedArg\(key='[^']*', val='([^']*)'\)", text)
    value = nested[1] if nested else values[0] if values else None
    where = f"--{'.'.join(keys)}: " if keys else ""
    unaccepted = [line for line in lines if "is not accepted" in line or "is not expected" in line]
    bad_class = [
        f"{line.removeprefix('Problem with given ').rstrip(':')}: {lines[i + 1]}"
        for i, line in enumerate(lines[:-1])
        if line.startswith("Problem with given class_path") and not lines[i + 1].startswith("Parser key")
    ]
    expected = [line for line in lines if line.startswith("Expected a ") and "NoneType" not in line]
    if unaccepted:
        reason = unaccepted[0]
    elif any(line.startswith("Expected a path but") for line in lines):
        reason = f"{value} is not a file that can be read"
    elif bad_class:
        reason = bad_class[-1] + (f" (in {value})" if value and value.endswith((".yaml", ".yml")) else "")
    elif expected:
        match = re.match(r"Expected a (.+?)(?:\. Got value: (.*))?$", expected[0])
        kind = re.sub(r"<class '([^']+)'>", r"\1", match[1])
        reason = f"expected {kind}, got {match[2] if match[2] is not None else value!r}"
    else:
        noise = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value")
        reasons = [line for line in lines if not line.startswith(noise)]
        reason = reasons[0] if reasons else lines[0] if lines else "invalid arguments"
    return f"{where}{reason.rstrip('.:')}."


def fail(message: str) -> None:
    print(f"gpt-ft: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    from_shell = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: gpt-ft {" + ",".join(COMMANDS) + "} ... [--debug]\n")
        for name, text in COMMANDS.items():
            print(f"  {name:<10} {text}")
        print("\n`gpt-ft COMMAND --help` lists a command's arguments.")
        return
    if argv[0] == "--version":
        print(f"gpt-ft {gpt_ft.__version__}")
        return
    command = argv[0]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; choose from {', '.join(COMMANDS)}.")
    try:
        if command in LIGHTNING_COMMANDS:
            if debug and from_shell:
                sys.argv.remove("--debug")
            with checkpoint_data(argv) as extended:
                if from_shell:
                    sys.argv = [sys.argv[0], *extended]
                    lightning_main(None)
                else:
                    lightning_main(extended)
        else:
            from gpt_ft import commands

            getattr(commands, command)(argv[1:])
    except USER_ERRORS as exc:
        if debug:
            raise
        fail(user_message(exc))
    except argparse.ArgumentError as exc:
        if debug:
            raise
        fail(parse_error_message(str(exc)))
    except SIGTERMException:
        print("gpt-ft: stopped by SIGTERM", file=sys.stderr)
        raise SystemExit(128 + 15) from None
