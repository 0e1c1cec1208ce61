"""Output kinds: what a task predicts for each example, one class per kind.

An output kind owns everything that differs between one class, one score, one of several choices
and several labels per example: the head layer it builds (with its loss and predictions, see
`heads.py`), how labels are read and checked, which metrics apply and how they are computed, and
how a prediction is written. The adapter picks its output kind once, when it reads its card
(`TaskAdapter.__init__`); everything else asks the kind. Multiple choice's kind is in `choice.py`,
multi-label's in `multilabel.py`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from gpt_ft.adapters.heads import ClassificationHead, RegressionHead, TaskHead
from gpt_ft.adapters.metrics import METRICS, metric_value
from gpt_ft.adapters.sources import finite_number, score_text
from gpt_ft.errors import CardError, TaskDataError

NUMBER = re.compile(r"-?[0-9]+(\.[0-9]*)?")  # a class name that is a number: '1', '-1', '1.0'
INDEX = re.compile(r"-?[0-9]+")  # a class id as text (ASCII digits: '١' is no id)


def checked_threshold(task_name: str, threshold: float) -> float:
    """A card's probability threshold (multi-label, steps, answers), strictly between 0 and 1."""
    if not 0 < threshold < 1:
        raise CardError(f"Task {task_name!r}: threshold must be in (0, 1), got {threshold}.")
    return threshold


@dataclasses.dataclass
class LabelSpec:
    """What a card says about its labels: the field holding them, the class names, whether they are
    scores (`regression`) and in what range, and the label values whose rows are dropped."""

    field: str = "label"
    names: list[str] | None = None
    regression: bool = False
    score_range: tuple[float, float] | None = None
    ignore: list[str] = dataclasses.field(default_factory=list)


