"""Benchmark metrics of single-label tasks (GLUE's conventions), from torchmetrics."""

from __future__ import annotations

from torch import Tensor
from torchmetrics.functional import (
    accuracy,
    f1_score,
    matthews_corrcoef,
    pearson_corrcoef,
    spearman_corrcoef,
)

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")


def metric_value(name: str, predictions: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """One benchmark metric; F1 and MCC are binary (positive class 1) for two classes, as GLUE reports."""
    binary = num_classes == 2
    if name == "accuracy":
        return accuracy(predictions, labels, task="multiclass", num_classes=num_classes, average="micro")
    if name == "f1":
        if binary:
            return f1_score(predictions, labels, task="binary")
        return f1_score(predictions, labels, task="multiclass", num_classes=num_classes, average="macro")
    if name == "matthews":
        if binary:
            return matthews_corrcoef(predictions, labels, task="binary")
        return matthews_corrcoef(predictions, labels, task="multiclass", num_classes=num_classes)
    if name == "pearson":
        return pearson_corrcoef(predictions.double(), labels.double())
    if name == "spearman":
        return spearman_corrcoef(predictions.double(), labels.double())
    raise ValueError(f"Unknown metric {name!r}; allowed: {', '.join(METRICS)}.")
