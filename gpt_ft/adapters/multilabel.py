"""Multi-label classification: [start] text [extract], one sigmoid per label (e.g. GoEmotions).

An example has any number of the card's labels, none included. The head gives one logit per
label, trained with binary cross-entropy (plus GPT-1's auxiliary LM loss, as every task); a label
is predicted when its probability passes the card's threshold. Scored by micro- and macro-averaged
F1, written as the predicted names joined by the card's separator.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torchmetrics.functional import f1_score

from gpt_ft.adapters.base import TaskDataError
from gpt_ft.adapters.heads import TaskHead
from gpt_ft.adapters.text import SingleText

MULTILABEL_METRICS = ("micro_f1", "macro_f1")


class MultiLabelHead(TaskHead):
    """One logit per label; binary cross-entropy averaged over the labels; the labels whose
    probability is above `threshold`, as a 0/1 row."""

    def __init__(
        self, n_embd: int, labels: int, *, threshold: float, dropout: float = 0.1, init_std: float = 0.02
    ) -> None:
        super().__init__(n_embd, labels, dropout=dropout, init_std=init_std)
        self.threshold = threshold

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        bce = F.binary_cross_entropy_with_logits(outputs.float(), labels.float(), reduction="none")
        return bce.mean(dim=-1)

    def predictions(self, outputs: Tensor) -> Tensor:
        return (self.probabilities(outputs) > self.threshold).long()

    def probabilities(self, outputs: Tensor) -> Tensor:
        return outputs.float().sigmoid()


class MultiLabel(SingleText):
    """[start] text [extract] with any number of labels per example, each a yes/no of its own."""

    allowed_metrics = MULTILABEL_METRICS

    def __init__(
        self,
        *,
        text: str = "text",
        labels: list[str],
        label_separator: str = ",",
        threshold: float = 0.5,
        metrics: list[str] | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            text: Field holding the text.
            labels: Label names in id order.
            label_separator: Joins label names in one text field (csv/tsv files; an empty text is no
                label) and in written predictions.
            threshold: A label is predicted when its probability is above this.
            metrics: Among micro_f1 and macro_f1 (F1 over all label decisions, or the mean of the
                labels' F1).
        """
        if kwargs.get("regression"):
            raise ValueError(f"Task {kwargs.get('name')!r}: a multi-label task cannot be a regression.")
        super().__init__(text=text, labels=labels, metrics=metrics or list(MULTILABEL_METRICS), **kwargs)
        if not label_separator:
            raise ValueError(f"Task {self.name!r}: label_separator must not be empty.")
        if not 0 < threshold < 1:
            raise ValueError(f"Task {self.name!r}: threshold must be in (0, 1), got {threshold}.")
        self.label_separator, self.threshold = label_separator, threshold

    def head(self, n_embd: int, *, dropout: float, init_std: float) -> TaskHead:
        return MultiLabelHead(
            n_embd, len(self.labels), threshold=self.threshold, dropout=dropout, init_std=init_std
        )

    @property
    def class_names(self) -> list[str] | None:
        return None  # several labels per example: no single class to pick zero-shot

    def example_label(self, example: dict[str, Any]) -> list[int] | None:
        """The example's labels as a 0/1 row over `labels`; None when unlabelled (no field, -1)."""
        value = example.get(self.label)
        if value is None or value == -1 or value == "-1":
            return None
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, str):
            value = [name for name in value.split(self.label_separator) if name.strip()]
        elif not isinstance(value, list | tuple):
            value = [value]
        row = [0] * len(self.labels)
        for name in value:
            row[self.label_id(name)] = 1
        return row

    def label_id(self, value: Any) -> int:
        """A label's id: its name in `labels`, or an integer id (hub datasets store ids)."""
        text = str(value).strip()
        if text in self.labels:
            return self.labels.index(text)
        if text.isdigit() and int(text) < len(self.labels):
            return int(text)
        raise TaskDataError(f"label {text!r} in field {self.label!r} is not among the labels {self.labels}.")

    def metric_values(self, predictions: Tensor, labels: Tensor) -> dict[str, Tensor]:
        n = len(self.labels)
        return {
            name: f1_score(predictions, labels, task="multilabel", num_labels=n, average=name.split("_")[0])
            for name in self.metrics
        }

    def format_prediction(self, prediction: Tensor, *, submission: bool = True) -> str:
        name = self.submission_label if submission else self.label_name
        return self.label_separator.join(name(i) for i in prediction.nonzero().flatten().tolist())

    def label_text(self, label: Any) -> Any:
        return None if label is None else [self.labels[i] for i, on in enumerate(label) if on]

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        return {
            "label": self.label_text(prediction.tolist()),
            "scores": dict(zip(self.labels, probabilities.tolist())),
        }
