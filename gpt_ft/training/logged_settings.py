"""A run's settings, every one, in each of its loggers.

Lightning logs the model's hyperparameters alone (`--model.*`): runs compared in TensorBoard's,
MLflow's or W&B's tables could not be told apart by their batch size, task card, epochs or
precision. `LoggedSettings` (the CLI's configuration saver) gives every logger the whole parsed
configuration too, flat under dotted names as the command line writes them: `data.batch_size`,
`data.task`, `trainer.max_epochs`, `seed_everything`; a class given with its arguments is its
name, its arguments below it (`data` is `gpt_ft.data.task_data.TaskDataModule`, `data.task.loss`
a card's field).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from lightning.pytorch.cli import SaveConfigCallback


class LoggedSettings(SaveConfigCallback):
    """Saves config.yaml in the run's folder (as LightningCLI's saver does) and gives each logger
    the model's hyperparameters under Lightning's own names (`lr`, not `model.lr`), with the other
    settings (`flat_settings`), in one call: TensorBoard's table keeps a run's first, whole (Lightning
    logs the model's again as the run starts: the same values). From the first process alone."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        if not trainer.loggers:
            return
        own = dict(pl_module.hparams)
        settings = {
            k: v
            for k, v in flat_settings(self.config.as_dict()).items()
            if not (k.startswith("model.") and k[6:].split(".")[0] in own)
        }
        for logger in trainer.loggers:
            try:
                logger.log_hyperparams({**own, **settings})
            except Exception as exc:  # MLflow keeps a run's first values (a run resumed by its run_id)
                if type(exc).__name__ != "MlflowException":  # (W&B without a key: the run stops, said so)
                    raise
                said = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                print(f"note: {type(logger).__name__} did not record the run's settings ({said}).",
                      file=sys.stderr)  # fmt: skip


Scalar = str | int | float | bool | None


def flat_settings(config: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """A nested configuration as {dotted name: value}: a `class_path` with its `init_args` is the
    class's name and its arguments under the same name; a list of classes (callbacks) numbered; a
    list of values, JSON; a key's characters other than letters, digits, `_-. /` as `_` (a card's
    column `#1 String`: MLflow refused every setting for it). The parser's own entries (`__path__`)
    are left out."""
    flat: dict[str, Scalar] = {}
    for key, value in config.items():
        if key.startswith("__"):
            continue
        name = prefix + re.sub(r"[^\w\-. /]", "_", str(key))  # the characters MLflow takes in a name
        if isinstance(value, dict) and "class_path" in value:
            flat[name] = value["class_path"]
            flat |= flat_settings(value.get("init_args") or {}, f"{name}.")
        elif isinstance(value, dict):
            flat |= flat_settings(value, f"{name}.")
        elif isinstance(value, list | tuple) and any(isinstance(v, dict) for v in value):
            flat |= flat_settings({str(i): v for i, v in enumerate(value)}, f"{name}.")
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(list(value), default=str)
        else:
            flat[name] = value if value is None or isinstance(value, str | int | float | bool) else str(value)
    return flat