class TaskOutput:
    """One output kind: a task's head, labels, metrics and written predictions.

    Subclasses (a user's own kind included, returned from `TaskAdapter.own_output`) name their
    `kind` and say how a label value becomes the model's target (`label_id`), which head predicts
    it (`num_outputs`, `head`), and how predictions are scored (`metric_values`), written
    (`format_prediction`) and returned by `Classifier.predict` (`outcome`).
    """

    kind: ClassVar[str]
    """The kind as error messages name it, e.g. 'multi-label'."""
    allowed_metrics: ClassVar[tuple[str, ...]] = METRICS
    """Metric names a card of this kind may list."""
    default_metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    """The metrics of a card that lists none."""
    needs_names: ClassVar[bool] = False
    """A card of this kind must name its classes (`labels`): `fewest_names` of them at least."""
    fewest_names: ClassVar[int] = 1
    has_probabilities: ClassVar[bool] = True
    """Its outputs become probabilities (of classes, choices, labels), which calibration fits."""
    default_lm_coef: ClassVar[float] = 0.5
    """The auxiliary LM loss's weight λ when the run does not give one (GPT-1 §3.2: 0.5)."""
    default_dropout: ClassVar[float] = 0.1
    """Dropout before the head when the run does not give one (GPT-1 §4.1: 0.1)."""
    problem_type: ClassVar[str | None] = None
    """transformers' `problem_type` of its `*ForSequenceClassification` export; None: the kind
    exports to no sequence classifier (multiple choice: GPT-1's and GPT-2's `*DoubleHeadsModel`)."""
    served_per_sequence: ClassVar[bool] = False
    """Its export scores one sequence of an example at a time (a reward model: one reply)."""
    served_per_token: ClassVar[bool] = False
    """Its export scores tokens, each step's separator (a process reward model)."""
    embeds: ClassVar[bool] = False
    """Its outputs are vectors, one per text (`Encoder`, a sentence-transformers export)."""
    reranks: ClassVar[bool] = False
    """Its one score per (query, document) pair ranks a query's documents (a reranker's GGUF file)."""
    names_field: str | None = None
    """A field in which each example names its own outputs (ARC's `choices.label`, where the label
    is one of them); None: the card names them (`labels`), or they are numbered."""
    stratified: ClassVar[bool] = True
    """`--data.train_size` keeps each label's share; False: no classes (tagged steps), one seeded draw."""

    def __repr__(self) -> str:
        """The kind and what the card set in it, no address: the encodings' cache fingerprints it."""
        fields = {k: v for k, v in vars(self).items() if not callable(v)}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in sorted(fields.items()))})"

    def served_labels(self) -> list[str]:
        """The names an export gives its outputs (`id2label`), in order."""
        return self.class_names or self.spec.names or [self.spec.field]

    def __init__(self, task_name: str, spec: LabelSpec) -> None:
        self.task_name, self.spec = task_name, spec
        repeated = sorted({n for n in spec.names or [] if spec.names.count(n) > 1})
        if repeated:
            raise CardError(
                f"Task {task_name!r}: label name(s) {repeated} appear more than once in `labels`."
            )
        if self.needs_names and not spec.names:
            raise CardError(
                f"Task {task_name!r}: a classification task needs `labels` (class names in id order)."
            )
        if self.needs_names and len(spec.names) < self.fewest_names:
            raise CardError(f"Task {task_name!r}: `labels` {spec.names} name one class: give two or more.")

    @property
    def num_outputs(self) -> int:
        """The head's outputs: one per class or label, 1 for a score, 1 per choice (its score)."""
        raise NotImplementedError

    @property
    def class_names(self) -> list[str] | None:
        """The classes when one of them is predicted per example; None for scores, choices, label sets."""
        return None

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> TaskHead:
        """The layer that turns an example's extract states into these outputs (GPT-1 §3.3)."""
        raise NotImplementedError

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        """`metrics` over a whole split's predictions and labels."""
        raise NotImplementedError

    def picked_values(self, picked: Tensor, labels: list) -> dict[str, float]:
        """Zero-shot scoring's metrics of the choices one rule picked, (N,), against the examples'
        labels (`example_label`'s): the share that are right (a cloze: its own)."""
        return {"accuracy": sum(p == y for p, y in zip(picked.tolist(), labels)) / len(labels)}

    def choose(self, predictions: Tensor, labels: Tensor) -> dict[str, float]:
        """Decision values chosen on a validation split (steps: the threshold), each kept by the head
        as a buffer of that name; none by default."""
        return {}

    def calibration(self, probabilities: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """Metrics of how well the probabilities match the outcomes (classes: `ece`); none by default."""
        return {}

    def per_class(self, predictions: Tensor, labels: Tensor) -> dict[str, dict[str, float]] | None:
        """Precision, recall, F1 and support of each class or label, by name; None where a task has
        no classes (a score, choices)."""
        return None

    def confusion(self, predictions: Tensor, labels: Tensor) -> Tensor | None:
        """The confusion matrix (true class x predicted class), or None."""
        return None

    @property
    def class_weight_count(self) -> int | None:
        """How many class weights the loss takes (classes, labels); None: it takes none."""
        return None

    def balanced_weights(self, labels: Tensor) -> Tensor:
        """Loss weights that give every class the same total weight, from the training labels."""
        raise ValueError(
            f"Task {self.task_name!r}: class weights apply to classification and multi-label tasks."
        )

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        """One prediction as text; `name` writes a class id."""
        raise NotImplementedError

    def submission_record(self, idx: Any, prediction: Tensor, name: Callable[[int], str]) -> dict[str, Any]:
        """One example's line of a JSON-lines submission file (SuperGLUE's): its id and its label
        as `format_prediction` writes it."""
        return {"idx": idx, "label": self.format_prediction(prediction, name)}

    def label_text(self, label: Any) -> Any:
        """An encoded label as `gpt-ft explain` shows it; NaN None (JSON has no NaN): a reply or step
        without a label, or the padding after the example's own (which explain cuts off)."""
        if isinstance(label, list):
            label = [None if isinstance(v, float) and math.isnan(v) else v for v in label]
        return label

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """One example's prediction as `Classifier.predict` returns it."""
        raise NotImplementedError

    def row_outcome(
        self, prediction: Tensor, probabilities: Tensor, sequences: int, names: list[str] | None = None
    ) -> dict[str, Any]:
        """`outcome` of a row of `sequences` sequences, out of a batch's (`Classifier`); `names`:
        the names the row gives its own choices (`row_names`)."""
        return self.outcome(prediction, probabilities)

    def row_names(self, example: dict[str, Any], choices: int | None = None) -> list[str] | None:
        """The names the example gives its own outputs, in order (`names_field`: its choices'); None
        where the card names them. With `choices`, how many the row has: as many names, each once."""
        if self.names_field is None:
            return None
        field, value = self.names_field, example.get(self.names_field)
        value = value.tolist() if hasattr(value, "tolist") else value  # pandas' numpy arrays
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (str, int)) for v in value):
            raise TaskDataError(f"field {field!r} must hold a list of the choices' names, got {value}.")
        names = [str(v).strip() for v in value]
        if choices is not None and len(names) != choices:
            raise TaskDataError(
                f"field {field!r} names {len(names)} choices {names}, but the row has {choices}."
            )
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise TaskDataError(f"field {field!r} names two choices {repeated[0]!r}: {names}.")
        return names

    def example_label(self, example: dict[str, Any]) -> Any:
        """The example's label; None when unlabelled (no field, a null or NaN, an empty cell, or -1 as
        in hub test splits, where the card has no class or score -1 of its own)."""
        value = example.get(self.spec.field)
        return None if self.unlabelled(value) else self.label_id(value)

    def unlabelled(self, value: Any) -> bool:
        """Whether a label field's value marks an unlabelled example (`example_label`)."""
        if value is None or value != value or (isinstance(value, str) and not value.strip()):  # NaN != NaN
            return True
        return value in (-1, "-1") and not self.takes_minus_one()

    def takes_minus_one(self) -> bool:
        """Whether -1 is one of the card's labels: a class named "-1", or a score in the card's
        `score_range` (without one, -1 stays the hub's mark of an unlabelled row)."""
        low, high = self.spec.score_range or (0.0, -1.0)
        return "-1" in (self.spec.names or []) or (self.spec.regression and low <= -1 <= high)

    def label_id(self, value: Any) -> Any:
        """The model's target for one raw label value."""
        raise NotImplementedError

    def label_name(self, label_id: int) -> str:
        return self.spec.names[label_id] if self.spec.names else str(label_id)

    def _missing(self, value: Any) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise TaskDataError(f"missing value in label field {self.spec.field!r}.")


