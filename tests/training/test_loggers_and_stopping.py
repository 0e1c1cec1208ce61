"""The shipped trainer configs beyond CSV: early stopping on the task's main metric, and MLflow
(a local SQLite store; its run in the background) and Weights & Biases (offline) recording a
run's metrics."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys

import pytest
import torch

from gpt_ft.cli import main
from gpt_ft.workarounds.trainer import no_tips
from tests.background import Command, gpt_ft
from tests.helpers import ROOT, common_args, make_task


def fit_args(tmp_path, tokenizer_dir, *extra: str) -> list[str]:
    card = make_task("single", tmp_path)
    args = [a for a in common_args(card, tokenizer_dir, tmp_path) if not a.startswith("--trainer.logger")]
    return ["fit", *args, *extra]


def test_early_stopping_stops_a_run_whose_main_metric_stalls(tmp_path, tokenizer_dir, capsys):
    # A learning rate too small to move the accuracy: it stalls from the first evaluation on.
    args = fit_args(
        tmp_path,
        tokenizer_dir,
        f"--config={ROOT / 'configs/trainer/early_stopping.yaml'}",
        "--model.lr=1e-12",
        "--trainer.max_epochs=20",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    )
    logging.getLogger("lightning.pytorch.utilities.rank_zero").removeFilter(no_tips)
    main(args)
    assert no_tips in logging.getLogger("lightning.pytorch.utilities.rank_zero").filters  # its tip left out
    saved = next(tmp_path.glob("runs/lightning_logs/version_0/checkpoints/last.ckpt"))
    last = torch.load(saved, weights_only=True)
    assert last["epoch"] == 2  # epoch 0 sets the best; 1 and 2 do not improve it (patience 2)
    capsys.readouterr()
    main([*args, f"--ckpt_path={saved}"])  # a requeued job: stopped, it stays stopped
    assert "The run stopped early at epoch 2: validation/accuracy did not improve" in capsys.readouterr().out
    for checkpoint in tmp_path.glob("runs/lightning_logs/*/checkpoints/last.ckpt"):
        assert torch.load(checkpoint, weights_only=True)["global_step"] == last["global_step"]
    # A larger patience goes on, as the line says (the checkpoint's patience was put back over it)
    main([*args, f"--ckpt_path={saved}", "--trainer.callbacks.patience=4", "--trainer.max_epochs=4"])
    assert "The run stopped early" not in capsys.readouterr().out
    (resumed,) = [p for p in tmp_path.glob("runs/lightning_logs/version_2/checkpoints/last.ckpt")]
    assert torch.load(resumed, weights_only=True)["epoch"] == 3  # two epochs more, to max_epochs 4


def test_early_stopping_on_a_metric_validation_does_not_log_stops_before_training(
    tmp_path, tokenizer_dir, capsys
):
    args = [*fit_args(tmp_path, tokenizer_dir), "--trainer.callbacks+=gpt_ft.training.stopping.EarlyStopping"]

    def error(*extra: str) -> str:
        with pytest.raises(SystemExit) as stopped:
            main([*args, *extra])
        assert stopped.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    said = error("--trainer.callbacks.monitor=validation/perplexity")
    assert said.startswith(
        "gpt-ft: error: EarlyStopping(monitor='validation/perplexity'): validation logs no "
    )
    assert "; it logs validation/accuracy, " in said and "validation/loss" in said
    assert not list(tmp_path.rglob("*.ckpt"))  # the sanity check's validation named it: nothing trained
    assert (
        error("--trainer.callbacks.mode=maximum")
        == "gpt-ft: error: EarlyStopping mode 'maximum': give max or min."
    )
    # Lightning's own, and a checkpoint's monitor: named alike (a traceback, or a refusal, after an epoch)
    args = fit_args(tmp_path, tokenizer_dir)
    for kind in ("EarlyStopping", "ModelCheckpoint"):
        said = error(
            f"--trainer.callbacks+=lightning.pytorch.callbacks.{kind}", "--trainer.callbacks.monitor=val/acc"
        )
        assert said.startswith(
            f"gpt-ft: error: {kind}(monitor='val/acc'): validation logs no such metric; it logs "
        )
    assert not list(tmp_path.rglob("*.ckpt"))
    # No validation at all: refused before training (Lightning's traceback came at the epoch's end)
    for kind in ("gpt_ft.training.stopping", "lightning.pytorch.callbacks"):
        watch = "--trainer.callbacks.monitor=validation/loss"
        said = error(f"--trainer.callbacks+={kind}.EarlyStopping", watch, "--trainer.limit_val_batches=0")
        assert said == (
            "gpt-ft: error: EarlyStopping(monitor='validation/loss') watches validation, and none runs "
            "(--trainer.limit_val_batches 0): let validation run, or watch a train/ metric."
        )
    assert not list(tmp_path.rglob("*.ckpt"))
    # One callback given with `=` (not a list), in a run that stops before its first validation: it
    # trains, and ends without Lightning's "metric not available" traceback
    main([*args, "--trainer.callbacks=gpt_ft.training.stopping.EarlyStopping", "--trainer.max_steps=1"])
    assert len(list(tmp_path.rglob("last.ckpt"))) == 1
    # a training metric no step logs (misspelt), watched where no validation runs: named at the
    # epoch's end (it was skipped without a word)
    watch = ["--trainer.callbacks.monitor=train/los", "--trainer.callbacks.mode=min"]
    said = error(
        "--trainer.callbacks+=gpt_ft.training.stopping.EarlyStopping", *watch, "--trainer.limit_val_batches=0"
    )
    assert said.startswith(
        "gpt-ft: error: EarlyStopping(monitor='train/los'): training logs no such metric; it logs "
    )


@pytest.mark.parametrize(
    ("monitor", "mode"),
    [("validation/accuracy", "max"), ("validation/f1", "max"), ("validation/loss", "min"),
     ("validation/ece", "min"), ("train/lm_loss", "min"), ("perf/tokens_per_s", None)],
)  # fmt: skip
def test_early_stopping_watches_a_named_metric_the_way_it_improves(monitor, mode):
    from types import SimpleNamespace

    from gpt_ft.adapters import SingleText
    from gpt_ft.training.stopping import EarlyStopping

    model = SimpleNamespace(task=SingleText(name="s", labels=["a", "b"], metrics=["accuracy", "f1"]))
    trainer = SimpleNamespace(val_check_interval=1.0, check_val_every_n_epoch=1)
    stop = EarlyStopping(monitor=monitor)
    if mode is None:  # neither the task's metric nor a loss: the direction must be given
        with pytest.raises(ValueError, match="EarlyStopping\\(monitor='perf/tokens_per_s'\\): give its mode"):
            stop.setup(trainer, model, "fit")
        stop, mode = EarlyStopping(monitor=monitor, mode="max"), "max"
    stop.setup(trainer, model, "fit")
    assert stop.mode == mode


def test_a_nan_score_counts_toward_patience_and_stops_nothing_at_once():
    """Pearson over constant predictions is NaN: one such validation is no improvement, not the end."""
    import math

    import torch

    from gpt_ft.training.stopping import EarlyStopping

    stop = EarlyStopping(monitor="validation/pearson", mode="max", patience=2)
    seen = []
    for score in (0.1, math.nan, 0.3, math.nan, math.nan):
        should_stop, _ = stop._evaluate_stopping_criteria(torch.tensor(score))
        seen.append(should_stop)
    assert seen == [False, False, False, False, True] and float(stop.best_score) == pytest.approx(0.3)
    assert stop.log_rank_zero_only  # its lines said once under DDP, not once per rank


READ_MLFLOW = """import json
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri="sqlite:///runs/mlflow.db")
(run,) = client.search_runs([client.get_experiment_by_name("gpt_ft").experiment_id])
print(json.dumps([m.value for m in client.get_metric_history(run.info.run_id, "validation/accuracy")]))
print(json.dumps(client.get_run(run.info.run_id).data.params))
"""


def start_mlflow(root, tokenizer_dir):
    """A fit with configs/trainer/mlflow.yaml (its store: runs/mlflow.db under the working folder),
    then MLflow's client reading the store; nothing where MLflow is not installed."""
    if importlib.util.find_spec("mlflow") is None:
        return []
    fit = fit_args(
        root, tokenizer_dir, f"--config={ROOT / 'configs/trainer/mlflow.yaml'}", "--trainer.max_epochs=2"
    )
    alone = fit_args(root, tokenizer_dir, "--trainer.logger=lightning.pytorch.loggers.MLFlowLogger",
                     "--trainer.logger.init_args.tracking_uri=sqlite:///alone.db")  # fmt: skip
    read = Command([sys.executable, "-c", READ_MLFLOW], cwd=root, preloaded=True)
    return [
        gpt_ft(*fit, cwd=root),
        read,
        gpt_ft(*alone, cwd=root),
    ]


