"""One fine-tuning run of a suite, in this process: fit, the chosen epoch's validation metrics,
and the same model's test predictions; a run's configuration, and what changed in it."""

from __future__ import annotations

import json
import math
from argparse import ArgumentError
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt_ft.adapters import TaskDataError
from gpt_ft.errors import absent, arguments_from
from gpt_ft.eval.progress import say
from gpt_ft.training.callbacks import History
from gpt_ft.training.checkpointing import SaveLast
from gpt_ft.training.recorded import without_nulls

SUITE_RESUME = (
    "the same `gpt-ft suite` command runs this run again from its start and keeps the finished ones"
)

if TYPE_CHECKING:
    from gpt_ft.training.runs import FitRuns


def fit_and_evaluate(
    build: Callable[[list[str]], tuple[Any, Any, Any]],
    args: list[str],
    select: str,
    *,
    predict: bool,
    log=say,
    min_steps: int | None = None,
) -> tuple[dict[str, float], int]:
    """`gpt-ft fit ARGS` in this process; the validation metrics of the last (or best) epoch, and
    that epoch. With `predict`, the same model writes its test predictions; a test split that
    cannot be read (e.g. MNLI's diagnostic file not downloaded) is named in a warning and left out,
    so the run's scores still count. With `min_steps` (a small training subset), the run takes at
    least that many optimizer steps: Lightning's `--trainer.min_steps`, which `FitRuns` reaches by
    raising the epochs where they would give fewer."""
    if min_steps:
        args = [*args, f"--trainer.min_steps={min_steps}"]
    model, data, trainer = build(args)
    if model.task is None:
        raise ValueError("A suite fine-tunes task cards; this run has no task.")
    splits = readable_test_splits(data, log) if predict else []
    if select == "best" and splits and trainer.checkpoint_callback is None:  # predicted from the last
        raise ValueError(
            "--select best predicts from the best epoch's checkpoint, and these runs keep none "
            "(--trainer.enable_checkpointing false): keep them, or --predict false, or --select last."
        )
    for callback in trainer.callbacks:  # stopped by SIGTERM or Ctrl-C: the suite, not `fit`, resumes
        if isinstance(callback, SaveLast):
            callback.rerun = SUITE_RESUME
    history = History.of(trainer)
    trainer.fit(model, datamodule=data)
    if not history.evaluations or select == "last" and history.steps[-1] < trainer.global_step:
        # none yet, or trained on after the last (max_steps mid-epoch): the weights it ended with scored
        trainer.validate(model, datamodule=data, verbose=False)
        if history.evaluations:
            history.evaluations[-1] = (history.trained_epoch, history.evaluations[-1][1])  # not the one after
    if not history.evaluations:
        raise ValueError("The run validated nothing: check --trainer.limit_val_batches.")
    main = main_key(model.task)
    if select == "best":
        # an undefined score (None: e.g. a correlation of constant predictions) ranks last
        epoch, metrics = max(
            history.evaluations, key=lambda e: -math.inf if e[1].get(main) is None else e[1][main]
        )
    else:
        epoch, metrics = history.evaluations[-1]
    if splits:
        kept = trainer.checkpoint_callback is not None and trainer.checkpoint_callback.best_model_path
        ckpt = "best" if select == "best" and kept else None  # (none kept: the weights validated at the end)
        loaders = data.predict_dataloader(splits)
        trainer.predict(model, dataloaders=loaders, ckpt_path=ckpt, return_predictions=False)
    return metrics, epoch


def readable_test_splits(data, log) -> list[str]:
    """The task's test splits that load; the others are named in a warning. The splits that train
    and validate load first: a fault there stops the run before any warning about a test split."""
    data.setup("fit")
    task, readable = data.task, []
    for split in task.test_splits:
        try:
            data.encoded(split, labelled=False)
            readable.append(split)
        except TaskDataError as exc:
            log(f"warning: no {task.name} predictions for split {split!r}: {exc}")
    return readable


def resolved(build: FitRuns, parts: tuple[list[str], list[str], list[str]], where: str) -> dict[str, Any]:
    """The configuration `gpt-ft fit ARGS` resolves to (`build.resolve`), ARGS a suite run's own,
    then --fit_args, then the suite's last; arguments it refuses named as coming from `where` (a
    suite file's task), or from --fit_args where the run's own resolve without them."""
    own, given, last = parts
    try:
        return absent_paths(build.resolve(own + given + last), where)
    except ArgumentError:
        try:
            where = "--fit_args" if given and build.resolve(own + last) else where
        except ArgumentError:
            pass
        with arguments_from(where):
            raise


def section(config: dict[str, Any], name: str) -> dict[str, Any]:
    """A resolved configuration's section `name`: its arguments (`init_args` where a class is named)."""
    given = config.get(name) or {}
    return given.get("init_args", given) if "class_path" in given else given


