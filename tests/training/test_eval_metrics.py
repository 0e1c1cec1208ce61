import math

import pytest
import torch

from gpt_ft.adapters import SingleText
from gpt_ft.training.eval_metrics import EvalMetrics, first_occurrences


def test_eval_metrics_count_each_example_once_and_weigh_lm_loss_by_tokens():
    task = SingleText(name="t", labels=["a", "b"], metrics=["accuracy"])
    metrics = EvalMetrics(task, lm_coef=0.5)
    t = torch.tensor
    metrics.update(
        t([0, 1, 2]), t([2.0, 6.0, 1.0]), t([1, 3, 1]), t([0.5, 1.0, 1.5]), t([1, 0, 1]), t([1, 1, 1])
    )
    # A distributed sampler's repeat of example 0 (here with other values, to show it is ignored).
    metrics.update(t([3, 0]), t([3.0, 100.0]), t([1, 1]), t([2.0, 9.0]), t([0, 0]), t([0, 1]))
    values = metrics.compute()
    lm = (2 + 6 + 1 + 3) / (1 + 3 + 1 + 1)  # token-weighted over examples 0-3
    assert float(values["loss"]) == pytest.approx((0.5 + 1.0 + 1.5 + 2.0) / 4 + 0.5 * lm)
    assert float(values["accuracy"]) == pytest.approx(3 / 4)
    # the objective's two terms apart (validation/task_loss, validation/lm_loss): λ runs compared
    assert (float(values["task_loss"]), float(values["lm_loss"])) == pytest.approx(
        ((0.5 + 1 + 1.5 + 2) / 4, lm)
    )
    no_aux = EvalMetrics(task, lm_coef=0.0)
    no_aux.update(t([0]), t([0.0]), t([0]), t([0.5]), t([1]), t([1]))
    assert "task_loss" not in no_aux.compute() and "lm_loss" not in no_aux.compute()  # (loss is the task's)
    lm_only = EvalMetrics(None)
    lm_only.update(t([5, 6, 5]), t([4.0, 8.0, 4.0]), t([2, 2, 2]))
    assert float(lm_only.compute()["perplexity"]) == pytest.approx(math.exp(12 / 4))


def test_first_occurrences_keeps_the_first_of_each_index():
    index = torch.tensor([4, 2, 4, 7, 2, 2, 9])
    assert first_occurrences(index).tolist() == [True, True, False, True, False, False, True]


def test_every_rank_reads_the_log_dir_lightning_broadcasts(monkeypatch):
    """`trainer.log_dir` is a broadcast under DDP: a validate or test run reads it on every rank
    (rank 0 alone would wait for the others, which had left)."""
    from types import SimpleNamespace

    from gpt_ft.training import eval_metrics
    from gpt_ft.training.eval_metrics import Evaluation, split_key

    read = []

    class Trainer:
        state, sanity_checking, is_global_zero = SimpleNamespace(fn="validate"), False, False
        strategy = SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision)

        @property
        def log_dir(self):
            read.append(True)
            return "runs"

    task = SingleText(name="t", labels=["a", "b"], metrics=["accuracy"])
    metric = EvalMetrics(task, lm_coef=0.5)
    metric.update(*(torch.tensor(v) for v in ([0], [1.0], [1], [0.5], [1], [1])))
    module = SimpleNamespace(task=task, trainer=Trainer(), metrics={split_key("validation"): metric})
    module.log, module.head = lambda *a, **k: None, None
    module._eval_splits = lambda stage: ["validation"]
    monkeypatch.setattr(eval_metrics, "write_report", lambda *a: pytest.fail("rank 1 wrote the report"))
    Evaluation._log_metrics(module, "validation")
    assert read == [True]


def test_the_per_class_reports_examples_are_every_ranks():
    """torchmetrics gathers the ranks' states inside `compute` and then puts this rank's back: the
    report read them after, and so held rank 0's share of the split alone. Two ranks faked: the
    gather gives this rank's examples and another's (other ids)."""
    task = SingleText(name="t", labels=["a", "b"], metrics=["accuracy"])
    metric = EvalMetrics(task, lm_coef=0.5)
    t = torch.tensor
    metric.update(
        t([0, 2, 4]), t([1.0, 1.0, 1.0]), t([1, 1, 1]), t([0.5, 0.5, 0.5]), t([1, 0, 1]), t([1, 1, 0])
    )
    calls = []

    def gather(tensor, group=None):  # the states in the order they were added: `index` first
        calls.append(tensor)
        return [tensor, tensor + 1 if len(calls) == 1 else tensor]

    metric.distributed_available_fn, metric.dist_sync_fn = (lambda: True), gather
    metric.compute()
    predictions, labels = metric.examples()
    assert predictions.tolist() == [1, 0, 1, 1, 0, 1] and labels.tolist() == [1, 1, 0, 1, 1, 0]
    assert len(metric.index) == 1 and len(metric.index[0]) == 3  # this rank's state, put back
