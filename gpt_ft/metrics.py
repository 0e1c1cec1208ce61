"""A task card's benchmark metrics as torchmetrics (GLUE: MCC for CoLA, F1 for MRPC/QQP, ...)."""

from __future__ import annotations

from torch import Tensor, nn
from torchmetrics import Accuracy, F1Score, MatthewsCorrCoef, Metric, PearsonCorrCoef, SpearmanCorrCoef

from gpt_ft.adapters import TaskAdapter


def make_metric(name: str, num_classes: int) -> Metric:
    """One metric by name; F1 and MCC are binary (positive class 1) for two classes, as GLUE reports them."""
    binary = num_classes == 2
    if name == "accuracy":
        return Accuracy(task="multiclass", num_classes=num_classes)
    if name == "f1":
        return (
            F1Score(task="binary")
            if binary
            else F1Score(task="multiclass", num_classes=num_classes, average="macro")
        )
    if name == "matthews":
        return (
            MatthewsCorrCoef(task="binary")
            if binary
            else MatthewsCorrCoef(task="multiclass", num_classes=num_classes)
        )
    if name == "pearson":
        return PearsonCorrCoef()
    if name == "spearman":
        return SpearmanCorrCoef()
    raise ValueError(f"Unknown metric {name!r}; allowed: accuracy, f1, matthews, pearson, spearman.")


class TaskMetrics(nn.ModuleDict):
    """The task's metrics, updated together with predictions (class ids, choice indices or scores)."""

    def __init__(self, task: TaskAdapter) -> None:
        classes = task.num_sequences if task.head_kind == "multiple_choice" else task.num_labels
        super().__init__({name: make_metric(name, classes) for name in task.metrics})

    def observe(self, predictions: Tensor, labels: Tensor) -> None:
        """Update every metric with a batch of predictions and labels."""
        for metric in self.values():
            metric.update(predictions, labels)

    def compute_all(self) -> dict[str, float]:
        return {name: float(metric.compute()) for name, metric in self.items()}
