"""Exact resume: a run stopped at any step (SIGKILL after a checkpoint, or SIGTERM) and resumed with
`--ckpt_path last` ends with the uninterrupted run's weights, mid-epoch and mid-accumulation too;
checkpoints are written atomically and stand alone; a non-finite loss stops training."""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import shutil
import signal
import sys
import warnings
from pathlib import Path

import pytest
import torch

from gpt_ft.cli import main
from gpt_ft.data.folders import LOCK
from gpt_ft.training.checkpointing import FIT_RESUME
from tests.background import gpt_ft
from tests.helpers import MICRO, ROOT, common_args, finetune_args, make_task, write_corpus


def swapped(tokenizer: Path, out: Path, first: int = 300) -> Path:
    """A copy of `tokenizer` at `out` whose tokens `first` and `first + 1` (by id) change places: the
    same size, other ids."""
    if out != tokenizer:
        shutil.copytree(tokenizer, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[first:][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


def lowercased(tokenizer: Path, out: Path) -> Path:
    """A copy of `tokenizer` at `out` that lowercases text first: the same vocabulary, read otherwise."""
    shutil.copytree(tokenizer, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [spec["normalizer"] or {"type": "NFC"}, {"type": "Lowercase"}],
    }
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


def lr_recorder():
    """A callback that records the learning rate each training batch starts with, in `seen`."""
    from lightning.pytorch.callbacks import Callback

    class Rates(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, trainer, *args):
            self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    return Rates()


def last_path(logs: Path, version: int) -> Path:
    return logs / "lightning_logs" / f"version_{version}" / "checkpoints" / "last.ckpt"


def last_state(logs: Path, version: int) -> dict:
    return torch.load(last_path(logs, version), map_location="cpu", weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"]
    diff = max((a["state_dict"][k] - b["state_dict"][k]).abs().max().item() for k in a["state_dict"])
    assert diff <= 1e-6


def interrupt(batch: int, signum: int) -> list[str]:
    return ["--trainer.callbacks+=tests.interrupt.InterruptAt", f"--trainer.callbacks.batch={batch}"] + [
        f"--trainer.callbacks.signum={signum}"
    ]


# A checkpoint every 2 steps; killed outright after batch 5 (epoch 1, batch 2 of 3): the last
# checkpoint is step 4, mid-epoch 1.
EVERY_2_STEPS = [
    "--trainer.callbacks+=gpt_ft.training.checkpointing.SaveLast",
    "--trainer.callbacks.every_n_steps=2",
]


def start_sigkill(root, tokenizer_dir, finetuned):
    """`finetuned`'s run (the uninterrupted one) into root/cut, killed by SIGKILL after batch 5."""
    args = finetune_args(finetuned.card, tokenizer_dir, finetuned.root, root / "cut")
    pythonpath = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"  # finds tests.interrupt
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return [gpt_ft("fit", *args, *EVERY_2_STEPS, *interrupt(5, signal.SIGKILL), env=env)]


@pytest.mark.background(start=start_sigkill)
def test_sigkill_mid_epoch_then_resume_gives_the_same_weights(background, tokenizer_dir, finetuned):
    (killed,) = background.runs
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    cut = background.root / "cut"
    assert last_state(cut, 0)["global_step"] == 4
    main(["fit", *finetune_args(finetuned.card, tokenizer_dir, finetuned.root, cut), "--ckpt_path=last"])
    assert_same_weights(last_state(finetuned.logs, 0), last_state(cut, 1))


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
    # Checkpointing off: the stop says nothing was saved (it named last.ckpt as "None").
    with pytest.raises(SystemExit):
        main(["fit", *args, "--trainer.enable_checkpointing=false", *interrupt(2, signal.SIGTERM)])
    said = "SIGTERM: stopped at step 1; nothing saved: checkpointing is off (--trainer.enable_checkpointing)."
    assert said in capsys.readouterr().out


def test_sigterm_as_the_run_is_set_up_stops_in_one_line_and_leaves_no_folder(tmp_path, tokenizer_dir, capsys):
    """Before Lightning's own handler (the data read, the folder made): SIGTERM's default ended the
    process on the spot, with no word and an empty version folder (or its config and lock) left."""
    card = make_task("single", tmp_path)
    args = finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "cut")

    def reached(*_):  # where gpt-ft let SIGTERM through: this process's default would end it
        raise AssertionError("SIGTERM reached the handler from before the command")

    previous = signal.signal(signal.SIGTERM, reached), signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as stopped:
            main(["fit", *args, *interrupt(1, signal.SIGTERM), "--trainer.callbacks.setup=true"])
    finally:  # (Lightning ignores Ctrl-C once it has stopped a run for a KeyboardInterrupt: its exit's)
        signal.signal(signal.SIGTERM, previous[0]), signal.signal(signal.SIGINT, previous[1])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().splitlines()[-1] == "gpt-ft: stopped by SIGTERM"
    assert not list((tmp_path / "cut").rglob("version_*"))


def test_under_slurm_sigterm_is_the_stop_and_lightnings_requeue_is_off(tmp_path, tokenizer_dir, monkeypatch):
    """Lightning's SLURM requeue saves an hpc_ckpt on SIGUSR1 mid-window (not resumed exactly), which
    any later run in the folder resumed from without a word: off, SIGTERM's last.ckpt the stop."""
    from gpt_ft.training.module import GPTModule

    slurm = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "job", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}  # fmt: skip
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    handlers, start = [], GPTModule.on_train_start
    monkeypatch.setattr(
        GPTModule,
        "on_train_start",
        lambda self: handlers.append(signal.getsignal(signal.SIGUSR1)) or start(self),
    )
    card = make_task("single", tmp_path)
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), "--trainer.max_epochs=1"])
    assert handlers == [signal.SIG_DFL]
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from gpt_ft.training.strategies import run_plugins

    (environment,) = [p for p in run_plugins(None) if isinstance(p, SLURMEnvironment)]
    assert not environment.auto_requeue
    # torchrun inside a SLURM job (`--ntasks 1`, then `torchrun --nproc_per_node 8`): torchrun's ranks,
    # as Lightning takes them (SLURM's one task each made every rank a run of its own)
    monkeypatch.setattr(torch.distributed, "is_torchelastic_launched", lambda: True)
    assert not [p for p in run_plugins(None) if isinstance(p, SLURMEnvironment)]


def validation_rows(logs: Path) -> list[tuple[str, ...]]:
    """(epoch, step, loss, accuracy) of every validation in the metrics of the logger's runs, in order."""
    rows = []
    for path in sorted(logs.rglob("metrics.csv")):
        with open(path, newline="") as f:
            rows += [r for r in csv.DictReader(f) if r.get("validation/loss")]
    return [(r["epoch"], r["step"], r["validation/loss"], r["validation/accuracy"]) for r in rows]


@pytest.mark.parametrize("during", [False, True], ids=["at-its-step", "during-it"])
def test_sigterm_where_a_validation_is_due_stops_after_it(tmp_path, tokenizer_dir, finetuned, capsys, during):
    """SIGTERM at an epoch's last batch, whose validation is due, or during that validation: the
    validation runs to its end before the run stops (Lightning would cut it short, and the resumed
    run would not run it again), so the resumed run has every score and the best checkpoint of the
    uninterrupted one."""
    args = finetune_args(finetuned.card, tokenizer_dir, finetuned.root, tmp_path / "cut")
    during_it = ["--trainer.callbacks.validation=true"] if during else []
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, *interrupt(3, signal.SIGTERM), *during_it])
    assert stopped.value.code == 128 + signal.SIGTERM
    out = capsys.readouterr().out
    assert "SIGTERM: validating step 3 before stopping" in out
    # saved once, after the validation: a save before it would resume past it if a second Ctrl-C
    # or a kill stopped the validation (its score and best checkpoint lost)
    assert out.count("SIGTERM: saved step 3") == 1 and out.index("validating step 3") < out.index(
        "saved step 3"
    )
    assert out.rstrip().endswith(
        "SIGTERM: saved step 3 to " + str(last_path(tmp_path / "cut", 0)) + f"; {FIT_RESUME}"
    )
    main(["fit", *args, "--ckpt_path=last"])
    assert validation_rows(tmp_path / "cut") == validation_rows(finetuned.logs)
    assert len(validation_rows(finetuned.logs)) == 3
    best = [sorted(p.name for p in logs.rglob("best-*.ckpt")) for logs in (tmp_path / "cut", finetuned.logs)]
    assert best[0] == best[1] and len(best[0]) == 1


