"""`gpt-ft fit|validate|predict` (LightningCLI) for each adapter kind: in processes of their own in the
background (tests/background.py), and in this process."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from gpt_ft.adapters.outputs import score_text
from gpt_ft.cli import main
from gpt_ft.errors import check_context
from gpt_ft.training.recorded import plain_config
from tests.background import gpt_ft
from tests.helpers import assert_classifier_agrees, common_args, make_task

ADAPTER_KINDS = ["single", "pair", "similarity", "choice"]


def start_each_kind(kind: str):
    """The background start of `gpt-ft fit`, `validate` and `predict` on make_task's `kind` task (the
    single text's: also validate and test from `last`, and two checkpoints refused)."""

    def start(root, tokenizer_dir):
        card = make_task(kind, root)
        args = common_args(card, tokenizer_dir, root)
        predictions, last = f"--model.predictions_dir={root / 'pred'}", f"--ckpt_path={last_of(root)}"
        runs = [["fit", *args, "--trainer.max_epochs=2", predictions], ["validate", *args, last]]
        if kind == "single":
            labelled = root / "labelled_test.yaml"  # its test split: the dev file, which has labels
            labelled.write_text(card.read_text().replace("test: d/test.tsv", "test: d/dev.tsv"))
            bar = "--trainer.enable_progress_bar=true"  # (the bar, closed by then, swallowed its line)
            runs.append(["validate", *args, "--ckpt_path=last"])  # the newest last.ckpt of the logger's runs
            runs += [
                [c, *args, "--ckpt_path=last", bar, f"--data.task={labelled}"] for c in ("validate", "test")
            ]
            elsewhere = f"--trainer.logger.init_args.save_dir={root / 'elsewhere'}"
            runs += [["test", *args, "--ckpt_path=best"], ["predict", *args, "--ckpt_path=last", elsewhere]]
        runs.append(["predict", *args, last, predictions])
        return [gpt_ft(*run, cwd=root) for run in runs]

    start.__name__ = f"start_{kind}"  # its folder's name
    return start


LABELLED = ("validate", "test")


def last_of(root: Path) -> Path:
    return root / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=pytest.mark.background(start=start_each_kind(k))) for k in ADAPTER_KINDS],
)
def test_fit_validate_predict_for_each_adapter_kind(kind, background):
    root, (fit, validate, *more, predict) = background.root, background.runs
    for run in (fit, validate, predict):
        assert run.returncode == 0, run.stderr[-3000:]
    metric = {"similarity": "validation/pearson"}.get(kind, "validation/accuracy")
    assert "epoch 1 step 4: " in fit.stdout and metric in fit.stdout
    best = list((root / "runs").rglob("best-*.ckpt"))
    last = list((root / "runs").rglob("last.ckpt"))
    assert len(best) == 1 and last == [last_of(root)]
    if kind == "single":
        from_last, *labelled, best, elsewhere = more
        scores = lambda out: [line for line in out.splitlines() if "validation/" in line]  # noqa: E731
        explicit = scores(validate.stdout)
        assert from_last.stdout.startswith(f"validate: {last[0]}\n") and scores(from_last.stdout) == explicit
        assert explicit
        # Its metrics line alone: Lightning's table showed each validation split under every split's column.
        assert (
            "Validate metric" not in from_last.stdout and "validate: validation/accuracy " in from_last.stdout
        )
        for command, run in zip(LABELLED, labelled, strict=True):
            assert run.returncode == 0, run.stderr[-3000:]
            assert f"{command}: {command if command == 'test' else 'validation'}/accuracy " in run.stdout
        for run in (best, elsewhere):
            assert run.returncode == 2, run.stderr[-3000:]
        best_error = (
            "gpt-ft: error: --ckpt_path best: gpt-ft test takes a checkpoint's path, or `last` (the newest"
        )
        assert best.stderr.strip().splitlines()[-1].startswith(best_error)
        assert (
            elsewhere.stderr.strip()
            .splitlines()[-1]
            .startswith(f"gpt-ft: error: --ckpt_path last: there is no {root}/elsewhere/lightning_logs/")
        )
    files = list((root / "pred").iterdir())
    assert len(files) == 1 and f"predictions of split 'test': {files[0]}\n" in predict.stdout
    lines = files[0].read_text().splitlines()
    ids = ["s-0", "s-1", "s-2"] if kind == "choice" else ["0", "1", "2"]  # the file's, text ones too
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == ids
    values = [line.split("\t")[1] for line in lines[1:]]
    expected_name, allowed = {
        "single": ("SENT.tsv", {"negative", "positive"}),
        "pair": ("pair-test.tsv", {"entailment", "not_entailment"}),
        "choice": ("mc-test.tsv", {"1", "2"}),
    }.get(kind, ("STS-B.tsv", None))
    assert files[0].name == expected_name
    if allowed:
        assert set(values) <= allowed
    else:
        assert all(0.0 <= float(v) <= 5.0 and v == score_text(float(v)) for v in values)  # float32's own
    # The Python classifier gives the same labels, and the probabilities of the data's own batches.
    assert_classifier_agrees(last[0], root, files[0])


