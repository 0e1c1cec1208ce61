"""Exact resume: a run stopped at any step (SIGKILL after a checkpoint, or SIGTERM) and resumed with
`--ckpt_path last` ends with the uninterrupted run's weights, mid-epoch and mid-accumulation too;
checkpoints are written atomically and stand alone; a non-finite loss stops training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli import MICRO, make_task
from test_pretrain import write_corpus

from gpt_ft.cli import main

TESTS = Path(__file__).resolve().parent


def finetune_args(card: Path, tokenizer_dir: str, root: Path, logs: Path) -> list[str]:
    return [
        f"--data.task={card}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={root}",
        "--data.batch_size=2",  # 6 examples: 3 batches an epoch
        "--data.max_length=64",
        "--model.preset=gpt-micro",
        f"--model.overrides={MICRO}",  # dropout 0.1: the resumed run must redraw the same masks
        "--trainer.max_epochs=3",
        "--seed_everything=3",
        f"--trainer.logger.init_args.save_dir={logs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]


def last_state(logs: Path, version: int) -> dict:
    ckpt = logs / "lightning_logs" / f"version_{version}" / "checkpoints" / "last.ckpt"
    return torch.load(ckpt, map_location="cpu", weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"]
    diff = max((a["state_dict"][k] - b["state_dict"][k]).abs().max().item() for k in a["state_dict"])
    assert diff <= 1e-6


def interrupt(batch: int, signum: int) -> list[str]:
    return ["--trainer.callbacks+=interrupt.InterruptAt", f"--trainer.callbacks.batch={batch}"] + [
        f"--trainer.callbacks.signum={signum}"
    ]


def test_sigkill_mid_epoch_then_resume_gives_the_same_weights(tmp_path, tokenizer_dir):
    card = make_task("single", tmp_path)
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "whole")])
    args = finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "cut")
    # A checkpoint every 2 steps; killed outright after batch 5 (epoch 1, batch 2 of 3): the last
    # checkpoint is step 4, mid-epoch 1.
    every = [
        "--trainer.callbacks+=gpt_ft.training.checkpointing.SaveLast",
        "--trainer.callbacks.every_n_steps=2",
    ]
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    killed = subprocess.run(
        [sys.executable, "-m", "gpt_ft", "fit", *args, *every, *interrupt(5, signal.SIGKILL)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert last_state(tmp_path / "cut", 0)["global_step"] == 4
    main(["fit", *args, "--ckpt_path=last"])
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", 1))


def test_sigterm_mid_accumulation_saves_at_the_step_and_resumes_exactly(tmp_path, tokenizer_dir, capsys):
    card = make_task("single", tmp_path)
    accumulate = ["--trainer.accumulate_grad_batches=2"]
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "whole"), *accumulate])
    args = finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "cut") + accumulate
    # Batch 4 is the first of epoch 1's first step: the checkpoint waits for batch 5 to step.
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, *interrupt(4, signal.SIGTERM)])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "SIGTERM: saved step 3 to " in capsys.readouterr().out
    assert last_state(tmp_path / "cut", 0)["global_step"] == 3
    main(["fit", *args, "--ckpt_path=last"])
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", 1))


def test_pretraining_resumes_mid_epoch_exactly(tmp_path, tokenizer_dir):
    main(
        ["prepare", str(write_corpus(tmp_path)), "--tokenizer", tokenizer_dir]
        + ["--out_dir", str(tmp_path / "tokens"), "--validation_fraction", "0.2"]
    )

    def args(logs: str) -> list[str]:
        return [
            "--config",
            str(TESTS.parent / "configs/pretrain/cpu.yaml"),
            f"--data.token_dir={tmp_path / 'tokens'}",
            "--data.block_size=32",
            "--data.batch_size=4",
            f"--model.overrides={MICRO}",
            "--trainer.max_steps=12",
            "--trainer.val_check_interval=5",
            "--model.warmup_steps=2",
            "--seed_everything=1",
            f"--trainer.logger.init_args.save_dir={tmp_path / logs}",
            "--trainer.enable_progress_bar=false",
        ]

    main(["fit", *args("whole")])
    with pytest.raises(SystemExit):
        main(["fit", *args("cut"), *interrupt(7, signal.SIGTERM)])
    assert last_state(tmp_path / "cut", 0)["global_step"] == 7
    main(["fit", *args("cut"), "--ckpt_path=last"])
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", 1))


def test_checkpoints_stand_alone_for_validate_and_predict(tmp_path, tokenizer_dir, capsys):
    card = make_task("single", tmp_path)
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs")])
    ckpt = tmp_path / "logs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    stored = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert stored["gpt_ft"]["version"] and stored["tokenizer"] == "tokenizer"
    card_args = stored["data_config"]["init_args"]["task"]
    assert card_args["class_path"] == "gpt_ft.adapters.SingleText"
    assert card_args["init_args"]["name"] == "sent"
    capsys.readouterr()
    # No model, data or tokenizer arguments: all come from the checkpoint (a 1-layer, 32-wide
    # model, not the default gpt1 preset).
    quiet = ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    main(["validate", f"--ckpt_path={ckpt}", *quiet, "--trainer.enable_progress_bar=false"])
    assert "validation/accuracy" in capsys.readouterr().out
    out = tmp_path / "pred"
    main(["predict", f"--ckpt_path={ckpt}", f"--model.predictions_dir={out}", *quiet])
    assert (out / "SENT.tsv").read_text().splitlines()[0] == "index\tprediction"


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from gpt_ft.training.checkpointing import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def crash(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left


def test_a_nonfinite_loss_stops_with_the_step_and_keeps_the_last_good_state(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    from gpt_ft.training.module import GPTModule

    losses = GPTModule.losses

    def nan_at_step_4(self, batch):
        loss, parts = losses(self, batch)
        return (loss * float("nan"), parts) if self.training and self.global_step == 4 else (loss, parts)

    monkeypatch.setattr(GPTModule, "losses", nan_at_step_4)
    card = make_task("single", tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "The training loss became nan at step 4 (epoch 1, batch 2)" in err and "last.ckpt" in err
    assert "Traceback" not in err
    state = last_state(tmp_path / "logs", 0)
    assert state["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())