def test_sigterm_during_validate_stops_it_and_saves_nothing(tmp_path, finetuned, capsys):
    """validate has no run to resume: SIGTERM stops it where it is, with one line and 143; it saved
    a last.ckpt of "step 0" into a new version folder and said to resume `gpt-ft fit`."""
    args = [f"--ckpt_path={finetuned.ckpt}", f"--trainer.default_root_dir={tmp_path}"]
    args += [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    args += ["--data.batch_size=1"]  # (a batch after the signal: Lightning stops there)
    with pytest.raises(SystemExit) as stopped:
        main(
            ["validate", *args, *interrupt(0, signal.SIGTERM), "--trainer.callbacks.validation=true"]
        )  # (no fit: 0)
    assert stopped.value.code == 128 + signal.SIGTERM
    said = capsys.readouterr()
    assert "saved" not in said.out and said.err.endswith("gpt-ft: stopped by SIGTERM\n")
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_max_time_stops_between_optimizer_steps_and_resumes_exactly(tmp_path, tokenizer_dir, optimizer):
    """A time limit that runs out mid-accumulation lets the window finish: the checkpoint is at a
    whole step (Lightning's own Timer would stop after the first micro-batch, at step 0). With
    either optimizer the resumed run ends with the uninterrupted run's weights."""
    card = make_task("single", tmp_path)
    accumulate = ["--trainer.accumulate_grad_batches=2", f"--model.optimizer={optimizer}"]
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "whole"), *accumulate])
    args = finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "cut") + accumulate
    main(["fit", *args, "--trainer.max_time={milliseconds: 1}"])  # out of time at the first batch
    stopped = last_state(tmp_path / "cut", 0)
    assert stopped["global_step"] == 1
    assert "time_elapsed" in stopped["callbacks"]["Timer"]  # Lightning's Timer state, under its key
    # no validation at the cut, where the uninterrupted run made none (Lightning adds one at a stop)
    assert (
        "validation/accuracy"
        not in (tmp_path / "cut" / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    )
    main(["fit", *args, "--ckpt_path=last"])
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", 1))


@pytest.mark.parametrize("workers", [0, 1])
def test_pretraining_resumes_mid_epoch_exactly(tmp_path, tokenizer_dir, workers):
    """Cut at step 7, an epoch's last batch: the resumed run starts the next epoch in its own order
    (a loader with workers draws it before Lightning sets the epoch)."""
    main(
        ["prepare", "--inputs", str(write_corpus(tmp_path)), "--tokenizer", tokenizer_dir]
        + ["--out_dir", str(tmp_path / "tokens"), "--validation_fraction", "0.2"]
    )

    def args(logs: str) -> list[str]:
        return [
            "--config",
            str(ROOT / "configs/pretrain/cpu.yaml"),
            f"--data.token_dir={tmp_path / 'tokens'}",
            "--data.block_size=32",
            "--data.batch_size=4",
            f"--data.num_workers={workers}",
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


def test_checkpoints_stand_alone_for_validate_and_predict(tmp_path, finetuned, capsys):
    ckpt = finetuned.ckpt  # a run of finetune_args
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
    lines = capsys.readouterr().out.splitlines()  # the checkpoint's own steps are not counted: none
    assert any(line.startswith("validate: validation/accuracy") for line in lines)
    out = tmp_path / "pred"
    main(["predict", f"--ckpt_path={ckpt}", f"--model.predictions_dir={out}", *quiet])
    assert (out / "SENT.tsv").read_text().splitlines()[0] == "index\tprediction"
    # Fields of the checkpoint's card changed, as of a card given (`text`, SingleText's own, too):
    # written under other names.
    written = ["--data.task.init_args.text", "sentence", "--data.task.submission_labels=[n, p]"]
    written += ["--data.task.init_args.submission_files={test: S.tsv}"]
    main(["predict", f"--ckpt_path={ckpt}", f"--model.predictions_dir={out}", *written, *quiet])
    rows = (out / "S.tsv").read_text().splitlines()[1:]
    assert len(rows) == 3 and {row.split("\t")[1] for row in rows} <= {"n", "p"}
    # The run's own predictions_dir is no default: a checkpoint from elsewhere chose the folder written.
    import shutil

    from gpt_ft.training.recorded import recorded_configuration

    run = shutil.copytree(ckpt.parents[1], tmp_path / "run")  # (its tokenizer beside it)
    stored["hyper_parameters"]["predictions_dir"] = str(tmp_path / "chosen")
    torch.save(stored, elsewhere := run / ckpt.relative_to(ckpt.parents[1]))
    assert "model.predictions_dir" not in recorded_configuration(str(elsewhere))


def test_a_checkpoint_records_the_checkouts_commit_asked_of_git_once_a_process(finetuned, monkeypatch):
    import subprocess

    from gpt_ft.training import checkpointing

    git = ["git", "-C", str(ROOT), "rev-parse", "HEAD"]
    head = subprocess.run(git, capture_output=True, text=True) if (ROOT / ".git").exists() else None
    expected = head.stdout.strip() if head is not None and head.returncode == 0 else None
    stored = torch.load(finetuned.ckpt, map_location="cpu", weights_only=True)
    assert stored["gpt_ft"]["commit"] == expected  # (None outside a checkout)
    calls, run = [], subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or run(*a, **k))
    checkpointing.source_commit.cache_clear()
    assert checkpointing.source_commit() == checkpointing.source_commit() == expected
    assert len(calls) == (ROOT / ".git").exists()  # once, where there is a checkout to ask


def test_a_checkpoint_is_read_with_the_tokenizer_it_was_trained_with(
    tmp_path, finetuned, tokenizer_dir, capsys
):
    """A tokenizer of the same size but other ids for some tokens is refused (it was taken, and every
    text silently read as other tokens); the one the run was given, from its own folder, is taken."""
    ckpt, quiet = finetuned.ckpt, ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    main(["validate", f"--ckpt_path={ckpt}", f"--data.tokenizer={tokenizer_dir}", *quiet])
    other = swapped(ckpt.parent / "tokenizer", tmp_path / "other")  # two of its tokens change places
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["validate", f"--ckpt_path={ckpt}", f"--data.tokenizer={other}", *quiet])
    assert stopped.value.code == 2
    first = moved_token(other)
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: --data.tokenizer {other} is not the tokenizer {ckpt} was trained with (its "
        f"{first!r} is token 301, the saved one's 300: the same text becomes other tokens). Give the one it "
        f"was trained with (a copy is saved in {ckpt.parent / 'tokenizer'})."
    )
    # The same vocabulary read otherwise (compared alone, it was taken: other ids, or unknown tokens)
    other = lowercased(ckpt.parent / "tokenizer", tmp_path / "lowercased")
    with pytest.raises(SystemExit):
        main(["validate", f"--ckpt_path={ckpt}", f"--data.tokenizer={other}", *quiet])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: --data.tokenizer {other} is not the tokenizer {ckpt} was trained with (its "
        "normalizer is another: the same text becomes other tokens). Give the one it was trained with (a "
        f"copy is saved in {ckpt.parent / 'tokenizer'})."
    )


def test_a_resumed_fit_named_from_home_is_read_with_its_tokenizer(tmp_path, finetuned, monkeypatch, capsys):
    """`--ckpt_path ~/...` (a config file's, unexpanded by a shell): the same checks as its full path
    (the tokenizer's was skipped, and the run trained on other ids)."""
    other = swapped(finetuned.ckpt.parent / "tokenizer", tmp_path / "other")
    monkeypatch.setenv("HOME", str(finetuned.ckpt.parent))
    args = finetune_args(finetuned.card, str(other), finetuned.root, tmp_path / "logs")
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, f"--ckpt_path=~/{finetuned.ckpt.name}"])
    assert stopped.value.code == 2
    assert f"is not the tokenizer {finetuned.ckpt} was trained with" in capsys.readouterr().err


def moved_token(tokenizer: Path, first: int = 300) -> str:
    """The token `swapped` moved from id `first` to `first + 1`."""
    vocab = json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    return next(token for token, i in vocab.items() if i == first + 1)


def test_a_refused_tokenizer_is_told_by_its_first_difference():
    """The refusal named no difference, and one tokenizer that differs from the saved one only by an
    added padding token was told "the same text would become other tokens"."""
    from gpt_ft.training.saved import vocabulary_difference

    own = {"a": 0, "b": 1, "<|pad|>": 2}
    assert vocabulary_difference({"a": 0, "b": 2, "<|pad|>": 1}, own) == (
        "its 'b' is token 2, the saved one's 1: the same text becomes other tokens"
    )
    assert vocabulary_difference({**own, "<|x|>": 4, "<|y|>": 3}, own) == (
        "it holds '<|y|>' (token 3), which the saved one does not"
    )
    assert vocabulary_difference({"a": 0, "b": 1}, own) == "it lacks the saved one's '<|pad|>' (token 2)"


def test_a_run_evaluated_with_its_saved_config_needs_not_the_weights_it_started_from(
    tmp_path, finetuned, tokenizer_dir, capsys, monkeypatch
):
    """The saved config names `--model.init_from` (the run's start, moved since): a checkpoint given
    is built on its own weights, as with --ckpt_path alone (the start was asked for, and was missing)."""
    start = tmp_path / "start" / "start.ckpt"
    shutil.copytree(finetuned.ckpt.parent, start.parent)
    (start.parent / finetuned.ckpt.name).rename(start)
    card, logs = make_task("single", tmp_path), tmp_path / "logs"
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, logs), f"--model.init_from={start}",
          "--trainer.max_epochs=1"])  # fmt: skip
    shutil.rmtree(start.parent)
    folder = logs / "lightning_logs" / "version_0"
    capsys.readouterr()
    last, scored = folder / "checkpoints" / "last.ckpt", tmp_path / "scored"
    monkeypatch.setenv("HOME", str(tmp_path))  # and named from the home folder, as typed quoted
    for given in (last, f"~/{last.relative_to(tmp_path)}"):
        main(["validate", f"--config={folder / 'config.yaml'}", f"--ckpt_path={given}",
              f"--trainer.logger.init_args.save_dir={scored}"])  # fmt: skip
        assert "validation/accuracy" in capsys.readouterr().out


def test_a_run_started_from_a_checkpoint_reads_it_with_its_tokenizer(tmp_path, finetuned, capsys):
    """`fit --model.init_from CKPT` with a tokenizer of the same size whose tokens moved is refused
    before any work (it was taken without a word); a copy of the saved one is taken."""
    from gpt_ft.training.saved import check_init_tokenizer

    ckpt, saved, moved = finetuned.ckpt, finetuned.ckpt.parent / "tokenizer", tmp_path / "moved"
    shutil.copytree(saved, tmp_path / "copy")
    check_init_tokenizer(str(tmp_path / "copy"), str(ckpt))
    with pytest.raises(
        ValueError, match=r"\(its normalizer is another: the same text becomes other tokens\)"
    ):
        check_init_tokenizer(str(lowercased(saved, tmp_path / "lowercased")), str(ckpt))
    swapped(saved, moved)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "fit",
                *common_args(make_task("single", tmp_path), str(moved), tmp_path),
                f"--model.init_from={ckpt}",
            ]
        )
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: --data.tokenizer {moved} is not the tokenizer {ckpt} was trained with (its "
        f"{moved_token(moved)!r} is token 301, the saved one's 300: the same text becomes other tokens). "
        f"Give the one it was trained with (a copy is saved in {saved})."
    )
    assert not (tmp_path / "runs").exists()
    # generate's --tokenizer: it printed other text than the model's, without a word
    with pytest.raises(SystemExit) as stopped:
        main(["generate", f"--ckpt_path={ckpt}", "--prompt=the cat", f"--tokenizer={moved}"])
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"gpt-ft: error: --tokenizer {moved} is not the tokenizer {ckpt} was trained with (its "
    )
    main(["generate", f"--ckpt_path={ckpt}", "--prompt=the cat", f"--tokenizer={tmp_path / 'copy'}"])
    assert capsys.readouterr().out.startswith("the cat")


