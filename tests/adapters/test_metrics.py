import math

import pytest
import torch

from gpt_ft.adapters import METRICS, MultipleChoice, Similarity, SingleText, metric_value
from gpt_ft.training.eval_metrics import EvalMetrics
from tests.helpers import cuda


def metric_values(task, predictions, labels):
    metrics = EvalMetrics(task)
    n = len(labels)
    zeros = torch.zeros(n)
    metrics.update(torch.arange(n), zeros, zeros + 1, zeros, torch.tensor(predictions), torch.tensor(labels))
    return {k: float(v) for k, v in metrics.compute().items()}


def ranks_by_hand(values):
    """scipy's `rankdata` (average ranks of equal values), written out."""
    values = values.tolist()
    return torch.tensor(
        [sum(v < x for v in values) + (sum(v == x for v in values) + 1) / 2 for x in values],
        dtype=torch.float64,
    )


def pearson_of(x, y):
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / ((x * x).sum() * (y * y).sum()).sqrt())


def test_metrics_on_hand_computed_cases():
    # TP=2, FP=1, TN=2, FN=0: MCC = (2*2 - 1*0) / sqrt(3*2*3*2) = 2/3; F1 = 2 / (2 + (1 + 0)/2) = 0.8.
    cls = SingleText(name="t", labels=["neg", "pos"], metrics=["matthews", "f1", "accuracy"])
    values = metric_values(cls, [1, 1, 0, 0, 1], [1, 0, 0, 0, 1])
    assert values["matthews"] == pytest.approx(2 / 3)
    assert values["f1"] == pytest.approx(0.8)
    assert values["accuracy"] == pytest.approx(0.8)
    # x = [1, 2, 3, 4], y = [2, 4, 5, 4]: Pearson 3.5 / sqrt(5 * 4.75); Spearman on ranks [1, 2.5, 4, 2.5].
    reg = Similarity(name="s", regression=True)
    values = metric_values(reg, [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 5.0, 4.0])
    assert values["pearson"] == pytest.approx(3.5 / math.sqrt(23.75), abs=1e-6)
    assert values["spearman"] == pytest.approx(3.0 / math.sqrt(22.5), rel=1e-7)  # (float32 values)
    # torchmetrics' Spearman adds 1e-6 to its denominator: a perfect ranking of 3 was 0.9999985.
    for n in (2, 3, 10):
        ranked = torch.arange(n, dtype=torch.float64)
        assert (
            metric_value("spearman", ranked, ranked, 1) == 1
            and metric_value("spearman", -ranked, ranked, 1) == -1
        )
    # Constant predictions (every score clamped to one end of the range): both undefined, as scipy's.
    constant = metric_values(reg, [5.0, 5.0, 5.0, 5.0], [2.0, 4.0, 5.0, 4.0])
    assert math.isnan(constant["pearson"]) and math.isnan(constant["spearman"])
    # One prediction for every example, computed in batches of other shapes: last bits apart, still one.
    noisy = torch.tensor([0.08418453, 0.08418453, 0.08418454, 0.08418453], dtype=torch.float32)
    for name in ("pearson", "spearman"):
        assert math.isnan(metric_value(name, noisy, torch.tensor([2.0, 4.0, 5.0, 4.0]), 1)), name
    near = torch.tensor([3.0, 3.00001, 3.00002, 3.00003])  # 1e-5 apart at 3: told apart
    assert metric_value("spearman", near, near, 1) == pytest.approx(1.0)
    # A row and its copy scored last bits apart (4.1557555 and 4.1557546: an STS-B dev file with rows
    # repeated) are one score, as scipy ranks them when equal; they were ranked apart (0.8721 here).
    # Ranks [4.5, 1, 4.5, 2, 3] and [4.5, 1, 4.5, 3, 2]: about their mean 3, products sum to 8.5 and
    # squares to 9.5 on each side: 17/19.
    copies = torch.tensor([4.1557555, 1.0, 4.1557546, 2.0, 3.0], dtype=torch.float32)
    gold = torch.tensor([4.0, 1.0, 4.0, 3.0, 2.0])
    assert metric_value("spearman", copies, gold, 1) == pytest.approx(17 / 19, rel=1e-12)
    # Values more than TIE apart never tie through others between them: 20 values 5e-7 apart (or 5
    # apart at 1e7) were one tie, NaN; in runs within TIE of their first, [0, 5e-7, 1e-6],
    # [1.5e-6, ...], ... tie by threes (and the last two), as scipy ranks them so rounded.
    threes = torch.div(torch.arange(20), 3, rounding_mode="floor").double()  # each run as one value
    for spaced, gold in (
        (torch.arange(20) * 5e-7, torch.arange(20)),
        (1e7 + 5 * torch.arange(20), (7 * torch.arange(20)) % 20),
    ):
        expected = pearson_of(ranks_by_hand(threes), ranks_by_hand(gold.double()))
        assert metric_value("spearman", spaced.double(), gold.double(), 1) == pytest.approx(
            expected, rel=1e-12
        )
    # A NaN prediction (an overflowed score), or one example: undefined too, not a made-up rank order.
    for x, y in (([math.nan, 1.0, 2.0, 3.0], [2.0, 4.0, 5.0, 1.0]), ([1.0], [2.0])):
        for name in ("pearson", "spearman"):
            assert math.isnan(metric_value(name, torch.tensor(x), torch.tensor(y), 1)), (name, x)
    mc = MultipleChoice(name="mc", context=["c"], choices=["a", "b", "c2", "d"])
    assert metric_values(mc, [0, 3, 2, 1], [0, 3, 1, 1])["accuracy"] == pytest.approx(0.75)


