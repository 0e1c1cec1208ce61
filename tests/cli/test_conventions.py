"""What Lightning and transformers users expect of the command line: a card given later replaces
the earlier one wholly, `--trainer.default_root_dir` moves a run, weights are required to evaluate,
bad checkpoints and YAML are one sentence, the metrics line stands on its own line."""

import logging
import re

import pytest
import yaml
from lightning.pytorch import Callback

from gpt_ft.cli import main
from tests.helpers import ROOT, HostReads, common_args, finetune_args, make_task

NLI_CARD = """class_path: gpt_ft.adapters.TextPair
init_args:
  name: my_nli
  premise: claim
  hypothesis: evidence
  label: verdict
  labels: [supported, refuted, unknown]
  local:
    splits: {train: train.jsonl, validation: dev.jsonl}
"""


def test_a_card_on_the_command_line_replaces_the_configs_card(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    (tmp_path / "my_nli.yaml").write_text(NLI_CARD)
    rows = '{"claim": "the cat sat", "evidence": "a cat", "verdict": "unknown"}\n'
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "dev.jsonl").write_text(rows)
    base = ["explain", "--config=configs/quickstart.yaml"]
    main([*base, f"--data.task={tmp_path / 'my_nli.yaml'}", f"--data.data_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert out.startswith("task my_nli, split train, example 0: label 'unknown'")
    # One field of the card before it still changes on the command line.
    main([*base, "--data.task.init_args.name=renamed", "--split=validation"])
    assert capsys.readouterr().out.startswith("task renamed, split validation")


def test_default_root_dir_moves_logs_and_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the quickstart's paths are relative to the repository
    before = sorted((ROOT / "runs").rglob("*")) if (ROOT / "runs").exists() else None
    quickstart = ["fit", "--config=configs/quickstart.yaml", "--trainer.enable_progress_bar=false"]
    main([*quickstart, f"--trainer.default_root_dir={tmp_path / 'D'}", "--trainer.max_steps=3"])
    assert list((tmp_path / "D" / "lightning_logs" / "version_0" / "checkpoints").glob("last.ckpt"))
    after = sorted((ROOT / "runs").rglob("*")) if (ROOT / "runs").exists() else None
    assert after == before  # nothing new under ./runs
    card = make_task("single", tmp_path)
    args = [
        a
        for a in common_args(card, str(ROOT / "examples/quickstart/tokenizer"), tmp_path)
        if "save_dir" not in a
    ]
    # An explicit logger folder still wins.
    main(
        [
            "fit",
            *args,
            f"--trainer.default_root_dir={tmp_path / 'D2'}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'L'}",
            "--trainer.max_steps=1",
        ]
    )
    assert list((tmp_path / "L").rglob("last.ckpt"))


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluating_needs_trained_weights(command, tmp_path, tokenizer_dir, finetuned, capsys):
    """No weights, or `--model.init_from` a fine-tuned checkpoint (it loads the GPT alone: the task
    head would start untrained, and was scored so without a word): refused before any work."""
    card = make_task("single", tmp_path)
    for weights, message in (
        ([], f"gpt-ft {command} needs trained weights: give --ckpt_path CKPT (a checkpoint of gpt-ft fit) "
         "or --model.init_from WEIGHTS; it does not score a randomly initialised model."),
        ([f"--model.init_from={finetuned.ckpt}"], f"gpt-ft {command} --model.init_from {finetuned.ckpt} "
         "would score a task head that was never trained (--model.init_from gives a run its starting "
         "weights): give the fine-tuned checkpoint with --ckpt_path CKPT."),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main([command, *common_args(card, tokenizer_dir, tmp_path), *weights])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"gpt-ft: error: {message}"
        assert not (tmp_path / "runs").exists()


def test_an_embedding_that_trains_nothing_beside_the_weights_validates_from_init_from(
    tmp_path, tokenizer_dir, finetuned, capsys, recwarn, monkeypatch
):
    """An embedding without a projection is the weights' own states: `validate --model.init_from`
    scores it (a base model's zero-shot retrieval); with a projection, whose weights would start
    untrained, it is refused. No seed given is 0, said by no warning (Lightning's "No seed found")."""
    import json

    rows = [{"anchor": f"a cat {i} .", "positive": f"the cat {i} sat ."} for i in range(4)]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = tmp_path / "pairs.yaml"
    card.write_text((ROOT / "tasks" / "embedding" / "pairs.yaml").read_text())
    args = ["validate", *common_args(card, tokenizer_dir, tmp_path), f"--model.init_from={finetuned.ckpt}"]
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # (an earlier run's: a new process has none)
    main(args)
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("validate: ")]
    assert "validation/mrr@10" in line
    assert not [w for w in recwarn if "seed" in str(w.message)], [str(w.message) for w in recwarn]
    with pytest.raises(SystemExit):
        main([*args, "--data.task.init_args.dimensions=8"])
    assert "would score a task head that was never trained" in capsys.readouterr().err


def test_the_metrics_line_is_printed_through_the_progress_bar_and_the_summary_has_no_flops(
    tmp_path, tokenizer_dir, capsys, caplog, monkeypatch
):
    from lightning.pytorch.callbacks import TQDMProgressBar

    printed = []
    monkeypatch.setattr(TQDMProgressBar, "print", lambda self, *a, **k: printed.append(a[0]))
    card = make_task("single", tmp_path)
    args = [
        a
        for a in common_args(card, tokenizer_dir, tmp_path)
        if "progress_bar" not in a and "summary" not in a
    ]
    with caplog.at_level(logging.INFO):
        main(["fit", *args, "--trainer.max_epochs=1"])
    assert len(printed) == 1 and printed[0].startswith("epoch 0 step 2: ")
    summary = [r.getMessage() for r in caplog.records if "Trainable params" in r.getMessage()]
    assert summary and "FLOPs" not in summary[0] and "Flops" not in summary[0] and "| head " in summary[0]


def test_the_bar_of_a_run_with_gradient_accumulation_counts_its_batches(tmp_path, tokenizer_dir, monkeypatch):
    """`max_steps 2` of 2 batches a step, 6 batches an epoch: the first epoch's bar runs to 4 (it read
    2, one batch a step, and ran past it); with `max_epochs` too (it read 6, and stopped at 4)."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    totals = []
    start = TQDMProgressBar.on_train_epoch_start

    def noted(self, trainer, *args) -> None:
        totals.append(self.total_train_batches)
        start(self, trainer, *args)

    monkeypatch.setattr(TQDMProgressBar, "on_train_epoch_start", noted)
    card = make_task("single", tmp_path)
    args = [a for a in common_args(card, tokenizer_dir, tmp_path) if "progress_bar" not in a]
    steps = ["--data.batch_size=1", "--trainer.max_steps=2", "--trainer.accumulate_grad_batches=2"]
    main(["fit", *args, *steps])
    main(["fit", *args, *steps, "--trainer.max_epochs=3"])
    assert totals == [4, 4]


def test_the_bar_in_a_log_writes_lines(tmp_path, tokenizer_dir, monkeypatch, capsys):
    """Off a terminal, Lightning's bar ran its every redraw into one line with carriage returns (a
    long run's, megabytes): it writes a line every `every` seconds of a pass, and each pass's last."""
    import io

    from gpt_ft.data.folders import LogLines
    from gpt_ft.training.callbacks import LogBar

    card = make_task("single", tmp_path)
    args = [a for a in common_args(card, tokenizer_dir, tmp_path) if "progress_bar" not in a]
    main(["fit", *args, "--trainer.max_epochs=2"])  # 2 batches an epoch, within `every`
    out = capsys.readouterr().out
    epochs = re.findall(r"^Epoch (\d): 100%\|#+\| 2/2 \[.*\]$", out, re.M)
    assert "\r" not in out and epochs == ["0", "1"] and len(out.splitlines()) == 5, out  # metrics lines, best
    best, last = (
        next(tmp_path.rglob(name)) for name in ("best-*.ckpt", "last.ckpt")
    )  # a run says where they are
    assert out.splitlines()[-1] == f"best: {best}; last: {last}"
    logs = f"--trainer.logger.init_args.save_dir={tmp_path / 'resumed'}"
    main(["fit", *args, logs, "--trainer.max_steps=1"])  # stopped within its first epoch, then resumed:
    capsys.readouterr()  # Lightning starts no epoch there, and the bar had neither total nor epoch
    main(["fit", *args, logs, "--trainer.max_epochs=2", "--ckpt_path=last"])
    out = capsys.readouterr().out
    assert re.findall(r"^Epoch (\d): 100%\|#+\| 2/2 \[.*\]$", out, re.M) == ["0", "1"], out
    monkeypatch.chdir(tmp_path)  # (validate's reports go under runs/ where it runs)
    main(["validate", f"--ckpt_path={next(tmp_path.rglob('last.ckpt'))}"])  # its bar alone: left
    assert re.search(r"^Validation DataLoader 0: 100%\|#+\| 2/2 \[.*\]$", capsys.readouterr().out, re.M)
    log = io.StringIO()
    bar = LogBar(total=25, desc="Epoch 0", file=LogLines(log), bar_format="{desc}: {n}/{total}")
    for n in (10, 20, 25):
        bar.n = n
        bar.refresh()
    bar.set_postfix({"loss": 1.0})  # the same count again: no line
    unknown = LogBar(total=None, desc="Epoch 1", file=LogLines(log), bar_format="{desc}: {n}/{total}")
    for n in (10, 20):  # a pass of no known total (resumed mid-way): its last count, when it is over
        unknown.n = n
        unknown.refresh()
    unknown.reset()
    unknown.n = 5
    unknown.close()
    monkeypatch.setattr(LogBar, "every", 0.0)
    bar.reset(25)
    for n in (10, 20, 25):
        bar.n = n
        bar.refresh()
    bar.close()
    shown = [
        "Epoch 0: 25/25",
        "Epoch 1: 20/None",
        "Epoch 1: 5/None",
        *(f"Epoch 0: {n}/25" for n in (10, 20, 25)),
    ]
    assert log.getvalue().splitlines() == shown


class StopAfter(Callback):
    """Stops the run after the training step with this index (0-based), as a time limit does."""

    def __init__(self, index: int) -> None:
        self.index = index

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = trainer.should_stop or trainer.global_step == self.index + 1


# 3 epochs of 3 batches, log_every_n_steps 2: the loggers write after steps 1, 3, 5, 7 (0-based), the
# epochs end at 2, 5, 8; a bar of every 2 batches refreshes after each epoch's 2nd (1, 4, 7).
LOGGED_STEPS = {
    "no bar": ([], {1, 3, 5, 7, 2, 8}, [1, 3, 5, 7]),
    "bar every 2": (["--trainer.callbacks+=TQDMProgressBar", "--trainer.callbacks.refresh_rate=2"],
                    {1, 3, 5, 7, 2, 8, 4}, [1, 3, 5, 7]),
    "max_steps 7": (["--trainer.max_steps=7"], {1, 3, 5, 2, 6}, [1, 3, 5]),  # 6: the run's last
    "stopped after step 4": ([], {1, 3, 2, 4}, [1, 3, 4]),  # the stop makes the loggers write 4
}  # fmt: skip


@pytest.mark.parametrize("case", list(LOGGED_STEPS))
def test_training_values_are_logged_fresh_on_the_steps_something_reads_them(
    tmp_path, tokenizer_dir, monkeypatch, case
):
    """`train/*` goes through Lightning's `log` (0.5-1 ms of host time a value) only on
    the steps whose values are read: the loggers' (every `log_every_n_steps`, and a stop), the bar's
    refreshes, each epoch's last and the run's last; whatever reads them gets the step's own value.
    Without a bar, no step's end reads a value back (Lightning turns a bar's values into numbers)."""
    import csv

    from lightning.pytorch.trainer.connectors.logger_connector import _LoggerConnector

    from gpt_ft.training import runs
    from gpt_ft.training.module import GPTModule

    extra, expected, rows_expected = LOGGED_STEPS[case]
    losses, logged, step, log = [], [], GPTModule.training_step, GPTModule.log
    batch_end, reads = _LoggerConnector.on_batch_end, HostReads()

    def on_batch_end(self):
        with reads:
            batch_end(self)

    monkeypatch.setattr(_LoggerConnector, "on_batch_end", on_batch_end)

    def training_step(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        losses.append(float(loss))
        return loss

    def spy(self, name, value, *args, **kwargs):
        if name == "train/loss":
            logged.append(float(value))
        return log(self, name, value, *args, **kwargs)

    monkeypatch.setattr(GPTModule, "training_step", training_step)
    monkeypatch.setattr(GPTModule, "log", spy)
    if case.startswith("stopped"):
        callbacks = runs.run_callbacks
        monkeypatch.setattr(runs, "run_callbacks", lambda *a, **k: [StopAfter(4), *callbacks(*a, **k)])
    card = make_task("single", tmp_path)
    args = [
        a for a in finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "runs") if "progress_bar" not in a
    ]
    bar = [] if "bar" in case and "no" not in case else ["--trainer.enable_progress_bar=false"]
    main(
        ["fit", *args, *bar, *extra, "--trainer.log_every_n_steps=2", "--trainer.enable_checkpointing=false"]
    )
    assert logged == [losses[i] for i in sorted(expected)]  # each step's own loss, on those steps only
    assert reads.calls == ([] if "--trainer.enable_progress_bar=false" in bar else ["item"] * len(expected))
    (metrics,) = (tmp_path / "runs").rglob("metrics.csv")
    with open(metrics) as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == rows_expected
    assert [float(r["train/loss"]) for r in rows] == pytest.approx(
        [losses[i] for i in rows_expected], rel=1e-6
    )


def test_a_runs_configuration_is_written_without_validating_it_again(tmp_path, tokenizer_dir, monkeypatch):
    """The parse validated the configuration: writing it (the model's hyper-parameters, config.yaml)
    checks it again only when asked (`--print_config` asks), each check costing a parse's time."""
    from gpt_ft.training.runs import ValidatedOnce, lightning_main

    card = make_task("single", tmp_path)
    cli = lightning_main(common_args(card, tokenizer_dir, tmp_path), run=False)  # fit's, unrun
    assert isinstance(cli.parser, ValidatedOnce)
    checked = []
    monkeypatch.setattr(ValidatedOnce, "validate", lambda self, cfg, **kwargs: checked.append(cfg))
    written = cli.parser.dump(cli.config, format="yaml")
    cli.parser.save(cli.config, tmp_path / "config.yaml", multifile=False)
    assert not checked and yaml.safe_load(written)["data"]["init_args"]["batch_size"] == 4
    cli.parser.dump(cli.config, skip_validation=False)
    assert checked


def test_the_toolkits_warnings_are_one_line_as_lightnings_are(monkeypatch):
    """A log showed each of the toolkit's warnings with the source line that raised it
    (`rank_zero_warn(f"{given} is {than} ...`); Lightning's own show on one line."""
    import warnings
    from pathlib import Path

    import gpt_ft
    from gpt_ft.workarounds.trainer import quiet_misleading_warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # (put back after the test)
    quiet_misleading_warnings()
    ours = str(Path(gpt_ft.__file__).parent / "training" / "optim.py")
    said = warnings.formatwarning(UserWarning("too long"), UserWarning, ours, 84, 'rank_zero_warn(f"...")')
    assert said == f"{ours}:84: too long\n"
    other = warnings.formatwarning(UserWarning("x"), UserWarning, "/elsewhere/m.py", 3, "f()")
    assert "UserWarning: x" in other and "f()" in other  # others' as before