def test_a_tokenizer_that_adds_a_token_moves_the_framing_tokens_and_is_taken(tmp_path, monkeypatch):
    """A GPT-2-style tokenizer (no framing tokens of its own) with a token added, as a run saves it:
    a checkpoint made with the plain one saved the framing tokens first, this one has them after its
    own. Every other token keeps its id: taken. The same with two tokens' ids swapped is refused."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from gpt_ft.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
    from gpt_ft.training.saved import check_init_tokenizer
    from gpt_ft.weights import pretrained

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    bpe.train_from_iterator(["the cat sat on the mat"] * 10, trainer)
    base = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    folder = {name: tmp_path / name for name in ("saved", "added")}
    base.save_pretrained(tmp_path / "base")
    load_tokenizer(tmp_path / "base").save_pretrained(folder["saved"])
    added = load_tokenizer(tmp_path / "base", add_specials=False)
    added.add_special_tokens({"additional_special_tokens": ["<sep>"]})
    added.save_pretrained(folder["added"])
    load_tokenizer(folder["added"]).save_pretrained(folder["added"])  # as a run saves it: framing after <sep>
    framing = list(SPECIAL_TOKENS.values())
    assert load_tokenizer(folder["added"]).convert_tokens_to_ids(framing) != load_tokenizer(
        folder["saved"]
    ).convert_tokens_to_ids(framing)
    ckpt = tmp_path / "last.ckpt"
    ckpt.touch()
    monkeypatch.setattr(pretrained, "weights_tokenizer", lambda path: str(folder["saved"]))
    check_init_tokenizer(str(folder["added"]), str(ckpt))
    # One that lacks a token the saved one has (the end of text `prepare` adds): the weights' rows do
    # not fit it, which was said as "not made for each other" once the weights had loaded
    monkeypatch.setattr(pretrained, "weights_tokenizer", lambda path: str(folder["added"]))
    with pytest.raises(
        ValueError, match=r"\(it lacks the saved one's '<sep>' \(token 269\)\)\. Give the one"
    ):
        check_init_tokenizer(str(folder["saved"]), str(ckpt))
    monkeypatch.setattr(pretrained, "weights_tokenizer", lambda path: str(folder["saved"]))
    swapped(folder["added"], folder["added"], first=-2)
    with pytest.raises(ValueError, match="is not the tokenizer .* was trained with"):
        check_init_tokenizer(str(folder["added"]), str(ckpt))


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


def test_a_disk_that_fills_while_fit_saves_stops_in_one_sentence_and_resumes(
    tmp_path, tokenizer_dir, capsys, monkeypatch
):
    """The second `last.ckpt` (after epoch 1) meets a full disk halfway: exit 2, one sentence naming
    the file, the first one (step 3) kept whole; `--ckpt_path last` resumes from it to the weights
    of an uninterrupted run."""
    card = make_task("single", tmp_path)
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "whole")])
    logs = tmp_path / "full"
    args = finetune_args(card, tokenizer_dir, tmp_path, logs)
    last = logs / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    save, steps = torch.save, []

    def disk_fills_at_the_second_last(obj, f, *more, **kwargs):
        if Path(f.name).name == ".last.ckpt.tmp":
            steps.append(obj["global_step"])
            if len(steps) == 2:
                f.write(b"half a checkpoint")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, f, *more, **kwargs)

    monkeypatch.setattr(torch, "save", disk_fills_at_the_second_last)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args])
    monkeypatch.undo()
    assert stopped.value.code == 2 and steps == [3, 6]
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {last}: could not be written (No space left on device); the previous file is kept."
    )
    assert last_state(logs, 0)["global_step"] == 3
    assert not [p.name for p in last.parent.iterdir() if p.name.endswith(".tmp")]
    main(["fit", *args, "--ckpt_path=last"])
    assert f"resuming from {last}" in capsys.readouterr().out
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(logs, 1))


def test_a_nonfinite_loss_stops_with_the_step_and_keeps_the_last_good_state(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    from gpt_ft.training.module import GPTModule

    losses = GPTModule.losses

    def nan_at_step_4(self, batch, window=None):
        loss, parts = losses(self, batch, window)
        return (loss * float("nan"), parts) if self.training and self.global_step == 4 else (loss, parts)

    monkeypatch.setattr(GPTModule, "losses", nan_at_step_4)
    card = make_task("single", tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert (
        "The training loss became nan at step 4 (epoch 1, batch 2); the state before it (step 4) is in "
        in err
    )
    assert (
        "last.ckpt, but its weights give this loss on this batch: resumed at this precision, the run stops "
        "here again. Try a lower --model.lr or gradient clipping (--trainer.gradient_clip_val 1.0) from the "
        "start."
    ) in err
    assert "Traceback" not in err
    state = last_state(tmp_path / "logs", 0)
    assert state["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


@pytest.mark.parametrize("late", [False, True], ids=["read-at-once", "read-late"])
def test_a_nonfinite_loss_inside_an_accumulation_window_resumes_at_the_windows_start(
    tmp_path, tokenizer_dir, monkeypatch, capsys, late
):
    """Four micro-batches a step: a non-finite loss at a window's second one keeps the state with
    the data at the window's start (the gradients of the micro-batches before the stop reached no
    checkpoint), and the resumed run trains them again, to the uninterrupted run's step count;
    also where the flag is read late (CUDA under fused AdamW: here the CPU's), a micro-batch on."""
    from gpt_ft.training import nonfinite
    from gpt_ft.training.module import GPTModule

    losses = GPTModule.losses

    def nan_in_epoch_1_batch_1(self, batch, window=None):
        loss, parts = losses(self, batch, window)
        at = (self.current_epoch, self.trainer.fit_loop.epoch_loop.batch_idx)
        bad = self.training and at == (1, 1)
        return (loss * float("nan"), parts) if bad else (loss, parts)

    card = make_task("single", tmp_path)
    args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs")]
    args += ["--data.batch_size=1", "--trainer.accumulate_grad_batches=4"]  # 6 batches: steps after 4 and 6
    with monkeypatch.context() as patch:
        patch.setattr(GPTModule, "losses", nan_in_epoch_1_batch_1)
        if late:
            patch.setattr(nonfinite, "defers_nonfinite_check", lambda device, optimizer: True)
        with pytest.raises(SystemExit):
            main(["fit", *args])
    assert "(epoch 1, batch 2)" in capsys.readouterr().err
    state = last_state(tmp_path / "logs", 0)
    assert state["global_step"] == 2
    # batches was 1 (2 read late): skipped on resume
    data_state = {
        "epoch": 1,
        "batches": 0,
        "batch_size": 1,
        "world": 1,
        "seed": 3,
        "size": 6,
        "order": "shuffled",
    }
    assert state["TaskDataModule"] == data_state
    progress = state["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert progress["completed"] == progress["processed"] == 0
    main(["fit", *args, "--ckpt_path=last"])
    assert last_state(tmp_path / "logs", 1)["global_step"] == 6  # 2 a epoch, 3 epochs


def test_a_nonfinite_loss_read_late_has_its_update_skipped_then_stops(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    """As CUDA under fused AdamW runs it (checked here on the CPU's fused AdamW): the finite flag
    reaches the optimizer as `found_inf`, which skips the bad step's update, and is read a step
    later, when the run stops with weights and AdamW's moments finite."""
    from gpt_ft.training import nonfinite
    from gpt_ft.training.module import GPTModule

    losses = GPTModule.losses

    def nan_at_step_4(self, batch, window=None):
        loss, parts = losses(self, batch, window)
        return (loss * float("nan"), parts) if self.training and self.global_step == 4 else (loss, parts)

    monkeypatch.setattr(GPTModule, "losses", nan_at_step_4)
    monkeypatch.setattr(nonfinite, "defers_nonfinite_check", lambda device, optimizer: True)
    card = make_task("single", tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert (
        "The training loss became nan at step 4 (epoch 1, batch 2); the state with its update skipped" in err
    )
    state = last_state(tmp_path / "logs", 0)
    assert state["global_step"] == 5  # read one step later
    tensors = [v for v in state["state_dict"].values() if v.is_floating_point()]
    for moments in state["optimizer_states"][0]["state"].values():
        tensors += [moments["exp_avg"], moments["exp_avg_sq"]]
        assert int(moments["step"]) == 4  # five steps, one skipped
    assert all(torch.isfinite(t).all() for t in tensors)


def test_the_newest_last_checkpoint_of_a_loggers_runs(tmp_path):
    from gpt_ft.training.checkpointing import find_last_checkpoint
    from gpt_ft.weights.checkpoint import Checkpoint

    assert find_last_checkpoint(tmp_path) is None
    paths = [tmp_path / f"version_{v}" / "checkpoints" / "last.ckpt" for v in (0, 1, 2)]
    for i, path in enumerate(paths):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
        os.utime(path, ns=(10**9 * (10 - i), 10**9 * [5, 9, 7][i]))
    (tmp_path / "version_3" / "checkpoints" / "last.ckpt").mkdir(parents=True)  # not a file
    assert find_last_checkpoint(tmp_path) == paths[1]
    # FSDP's sharded checkpoint is a folder of shards and meta.pt: `fit --ckpt_path last` started
    # afresh past it. Resumed; read by any other command, it is named with the way to one file.
    sharded = tmp_path / "version_3" / "checkpoints" / "last.ckpt"
    (sharded / "meta.pt").write_bytes(b"x")
    assert find_last_checkpoint(tmp_path) == sharded
    with pytest.raises(
        ValueError, match=rf"^{sharded} is a sharded checkpoint: every command reads it made into one"
    ):
        Checkpoint.read(sharded)


def test_fit_resumes_the_newest_run_of_its_own_task(tmp_path, tokenizer_dir, capsys, monkeypatch):
    """`--ckpt_path last` among runs of several cards under one logger: the newest run of the task
    given (another task's newer run would resume with its head, or be refused); said by a DDP run's
    first process alone."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    logs, (sent, pair) = tmp_path / "logs", (make_task(kind, tmp_path / kind) for kind in ("single", "pair"))
    for card in (sent, pair):
        main(["fit", *finetune_args(card, tokenizer_dir, card.parent, logs), "--trainer.max_epochs=1"])
    capsys.readouterr()
    main(["fit", *finetune_args(sent, tokenizer_dir, sent.parent, logs), "--ckpt_path=last"])
    assert f"resuming from {last_path(logs, 0)}" in capsys.readouterr().out
    assert last_state(logs, 2)["global_step"] == 9  # three epochs of three steps, the first resumed
    other = tmp_path / "other.yaml"
    other.write_text(sent.read_text().replace("name: sent", "name: other"))
    main(["fit", *finetune_args(other, tokenizer_dir, sent.parent, logs), "--ckpt_path=last"])
    assert (
        f"no {logs / 'lightning_logs'}/*/checkpoints/last.ckpt of task 'other' (the newest, "
        f"{last_path(logs, 2)}, trained another) to resume from: starting afresh"
    ) in capsys.readouterr().out
    # validate with a card takes that task's newest run too (it scored the newest of any, other's)
    main(["validate", *finetune_args(sent, tokenizer_dir, sent.parent, logs), "--ckpt_path=last"])
    assert f"validate: {last_path(logs, 2)}" in capsys.readouterr().out
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # a second process of a DDP run: said by the first alone
    main(
        [
            "fit",
            *finetune_args(sent, tokenizer_dir, sent.parent, logs),
            "--ckpt_path=last",
            "--trainer.max_epochs=4",
        ]
    )
    assert "resuming from" not in capsys.readouterr().out
    monkeypatch.undo()


def test_a_second_fit_into_a_given_logger_version_is_refused_before_it_touches_the_first(
    tmp_path, tokenizer_dir, capsys
):
    """A logger's version given (`--trainer.logger.init_args.version 0`): the second fit's refusal came
    after the logger had deleted the first run's metrics.csv and its configuration had been written
    over; both are now as the first run left them. Resuming its own last.ckpt there goes on."""
    card, logs = make_task("single", tmp_path), tmp_path / "logs"
    args = [*finetune_args(card, tokenizer_dir, tmp_path, logs), "--trainer.logger.init_args.version=0"]
    main(["fit", *args, "--trainer.max_epochs=1"])
    folder = logs / "lightning_logs" / "version_0"
    kept = {name: (folder / name).read_bytes() for name in ("metrics.csv", "config.yaml")}
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *args, "--trainer.max_epochs=2"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {folder / 'checkpoints'} holds an earlier run's checkpoints (best-0-3.ckpt, "
        "last.ckpt), which this run would write over: resume one of them (--ckpt_path last), or give the "
        "logger another version (or none) (they are kept)."
    )
    assert {name: (folder / name).read_bytes() for name in kept} == kept
    main(["fit", *args, "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert last_state(logs, 0)["global_step"] == 6
    # resumed there, the rows logged before are kept aside (the CSV logger deleted metrics.csv)
    assert (folder / "metrics.1.csv").read_bytes() == kept["metrics.csv"]
    assert "epoch" in (folder / "metrics.csv").read_text()
    # its configuration records the checkpoint resumed, not `last` (which, rerun, is its own end)
    assert f"ckpt_path: {folder / 'checkpoints' / 'last.ckpt'}\n" in (folder / "config.yaml").read_text()
    # Evaluated into that version (as the run's saved config names it): refused, both files kept (the
    # logger deleted metrics.csv, config.yaml became an evaluation's).
    kept = {name: (folder / name).read_bytes() for name in ("metrics.csv", "config.yaml")}
    for command in ("validate", "predict"):
        with pytest.raises(SystemExit):
            main(
                [
                    command,
                    "--config",
                    str(folder / "config.yaml"),
                    f"--ckpt_path={folder / 'checkpoints' / 'last.ckpt'}",
                ]
            )
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"gpt-ft: error: {folder} holds a run's metrics.csv and config.yaml, which `gpt-ft {command}` "
            "would write over: give its logger another version (--trainer.logger.init_args.version), or none "
            "for a new one (they are kept)."
        )
    assert {name: (folder / name).read_bytes() for name in kept} == kept


def test_every_csv_loggers_folder_of_a_given_version_keeps_its_rows_or_refuses_the_run(
    tmp_path, tokenizer_dir, capsys
):
    """A second CSV logger (W&B or TensorBoard first) or a first one without checkpoints there: a
    resumed run kept the first's rows only, and a fit not resumed or an evaluation deleted them."""
    card, logs = make_task("single", tmp_path), tmp_path / "logs"
    (config := tmp_path / "loggers.yaml").write_text(
        "trainer:\n  logger:\n    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {logs}}}\n    - class_path: lightning.pytorch.loggers.CSVLogger\n"
        f"      init_args: {{save_dir: {tmp_path / 'second'}, version: 0}}\n"
    )
    args = [*finetune_args(card, tokenizer_dir, tmp_path, logs), f"--config={config}"]
    main(["fit", *args, "--trainer.max_epochs=1"])
    second = tmp_path / "second" / "lightning_logs" / "version_0"
    rows = (second / "metrics.csv").read_bytes()
    main(["fit", *args, "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert (second / "metrics.1.csv").read_bytes() == rows and (second / "metrics.csv").is_file()
    kept = (second / "metrics.csv").read_bytes()
    last = max(logs.rglob("last.ckpt"), key=lambda p: p.stat().st_mtime_ns)
    for command, given in (("fit", []), ("validate", [f"--ckpt_path={last}"])):  # not resumed: refused
        with pytest.raises(SystemExit):
            main([command, *args, *given])
        said = f"{second} holds a run's metrics.csv, which `gpt-ft {command}` would write over"
        assert said in capsys.readouterr().err
    assert (second / "metrics.csv").read_bytes() == kept
    # A given version without checkpoints (checkpointing off): a second fit deleted its logs.
    off = finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "off") + ["--trainer.max_epochs=1"]
    off += ["--trainer.enable_checkpointing=false", "--trainer.logger.init_args.version=3"]
    main(["fit", *off])
    with pytest.raises(SystemExit):
        main(["fit", *off])
    said = "version_3 holds a run's metrics.csv and config.yaml, which `gpt-ft fit` would write over"
    assert said in capsys.readouterr().err


def test_a_checkpoint_callbacks_own_folder_resumes_whatever_task_ran_last_elsewhere(tmp_path):
    """A `last.ckpt` in a checkpoint callback's `dirpath` has no run folder to say its task: it is
    a candidate as it was, beside the logger's runs of this task, and a newer run of another is not."""
    from gpt_ft.training.run_folders import last_of_task, run_task

    root, own = tmp_path / "lightning_logs", tmp_path / "ck" / "last.ckpt"
    other = root / "version_0" / "checkpoints" / "last.ckpt"
    for i, path in enumerate([own, other]):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
        os.utime(path, ns=(10**9 * (i + 1),) * 2)
    task = {"class_path": "gpt_ft.adapters.TextPair", "init_args": {"name": "pair"}}
    (root / "version_0" / "config.yaml").write_text(json.dumps({"data": {"init_args": {"task": task}}}))
    assert (run_task(other), run_task(own)) == ("pair", False)
    assert last_of_task(root, [own.parent], "sent") == (own, other)
    assert last_of_task(root, [], "sent") == (None, other) and last_of_task(root, [], "pair") == (
        other,
        other,
    )


def test_a_run_stopped_by_max_steps_mid_epoch_and_extended_ends_as_the_longer_run(tmp_path, tokenizer_dir):
    """Lightning counts an epoch that `max_steps` stopped as done yet restores its batch count: an
    extended run started the next epoch at that batch and trained it short. It now trains the rest
    of the stopped epoch, then every epoch whole, and ends with the uninterrupted run's weights."""
    from lightning.pytorch.callbacks import Callback

    from gpt_ft.training.runs import lightning_main

    class Seen(Callback):
        def __init__(self):
            self.batches = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.batches.append((trainer.current_epoch, batch_idx, len(batch)))

    card = make_task("single", tmp_path)
    constant = ["--model.schedule=constant", "--model.warmup_steps=0"]  # the same rates, however long
    args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "cut"), *constant]  # 3 batches an epoch
    main(["fit", *args, "--trainer.max_steps=5"])  # epoch 1's batches 0 and 1, then stopped
    seen = Seen()
    lightning_main(["fit", *args, "--ckpt_path=last"], callbacks=[seen])  # to the end of epoch 2
    assert seen.batches == [(1, 2, 2), (2, 0, 2), (2, 1, 2), (2, 2, 2)]
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "whole"), *constant])
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", 1))


