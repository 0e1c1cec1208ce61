"""Where a run's logs and checkpoints are: the default logger's folder, which
`--trainer.default_root_dir` moves, and the checkpoint `--ckpt_path last` names."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext, redirect_stdout, suppress
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from gpt_ft.data.folders import held
from gpt_ft.errors import absent
from gpt_ft.training.checkpointing import LAST, find_last_checkpoint, is_checkpoint
from gpt_ft.weights.checkpoint import safe_load

# Logs and checkpoints go to runs/lightning_logs/version_N, or under --trainer.default_root_dir.
DEFAULT_LOGGER = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}}


def newest_last(trainer, subcommand: str, name: str, task: str | None = None) -> str:
    """`--ckpt_path last` of validate, test or predict: the newest last.ckpt of the logger's runs
    (of task `task`, where a card is given and it has one), as `fit` resumes from (Lightning would
    look in no run's folder and score a random model)."""
    logger = trainer.get("logger")
    init = logger.get("init_args") if hasattr(logger, "get") else None
    save_dir = init.get("save_dir") if init is not None else None
    given = [  # a checkpoint callback's own folder, where `fit` saved (and resumes from) too
        folder
        for c in trainer.get("callbacks") or []
        if hasattr(c, "get") and hasattr(c.get("init_args"), "get") and (folder := c.init_args.get("dirpath"))
    ]
    if name == "last" and logger is False:  # `--trainer.logger false`: fit saved in ROOT/checkpoints
        folders = [Path(trainer.get("default_root_dir") or ".") / "checkpoints", *given]
        where, found = " or ".join(str(Path(f) / LAST) for f in folders), find_last_checkpoint(None, folders)
    elif name != "last" or not save_dir:
        raise ValueError(
            f"--ckpt_path {name}: gpt-ft {subcommand} takes a checkpoint's path, or `last` (the newest "
            "last.ckpt of the default logger's runs, or of ROOT/checkpoints with --trainer.logger false)."
        )
    else:
        if follows_root_dir(logger, trainer):
            save_dir = trainer.default_root_dir  # as `logs_follow_root_dir` moves it
        root = Path(save_dir) / (init.get("name", "lightning_logs") or "")  # CSVLogger's and TensorBoard's
        where = " or ".join([f"{root}/*/checkpoints/{LAST}", *(str(Path(f) / LAST) for f in given)])
        of_task, newest = last_of_task(root, given, task) if task is not None else (None, None)
        found = of_task or newest or find_last_checkpoint(root, given)  # (another task's: a warning says so)
    if found is None:
        raise ValueError(f"--ckpt_path last: there is no {where}; give the checkpoint's path.")
    print(f"{subcommand}: {found}", flush=True)
    return str(found)


LIGHTNING_NAMES = ("last", "best", "hpc", "registry")


def checkpoint_to_read(
    trainer, subcommand: str, ckpt: str | None, previewing: bool = False, card=None
) -> str | None:
    """The checkpoint `validate`, `test`, `predict` or `explain` reads: `ckpt`, or the one Lightning's
    name stands for (`newest_last`: a run of the task `card` gives, where given). `previewing`
    (`--print_config`): None where there is none to read, what is given shown instead, and the
    line naming the one found kept off stdout."""
    try:
        if ckpt in LIGHTNING_NAMES:
            with redirect_stdout(sys.stderr) if previewing else nullcontext():
                ckpt = newest_last(trainer, subcommand, ckpt, card_name(card))
    except ValueError:
        if not previewing:
            raise
        return None
    return None if previewing and not (ckpt and Path(ckpt).expanduser().is_file()) else ckpt


def card_name(card) -> str | None:
    """The task name of a card given on the command line (a file or a mapping); None without one,
    or where it does not read (the parse names its fault)."""
    from gpt_ft.adapters.cards import as_task

    try:  # (the parser's Namespace of class_path and init_args, as a mapping)
        return as_task(card.as_dict() if hasattr(card, "as_dict") else card).name if card else None
    except Exception:  # noqa: BLE001 (named where the card is read)
        return None


def run_task(ckpt: Path) -> str | None | bool:
    """The task card's name of the run that saved `ckpt`, from the configuration saved in its run
    folder (`version_N/config.yaml`); None for a language model's run; False where none is recorded
    (a checkpoint callback's own folder, an unreadable file)."""
    import yaml

    try:
        config = (ckpt.parent.parent / "config.yaml").read_text(encoding="utf-8")
        data = (yaml.safe_load(config) or {}).get("data") or {}
        task = (data.get("init_args") or data).get("task")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return False
    return (task.get("init_args") or {}).get("name", False) if isinstance(task, dict) else None


def last_of_task(root: Path, folders: list, task: str | None) -> tuple[Path | None, Path | None]:
    """`fit --ckpt_path last`: the newest last.ckpt of the logger's runs (and of the `folders` of a
    checkpoint callback) that trained `task` (None: a language model), and the newest of all."""
    newest = find_last_checkpoint(root, folders)
    runs = [
        p for p in root.glob(f"*/checkpoints/{LAST}") if is_checkpoint(p) and run_task(p) in (task, False)
    ]
    runs += [p for p in (Path(folder) / LAST for folder in folders) if is_checkpoint(p)]  # a run's own folder
    return max(runs, key=lambda p: p.stat().st_mtime_ns) if runs else None, newest


def earlier_logs(trainer, resumed: str | None, command: str = "fit") -> None:
    """The logs a logger's folder of a given version holds (CSV's and TensorBoard's folders are new to
    each run unless the version is given, as a run's saved config gives it): a resumed `fit` keeps
    the rows logged before, moved aside to the first free metrics.N.csv (Lightning's CSV logger
    deletes metrics.csv as it starts); any other run is refused before they are deleted and its
    configuration written over config.yaml. Every such logger's, not the first's alone."""
    no_folder(trainer)  # (before the loggers make their stores)
    for folder in logger_folders(trainer):
        rows = folder / "metrics.csv"
        if resumed and command == "fit":
            if rows.is_file() and trainer.is_global_zero:
                kept = next(p for n in range(1, 10_000) if not (p := folder / f"metrics.{n}.csv").exists())
                rows.replace(kept)
                print(f"the rows logged before the resumed step: {kept} (metrics.csv starts anew)")
        elif found := " and ".join(p.name for p in (rows, folder / "config.yaml") if p.is_file()):
            raise ValueError(
                f"{folder} holds a run's {found}, which `gpt-ft {command}` would write over: give its logger "
                "another version (--trainer.logger.init_args.version), or none for a new one (they are kept)."
            )


def logger_folders(trainer) -> list[Path]:
    """The folders the run's CSV and TensorBoard loggers write (a version folder each)."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    return [Path(lg.log_dir) for lg in trainer.loggers if isinstance(lg, (CSVLogger, TensorBoardLogger))]


def runs_root(trainer) -> Path:
    """The folder of the logger's runs, where Lightning puts each run's checkpoints: its `root_dir`;
    for a logger without one (W&B, MLflow alone), SAVE_DIR/NAME, as Lightning's checkpoint folders."""
    logger = trainer.logger
    root = getattr(logger, "root_dir", None)
    return Path(root) if root else Path(logger.save_dir or trainer.default_root_dir) / str(logger.name)


@contextmanager
def no_new_empty_folders(trainer) -> Iterator[None]:
    """A run stopped by an error leaves none of the folders it made for its logger's runs empty
    behind (Lightning's loggers make SAVE_DIR/NAME before the task's files are read: a refused run
    left an empty `runs/lightning_logs`); an empty folder that was there before is kept."""
    root = getattr(trainer.logger, "root_dir", None)
    new = []  # the folders to the logger's root that do not exist yet, deepest first
    folder = Path(root).absolute() if root else None
    while folder is not None and not folder.exists() and folder != folder.parent:
        new.append(folder)
        folder = folder.parent
    try:
        yield
    except BaseException:
        if trainer.is_global_zero:
            with suppress(OSError):  # (not empty: what is in it stays)
                for folder in new:
                    folder.rmdir()
        raise


def follows_root_dir(logger, trainer) -> bool:
    """Whether the logger is the default one at its default folder, which `--trainer.default_root_dir`
    moves; a logger `save_dir` given explicitly, or another logger, stays."""
    return (
        bool(trainer.get("default_root_dir"))
        and hasattr(logger, "init_args")
        and logger.get("class_path") == DEFAULT_LOGGER["class_path"]
        and logger.init_args.get("save_dir") == DEFAULT_LOGGER["init_args"]["save_dir"]
    )


def logs_follow_root_dir(trainer) -> None:
    """`--trainer.default_root_dir D` moves the default logger (and so the checkpoints) under D; a
    `~` in D is the home folder, as the shell reads one unquoted (the logger would expand it and
    Lightning's checkpoints not: a run split between the two, and `last` unreadable)."""
    if isinstance(trainer.get("default_root_dir"), str):
        trainer.default_root_dir = os.path.expanduser(trainer.default_root_dir)
    logger = trainer.get("logger")
    if follows_root_dir(logger, trainer):
        logger.init_args.save_dir = trainer.default_root_dir
    first = (logger or [None])[0] if isinstance(logger, list) else logger
    given = (first.get("init_args") or {}) if hasattr(first, "get") else {}
    uri = given.get("tracking_uri") or os.getenv("MLFLOW_TRACKING_URI", "file:")
    if str(getattr(first, "class_path", "")).endswith(".MLFlowLogger") and not uri.startswith("file:"):
        no_folder(trainer, "MLFlowLogger")  # (before the logger makes its store: a database's file)


def no_folder(trainer, planned: str | None = None) -> None:
    """A first logger that keeps no folder (MLflow on a database; `planned`: its class, as configured),
    where the run's config.yaml, checkpoints and reports go: one sentence (LightningCLI's config saver
    failed an assertion)."""
    if planned is None:
        first = trainer.loggers[0] if trainer.loggers and not trainer.fast_dev_run else None  # (Dummy: none)
        if first is None or getattr(first, "log_dir", None) is not None or first.save_dir is not None:
            return
    elif trainer.get("fast_dev_run"):
        return
    raise ValueError(
        f"--trainer.logger: {planned or type(first).__name__}, the first logger, keeps no folder of its own "
        "(a tracking server or database), where a run's config.yaml, checkpoints and reports go: put a "
        "CSVLogger first, as configs/trainer/mlflow.yaml does."
    )


def no_run_config(trainer) -> None:
    """With `--trainer.logger false` a run writes its configuration to ROOT/config.yaml: one there
    that no run wrote (a user's own config, most often so named) is refused in one sentence."""
    config = Path(trainer.default_root_dir) / "config.yaml"
    if trainer.logger is None and config.is_file():
        if not config.read_text(encoding="utf-8", errors="replace").startswith("# lightning.pytorch=="):
            raise ValueError(
                f"{config} is no run's configuration, and with --trainer.logger false a run writes its "
                f"own there (in --trainer.default_root_dir): give another root folder (the file is kept)."
            )


def no_earlier_checkpoints(trainer, resumed: str | None) -> None:
    """A fixed checkpoint folder (`--trainer.logger false`: ROOT/checkpoints, or a checkpoint
    callback's `dirpath`) holding an earlier run's checkpoints, refused to a run that does not resume
    one of them (`resumed`: the checkpoint given; `last`: the folder's own): it would write over them
    (Lightning only warns), a run resumed from elsewhere too. A checkpoint to resume that does not
    exist is refused here too, before a distributed run's other processes start (each said it)."""
    if resumed == "last":
        return
    # a local path's (a sharded checkpoint is a folder; Lightning's names and remote paths: its own)
    named = resumed in ("hpc", "registry") or str(resumed).startswith("registry:") or "://" in str(resumed)
    if resumed is not None and not named and not Path(resumed).exists():
        raise FileNotFoundError(f"--ckpt_path {resumed} {absent(resumed)}.")
    for folder, remedy in fixed_folders(trainer):
        if resumed is not None and Path(resumed).resolve().parent == folder.resolve():
            continue  # one of its own, resumed
        if held := sorted(p.name for p in folder.glob("*.ckpt")):
            raise ValueError(
                f"{folder} holds an earlier run's checkpoints ({', '.join(held[:3])}), which this run "
                f"would write over: resume one of them (--ckpt_path last), or {remedy} (they are kept)."
            )


def fixed_folders(trainer) -> list[tuple[Path, str]]:
    """The checkpoint folders a run does not choose anew (a version folder is new to each run),
    each with where else a run could save: ROOT/checkpoints with `--trainer.logger false`, a
    checkpoint callback's `dirpath`, and a logger's folder of a given version."""
    folders = [(Path(c.dirpath), "give the checkpoint callback another dirpath")
               for c in trainer.checkpoint_callbacks if getattr(c, "dirpath", None)]  # fmt: skip
    if log_dir := getattr(trainer.logger, "log_dir", None):  # new to each run, unless its version is given
        folders.append((Path(log_dir) / "checkpoints", "give the logger another version (or none)"))
    if trainer.logger is None:
        folders.append(
            (Path(trainer.default_root_dir) / "checkpoints", "give another --trainer.default_root_dir")
        )
    return folders


def epochs_done(loop: dict) -> int:
    """The epochs a checkpoint's fit loop has trained to their end, as its resumed run counts them
    (`StoppedEpochResumes`): saved on an epoch's last batch, that epoch; cut mid-epoch (by
    `max_steps` too, which Lightning counts as an epoch processed), the epochs before it."""
    epochs = (loop.get("epoch_progress") or {}).get("current") or {}
    batches = loop.get("epoch_loop.batch_progress") or {}
    if batches.get("is_last_batch"):
        return epochs.get("started", 0)
    if (batches.get("current") or {}).get("processed"):
        return epochs.get("started", 0) - 1
    return epochs.get("processed", 0)


def stop_if_trained_out(trainer, resumed: str | None) -> None:
    """A run resumed from a checkpoint already at `--trainer.max_steps` or `max_epochs` ends here
    (exit 0; its new folder goes, as at an error), saying so: Lightning would make a version folder
    that holds nothing and say only that the limit is reached (its `FitLoop.done`'s counts)."""
    if resumed is None or not Path(resumed).is_file():  # (a sharded checkpoint: Lightning's own way)
        return
    saved = safe_load(resumed)
    step, loop = saved.get("global_step", 0), (saved.get("loops") or {}).get("fit_loop") or {}
    epochs = epochs_done(loop)
    if trainer.max_steps not in (None, -1) and step >= trainer.max_steps:
        option, said = "max_steps", f"is at step {step}, where --trainer.max_steps={trainer.max_steps} stops"
    elif trainer.max_epochs not in (None, -1) and epochs >= trainer.max_epochs:
        option, limit = "max_epochs", trainer.max_epochs
        said = f"has trained {epochs} epochs ({step} steps), as many as --trainer.max_epochs={limit}"
    else:
        return
    rank_zero_only(print)(
        f"{resumed} {said}: nothing is left to train (raise --trainer.{option} to train on)."
    )
    raise SystemExit(0)


class RunFolder(Callback):
    """A run neither writes over what it should not (`no_run_config` before its configuration is
    saved, `no_earlier_checkpoints` before it too, and again once the checkpoint it resumes is
    known), nor, stopped by an
    error before it writes anything to its logger's new folder but its configuration (config.yaml,
    the settings in hparams.yaml),
    leaves that folder behind: a refused resume, or a data file found missing, left an empty
    `version_N`, and each attempt one more. (Every rank checks: each stops alike.)"""

    def __init__(self, resumes: str | None = None) -> None:
        self.resumes = resumes  # the checkpoint given (`last`: the one found, checked at the fit's start)
        self.held = ExitStack()

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" and trainer.logger is None:  # an evaluation keeps ROOT/config.yaml, a fit's
            from lightning.pytorch.cli import SaveConfigCallback

            for saver in (c for c in trainer.callbacks if isinstance(c, SaveConfigCallback)):
                saver.already_saved = True  # (its configuration saved nowhere: it is the checkpoint's)
        if stage == "fit":
            try:
                self.hold(trainer)
                no_earlier_checkpoints(trainer, self.resumes)  # before config.yaml, tokenizer/ are written
                no_run_config(trainer)
            except BaseException:
                self.held.close()
                raise

    def hold(self, trainer) -> None:
        """The run's fixed folders held by its first process (two runs at once there: one's
        last.ckpt lost); a refusal reaches every process, so that all stop alike."""
        refused = None
        if trainer.is_global_zero:
            try:
                for folder, _ in fixed_folders(trainer):
                    self.held.enter_context(held(folder, "`gpt-ft fit`"))
            except ValueError as exc:
                refused = str(exc)
        refused = trainer.strategy.broadcast(refused) if trainer.world_size > 1 else refused
        if refused and not trainer.is_global_zero:
            raise SystemExit(2)  # the first process says why, once
        if refused:
            raise ValueError(refused)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.held.close()

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.strategy.restore_checkpoint_after_setup:  # (FSDP's resumes after this: unchecked)
            no_earlier_checkpoints(trainer, trainer.ckpt_path)
            stop_if_trained_out(trainer, trainer.ckpt_path)  # (the checkpoint checked as it was read)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.held.close()  # (no teardown follows an error)
        logger = trainer.logger
        version = getattr(logger, "version", None)
        name = f"version_{version}" if isinstance(version, int) else version
        folder = getattr(logger, "log_dir", None)
        if not trainer.is_global_zero or not name or folder is None or Path(folder).name != name:
            return  # not a run's own folder (a folder the logger was given, or no logger)
        folder = Path(folder)
        if folder.is_dir() and folder.resolve() != Path.cwd().resolve():
            written = {folder / "config.yaml", folder / "hparams.yaml"}  # (its settings, logged at setup)
            if all(p in written and p.is_file() for p in folder.iterdir()):
                for path in written:
                    path.unlink(missing_ok=True)
                folder.rmdir()