def test_three_classes_take_macro_f1_and_multiclass_mcc():
    predictions, labels = torch.tensor([0, 1, 2, 2, 1, 0]), torch.tensor([0, 1, 2, 1, 1, 2])
    # class 0: TP 1 FP 1 FN 0 -> 2/3; class 1: TP 2 FP 0 FN 1 -> 4/5; class 2: TP 1 FP 1 FN 1 -> 1/2.
    f1 = metric_value("f1", predictions, labels, num_classes=3)
    assert float(f1) == pytest.approx((2 / 3 + 0.8 + 0.5) / 3)
    assert float(metric_value("accuracy", predictions, labels, num_classes=3)) == pytest.approx(4 / 6)
    # Gorodkin's multiclass MCC: (c * s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2) (s^2 - sum t_k^2)),
    # c = 4 right of s = 6; predicted counts p = (2, 2, 2), true counts t = (1, 3, 2).
    expected = (4 * 6 - (2 * 1 + 2 * 3 + 2 * 2)) / math.sqrt((36 - 12) * (36 - 14))
    assert float(metric_value("matthews", predictions, labels, num_classes=3)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("predictions", "labels"),
    [
        ([1, 1, 1, 1], [1, 1, 1, 1]),
        ([0, 0, 0], [0, 0, 0]),
        ([1, 0, 1], [1, 1, 1]),
        ([1, 1, 1], [0, 0, 0]),
        ([0, 0, 0, 0], [0, 1, 0, 1]),
    ],  # fmt: skip
)
def test_matthews_is_0_where_the_labels_or_the_predictions_are_one_class(predictions, labels):
    """GLUE's scorer (scikit-learn) has 0 there; torchmetrics gave 1, 1, 0.41 and -1 to the first four."""
    for classes in (2, 3):
        value = metric_value("matthews", torch.tensor(predictions), torch.tensor(labels), num_classes=classes)
        assert float(value) == 0.0


def test_unknown_metric():
    assert METRICS == ("accuracy", "f1", "matthews", "pearson", "spearman")
    with pytest.raises(ValueError, match="Unknown metric 'bleu'; allowed: accuracy, f1, matthews"):
        metric_value("bleu", torch.tensor([1]), torch.tensor([1]), num_classes=2)


@cuda
def test_cuda_correlations_of_predictions_on_the_gpu_equal_the_cpus():
    """Validation gathers STS-B's predictions on the GPU; Spearman's ranks are found on the host and
    go back to the predictions' device (an index on the GPU into a tensor on the host fails)."""
    predictions = torch.tensor([4.1557555, 1.0, 4.1557546, 2.0, 3.0])
    gold = torch.tensor([4.0, 1.0, 4.0, 3.0, 2.0])
    for name in ("spearman", "pearson"):
        on_gpu = metric_value(name, predictions.cuda(), gold.cuda(), 1)
        assert on_gpu.device.type == "cuda" and float(on_gpu) == pytest.approx(
            float(metric_value(name, predictions, gold, 1))
        )