def absent_paths(config: dict[str, Any], where: str) -> dict[str, Any]:
    """`config`, a suite run's resolved configuration, once the weights and tokenizer it names by
    a local path (a checkpoint or GGUF file; a path from `/`, `.` or `~`) are there: one that is
    not stops the suite before any run trains, not when its run starts (a hub id is fetched then)."""
    for name, key in (("model", "init_from"), ("data", "tokenizer")):
        value = section(config, name).get(key)
        local = isinstance(value, str) and (
            value.startswith(("/", ".", "~")) or value.endswith((".ckpt", ".gguf"))
        )
        if local and not Path(value).expanduser().exists():
            raise FileNotFoundError(f"{where}: --{name}.{key} {value} {absent(Path(value).expanduser())}.")
    return config


def check_run(config: dict[str, Any], run, folder: Path, where: str) -> dict[str, Any]:
    """`config`, a suite `run`'s resolved configuration, where it keeps the run's seed, transferred
    layers and training examples, and its logs in its `folder`: a `--seed_everything` among the
    suite's fit arguments (given last, so it wins) would run every seed as one, and report a spread of
    0; a `--model.transfer_layers` or `--data.train_size` would run every depth or size of a sweep as
    one, its table labelling them apart; a logger of their own (a list, W&B's) would write every
    run's logs and checkpoints where it says, never deleted once scored."""
    model, data = section(config, "model"), section(config, "data")
    sweeps = [
        (
            "--seed_everything",
            run.seed,
            config.get("seed_everything"),
            "seed",
            "seeds: in its file, or --seeds",
        ),
        ("--model.transfer_layers", run.layers, model.get("transfer_layers"), "depth", "--transfer_layers"),
        (
            "--data.train_size",
            run.size,
            data.get("train_size"),
            "size",
            "train_sizes: in its file, or --train_sizes",
        ),
    ]
    for option, wanted, given, what, sweep in sweeps:
        if wanted is not None and given != wanted:
            raise ValueError(
                f"{where}: {option} {given} in the fit arguments would run each of the suite's {what}s as "
                f"{given}; the suite sets every run's {what} ({sweep})."
            )
    loggers = config.get("trainer", {}).get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers] if isinstance(loggers, dict) else []:
        if (logger.get("init_args") or {}).get("save_dir") != str(folder) or isinstance(loggers, list):
            name = str(logger.get("class_path", "")).rsplit(".", 1)[-1]
            raise ValueError(
                f"{where}: --trainer.logger {name}{' (of a list)' * isinstance(loggers, list)} in the fit "
                f"arguments would write every run's logs and checkpoints outside its folder ({folder}): a "
                "suite keeps them there (its checkpoints deleted once scored); leave it the CSV logger."
            )
    return config


def main_key(task) -> str:
    return f"{task.validation_splits[0]}/{task.main_metric}"


# Options that say where a run writes, not what it computes: a moved folder still holds the same runs.
OUTPUTS = ("trainer.default_root_dir", "trainer.logger.save_dir", "model.predictions_dir")


def config_changes(
    result: dict[str, Any], now: dict[str, Any], build: FitRuns, extra: list[str]
) -> list[str]:
    """What differs between the configuration a finished run recorded (its `result`) and the one
    its arguments resolve to `now`, as options (`changed_options`), where it writes left out. A
    result written before runs recorded their configuration holds their arguments (`args`): those
    are resolved now (with `extra`, the options the suite adds); arguments that no longer resolve (a
    file gone) cannot be compared: ["(not comparable)"]."""
    recorded = result.get("config")
    if recorded is None:
        try:
            recorded = build.resolve([*result.get("args", []), *extra])
        except (ArgumentError, ValueError, FileNotFoundError, KeyError):
            return ["(not comparable)"]
    return changed_options(recorded, now, ignored=OUTPUTS)


def changed_options(before: dict[str, Any], now: dict[str, Any], ignored: tuple[str, ...] = ()) -> list[str]:
    """What differs between two configurations, as the options that give it now (`--data.batch_size=2`;
    `not --X=V` for one gone), leaving out the `ignored` options; null is no value (`without_nulls`)."""
    old, new = (  # (a field added since, null where it was not recorded: no change)
        {k: _spelled_once(k, v) for k, v in _options(without_nulls(config)).items() if k not in ignored}
        for config in (before, now)
    )
    changed = [f"--{k}={_shown(v)}" for k, v in new.items() if k not in old or old[k] != v]
    return changed + [f"not --{k}={_shown(v)}" for k, v in old.items() if k not in new]


# Options naming a local path: the same folder spelled otherwise (`~/glue`, `glue/`, `./glue`) is no change.
PATHS = ("data.data_dir", "data.tokenizer", "model.init_from")


def _spelled_once(option: str, value: Any) -> Any:
    if option in PATHS and isinstance(value, str) and (path := Path(value).expanduser()).exists():
        return str(path.resolve())
    return value


def _options(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A configuration's values by option name, as a command line gives them (`data.batch_size`:
    `init_args` left out)."""
    options: dict[str, Any] = {}
    for key, value in config.items():
        name = prefix if key == "init_args" else f"{prefix}.{key}".lstrip(".")
        if isinstance(value, dict) and value:
            options.update(_options(value, name))
        else:
            options[name] = value
    return options


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