@pytest.mark.parametrize("cut", ["max_steps", "killed"])
def test_a_run_saved_after_an_epochs_closing_validation_resumes_with_the_next_epochs_order(
    tmp_path, tokenizer_dir, cut
):
    """`last.ckpt` as the validation at an epoch's end leaves it (the run then stopped by max_steps, or
    killed before the next step): Lightning ended that epoch again on resume and counted it twice,
    so the next epoch trained in the order of the one after it. Resumed, it trains epoch 1 in its
    own order and ends with the uninterrupted run's weights."""
    from lightning.pytorch.callbacks import Callback

    from gpt_ft.training.runs import lightning_main

    class Seen(Callback):
        def __init__(self):
            self.batches = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.batches.append((trainer.current_epoch, batch_idx, module.global_step))

    class KeepEpochEnd(Callback):  # last.ckpt as a kill right after epoch 0's validation leaves it
        def on_train_epoch_start(self, trainer, module):
            if trainer.current_epoch == 1:
                shutil.copy(last_path(tmp_path / "whole", 0), tmp_path / "epoch_end.ckpt")

    card = make_task("single", tmp_path)
    constant = ["--model.schedule=constant", "--model.warmup_steps=0", "--trainer.max_steps=6"]
    constant += ["--trainer.log_every_n_steps=1"]
    args = [
        *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "whole"),
        *constant,
    ]  # 3 batches an epoch
    lightning_main(["fit", *args], callbacks=[KeepEpochEnd()])
    cut_args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "cut"), *constant]
    if cut == "max_steps":
        main(["fit", *cut_args, "--trainer.max_steps=3"])
        checkpoint = "last"
    else:
        checkpoint = str(tmp_path / "epoch_end.ckpt")
    seen = Seen()
    lightning_main(["fit", *cut_args, f"--ckpt_path={checkpoint}"], callbacks=[seen])
    assert seen.batches == [(1, 0, 3), (1, 1, 4), (1, 2, 5)]
    version = int(cut == "max_steps")
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", version))

    def losses(logs: Path, version: int) -> dict[int, str]:  # the steps the logger wrote them under too
        with open(logs / "lightning_logs" / f"version_{version}" / "metrics.csv") as f:
            return {int(row["step"]): row["train/loss"][:6] for row in csv.DictReader(f) if row["train/loss"]}

    whole = losses(tmp_path / "whole", 0)
    assert losses(tmp_path / "cut", version) == {step: whole[step] for step in (3, 4, 5)}


def test_a_run_stopped_by_max_steps_on_an_epochs_last_batch_and_extended_ends_as_the_longer_run(
    tmp_path, tokenizer_dir
):
    """Pretraining of 7 batches an epoch, stopped by max_steps 7 (no validation at the epoch's end):
    Lightning would end the finished epoch again and count it twice, giving the next epoch's batches
    the order of the one after. Extended to 12 steps, it ends with the uninterrupted run's weights."""
    main(["prepare", "--inputs", str(write_corpus(tmp_path)), "--tokenizer", tokenizer_dir,
          "--out_dir", str(tmp_path / "tokens"), "--validation_fraction", "0.2"])  # fmt: skip

    def args(logs: str, steps: int) -> list[str]:
        return ["--config", str(ROOT / "configs/pretrain/cpu.yaml"), f"--data.token_dir={tmp_path}/tokens",
                "--data.block_size=32", "--data.batch_size=4", f"--model.overrides={MICRO}",
                f"--trainer.max_steps={steps}", "--trainer.val_check_interval=5", "--model.schedule=constant",
                "--model.warmup_steps=0", "--seed_everything=1", "--trainer.enable_progress_bar=false",
                f"--trainer.logger.init_args.save_dir={tmp_path / logs}"]  # fmt: skip

    main(["fit", *args("whole", 12)])
    main(["fit", *args("cut", 7)])
    assert last_state(tmp_path / "cut", 0)["global_step"] == 7
    main(["fit", *args("cut", 12), "--ckpt_path=last"])
    assert_same_weights(last_state(tmp_path / "whole", 0), last_state(tmp_path / "cut", 1))