@pytest.mark.background(start=start_mlflow)
def test_mlflow_records_the_metrics(background):
    """...with the CSV logger first; alone, on a database, it keeps no folder for the run's files: one
    sentence before the run starts (LightningCLI's config saver failed an assertion)."""
    pytest.importorskip("mlflow")
    fit, read, alone = background.runs
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert read.returncode == 0, read.stderr[-3000:]
    history, params = map(json.loads, read.stdout.splitlines())
    assert len(history) == 2  # one evaluation after each of the 2 epochs
    assert 0 <= history[-1] <= 1
    # every setting, not the model's alone: runs compared by their batch size, card or epochs
    assert {k: params.get(k) for k in ("data.batch_size", "data.task.name", "trainer.max_epochs", "lr")} == {
        "data.batch_size": "4", "data.task.name": "sent", "trainer.max_epochs": "2", "lr": "6.25e-05"
    }  # fmt: skip
    assert alone.returncode == 2, alone.stderr[-3000:]
    assert alone.stderr.strip().splitlines()[-1] == (
        "gpt-ft: error: --trainer.logger: MLFlowLogger, the first logger, keeps no folder of its own (a "
        "tracking server or database), where a run's config.yaml, checkpoints and reports go: put a "
        "CSVLogger first, as configs/trainer/mlflow.yaml does."
    )
    assert not (background.root / "alone.db").exists()  # refused before MLflow made its store


