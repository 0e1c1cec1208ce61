"""Multi-label classification: [start] text [extract], one sigmoid per label (e.g. GoEmotions).

An example has any number of the card's labels, none included. The head gives one logit per
label, trained with binary cross-entropy (plus GPT-1's auxiliary LM loss, as every task); a label
is predicted when its probability passes the card's threshold. Scored by micro- and macro-averaged
F1, written as the predicted names joined by the card's separator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters.heads import TaskHead
from gpt_ft.adapters.outputs import (
    CardError,
    LabelSpec,
    TaskOutput,
    checked_threshold,
    label_of,
)
from gpt_ft.adapters.text import SingleText


class MultiLabelHead(TaskHead):
    """One logit per label; binary cross-entropy averaged over the labels; the labels whose
    probability is above `threshold`, as a 0/1 row."""

    def __init__(
        self,
        n_embd: int,
        labels: int,
        *,
        threshold: float,
        dropout: float = 0.1,
        init_std: float = 0.02,
        bias: bool = True,
    ) -> None:
        super().__init__(n_embd, labels, dropout=dropout, init_std=init_std, bias=bias)
        self.threshold = threshold

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        bce = F.binary_cross_entropy_with_logits(
            outputs.float(), labels.float(), pos_weight=self.class_weights, reduction="none"
        )
        return bce.mean(dim=-1)

    def predictions(self, outputs: Tensor) -> Tensor:
        return (self.probabilities(outputs) > self.threshold).long()

    def probabilities(self, outputs: Tensor) -> Tensor:
        return outputs.float().sigmoid()


class MultiLabelOutput(TaskOutput):
    """Any number of the card's labels per example: a 0/1 row over `labels`, read from a list or
    from names joined by `separator`, predicted above `threshold`, scored by micro and macro F1."""

    kind = "multi-label"
    problem_type = "multi_label_classification"
    allowed_metrics = default_metrics = ("micro_f1", "macro_f1")
    needs_names = True

    def __init__(self, task_name: str, spec: LabelSpec, *, separator: str, threshold: float) -> None:
        super().__init__(task_name, spec)
        if not separator:
            raise CardError(f"Task {task_name!r}: label_separator must not be empty.")
        if joined := next((name for name in spec.names or [] if separator in name), None):
            raise CardError(
                f"Task {task_name!r}: label {joined!r} holds the label_separator {separator!r}, which would "
                "split it in a file's cell and in the names predictions join: rename it, or choose another."
            )
        checked_threshold(task_name, threshold)
        self.separator, self.threshold = separator, threshold

    @property
    def num_outputs(self) -> int:
        return len(self.spec.names)

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> TaskHead:
        return MultiLabelHead(
            n_embd, self.num_outputs, threshold=self.threshold, dropout=dropout, init_std=init_std, bias=bias
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        """`micro_f1` over every label decision; `macro_f1` the mean F1 of the labels the split or
        the predictions hold, as single-label `f1` averages the classes seen (a label absent from
        both has no F1: counted as 0, a small split's missing labels sank a perfect model's). With no
        label in either, both are 0 (scikit-learn's and torchmetrics' `zero_division=0`)."""
        tp, fp, fn = decisions(predictions, labels)
        micro = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp(min=1)
        seen = (tp + fp + fn) > 0
        f1 = 2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])
        values = {"micro_f1": micro.float(), "macro_f1": (f1.mean() if seen.any() else micro).float()}
        return {name: values[name] for name in metrics}

    @property
    def class_weight_count(self) -> int | None:
        return self.num_outputs

    def balanced_weights(self, labels: Tensor) -> Tensor:
        """Each label's `pos_weight`: its negatives over its positives (1 for a label never seen)."""
        positives = labels.double().sum(dim=0)
        negatives = len(labels) - positives
        return torch.where(
            positives > 0, negatives / positives.clamp(min=1), torch.ones_like(positives)
        ).float()

    def per_class(self, predictions: Tensor, labels: Tensor) -> dict[str, dict[str, float]] | None:
        """Each label's precision, recall, F1 and support (the examples that have it)."""

        tp, fp, fn = decisions(predictions, labels)
        columns = {  # 0 where a ratio has nothing to count (`zero_division=0`)
            "precision": tp / (tp + fp).clamp(min=1),
            "recall": tp / (tp + fn).clamp(min=1),
            "f1": 2 * tp / (2 * tp + fp + fn).clamp(min=1),
            "support": labels.sum(dim=0),
        }
        return {
            name: {column: float(values[i]) for column, values in columns.items()}
            for i, name in enumerate(self.spec.names)
        }

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        return self.separator.join(name(i) for i in prediction.nonzero().flatten().tolist())

    def label_text(self, label: Any) -> Any:
        return None if label is None else [self.spec.names[i] for i, on in enumerate(label) if on]

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        return {
            "label": self.label_text(prediction.tolist()),
            "scores": dict(zip(self.spec.names, probabilities.tolist())),
        }

    def example_label(self, example: dict[str, Any]) -> list[int] | None:
        """The example's labels as a 0/1 row over `labels`; None when unlabelled (no field, -1)."""
        value = example.get(self.spec.field)
        if value is None or (value in (-1, "-1") and not self.takes_minus_one()):
            return None
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, str):
            value = [name for name in value.split(self.separator) if name.strip()]
        elif not isinstance(value, list | tuple):
            value = [value]
        row = [0] * len(self.spec.names)
        for name in value:
            row[self.label_id(name)] = 1
        return row

    def label_id(self, value: Any) -> int:
        """A label's id, as a class's (`label_of`: names that are numbers by value only)."""
        return label_of(value, self.spec.names, self.spec.field, len(self.spec.names))


class MultiLabel(SingleText):
    """[start] text [extract] with any number of labels per example, each a yes/no of its own."""

    def __init__(
        self,
        *,
        text: str | list[str] = "text",
        labels: list[str],
        label_separator: str = ",",
        threshold: float = 0.5,
        metrics: list[str] | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            text: Field holding the text, or fields whose texts, joined by a space, make it.
            labels: Label names in id order.
            label_separator: Joins label names in one text field (csv/tsv files; an empty text is no
                label) and in written predictions.
            threshold: A label is predicted when its probability is above this.
            metrics: Among micro_f1 and macro_f1 (F1 over all label decisions, or the mean of the
                labels' F1).
        """
        self.label_separator, self.threshold = label_separator, threshold  # for own_output
        super().__init__(text=text, labels=labels, metrics=metrics, **kwargs)

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return MultiLabelOutput(self.name, spec, separator=self.label_separator, threshold=self.threshold)


def decisions(predictions: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each label's true positives, false positives and false negatives (float64), of 0/1 rows."""
    predicted, gold = predictions.bool(), labels.bool()
    return tuple(
        (a & b).sum(dim=0).double() for a, b in ((predicted, gold), (predicted, ~gold), (~predicted, gold))
    )
