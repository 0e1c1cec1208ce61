"""One fine-tuning run of a suite, in this process: fit, the chosen epoch's validation metrics,
and the same model's test predictions."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import Callback

from gpt_ft.adapters import TaskDataError

BuildRun = Callable[[list[str]], tuple[Any, Any, Any]]
"""`gpt-ft fit` arguments -> (model, data module, trainer), built but not run (the command line's)."""


class History(Callback):
    """Every validation's metrics of the task's validation splits, with its epoch."""

    def __init__(self) -> None:
        self.evaluations: list[tuple[int, dict[str, float | None]]] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        splits = pl_module.task.validation_splits
        metrics = {
            k: finite(float(v)) for k, v in trainer.callback_metrics.items() if k.split("/")[0] in splits
        }
        self.evaluations.append((trainer.current_epoch, metrics))


def fit_and_evaluate(
    build: BuildRun, argv: list[str], select: str, *, predict: bool, log=print, min_steps: int | None = None
) -> tuple[dict[str, float], int]:
    """`gpt-ft fit argv` in this process; the validation metrics of the last (or best) epoch, and
    that epoch. With `predict`, the same model writes its test predictions; a test split that
    cannot be read (e.g. MNLI's diagnostic file not downloaded) is named in a warning and left out,
    so the run's scores still count. With `min_steps`, the epochs are raised where they would give
    fewer optimizer steps (a small training subset)."""
    model, data, trainer = build(argv)
    if model.task is None:
        raise ValueError("A suite fine-tunes task cards; this run has no task.")
    if min_steps:
        batches = math.ceil(len(data.encoded("train", labelled=True)) / data.batch_size)
        steps = math.ceil(batches / trainer.accumulate_grad_batches)
        needed = math.ceil(min_steps / steps)
        if trainer.max_epochs is not None and 0 <= trainer.max_epochs < needed:
            trainer.fit_loop.max_epochs = needed
    history = History()
    trainer.callbacks.append(history)
    trainer.fit(model, datamodule=data)
    if not history.evaluations:
        raise ValueError("The run ended without a validation: check --trainer.limit_val_batches.")
    main = main_key(model.task)
    if select == "best":
        # an undefined score (None: e.g. a correlation of constant predictions) ranks last
        epoch, metrics = max(
            history.evaluations, key=lambda e: -math.inf if e[1].get(main) is None else e[1][main]
        )
    else:
        epoch, metrics = history.evaluations[-1]
    splits = readable_test_splits(data, log) if predict else []
    if splits:
        ckpt = "best" if select == "best" and trainer.checkpoint_callback is not None else None
        loaders = data.predict_dataloader(splits)
        trainer.predict(model, dataloaders=loaders, ckpt_path=ckpt, return_predictions=False)
    return metrics, epoch


def readable_test_splits(data, log) -> list[str]:
    """The task's test splits that load; the others are named in a warning."""
    task, readable = data.task, []
    for split in task.test_splits:
        try:
            data.encoded(split, labelled=False)
            readable.append(split)
        except TaskDataError as exc:
            log(f"warning: no {task.name} predictions for split {split!r}: {exc}")
    return readable


def main_key(task) -> str:
    return f"{task.validation_splits[0]}/{task.main_metric}"


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
