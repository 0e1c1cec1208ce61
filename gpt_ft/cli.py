"""The `gpt-ft` command line.

`fit`, `validate`, `test`, `predict` are LightningCLI subcommands; this is the only place where
arguments are linked (data -> model). `explain` shows what the model is fed; it takes the same
data arguments (and --config) as `fit`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

import gpt_ft

LIGHTNING_COMMANDS = {
    "fit": "train (fine-tune or pretrain) a model",
    "validate": "evaluate on the validation splits",
    "test": "evaluate on the test splits",
    "predict": "write predictions for the test splits (GLUE submission files)",
}
COMMANDS = {**LIGHTNING_COMMANDS, "explain": "print one example of a split as the model sees it"}
USER_ERRORS = (ValueError, FileNotFoundError, KeyError)


class PrintMetrics(Callback):
    """One line of validation metrics per evaluation, so a run's result is visible without a logger."""

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        shown = {k: float(v) for k, v in trainer.callback_metrics.items() if not k.startswith("train/")}
        if shown:
            text = ", ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items()))
            print(f"epoch {trainer.current_epoch} step {trainer.global_step}: {text}", flush=True)


def best_checkpoint(model) -> ModelCheckpoint:
    """Keep the best checkpoint by the task's main metric (or the validation loss), and the last."""
    if model.task is not None:
        monitor, mode = f"{model.task.validation_splits[0]}/{model.task.main_metric}", "max"
    else:
        monitor, mode = "validation/loss", "min"
    return ModelCheckpoint(
        monitor=monitor,
        mode=mode,
        save_top_k=1,
        save_last=True,
        filename="best-{epoch}-{step}",
        auto_insert_metric_name=False,
    )


class GPTCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # What the model needs from the data, stated once (DESIGN: links live here only).
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data", "model.task", compute_fn=lambda data: data.task, apply_on="instantiate")

    def instantiate_trainer(self, **kwargs: Any):
        callbacks = list(self._get(self.config_init, "trainer", default={}).get("callbacks") or [])
        if not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            callbacks.append(best_checkpoint(self.model))
        callbacks.append(PrintMetrics())
        return super().instantiate_trainer(**kwargs, callbacks=callbacks)


def lightning_main(argv: list[str] | None) -> None:
    from gpt_ft.module import GPTModule
    from gpt_ft.task_data import TaskDataModule

    GPTCLI(
        GPTModule,
        TaskDataModule,
        args=argv,
        trainer_defaults={
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": "runs"},
            },
        },
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "gpt-ft"},
    )


def fail(message: str) -> None:
    print(f"gpt-ft: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def explain(argv: list[str]) -> None:
    from jsonargparse import ActionConfigFile, ArgumentParser

    from gpt_ft.task_data import TaskDataModule

    parser = ArgumentParser(prog="gpt-ft explain", description=COMMANDS["explain"])
    parser.add_argument(
        "--config", action=ActionConfigFile, help="a fit config; only its data section is used"
    )
    parser.add_class_arguments(TaskDataModule, "data", sub_configs=True)
    # The rest of a fit config is accepted and ignored, so `explain` takes the very same files.
    for section in ("model", "trainer", "optimizer", "lr_scheduler", "seed_everything", "ckpt_path"):
        parser.add_argument(f"--{section}", type=Any, default=None, help="(ignored)")
    parser.add_argument("--split", default="train", help="split name, e.g. train, validation")
    parser.add_argument("--index", type=int, default=0, help="example number within the split")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    cfg = parser.parse_args(argv)
    data = parser.instantiate(cfg).data
    shown = data.explain(cfg.split, cfg.index)
    if cfg.json:
        print(json.dumps(shown, ensure_ascii=False))
        return
    print(f"task {data.task.name}, split {cfg.split}, example {cfg.index}: label {shown['label']!r}")
    for i, seq in enumerate(shown["sequences"]):
        k = seq["extract_index"]
        print(f"sequence {i} ({len(seq['ids'])} tokens, extract at {k}):")
        print("  " + " ".join(seq["tokens"]))
        print("  " + " ".join(str(t) for t in seq["ids"]))


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
        if command == "explain":
            explain(argv[1:])
        else:
            if debug and from_shell:
                sys.argv.remove("--debug")
            lightning_main(None if from_shell else argv)
    except USER_ERRORS as exc:
        if debug:
            raise
        fail(str(exc).strip().strip('"'))