def test_a_resumed_runs_best_carries_on_from_the_run_it_resumes(tmp_path):
    """Into its own version folder: the earlier best stays the best until a better one comes, so the
    resumed run does not take its first model for the best (Lightning's own ModelCheckpoint does)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from gpt_ft.adapters import SingleText
    from gpt_ft.training.callbacks import BestCheckpoint, best_checkpoint

    earlier = best_checkpoint(type("Model", (), {"task": SingleText(name="s", labels=["a", "b"])})())
    assert isinstance(earlier, BestCheckpoint) and earlier.mode == "max"
    best = tmp_path / "version_0" / "checkpoints" / "best-epoch=0-step=10.ckpt"
    best.parent.mkdir(parents=True)
    best.write_bytes(b"x")
    earlier.dirpath, earlier.best_model_path = str(best.parent), str(best)
    earlier.best_model_score = earlier.kth_value = torch.tensor(0.9)
    earlier.kth_best_model_path, earlier.best_k_models = str(best), {str(best): torch.tensor(0.9)}
    state = earlier.state_dict()
    for cls, expected in ((BestCheckpoint, 0.9), (ModelCheckpoint, None)):
        resumed = cls(
            dirpath=str(tmp_path / "version_1" / "checkpoints"), monitor=earlier.monitor, mode="max"
        )
        resumed.load_state_dict(state)
        score = resumed.best_model_score
        assert (None if score is None else float(score)) == pytest.approx(expected), cls
    assert resumed.best_model_path == str(best)
    # Lightning's own state key: checkpoints written by a plain ModelCheckpoint resume into it
    assert (
        BestCheckpoint(monitor=earlier.monitor, mode="max").state_key
        == ModelCheckpoint(monitor=earlier.monitor, mode="max").state_key
    )
    best.unlink()  # the earlier best gone: nothing to carry on from
    resumed = BestCheckpoint(dirpath=str(tmp_path / "version_1" / "checkpoints"), monitor=earlier.monitor)
    resumed.load_state_dict(state)
    assert resumed.best_model_score is None and resumed.best_k_models == {}


def test_last_holds_the_stochastic_weight_average(tmp_path, tokenizer_dir):
    """The average goes into the model when training ends, after the last step's save; SaveLast,
    named before it here (its `every_n_steps`), saves after it."""
    from gpt_ft.training.runs import lightning_main

    card = make_task("single", tmp_path)
    swa = ["--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs=1e-3",
           "--trainer.callbacks.swa_epoch_start=1"]  # fmt: skip
    swa = ["--trainer.callbacks+=gpt_ft.training.checkpointing.SaveLast", *swa]
    cli = lightning_main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), *swa])
    (last,) = (tmp_path / "logs").rglob("last.ckpt")
    saved = torch.load(last, weights_only=True)["state_dict"]
    for name, value in cli.model.state_dict().items():
        assert torch.equal(saved[name], value), name


def test_a_run_resumed_with_another_length_follows_its_own_schedule_from_the_first_step(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    """3 epochs of 3 steps, resumed to 6 and cosine: the restored optimizer's rate is the old
    schedule's end (0); the first resumed step takes the new schedule's, halfway down its decay.
    Resumed with the other optimizer, whose state the saved one does not fit, the run is refused."""
    from gpt_ft.training import optim
    from gpt_ft.training.runs import lightning_main

    card = make_task("single", tmp_path)
    args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), "--model.warmup_fraction=0"]
    main(["fit", *args, "--model.lr=1e-3"])
    said = []
    monkeypatch.setattr(optim, "rank_zero_info", said.append)
    rates = lr_recorder()
    lightning_main(
        [
            "fit",
            *args,
            "--model.lr=2e-3",
            "--model.weight_decay=0.05",
            "--trainer.max_epochs=6",
            "--model.schedule=cosine",
            "--ckpt_path=last",
        ],
        callbacks=[rates],
    )
    cosine = [2e-3 * 0.5 * (1 + math.cos(math.pi * step / 18)) for step in range(9, 18)]
    assert rates.seen == pytest.approx(cosine, rel=1e-6)
    assert said == [
        "resumed with other optimizer settings than the checkpoint's, which apply from step 9: lr 0.002 (the "
        "checkpoint's 0.001), weight_decay 0.05 (the checkpoint's 0.01)",
        "the schedule is now cosine after 0 warmup steps, the checkpoint's linear after 0, from step 9 on",
        "the schedule now spans 18 steps, the checkpoint's 9: learning rates follow the new one from step 9",
    ]
    decays = {
        group["weight_decay"]
        for group in last_state(tmp_path / "logs", 1)["optimizer_states"][0]["param_groups"]
    }
    assert decays == {0.0, 0.05}  # the matrices' new decay; biases and gains none
    from tests.cli.test_bad_files import error_of

    first = sorted((tmp_path / "logs").rglob("last.ckpt"))[0]  # the first run's
    error = error_of(["fit", *args, "--model.optimizer=muon", f"--ckpt_path={first}"], capsys)
    assert error == (
        f"gpt-ft: error: {first} was trained with --model.optimizer adamw: resume with it, or start a run "
        "of muon from its weights with --model.init_from."
    )


def test_a_run_resumed_with_another_batch_size_spans_the_steps_it_makes(tmp_path, tokenizer_dir, monkeypatch):
    """Stopped at step 4 (3 batches of 2 an epoch, 3 epochs), resumed with batches of 3: the rest of
    epoch 1 is one batch (Lightning counts 1 of its 2 done), epoch 2 two: 7 steps in all, where the
    Trainer's estimate, 3 epochs of 2, ended the schedule at step 6 and left the last step at rate 0.
    A warmup by fraction is the fraction of those 7 steps, 3.5."""
    from gpt_ft.training import optim
    from gpt_ft.training.runs import lightning_main

    card = make_task("single", tmp_path)
    args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), "--model.warmup_fraction=0.5"]
    main(["fit", *args, "--model.lr=1e-3", "--trainer.max_steps=4"])
    said, rates = [], lr_recorder()
    monkeypatch.setattr(optim, "rank_zero_info", said.append)
    resumed = ["--model.lr=1e-3", "--data.batch_size=3", "--trainer.max_steps=-1", "--ckpt_path=last"]
    lightning_main(["fit", *args, *resumed], callbacks=[rates])
    assert rates.seen == pytest.approx([1e-3 * (1 - (step - 3.5) / 3.5) for step in (4, 5, 6)], rel=1e-6)
    assert last_state(tmp_path / "logs", 1)["global_step"] == 7
    assert said == [
        "the schedule is now linear after 3.5 warmup steps, the checkpoint's linear after 2, from step 4 on",
        "the schedule now spans 7 steps, the checkpoint's 4: learning rates follow the new one from step 4",
    ]


def test_training_on_from_a_calibrated_checkpoint_leaves_its_temperature_behind(
    tmp_path, tokenizer_dir, finetuned
):
    """T was fitted to the weights as they were: trained on, they are not those any more. Scoring
    the calibrated checkpoint keeps it."""
    from gpt_ft.weights.checkpoint import Checkpoint

    checkpoint = torch.load(finetuned.ckpt, weights_only=True)
    Checkpoint(checkpoint).temperature = 2.5
    calibrated = tmp_path / "calibrated.ckpt"
    torch.save(checkpoint, calibrated)
    shutil.copytree(
        finetuned.ckpt.parent / "tokenizer", tmp_path / "tokenizer"
    )  # saved beside, as calibrate does
    logs = tmp_path / "logs"
    args = finetune_args(finetuned.card, tokenizer_dir, finetuned.root, logs)
    main(["fit", *args, "--trainer.max_epochs=4", f"--ckpt_path={calibrated}"])
    assert Checkpoint(last_state(logs, 0)).temperature == 1.0
    from gpt_ft import Classifier

    assert Classifier.from_checkpoint(str(calibrated), device="cpu").temperature == 2.5


# ---- DDP: every rank's random states come back on their own rank ----

DDP_CARD = """class_path: gpt_ft.adapters.SingleText
init_args:
  name: sent
  labels: [negative, positive]
  local: {splits: {train: d/train.tsv, validation: d/dev.tsv}, columns: {index: idx}}
"""


def ddp_fit_args(root: Path, tokenizer_dir: str, logs: str) -> list[str]:
    return [
        "fit",
        f"--data.task={root / 'card.yaml'}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={root}",
        "--data.batch_size=2",  # 16 examples on 2 ranks: 4 steps an epoch
        "--data.max_length=32",
        "--model.preset=gpt-micro",
        "--model.overrides={n_positions: 32, n_embd: 32, n_layer: 1, n_head: 2}",  # dropout 0.1
        "--trainer.max_epochs=2",
        "--seed_everything=3",
        f"--trainer.logger.init_args.save_dir={root / logs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.strategy=ddp",
    ]


def start_ddp_kill(root, tokenizer_dir):
    """A 2-process run with dropout; the same run with rank 1 killed after batch 5 (a periodic
    last.ckpt at step 4), then resumed with --ckpt_path last; and with SIGTERM sent to rank 0 alone
    after batch 5, then resumed."""
    (root / "d").mkdir()
    good, bad = "the cat sat on the mat .", "two dogs run in a park ."
    for split, n in (("train", 16), ("dev", 4)):
        rows = "".join(f"{i}\t{good if i % 2 else bad}\t{i % 2}\n" for i in range(n))
        (root / "d" / f"{split}.tsv").write_text("index\tsentence\tlabel\n" + rows)
    (root / "card.yaml").write_text(DDP_CARD)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    kill = ["--trainer.callbacks+=tests.interrupt.InterruptAt", "--trainer.callbacks.batch=5"]
    kill += [f"--trainer.callbacks.signum={int(signal.SIGKILL)}", "--trainer.callbacks.rank=1"]
    return [
        gpt_ft(*ddp_fit_args(root, tokenizer_dir, "whole"), cwd=root, env=env),
        gpt_ft(*ddp_fit_args(root, tokenizer_dir, "cut"), *EVERY_2_STEPS, *kill, cwd=root, env=env),
        gpt_ft(*ddp_fit_args(root, tokenizer_dir, "cut"), "--ckpt_path=last", cwd=root, env=env),
        gpt_ft(
            *ddp_fit_args(root, tokenizer_dir, "term"),
            *interrupt(5, signal.SIGTERM),
            "--trainer.callbacks.rank=0",
            cwd=root,
            env=env,
        ),  # fmt: skip
        gpt_ft(*ddp_fit_args(root, tokenizer_dir, "term"), "--ckpt_path=last", cwd=root, env=env),
    ]


HOLD_AND_FIT = """import runpy, sys
from pathlib import Path
from gpt_ft.data.folders import held
with held(Path(sys.argv[1]), "`gpt-ft fit`"):  # another run's, as it trains there: a lock of its own
    sys.argv = ["gpt_ft", *sys.argv[2:]]  # the run, in this process (its other rank forked from it)
    runpy.run_module("gpt_ft", run_name="__main__", alter_sys=True)
"""


def start_ddp_held(root, tokenizer_dir):
    """A 2-process run into a fixed checkpoint folder (`--trainer.logger false`) that another run
    holds: a lock taken first in the run's own process, on a file of its own (flock's locks belong
    to an open file, so the run's lock is refused as another process's would be)."""
    from tests.background import Command

    (root / "d").mkdir()
    rows = "".join(f"{i}\tthe cat sat .\t{i % 2}\n" for i in range(8))
    for split in ("train", "dev"):
        (root / "d" / f"{split}.tsv").write_text("index\tsentence\tlabel\n" + rows)
    (root / "card.yaml").write_text(DDP_CARD)
    args = [a for a in ddp_fit_args(root, tokenizer_dir, "logs") if not a.startswith("--trainer.logger")]
    fit = [*args, "--trainer.logger=false", f"--trainer.default_root_dir={root / 'run'}"]
    code = [sys.executable, "-c", HOLD_AND_FIT, str(root / "run" / "checkpoints"), *fit]
    return [Command(code, root, {**os.environ, "PYTHONPATH": str(ROOT)}, preloaded=True)]


@pytest.mark.background(start=start_ddp_held)
def test_a_ddp_run_into_a_folder_another_run_holds_is_refused_on_every_rank(background):
    """Its first process holds the folder for all: refused, said once, every rank stops (none
    waits on the others for ever), nothing written."""
    [run] = background.runs
    refused = f"gpt-ft: error: Another `gpt-ft fit` is writing to {background.root / 'run' / 'checkpoints'}"
    assert run.returncode != 0 and run.stderr.count(refused) == 1, run.stderr[-3000:]
    assert list((background.root / "run").rglob("*")) == []


@pytest.mark.background(start=start_ddp_kill)
def test_a_killed_ddp_rank_resumes_to_the_uninterrupted_weights(background):
    whole, killed, resumed, *_ = background.runs
    root = background.root
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert killed.returncode != 0
    lost = [line for line in killed.stderr.splitlines() if line.startswith("gpt-ft: error: rank 0 lost")]
    assert lost, killed.stderr[-3000:]  # the other rank stops at once, in one sentence
    cut = last_state(root / "cut", 0)
    assert cut["global_step"] == 4 and len(cut["callbacks"]["ResumeState"]["ranks"]) == 2
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = last_state(root / "whole", 0), last_state(root / "cut", 1)
    assert a["global_step"] == b["global_step"] == 8
    assert_same_weights(a, b)


@pytest.mark.background(start=start_ddp_kill)
def test_sigterm_to_one_ddp_rank_stops_every_rank_at_one_step_and_resumes_exactly(background):
    """Lightning's SIGTERM handler broadcasts inside the handler, where it could meet the other rank's
    collective of the step (the loss's mean, a checkpoint's gathered states): both waited forever,
    with no checkpoint. The signal is now only noted, and the ranks agree on it at each batch's end."""
    whole, *_, stopped, resumed = background.runs
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    path = last_path(background.root / "term", 0)
    assert f"SIGTERM: saved step 5 to {path}; {FIT_RESUME}" in stopped.stdout
    assert last_state(background.root / "term", 0)["global_step"] == 5
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(last_state(background.root / "whole", 0), last_state(background.root / "term", 1))


