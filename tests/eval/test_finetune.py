from types import SimpleNamespace

import pytest

from gpt_ft.adapters import TaskDataError
from gpt_ft.eval import finetune
from gpt_ft.training import callbacks


def test_best_epoch_ranks_an_undefined_score_last(monkeypatch):
    task = SimpleNamespace(validation_splits=["validation"], test_splits=[], name="sts")
    evaluations = [(0, {"validation/pearson": None}), (1, {"validation/pearson": 0.25}), (2, {})]
    monkeypatch.setattr(finetune, "main_key", lambda task: "validation/pearson")

    class Trainer:  # built with its History, as `BuildRun` builds them
        def __init__(self) -> None:
            self.callbacks, self.sanity_checking, self.global_step = [callbacks.History()], False, 3

        def fit(self, model, datamodule):
            history = self.callbacks[-1]
            history.evaluations.extend(evaluations)
            history.steps.extend([1, 2, 3])

    build = lambda argv: (SimpleNamespace(task=task), None, Trainer())  # noqa: E731
    assert finetune.fit_and_evaluate(build, [], "best", predict=False) == ({"validation/pearson": 0.25}, 1)
    assert finetune.fit_and_evaluate(build, [], "last", predict=False) == ({}, 2)


def test_the_last_models_scores_are_those_of_the_weights_it_ends_with():
    """`--trainer.max_steps` mid-epoch: training went on after the last validation (step 3 of 4), so
    the model that predicts is validated again and its scores are the ones kept."""
    task = SimpleNamespace(validation_splits=["validation"], main_metric="accuracy")

    class Trainer:
        def __init__(self) -> None:
            self.callbacks, self.global_step, self.validated = [callbacks.History()], 0, []

        def fit(self, model, datamodule):
            self.callbacks[-1].evaluations.append((0, {"validation/accuracy": 0.5}))
            self.callbacks[-1].steps.append(3)
            self.global_step, self.callbacks[-1].trained_epoch = 4, 1  # stopped in epoch 1's first batch

        def validate(self, model, datamodule, verbose):  # Lightning counts the cut epoch as done: 2
            self.validated.append(verbose)
            self.callbacks[-1].evaluations.append((2, {"validation/accuracy": 0.75}))
            self.callbacks[-1].steps.append(4)

    trainer = Trainer()
    build = lambda argv: (SimpleNamespace(task=task), None, trainer)  # noqa: E731
    assert finetune.fit_and_evaluate(build, [], "last", predict=False) == ({"validation/accuracy": 0.75}, 1)
    assert trainer.validated == [False]
    trainer = Trainer()  # the best epoch is one that was validated, its checkpoint kept
    assert finetune.fit_and_evaluate(build, [], "best", predict=False) == ({"validation/accuracy": 0.5}, 0)
    assert trainer.validated == []


def test_a_run_without_a_task_or_a_validation_is_refused():
    class Trainer:
        def __init__(self) -> None:
            self.callbacks, self.sanity_checking = [callbacks.History()], False

        def fit(self, model, datamodule):
            pass

        def validate(self, model, datamodule, verbose):  # (validates nothing: limit_val_batches 0)
            self.validated = True

    no_task = lambda argv: (SimpleNamespace(task=None), None, Trainer())  # noqa: E731
    with pytest.raises(ValueError, match=r"^A suite fine-tunes task cards; this run has no task\.$"):
        finetune.fit_and_evaluate(no_task, [], "last", predict=False)
    task = SimpleNamespace(validation_splits=["validation"], main_metric="accuracy")
    trainer = Trainer()
    never_validated = lambda argv: (SimpleNamespace(task=task), None, trainer)  # noqa: E731
    with pytest.raises(ValueError, match=r"^The run validated nothing: check --trainer.limit_val_batches\.$"):
        finetune.fit_and_evaluate(never_validated, [], "last", predict=False)
    assert trainer.validated  # (the weights it ended with, asked for a validation)
    # --select best with a test split to predict and no checkpoint to read the best epoch from:
    # refused before it trains (the last epoch's predictions went out beside the best epoch's
    # scores); with no test file to predict, it trains (here: to no validation).
    unkept = Trainer()
    unkept.checkpoint_callback = None
    data = SimpleNamespace(task=SimpleNamespace(name="t", test_splits=["test"]), encoded=lambda *a, **k: [])
    data.setup = lambda stage: None
    no_checkpoints = lambda argv: (SimpleNamespace(task=task), data, unkept)  # noqa: E731
    with pytest.raises(
        ValueError, match=r"^--select best predicts from the best epoch's checkpoint, and these"
    ):
        finetune.fit_and_evaluate(no_checkpoints, [], "best", predict=True)

    def unreadable(split, labelled):
        raise TaskDataError("d/test.tsv: file not found")

    data.encoded, said = unreadable, []
    with pytest.raises(ValueError, match="validated nothing"):
        finetune.fit_and_evaluate(no_checkpoints, [], "best", predict=True, log=said.append)
    assert said == ["warning: no t predictions for split 'test': d/test.tsv: file not found"]
    # A training split that cannot be read stops the run first, without a warning about the test split.

    def no_training_file(stage):
        assert stage == "fit"
        raise TaskDataError("d/train.tsv: file not found")

    data.setup, said = no_training_file, []
    with pytest.raises(TaskDataError, match="train.tsv"):
        finetune.fit_and_evaluate(no_checkpoints, [], "best", predict=True, log=said.append)
    assert said == []


def test_main_key_and_finite():
    task = SimpleNamespace(
        validation_splits=["validation_matched", "validation_mismatched"], main_metric="f1"
    )
    assert finetune.main_key(task) == "validation_matched/f1"
    assert callbacks.finite(0.25) == 0.25 and callbacks.finite(0.0) == 0.0
    assert callbacks.finite(float("nan")) is None and callbacks.finite(float("-inf")) is None


def test_changed_options_name_what_differs_as_a_command_line_would():
    def config(root: str, batch: int, labels: list[str], **task) -> dict:
        card = {"class_path": "T", "init_args": {"labels": labels, **task}}
        data = {"class_path": "D", "init_args": {"batch_size": batch, "task": card}}
        return {"seed_everything": 0, "trainer": {"default_root_dir": root, "max_epochs": 3}, "data": data}

    before, now = config("a", 4, ["x", "y"], hub=None), config("b", 2, ["x", "z"])
    assert finetune.changed_options(before, now, ignored=("trainer.default_root_dir",)) == [
        "--data.batch_size=2",
        '--data.task.labels=["x", "z"]',
    ]  # (hub null, and not recorded: the same; a field a later version added reads so in earlier runs)
    moved = config("c", 4, ["x", "y"], hub=None)
    assert finetune.changed_options(before, moved) == ["--trainer.default_root_dir=c"]
    assert finetune.changed_options(now, now) == []
    named = config("a", 4, ["x", "y"], hub="h")
    assert finetune.changed_options(before, named) == ["--data.task.hub=h"]
    assert finetune.changed_options(named, before) == ["not --data.task.hub=h"]
    local = {"splits": {"train": "t.tsv"}}  # a card's nested field that gained an entry since: null
    earlier = config("a", 4, ["x", "y"], local=local)
    assert (
        finetune.changed_options(earlier, config("a", 4, ["x", "y"], local={**local, "written_by": None}))
        == []
    )