def test_wandb_offline_records_the_metrics(tmp_path, tokenizer_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    main(
        fit_args(
            tmp_path,
            tokenizer_dir,
            f"--config={ROOT / 'configs/trainer/wandb.yaml'}",
            "--trainer.max_epochs=2",
        )
    )
    import wandb

    recorded = dict(wandb.run.summary)  # the run's last values, as the offline files will hold them
    settings = dict(wandb.run.config)  # every setting, not the model's alone (Lightning's), once each
    assert settings["data.batch_size"] == 4 and settings["data.task"] == "gpt_ft.adapters.SingleText"
    assert settings["data.task.name"] == "sent" and settings["trainer.max_epochs"] == 2
    assert isinstance(settings["seed_everything"], int) and settings["lr"] > 0 and "model.lr" not in settings
    named = wandb.run.name
    wandb.finish()  # what the process's exit does: the offline run written out
    assert named != "lightning_logs"  # W&B's own name, not the CSV logger's folder name for every run
    run_folder = tmp_path / "runs" / "lightning_logs" / "version_0"  # a run's own: its config not shared
    assert (run_folder / "config.yaml").is_file() and (run_folder / "checkpoints" / "last.ckpt").is_file()
    assert "\ndata.batch_size: 4\n" in (run_folder / "hparams.yaml").read_text()  # the CSV logger's too
    assert 0 <= recorded["validation/accuracy"] <= 1 and recorded["epoch"] == 1
    (run,) = tmp_path.glob("runs/wandb/wandb/offline-run-*/run-*.wandb")
    assert run.stat().st_size > 0


def test_wandb_live_without_an_api_key_is_one_sentence(tmp_path, tokenizer_dir, monkeypatch, capsys):
    """W&B's UsageError ("No API key configured") was a traceback from inside the logger."""
    wandb = pytest.importorskip("wandb")
    wandb.teardown()  # (an offline run before, in this process, left its settings)
    monkeypatch.chdir(tmp_path)
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path))  # (no ~/.netrc key)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    with pytest.raises(SystemExit) as stopped:
        main(fit_args(tmp_path, tokenizer_dir, "--trainer.logger=WandbLogger", "--trainer.max_steps=1"))
    assert stopped.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("gpt-ft: error: W&B has no API key to log this run live: run `wandb login`")
    )