def test_a_validation_inside_an_accumulation_window_saves_last_at_the_windows_end(monkeypatch, tmp_path):
    """Validating every N batches across epochs can land inside an accumulation window (epochs whose
    length is no multiple of it): the gradients gathered so far are in no checkpoint, while the
    data position would count their batches as trained; so last.ckpt waits for the optimizer step."""
    from types import SimpleNamespace

    from gpt_ft.training import checkpointing

    saved, accumulating = [], [True]
    monkeypatch.setattr(checkpointing, "should_accumulate", lambda trainer: accumulating[0])
    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), sanity_checking=False, global_step=4,
                              fast_dev_run=0, received_sigterm=False, callbacks=[])  # fmt: skip
    trainer.checkpoint_callback = SimpleNamespace(dirpath=tmp_path)
    trainer.save_checkpoint = lambda path, weights_only: saved.append(trainer.global_step)
    callback = checkpointing.SaveLast()
    callback.after_validation(trainer)
    callback.on_train_batch_end(trainer, None, None, None, 9)  # still accumulating
    assert saved == []
    accumulating[0], trainer.global_step = False, 5
    callback.on_train_batch_end(trainer, None, None, None, 10)  # the window's optimizer step
    callback.on_train_batch_end(trainer, None, None, None, 11)
    accumulating[0] = False
    callback.after_validation(trainer)  # a validation at a step's end saves at once, again at step 5
    trainer.global_step = 6  # (its scores and the best checkpoint are state that last.ckpt must hold)
    callback.after_validation(trainer)
    callback.on_train_end(trainer, None)  # nothing new since
    assert saved == [5, 5, 6]


def test_last_holds_the_best_checkpoint_of_its_own_validation(tmp_path, tokenizer_dir):
    """last.ckpt, saved after a validation, holds the best as that validation left it: the best of
    a run whose monitor rises every validation (`step`) is the last one's file, which exists. (The
    best before it, deleted by then, would be forgotten by a run resumed from there.)"""
    card = make_task("single", tmp_path)
    best = [
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.monitor=step",
        "--trainer.callbacks.mode=max",
        "--trainer.callbacks.filename=best-{step}",
    ]
    main(
        [
            "fit",
            *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"),
            "--trainer.max_epochs=2",
            *best,
        ]
    )
    state = last_state(tmp_path / "logs", 0)
    (kept,) = [v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert (
        Path(kept["best_model_path"]).name == "best-step=6.ckpt" and Path(kept["best_model_path"]).is_file()
    )
    assert list(kept["best_k_models"]) == [kept["best_model_path"]]


def test_validating_after_every_batch_keeps_a_best_by_every_validation(tmp_path, tokenizer_dir):
    """`--trainer.val_check_interval 1` (the int: after every batch): a checkpoint that keeps every
    better score keeps one a validation, not one an epoch (tests/test_workarounds.py has why)."""
    card = make_task("single", tmp_path)
    every = [
        "--trainer.val_check_interval=1",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.monitor=step",
        "--trainer.callbacks.mode=max",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.filename=best-{step}",
    ]
    main(
        [
            "fit",
            *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"),
            "--trainer.max_epochs=1",
            *every,
        ]
    )
    kept = sorted(p.name for p in (tmp_path / "logs").rglob("best-step=*.ckpt"))
    assert kept == ["best-step=1.ckpt", "best-step=2.ckpt", "best-step=3.ckpt"]


def test_fast_dev_run_writes_no_checkpoint(tmp_path, tokenizer_dir, monkeypatch, capsys):
    """Lightning says checkpointing is off under --trainer.fast_dev_run: no last.ckpt nor tokenizer
    lands in the working folder; the run's last note says so (it said no validation had run, and
    that last.ckpt held the weights)."""
    card = make_task("single", tmp_path / "task")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    args = finetune_args(card, tokenizer_dir, tmp_path / "task", tmp_path / "logs")
    main(["fit", *args, "--trainer.fast_dev_run=1"])
    assert not any((tmp_path / "work").iterdir()) and not list((tmp_path / "task").rglob("*.ckpt"))
    assert capsys.readouterr().err.strip().splitlines()[-1] == "note: fast_dev_run saves no checkpoint."


def test_a_run_saved_with_more_gpus_visible_resumes_on_fewer(monkeypatch):
    """CUDA random states are saved for every visible device; a machine with fewer restores those
    of the devices it has (torch would index past its generators)."""
    from gpt_ft.training import checkpointing

    state = checkpointing.rng_state()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 2  # saved where two GPUs were visible
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.extend(states))
    checkpointing.set_rng_state(state)
    assert len(restored) == 1


def test_pretraining_resumed_on_token_files_of_another_tokenizer_is_refused(tmp_path, tokenizer_dir, capsys):
    """Token files of a tokenizer of the same size but other ids, or of another size: refused, as a
    task's tokenizer is, naming the token folder (the fault) and the remedy, by a resumed run and by
    `validate` (which builds the model of the checkpoint's size first)."""
    from gpt_ft.data.tokenizer import train_tokenizer

    corpus = write_corpus(tmp_path)
    smaller = tmp_path / "smaller"
    train_tokenizer(inputs=[corpus], vocab_size=350, out_dir=smaller, show_progress=False)
    others = {"tokens2": swapped(Path(tokenizer_dir), tmp_path / "other"), "tokens3": smaller}
    for tok, out in ((tokenizer_dir, "tokens"), *((t, o) for o, t in others.items())):
        main(["prepare", "--inputs", str(corpus), "--tokenizer", str(tok), "--out_dir", str(tmp_path / out),
              "--validation_fraction", "0.2"])  # fmt: skip

    def args(tokens: str, steps: int) -> list[str]:
        return ["--config", str(ROOT / "configs/pretrain/cpu.yaml"),
                f"--data.token_dir={tmp_path / tokens}", "--data.block_size=32", "--data.batch_size=4",
                f"--model.overrides={MICRO}", f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=0",
                "--trainer.enable_progress_bar=false",
                f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}"]  # fmt: skip

    main(["fit", *args("tokens", 2)])
    ckpt = last_path(tmp_path / "logs", 0)
    for tokens in others:
        for command in (
            ["fit", *args(tokens, 4), "--ckpt_path=last"],
            ["validate", *args(tokens, 4), f"--ckpt_path={ckpt}"],
        ):
            capsys.readouterr()
            with pytest.raises(SystemExit) as stopped:
                main(command)
            assert stopped.value.code == 2
            said = capsys.readouterr().err.strip().splitlines()[-1]
            assert said.startswith(
                f"gpt-ft: error: --data.token_dir {tmp_path / tokens} was prepared with another tokenizer "
            ), said
            assert said.endswith(f"Prepare the corpus again with --tokenizer {ckpt.parent / 'tokenizer'}."), (
                said
            )


def test_pretraining_resumed_on_a_corpus_prepared_again_says_its_data_changed(
    tmp_path, tokenizer_dir, capsys, recwarn
):
    """`gpt-ft prepare` into a folder it wrote before says it replaces its token files, and a run
    resumed on them says its data changed, with both token counts; a token folder without a
    validation block says so once, without Lightning's warning of an empty loader list after it, nor
    of a checkpoint folder not empty (it holds the run's lock)."""
    tokens = tmp_path / "tokens"

    def prepare(lines: int) -> str:
        corpus = tmp_path / f"corpus{lines}"
        shutil.move(write_corpus(tmp_path, n_files=2, lines=lines), corpus)
        main(["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir, "--out_dir", str(tokens),
              "--validation_fraction", "0"])  # fmt: skip
        return capsys.readouterr().err

    def fit(steps: int, *resume: str, block: int = 16) -> str:
        main(["fit", "--config", str(ROOT / "configs/pretrain/cpu.yaml"), f"--data.token_dir={tokens}",
              f"--data.block_size={block}", "--data.batch_size=2", f"--model.overrides={MICRO}",
              f"--trainer.max_steps={steps}", "--trainer.enable_progress_bar=false",
              f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}", *resume])  # fmt: skip
        said = " ".join(" ".join(str(w.message) for w in recwarn).split())
        recwarn.clear()
        return said

    assert "replaced" not in prepare(30)
    said = fit(2)
    assert said.count("training will not validate") == 1 and "across ranks is zero" not in said, said
    assert "exists and is not empty" not in said, said  # (its own lock file was all there)
    assert "on_after_batch_transfer" not in said, said  # (the data modules define none)
    assert "LeafSpec" not in said and "not supported by the model summary" not in said, said
    before = json.loads((tokens / "meta.json").read_text())["tokens"]["train"]
    said = fit(4, "--ckpt_path=last")  # the same data: nothing said, nor of a best that no run kept
    assert "data changed" not in said and "dirpath has changed" not in said, said
    assert f"the token files {tokens} held before are replaced" in prepare(40)
    now = json.loads((tokens / "meta.json").read_text())["tokens"]["train"]
    said = fit(6, "--ckpt_path=last")
    assert (
        f"The checkpoint's run trained on {before:,} training tokens and this run's, in {tokens}, hold "
        f"{now:,}: the data changed since it was saved" in said
    ), said
    # Mid-epoch (6 of its 24 batches) with blocks of another size: the rest of the epoch is of other blocks.
    said = fit(8, "--ckpt_path=last", block=8)
    blocks = "The checkpoint stopped 6 batches into epoch 0 of blocks of 16 tokens, and this run reads blocks"
    assert f"{blocks} of 8: the rest of that epoch follows the new blocks' order" in said, said
    assert "data changed" not in said


def test_a_run_resumed_with_another_task_card_says_what_changed(tmp_path, tokenizer_dir):
    """Labels swapped between the run and its resumption flip what each class means: named, not silent."""
    from tests.helpers import finetune_args, make_task

    card, logs = make_task("single", tmp_path), tmp_path / "logs"
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, logs), "--trainer.max_epochs=1"])
    swapped = tmp_path / "swapped.yaml"
    swapped.write_text(card.read_text().replace("[negative, positive]", "[positive, negative]"))
    resume = [
        *finetune_args(swapped, tokenizer_dir, tmp_path, logs),
        "--trainer.max_epochs=2",
        "--ckpt_path=last",
    ]
    with pytest.warns(UserWarning) as warned:
        main(["fit", *resume])
    said = [str(w.message) for w in warned if "another task card" in str(w.message)]
    assert len(said) == 1 and said[0].endswith(
        "trained on: labels ['negative', 'positive'] -> ['positive', 'negative']. The run goes on with the "
        "new one."
    )
    other = tmp_path / "other.yaml"  # scored, or predicted, as another task: said as well
    other.write_text(swapped.read_text().replace("name: sent", "name: other"))
    for command, doing in (("validate", "validating"), ("predict", "predicting")):
        with pytest.warns(UserWarning) as warned:
            where = [f"--model.predictions_dir={tmp_path / 'predictions'}"] if command == "predict" else []
            main([command, *finetune_args(other, tokenizer_dir, tmp_path, logs), "--ckpt_path=last", *where])
        said = [str(w.message) for w in warned if "another task card" in str(w.message)]
        assert len(said) == 1 and said[0].startswith(f"{doing} with another task card than ")
        assert said[0].endswith("trained on: name 'sent' -> 'other'. Its head's outputs are " + (
            "written as the new card's." if command == "predict" else "read as the new card's."))  # fmt: skip
    # a field a later version added to cards (null in this one) is no change to an earlier checkpoint
    first = next(logs.glob("lightning_logs/version_0/checkpoints/last.ckpt"))
    stored = torch.load(first, weights_only=True)
    recorded = stored["data_config"]["init_args"]["task"]["init_args"]
    assert None in recorded["local"].values()
    recorded["local"] = {k: v for k, v in recorded["local"].items() if v is not None}  # as written before
    torch.save(stored, first)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, logs), "--trainer.max_epochs=2",
              f"--ckpt_path={first}"])  # fmt: skip
    assert not [str(w.message) for w in warned if "another task card" in str(w.message)]