def test_fit_without_checkpointing_writes_no_checkpoint(tmp_path, tokenizer_dir):
    card = make_task("single", tmp_path)
    args = common_args(card, tokenizer_dir, tmp_path)
    main(["fit", *args, "--trainer.max_epochs=1", "--trainer.enable_checkpointing=false"])
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


def test_sequences_longer_than_the_context_are_refused_before_anything_runs():
    check_context(SimpleNamespace(max_length=64), 64)
    check_context(SimpleNamespace(block_size=32), 64)
    with pytest.raises(
        ValueError, match=r"^--data.max_length 100 is longer than the model's context of 64 tokens"
    ):
        check_context(SimpleNamespace(max_length=100), 64)
    with pytest.raises(
        ValueError, match=r"^--data.block_size 65 is longer than the model's context of 64 tokens"
    ):
        check_context(SimpleNamespace(block_size=65), 64)


def test_a_parsed_config_is_stored_as_plain_values():
    config = {"task": {"class_path": "x.Y", "init_args": {"labels": ("a", "b")}}, "__path__": "c.yaml"}
    config["dir"], config["n"], config["off"] = Path("data"), 3, None
    assert plain_config(config) == {
        "task": {"class_path": "x.Y", "init_args": {"labels": ["a", "b"]}},
        "dir": "data",
        "n": 3,
        "off": None,
    }


def test_fine_tuning_given_no_length_runs_the_recipes_3_epochs_and_says_so(
    tmp_path, tokenizer_dir, capsys, caplog
):
    """Not Lightning's default of 1,000 epochs: GPT-1's 3, said at start; a length given still wins."""
    card = make_task("single", tmp_path)
    args = common_args(card, tokenizer_dir, tmp_path)
    with caplog.at_level("INFO"):
        main(["fit", *args, "--trainer.enable_checkpointing=false"])
    epochs = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert epochs == ["0", "1", "2"]
    assert "no --trainer.max_epochs given: fine-tuning runs the recipe's 3 epochs" in caplog.text
    caplog.clear()
    main(["fit", *args, "--trainer.max_steps=2"])
    assert "recipe's 3 epochs" not in caplog.text
    (last,) = tmp_path.rglob("last.ckpt")
    main(["validate", f"--ckpt_path={last}", f"--trainer.default_root_dir={tmp_path}"])  # it trains nothing
    assert "recipe's 3 epochs" not in caplog.text


def test_last_is_looked_for_where_fit_writes_with_another_logger(tmp_path, monkeypatch):
    """`--trainer.default_root_dir` moves the default CSV logger's folder only: a TensorBoard logger
    at `runs` keeps writing there, and `--ckpt_path last` looks there too."""
    from jsonargparse import Namespace

    from gpt_ft.training.run_folders import newest_last

    monkeypatch.chdir(tmp_path)
    for folder in ("runs", "root"):
        last = tmp_path / folder / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
        last.parent.mkdir(parents=True)
        last.write_bytes(b"x")
    init = Namespace(save_dir="runs", name="lightning_logs")
    for logger, expected in (("lightning.pytorch.loggers.TensorBoardLogger", "runs"),
                             ("lightning.pytorch.loggers.CSVLogger", "root")):  # fmt: skip
        trainer = Namespace(logger=Namespace(class_path=logger, init_args=init), default_root_dir="root")
        found = newest_last(trainer, "validate", "last")
        assert found == str(Path(expected) / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt")