def test_a_run_stopped_in_its_first_epoch_stays_stopped(capsys):
    """Pretraining validates every N steps of one epoch: a stop there (stopped_epoch 0) is a stop."""
    from types import SimpleNamespace

    from gpt_ft.training.stopping import EarlyStopping

    stopping = EarlyStopping("validation/loss", patience=1, mode="min")
    stopping.load_state_dict(
        {"wait_count": 1, "stopped_epoch": 0, "best_score": torch.tensor(2.5), "patience": 1}
    )
    trainer = SimpleNamespace(should_stop=False, is_global_zero=True, limit_val_batches=1.0)
    stopping.on_train_start(trainer, None)
    assert trainer.should_stop and "The run stopped early at epoch 0" in capsys.readouterr().out
    stopping.patience, trainer.should_stop = 2, False  # a larger patience goes on
    stopping.on_train_start(trainer, None)
    assert not trainer.should_stop


def test_the_settings_each_logger_gets_and_one_that_refuses_them(capsys):
    """Flat under the command line's names: a class its name, its arguments below it; the model's
    left to Lightning's own names. A logger that refuses them (MLflow, a run resumed by its run_id
    with other values) is noted, and the run goes on."""
    from types import SimpleNamespace

    from jsonargparse import Namespace

    from gpt_ft.training.logged_settings import LoggedSettings

    class MlflowException(Exception):  # (MLflow's, by its name)
        pass

    class Refusing:
        def log_hyperparams(self, params):
            raise MlflowException("Changing param values is not allowed.\nParams were already logged=...")

    class Keeping:
        def log_hyperparams(self, params):
            self.got = params

    saver = LoggedSettings.__new__(LoggedSettings)  # (its parser and file are LightningCLI's)
    columns = {"#1 String": "text"}  # (MRPC's card: MLflow takes no '#' in a name, and refused them all)
    card = {"name": "sent", "labels": ["a", "b"], "local": {"columns": columns}}
    task = {"class_path": "gpt_ft.adapters.SingleText", "init_args": card}
    data = Namespace(
        class_path="gpt_ft.data.task_data.TaskDataModule", init_args=Namespace(batch_size=4, task=task)
    )
    stop = {"class_path": "EarlyStopping", "init_args": {"patience": 2}}
    saver.config = Namespace(
        data=data,
        model=Namespace(lr=0.1, preset="gpt-micro", overrides={"n_layer": 1}),
        trainer=Namespace(callbacks=[stop], devices="auto"),
        seed_everything=0,
        __path__="config.yaml",
    )
    kept = Keeping()
    saver.save_config(
        SimpleNamespace(loggers=[Refusing(), kept]), SimpleNamespace(hparams={"lr": 0.1}), "fit"
    )
    assert kept.got == {  # the model's own first, under Lightning's names: one call holds them all
        "lr": 0.1, "data": "gpt_ft.data.task_data.TaskDataModule", "data.batch_size": 4,
        "data.task": "gpt_ft.adapters.SingleText", "data.task.name": "sent", "data.task.labels": '["a", "b"]',
        "data.task.local.columns._1 String": "text",
        "model.preset": "gpt-micro", "model.overrides.n_layer": 1,
        "trainer.callbacks.0": "EarlyStopping", "trainer.callbacks.0.patience": 2, "trainer.devices": "auto",
        "seed_everything": 0,
    }  # fmt: skip
    assert capsys.readouterr().err == (
        "note: Refusing did not record the run's settings (Changing param values is not allowed.).\n"
    )