def test_a_merged_lora_runs_stop_says_it_cannot_resume(capsys):
    """`--model.lora.checkpoint merged` saves merged weights, which a LoRA run cannot resume from: the
    stop's line said to resume with --ckpt_path last, which then failed."""
    from types import SimpleNamespace

    from gpt_ft.model.lora import LoRA
    from gpt_ft.training.checkpointing import FIT_RESUME, SaveLast

    for kind, advice in (("adapters", FIT_RESUME), ("merged", "it holds the merged model")):
        module = SimpleNamespace(lora=LoRA(checkpoint=kind))
        trainer = SimpleNamespace(is_global_zero=True, global_step=4, lightning_module=module)
        save = SaveLast()
        save._save = lambda trainer: Path("last.ckpt")
        save._stop(trainer)
        assert capsys.readouterr().out.startswith(f"SIGTERM: saved step 4 to last.ckpt; {advice}")


def test_last_resumes_from_a_checkpoint_callbacks_own_folder(tmp_path, tokenizer_dir, capsys):
    """A ModelCheckpoint given its own `dirpath` keeps last.ckpt there: `--ckpt_path last` resumes
    from it, where it had started afresh and written over that folder's checkpoints."""
    card = make_task("single", tmp_path)
    mine = tmp_path / "mine"
    own = ["--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.dirpath={mine}"]
    args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), *own]
    main(["fit", *args, "--trainer.max_epochs=1"])
    assert torch.load(mine / "last.ckpt", weights_only=True)["global_step"] == 3
    capsys.readouterr()
    main(["fit", *args, "--ckpt_path=last"])
    assert f"resuming from {mine / 'last.ckpt'}" in capsys.readouterr().out
    assert torch.load(mine / "last.ckpt", weights_only=True)["global_step"] == 9  # 3 epochs, on from 3
    capsys.readouterr()
    main(["validate", *args, "--ckpt_path=last"])  # and so do validate, test, predict and explain
    assert capsys.readouterr().out.startswith(f"validate: {mine / 'last.ckpt'}\n")


def test_last_without_a_logger_and_best_in_fit(tmp_path, tokenizer_dir, capsys):
    """With `--trainer.logger false` fit saves in ROOT/checkpoints, and validate's `last` is found
    there (it was refused as if no `last` were taken); `fit --ckpt_path best` is one sentence."""
    from tests.cli.test_bad_files import error_of

    card = make_task("single", tmp_path)
    args = [
        a
        for a in finetune_args(card, tokenizer_dir, tmp_path, tmp_path)
        if not a.startswith("--trainer.logger")
    ]
    args += [
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path / 'root'}",
        "--trainer.max_epochs=1",
    ]
    main(["fit", *args])
    capsys.readouterr()
    fitted = (tmp_path / "root" / "config.yaml").read_text()
    main(["validate", *args, "--ckpt_path=last"])
    assert capsys.readouterr().out.startswith(
        f"validate: {tmp_path / 'root' / 'checkpoints' / 'last.ckpt'}\n"
    )
    assert (tmp_path / "root" / "config.yaml").read_text() == fitted  # (it became validate's)
    # the run's own config.yaml is known as a run's (its header was lost: a requeued run was refused)
    assert (tmp_path / "root" / "config.yaml").read_text().startswith("# lightning.pytorch==")
    with pytest.raises(SystemExit) as ended:  # at its end already: nothing more to train, said so
        main(["fit", *args, "--ckpt_path=last"])
    assert ended.value.code == 0 and "nothing is left to train" in capsys.readouterr().out
    assert torch.load(tmp_path / "root" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert error_of(["fit", *args, "--ckpt_path=best"], capsys) == (
        "gpt-ft: error: --ckpt_path best: gpt-ft fit resumes from `last` or a checkpoint's path "
        "(a best-*.ckpt's)."
    )
    # While a run trains there, another process's run into the folder is refused before it writes
    # (two started at once both passed the check below, and the one that ended last kept last.ckpt).
    from gpt_ft.data.folders import held

    saved = {p: p.read_bytes() for p in (tmp_path / "root").rglob("*") if p.is_file()}
    with held(tmp_path / "root" / "checkpoints", "`gpt-ft fit`"):  # (as another process holds it)
        assert error_of(["fit", *args, "--ckpt_path=last"], capsys) == (
            f"gpt-ft: error: Another `gpt-ft fit` is writing to {tmp_path / 'root' / 'checkpoints'}; wait "
            "for it to end, or choose another folder."
        )
        assert {
            p: p.read_bytes() for p in (tmp_path / "root").rglob("*") if p.is_file() and p.name != LOCK
        } == saved
    assert not (tmp_path / "root" / "checkpoints" / LOCK).exists()
    # A second run into the same folder would write over the first's checkpoints (Lightning only
    # warned), and a config.yaml of the user's own where the run writes its configuration: refused.
    last = tmp_path / "root" / "checkpoints" / "last.ckpt"
    saved = {p: p.read_bytes() for p in (tmp_path / "root").rglob("*") if p.is_file()}
    assert error_of(["fit", *args, "--model.lr=0.005"], capsys) == (
        f"gpt-ft: error: {last.parent} holds an earlier run's checkpoints (best-0-3.ckpt, last.ckpt), "
        "which this run would write over: resume one of them (--ckpt_path last), or give another "
        "--trainer.default_root_dir (they are kept)."
    )  # and its config.yaml and tokenizer/ are the checkpoints' still (both were the refused run's)
    assert {p: p.read_bytes() for p in (tmp_path / "root").rglob("*") if p.is_file()} == saved
    # So is a run that resumes a checkpoint from elsewhere into this folder (it wrote over them, rc 0).
    other = [
        *(a for a in args if not a.startswith("--trainer.default_root_dir")),
        f"--trainer.default_root_dir={tmp_path / 'other'}",
    ]
    main(["fit", *other])
    into = error_of(["fit", *args, f"--ckpt_path={tmp_path / 'other' / 'checkpoints' / 'last.ckpt'}"], capsys)
    assert into.startswith(f"gpt-ft: error: {last.parent} holds an earlier run's checkpoints")
    assert {p: p.read_bytes() for p in (tmp_path / "root").rglob("*") if p.is_file()} == saved
    from types import SimpleNamespace

    from gpt_ft.training.run_folders import no_earlier_checkpoints

    callback = SimpleNamespace(dirpath=last.parent)  # a checkpoint callback's own folder: its own remedy
    trainer = SimpleNamespace(checkpoint_callbacks=[callback], logger=object(), default_root_dir=tmp_path)
    with pytest.raises(
        ValueError, match=r"--ckpt_path last\), or give the checkpoint callback another dirpath"
    ):
        no_earlier_checkpoints(trainer, None)
    no_earlier_checkpoints(trainer, str(last))  # one of its own, resumed
    (tmp_path / "mine").mkdir()
    (own := tmp_path / "mine" / "config.yaml").write_text("# my run\ntrainer: {max_steps: 1}\n")
    elsewhere = [a for a in args if not a.startswith("--trainer.default_root_dir")]
    assert error_of(["fit", *elsewhere, f"--trainer.default_root_dir={own.parent}"], capsys) == (
        f"gpt-ft: error: {own} is no run's configuration, and with --trainer.logger false a run writes "
        "its own there (in --trainer.default_root_dir): give another root folder (the file is kept)."
    )
    assert own.read_text() == "# my run\ntrainer: {max_steps: 1}\n"
    main(
        [
            "validate",
            f"--ckpt_path={last}",
            "--trainer.logger=false",
            f"--trainer.default_root_dir={own.parent}",
        ]
    )
    assert own.read_text() == "# my run\ntrainer: {max_steps: 1}\n"  # (replaced: an evaluation saves none)


def test_a_run_that_ends_before_any_validation_says_it_kept_no_best(tmp_path, tokenizer_dir, capsys):
    """max_steps 1 of an epoch of 3 batches: no best-*.ckpt and one note saying why (Lightning warned
    that the metric was never `log`ged, a hint for a module's author); last.ckpt written."""
    import warnings

    card = make_task("single", tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        main(
            ["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), "--trainer.max_steps=1"]
        )
    assert not [w for w in seen if "could not find the monitored key" in str(w.message)]
    note = "note: the run ended before any validation gave validation/accuracy: no best checkpoint was kept"
    assert capsys.readouterr().err.count(f"{note} (last.ckpt holds the weights).") == 1
    (folder,) = (tmp_path / "logs").rglob("checkpoints")
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["last.ckpt"]
    # max_steps 0 trains nothing and writes no checkpoint: the note does not promise one.
    main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "zero"), "--trainer.max_steps=0"])
    assert f"{note} (nor any other: no step trained)." in capsys.readouterr().err
    assert not list((tmp_path / "zero").rglob("*.ckpt"))


def test_an_every_n_steps_save_due_with_a_validation_waits_for_it(tmp_path, tokenizer_dir, monkeypatch):
    """Every 3 steps, 3 batches an epoch: each save comes after its step's validation. Saved before
    it, a run killed during that validation resumed past it: its score and best checkpoint lost."""
    from gpt_ft.training.checkpointing import SaveLast

    events, save, validate = [], SaveLast._save, SaveLast.on_validation_start

    def saving(self, trainer, again=False):
        if (path := save(self, trainer, again)) is not None:  # written (not this step's already)
            events.append(("save", trainer.global_step))
        return path

    def validating(self, trainer, pl_module):
        if not trainer.sanity_checking:
            events.append(("validate", trainer.global_step))
        return validate(self, trainer, pl_module)

    monkeypatch.setattr(SaveLast, "_save", saving)
    monkeypatch.setattr(SaveLast, "on_validation_start", validating)
    card = make_task("single", tmp_path)
    every = [
        "--trainer.callbacks+=gpt_ft.training.checkpointing.SaveLast",
        "--trainer.callbacks.every_n_steps=3",
    ]
    args = finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs")
    main(["fit", *args, *every, "--trainer.max_epochs=2"])
    assert events == [("validate", 3), ("save", 3), ("validate", 6), ("save", 6)]