class ClassificationOutput(TaskOutput):
    """One class per example: a logit per class, cross-entropy, the likeliest class."""

    kind = "classification"
    problem_type = "single_label_classification"
    needs_names, fewest_names = True, 2  # (one class is never wrong)
    allowed_metrics = ("accuracy", "f1", "matthews")  # scores of classes; correlations are a regression's

    @property
    def num_outputs(self) -> int:
        return len(self.spec.names)

    @property
    def num_classes(self) -> int:
        """Classes a prediction is among, for the metrics."""
        return len(self.spec.names)

    @property
    def class_names(self) -> list[str] | None:
        return self.spec.names

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> TaskHead:
        return ClassificationHead(n_embd, self.num_outputs, dropout=dropout, init_std=init_std, bias=bias)

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        return {name: metric_value(name, predictions, labels, self.num_classes) for name in metrics}

    def calibration(self, probabilities: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """Expected calibration error: |accuracy - confidence| over 15 equal-width bins of
        confidence, (k/15, (k+1)/15], weighted by each bin's share of examples (Guo et al. 2017;
        torchmetrics' bins are [lo, hi) and give a confidence of exactly 1, common in float32, a
        16th bin of its own, which can only raise the error)."""
        confidence, predicted = probabilities.float().max(dim=-1)
        edges = torch.linspace(0, 1, 16, device=confidence.device)
        bins = (torch.bucketize(confidence, edges) - 1).clamp(0, 14)  # edges[b] < c <= edges[b + 1]; NaN: NaN
        gaps = (predicted == labels).float() - confidence  # summed within a bin, then |.|
        ece = torch.zeros(15, device=gaps.device).index_add_(0, bins, gaps).abs().sum() / max(len(gaps), 1)
        return {"ece": ece}

    def per_class(self, predictions: Tensor, labels: Tensor) -> dict[str, dict[str, float]] | None:
        if self.class_names is None:
            return None
        from torchmetrics.functional.classification import (
            multiclass_f1_score,
            multiclass_precision,
            multiclass_recall,
        )

        n = self.num_classes
        kwargs = dict(num_classes=n, average=None, zero_division=0)
        columns = {
            "precision": multiclass_precision(predictions, labels, **kwargs),
            "recall": multiclass_recall(predictions, labels, **kwargs),
            "f1": multiclass_f1_score(predictions, labels, **kwargs),
            "support": labels.bincount(minlength=n),
        }
        return {
            name: {column: float(values[i]) for column, values in columns.items()}
            for i, name in enumerate(self.class_names)
        }

    @property
    def class_weight_count(self) -> int | None:
        return self.num_classes if self.class_names is not None else None

    def balanced_weights(self, labels: Tensor) -> Tensor:
        """n / (classes x n_k) for class k (scikit-learn's "balanced"); a class with no example: 0."""
        if self.class_names is None:
            return super().balanced_weights(labels)
        counts = labels.bincount(minlength=self.num_classes).double()
        weights = len(labels) / (self.num_classes * counts)
        return torch.where(counts > 0, weights, torch.zeros_like(weights)).float()

    def confusion(self, predictions: Tensor, labels: Tensor) -> Tensor | None:
        if self.class_names is None:
            return None
        from torchmetrics.functional.classification import multiclass_confusion_matrix

        return multiclass_confusion_matrix(predictions, labels, num_classes=self.num_classes)

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        return name(int(prediction.item()))

    def label_text(self, label: Any) -> Any:
        return None if label is None else self.label_name(label)

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        names = [self.label_name(i) for i in range(len(probabilities))]
        return {"label": self.label_name(int(prediction)), "scores": dict(zip(names, probabilities.tolist()))}

    def label_id(self, value: Any) -> int:
        self._missing(value)
        return label_of(value, self.spec.names or [], self.spec.field, self.num_classes)


def label_of(value: Any, names: list[str], field: str, count: int) -> int:
    """A class id: the value is a name in `names` (names that are numbers, Story Cloze's '1' and
    '2', by value: 1.0 is '1'; then a name only, as 0 could be either), or else an integer id
    below `count` (hub datasets store ids). A name is found in either Unicode form (NFC, NFD)."""
    text = str(value).strip()
    numbers = {float(name): i for i, name in enumerate(names) if NUMBER.fullmatch(name)}
    if text in names or (numbers and NUMBER.fullmatch(text) and float(text) in numbers):
        return names.index(text) if text in names else numbers[float(text)]
    composed = [unicodedata.normalize("NFC", name) for name in names]  # 'négatif' saved as e + U+0301
    if not text.isascii() and (nfc := unicodedata.normalize("NFC", text)) in composed:
        return composed.index(nfc)
    n = len(names) or count
    if isinstance(value, float) and value.is_integer():  # a JSON column read as floats: 1.0
        text = str(int(value))
    if INDEX.fullmatch(text) and 0 <= int(text) < n and not numbers:
        return int(text)
    allowed = names if names else list(range(n))
    why = " (the labels are numbers: a value is a label, never an index)" if numbers else ""
    raise TaskDataError(f"label {value!r} in field {field!r} is not among the labels {allowed}{why}.")


class RegressionOutput(TaskOutput):
    """One real number per example (STS-B): squared error, the score clipped to the card's range."""

    kind = "regression"
    problem_type = "regression"
    has_probabilities = False
    allowed_metrics = default_metrics = ("pearson", "spearman")

    def __init__(self, task_name: str, spec: LabelSpec) -> None:
        super().__init__(task_name, spec)
        if spec.names:
            raise CardError(f"Task {task_name!r}: a regression task takes no `labels`.")
        if spec.score_range is not None and not spec.score_range[0] < spec.score_range[1]:
            raise CardError(
                f"Task {task_name!r}: score_range {list(spec.score_range)} must be [low, high], low < high."
            )

    @property
    def num_outputs(self) -> int:
        return 1

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> TaskHead:
        return RegressionHead(
            n_embd, score_range=self.spec.score_range, dropout=dropout, init_std=init_std, bias=bias
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        return {name: metric_value(name, predictions, labels, 1) for name in metrics}

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        return score_text(prediction.item())

    def submission_record(self, idx: Any, prediction: Tensor, name: Callable[[int], str]) -> dict[str, Any]:
        return {"idx": idx, "label": float(self.format_prediction(prediction, name))}  # the score, a number

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        value = float(prediction)
        return {"label": value, "scores": value}  # a score: the score, twice

    def label_id(self, value: Any) -> float:
        """A score: the value as a number."""
        self._missing(value)
        return finite_number(value, "regression score", self.spec.field, self.spec.score_range)