CLIP = "gradient clipping (--trainer.gradient_clip_val 1.0)"


@pytest.mark.parametrize(
    "clip, precision, tries",
    [
        (None, "32-true", f"a lower --model.lr or {CLIP} from the start"),
        (1.0, "32-true", "a lower --model.lr from the start"),
        (1.0, "16-true", "a lower --model.lr from the start, or --trainer.precision bf16-mixed (or 32-true)"),
        (0.0, "bf16-mixed", f"a lower --model.lr or {CLIP} from the start, or --trainer.precision 32-true"),
    ],
)  # fmt: skip
def test_a_nonfinite_loss_suggests_what_the_run_does_not_already_do(clip, precision, tries):
    from types import SimpleNamespace

    from gpt_ft.training.nonfinite import remedies

    assert remedies(SimpleNamespace(gradient_clip_val=clip, precision=precision)) == tries
    first = remedies(SimpleNamespace(gradient_clip_val=clip, precision=precision), first=True)
    assert first.startswith("checking the data (no update has run yet") and "--model.lr" not in first


def test_a_nonfinite_loss_on_another_process_is_named_so(tmp_path):
    """Under DDP every rank stops at a loss any rank found non-finite; a rank whose own is finite
    says the loss became non-finite elsewhere, not "became 7.96"."""
    from types import SimpleNamespace

    from gpt_ft.training.nonfinite import stop_on_nonfinite

    trainer = SimpleNamespace(checkpoint_callback=None, gradient_clip_val=None, precision="32-true")
    with pytest.raises(FloatingPointError) as stopped:
        stop_on_nonfinite(trainer, 7.958456993103027, (0, 0, 1))
    assert str(stopped.value) == (
        "The training loss became non-finite on another process (this one's: 7.958) at step 0 (epoch 0, "
        "batch 1). Try checking the data (no update has run yet: a value too large for the loss?)."
    )


def test_a_nonfinite_loss_in_a_dev_run_saves_nothing(tmp_path):
    """`fast_dev_run` saves no checkpoint (Lightning says so, and `SaveLast` keeps none); the stop at a
    non-finite loss wrote last.ckpt all the same, and named it."""
    from types import SimpleNamespace

    from gpt_ft.training.nonfinite import stop_on_nonfinite

    ckpt = SimpleNamespace(dirpath=str(tmp_path / "checkpoints"))
    saved = lambda *args, **kwargs: pytest.fail("saved")  # noqa: E731
    trainer = SimpleNamespace(checkpoint_callback=ckpt, fast_dev_run=1, gradient_clip_val=None,
                              precision="32-true", save_checkpoint=saved)  # fmt: skip
    with pytest.raises(
        FloatingPointError, match=r"^The training loss became nan at step 0 \(epoch 0, batch 1\)\. "
    ):
        stop_on_nonfinite(trainer, float("nan"), (0, 0, 1), rewind=False)


def test_a_checkpoint_copied_without_its_tokenizer_folder_says_so(tmp_path, finetuned, monkeypatch, capsys):
    """The tokenizer lies beside a checkpoint (`tokenizer/`): a file copied alone names the folder
    that should have come with it (it was taken for a Hub model named `tokenizer`), and validate
    takes `--data.tokenizer` instead."""
    from gpt_ft import Classifier

    alone = tmp_path / "m" / "model.ckpt"
    alone.parent.mkdir()
    shutil.copy(finetuned.ckpt, alone)
    monkeypatch.chdir(alone.parent)
    missing = (
        "model.ckpt: its tokenizer, saved beside it by gpt-ft fit, is not there "
        f"({alone.parent / 'tokenizer'}): copy the checkpoint's tokenizer/ folder along with it"
    )
    with pytest.raises(ValueError) as error:
        Classifier.from_checkpoint("model.ckpt", device="cpu")
    assert str(error.value).startswith(missing), error.value
    quiet = ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    test_file, out = finetuned.root / "d" / "test.tsv", tmp_path / "labelled.tsv"
    for command in (["label", "--ckpt_path=model.ckpt", f"--input={test_file}", f"--output={out}"],
                    ["validate", "--ckpt_path=model.ckpt", *quiet]):  # fmt: skip
        with pytest.raises(SystemExit):
            main(command)
        assert missing in capsys.readouterr().err, command
    main(
        [
            "validate",
            "--ckpt_path=model.ckpt",
            f"--data.tokenizer={finetuned.ckpt.parent / 'tokenizer'}",
            *quiet,
        ]
    )
    assert "validate: validation/accuracy" in capsys.readouterr().out


def test_a_root_folder_and_predictions_under_the_home_folder(tmp_path, tokenizer_dir, monkeypatch):
    """`~` in --trainer.default_root_dir and --model.predictions_dir is the home folder, as the shell
    reads it unquoted: the logger expanded it and the checkpoints went to a folder named `~`, where
    `--ckpt_path last` found a checkpoint it then could not read; predictions went there too."""
    card = make_task("single", tmp_path)
    (home := tmp_path / "home").mkdir()
    (cwd := tmp_path / "cwd").mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    args = [
        a
        for a in finetune_args(card, tokenizer_dir, tmp_path, tmp_path)
        if not a.startswith("--trainer.logger")
    ]
    args += ["--trainer.default_root_dir=~/runs", "--trainer.max_steps=2"]
    main(["fit", *args])
    main(["fit", *args[:-1], "--trainer.max_steps=3", "--ckpt_path=last"])
    assert last_state(home / "runs", 1)["global_step"] == 3 and not (cwd / "~").exists()
    main(["predict", f"--ckpt_path={last_path(home / 'runs', 1)}", "--model.predictions_dir=~/subm"])
    assert list((home / "subm").iterdir()) and not (cwd / "~").exists()


@pytest.mark.parametrize("save_dir", ["saved", None])
def test_last_is_looked_for_where_a_logger_without_a_root_folder_puts_checkpoints(tmp_path, save_dir):
    """W&B or MLflow alone have no `root_dir` (it crashed `fit --ckpt_path last`): the runs are
    under SAVE_DIR/NAME (the trainer's root without a save_dir), as Lightning's checkpoint folders."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers.logger import DummyLogger

    from gpt_ft.training.run_folders import runs_root

    given = None if save_dir is None else str(tmp_path / save_dir)

    class FolderlessLogger(DummyLogger):  # what W&B and MLflow give: a name, a version, no root_dir
        name, version, save_dir = "project", "run-1", given

    checkpoints = ModelCheckpoint()
    trainer = pl.Trainer(
        logger=FolderlessLogger(), callbacks=[checkpoints], default_root_dir=tmp_path / "root"
    )
    assert getattr(trainer.logger, "root_dir", None) is None
    folder = Path(checkpoints._ModelCheckpoint__resolve_ckpt_dir(trainer))
    assert runs_root(trainer) == folder.parent.parent == tmp_path / (save_dir or "root") / "project"


def test_a_checkpoint_of_another_number_of_processes_warns_of_dropout_when_it_trains_only():
    """Scored on 2 processes (`validate --ckpt_path`), a 1-process checkpoint warned that dropout
    masks would differ from the uninterrupted run's: nothing trains there."""
    import warnings
    from types import SimpleNamespace

    from gpt_ft.training.checkpointing import ResumeState, rng_state

    saved = {"ranks": [rng_state()]}
    for fn, warns in (("validate", False), ("fit", True)):
        resume = ResumeState()
        resume.trainer = SimpleNamespace(world_size=2, global_rank=1, state=SimpleNamespace(fn=fn))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resume.load_state_dict(saved)
        said = [str(w.message) for w in caught if "random states of 1 processes" in str(w.message)]
        assert len(said) == warns, (fn, said)


def test_a_checkpoint_to_resume_is_refused_before_the_run_only_where_no_such_path_exists(tmp_path):
    """A missing --ckpt_path is refused before a distributed run's other processes start; a sharded
    checkpoint (a folder), Lightning's own names (`hpc`, `registry`) and remote paths go on to
    Lightning (the first check refused the first two as missing)."""
    from types import SimpleNamespace

    from gpt_ft.training.run_folders import no_earlier_checkpoints

    trainer = SimpleNamespace(checkpoint_callbacks=[], logger=object(), default_root_dir=tmp_path)
    missing = tmp_path / "nowhere.ckpt"
    with pytest.raises(FileNotFoundError, match=rf"^--ckpt_path {missing} does not exist\.$"):
        no_earlier_checkpoints(trainer, str(missing))
    (sharded := tmp_path / "last.ckpt").mkdir()
    (sharded / "meta.pt").write_bytes(b"x")
    for resumed in (
        str(sharded),
        "hpc",
        "registry",
        "registry:me/model:latest",
        "s3://bucket/x.ckpt",
        "last",
    ):
        no_earlier_checkpoints(trainer, resumed)


@pytest.mark.parametrize(
    "limit, said",
    [
        ([], "has trained 3 epochs (9 steps), as many as --trainer.max_epochs=3"),
        (["--trainer.max_steps=4"], "is at step 9, where --trainer.max_steps=4 stops"),
    ],
)
def test_resuming_a_run_already_at_its_limit_says_so_and_makes_no_folder(
    tmp_path, finetuned, tokenizer_dir, capsys, limit, said
):
    """A finished run resumed with the same limit (or a lower one) has nothing left to train: one
    line, exit 0 (a rerun of a finished job is no fault), and no new version folder, where
    Lightning made one holding only its configuration."""
    logs = tmp_path / "logs"
    args = finetune_args(finetuned.card, tokenizer_dir, finetuned.root, logs)
    with pytest.raises(SystemExit) as ended:
        main(["fit", *args, *limit, f"--ckpt_path={finetuned.ckpt}"])
    assert ended.value.code == 0
    assert f"{finetuned.ckpt} {said}: nothing is left to train" in capsys.readouterr().out
    assert not list((logs / "lightning_logs").glob("version_*"))


def test_a_run_cut_by_max_steps_mid_epoch_is_not_taken_for_a_finished_one(tmp_path, tokenizer_dir):
    """Lightning counts the epoch `max_steps` cut as processed: read as such, a run stopped at step 4
    of 2 epochs of 3 steps was "trained out" and its resume trained nothing (it has 2 steps left)."""
    from gpt_ft.training.run_folders import epochs_done

    card = make_task("single", tmp_path)
    args = [*finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), "--trainer.max_epochs=2"]
    main(["fit", *args, "--trainer.max_steps=4"])
    main(["fit", *args, "--ckpt_path=last"])
    assert last_state(tmp_path / "logs", 1)["global_step"] == 6

    # the counts each save leaves, as the resumed run reads them (3 epochs started)
    def loop(processed, last, batches):
        batch = {"is_last_batch": last, "current": {"processed": batches}}
        return {"epoch_progress": {"current": {"started": 3, "processed": processed}},
                "epoch_loop.batch_progress": batch}  # fmt: skip

    assert epochs_done(loop(3, True, 3)) == 3  # at the epoch's end
    assert epochs_done(loop(2, True, 3)) == 3  # by a validation on its last batch, before it is counted
    assert epochs_done(loop(2, False, 1)) == 2  # mid-epoch (SIGTERM, every N steps)
    assert epochs_done(loop(3, False, 1)) == 2  # cut there by max_steps, counted processed
