"""`TaskAdapter`: what every input shape shares (labels, metrics, data sources, truncation), and
the contract a shape fulfils for the rest of the toolkit.

A shape says, in its own class, how an example becomes token sequences (`texts`, `encode`), which
head turns the sequences' extract states into outputs, loss and predictions (`head`), how its
predictions are scored (`metric_values`) and written (`format_prediction`). Nothing outside the
adapters branches on a shape, and nothing here branches on a task's name: what differs between
tasks of one shape is in their card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import Tensor

from gpt_ft.adapters.heads import ClassificationHead, RegressionHead, TaskHead
from gpt_ft.adapters.metrics import METRICS, metric_value


class TaskDataError(ValueError):
    """Bad task data: one sentence naming the file, field or value at fault."""


@dataclass
class HubDataset:
    """A dataset on the Hugging Face Hub, loaded with `datasets.load_dataset(path, name)`."""

    path: str
    """Dataset id, e.g. nyu-mll/glue."""
    name: str | None = None
    """Configuration (subset) name, e.g. rte."""
    columns: dict[str, str] | None = None
    """Renames: dataset column -> the field name the adapter reads."""
    splits: dict[str, str] | None = None
    """Our split name -> the dataset's split (slices such as 'train[:90%]' allowed); default: same names."""
    configs: dict[str, str] | None = None
    """Our split name -> the configuration it comes from when not `name` (GLUE's diagnostic set: ax)."""


@dataclass
class LocalFiles:
    """A task's files under `--data.data_dir`, and how to read them."""

    splits: dict[str, str]
    """Split name -> file path relative to data_dir; a slice may follow, e.g. 'val.csv[:1497]'."""
    format: Literal["tsv", "csv", "json", "parquet"] | None = None
    """File format; by default from the extension (.tsv, .csv, .json/.jsonl, .parquet)."""
    column_names: list[str] | None = None
    """Column names of files without a header row (e.g. GLUE's CoLA train/dev)."""
    headerless_splits: list[str] | None = None
    """Splits whose files have no header row (they use column_names); default: every split if column_names."""
    columns: dict[str, str] | None = None
    """Renames: file column -> the field name the adapter reads."""


@dataclass
class Encoded:
    """One example as the model sees it: S token sequences and where to read each one."""

    sequences: list[list[int]]
    extract_index: list[int]
    label: int | float | None


def fit_lengths(lengths: list[int], budget: int) -> list[int]:
    """Shorten the longest texts first until the total fits `budget` tokens.

    Returns the new lengths, as if one token at a time were cut from the longest text, ties cutting
    the later text (as transformers' `longest_first`): [10, 3, 7] with budget 12 gives [5, 3, 4].
    """
    if budget < 0:
        raise ValueError(f"No room for text: the special tokens alone exceed the maximum length ({budget}).")
    if sum(lengths) <= budget:
        return list(lengths)
    # Find the largest cap c with sum(min(l, c)) <= budget, then hand leftover tokens to the
    # longest texts (earliest first), which is what cutting one token at a time from the longest gives.
    lo, hi = 0, max(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            lo = mid
        else:
            hi = mid - 1
    out = [min(n, lo) for n in lengths]
    spare = budget - sum(out)
    for i, n in enumerate(lengths):
        if spare and n > lo:
            out[i] += 1
            spare -= 1
    return out


def field_text(value: Any) -> str:
    """A field's text; a missing value is an empty text (encoded as just the special tokens)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


class TaskAdapter:
    """Base class: labels, metrics, data sources and truncation shared by every input transform.

    Subclasses name their text fields and implement `encode`.
    """

    num_sequences: ClassVar[int] = 1
    """Sequences per example (S): 1 for single texts and pairs, 2 for similarity, C for multiple choice."""
    allowed_metrics: ClassVar[tuple[str, ...]] = METRICS
    """Metric names a card of this shape may list."""
    needs_label_names: ClassVar[bool] = True
    """A classification card must name its classes (`labels`); multiple choice needs none."""
    shares_context: ClassVar[bool] = False
    """An example's sequences start with the same `[start] context [delim]` (multiple choice), so
    the context can run once for all of them (`--data.shared_context`)."""
    choices_in_examples: ClassVar[bool] = False
    """Each example carries its own answer choices (multiple choice): zero-shot scoring ranks them
    by likelihood; other shapes need a verbalizer or threshold method from the suite file."""

    def __init__(
        self,
        *,
        name: str,
        label: str = "label",
        labels: list[str] | None = None,
        regression: bool = False,
        score_range: tuple[float, float] | None = None,
        metrics: list[str] | None = None,
        main_metric: str | None = None,
        ignore_labels: list[str] | None = None,
        index: str | None = "idx",
        hub: HubDataset | None = None,
        local: LocalFiles | None = None,
        validation_splits: list[str] | None = None,
        test_splits: list[str] | None = None,
        submission_files: dict[str, str] | None = None,
        submission_labels: list[str] | None = None,
    ) -> None:
        """
        Args:
            name: Task name, used in logs and file names.
            label: Field holding the label (class, score, or index of the right choice).
            labels: Class names in id order. A label value matches a name, or else is an integer id.
            regression: Predict one real number (STS-B) instead of a class.
            score_range: (low, high) of regression scores; predictions are clipped to it.
            metrics: Metric names among accuracy, f1, matthews, pearson, spearman.
            main_metric: The metric that picks the best checkpoint; default the first of `metrics`.
            ignore_labels: Label values that mark rows to drop (e.g. SNLI's '-': no gold label).
            index: Field with the example's id in test files (for submission files); None: row number.
            hub: Where the dataset lives on the Hugging Face Hub.
            local: Where its files live under `--data.data_dir`, and how to read them.
            validation_splits: Splits evaluated during fit and by `validate`.
            test_splits: Splits evaluated by `test` and written by `predict`.
            submission_files: Split -> file name a leaderboard expects (e.g. test: RTE.tsv).
            submission_labels: How each class is written in submission files, in id order, when the
                leaderboard wants other names than `labels` (GLUE: '0', '1' for SST-2).
        """
        self.name = name
        self.label = label
        self.labels = list(labels) if labels is not None else None
        self.regression = regression
        self.score_range = tuple(score_range) if score_range is not None else None
        self.metrics = (
            list(metrics) if metrics else ["accuracy"] if not regression else ["pearson", "spearman"]
        )
        unknown = [m for m in self.metrics if m not in self.allowed_metrics]
        if unknown:
            raise ValueError(
                f"Task {name!r}: unknown metric(s) {unknown}; allowed: {', '.join(self.allowed_metrics)}."
            )
        self.main_metric = main_metric or self.metrics[0]
        if self.main_metric not in self.metrics:
            raise ValueError(
                f"Task {name!r}: main_metric {self.main_metric!r} is not among metrics {self.metrics}."
            )
        self.ignore_labels = [str(v) for v in ignore_labels or []]
        self.index = index
        self.hub = hub
        self.local = local
        self.validation_splits = list(validation_splits or ["validation"])
        self.test_splits = list(test_splits or ["test"])
        self.submission_files = dict(submission_files or {})
        self.submission_labels = list(submission_labels) if submission_labels is not None else None
        if self.submission_labels is not None and len(self.submission_labels) != len(self.labels or []):
            raise ValueError(
                f"Task {name!r}: submission_labels {self.submission_labels} must name each of the "
                f"{len(self.labels or [])} labels {self.labels}."
            )
        if regression and labels:
            raise ValueError(f"Task {name!r}: a regression task takes no `labels`.")
        if not regression and self.needs_label_names and not labels:
            raise ValueError(
                f"Task {name!r}: a classification task needs `labels` (class names in id order)."
            )

    # ---- the head, its metrics and its written predictions ----

    def head(self, n_embd: int, *, dropout: float, init_std: float) -> TaskHead:
        """The layer that turns an example's extract states into this task's outputs (GPT-1 §3.3)."""
        if self.regression:
            return RegressionHead(n_embd, score_range=self.score_range, dropout=dropout, init_std=init_std)
        return ClassificationHead(n_embd, len(self.labels), dropout=dropout, init_std=init_std)

    @property
    def num_labels(self) -> int:
        """Outputs of the task head: classes, 1 for regression, 1 score per choice for multiple choice."""
        return 1 if self.regression else len(self.labels)

    @property
    def class_names(self) -> list[str] | None:
        """The classes when one of them is predicted per example; None for scores and choices."""
        return None if self.regression else self.labels

    def metric_values(self, predictions: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """The card's metrics over a whole split's predictions and labels."""
        return {name: metric_value(name, predictions, labels, self.num_labels) for name in self.metrics}

    def format_prediction(self, prediction: Tensor, *, submission: bool = True) -> str:
        """One prediction as text: a score, or the class's name (as the leaderboard names it, or,
        with `submission=False`, as the card does)."""
        value = prediction.item()
        if self.regression:
            return f"{value:.3f}"
        return self.submission_label(int(value)) if submission else self.label_name(int(value))

    def label_text(self, label: Any) -> Any:
        """An encoded label as `gpt-ft explain` shows it: the class's name, or the value."""
        return self.label_name(label) if label is not None and not self.regression else label

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """One example's prediction as `Classifier.predict` returns it: the label's name and the
        probability of each label (for a score: the score, twice)."""
        if self.regression:
            value = float(prediction)
            return {"label": value, "scores": value}
        names = [self.label_name(i) for i in range(len(probabilities))]
        return {"label": self.label_name(int(prediction)), "scores": dict(zip(names, probabilities.tolist()))}

    # ---- encoding ----

    def text_fields(self) -> list[str]:
        """Every field the adapter reads text from (checked to exist in the data)."""
        raise NotImplementedError

    def required_fields(self, with_label: bool) -> list[str]:
        return self.text_fields() + ([self.label] if with_label else [])

    def texts(self, example: dict[str, Any]) -> list[str]:
        """The texts of one example to tokenize, in the order `encode` reads their tokens."""
        return [field_text(example[f]) for f in self.text_fields()]

    def encode(self, example: dict[str, Any], tokens: list[list[int]], specials, max_length: int) -> Encoded:
        """Build the token sequences of one example.

        Args:
            example: The raw row (fields by name), for the label.
            tokens: Token ids of each of `texts(example)`, without special tokens.
            specials: `gpt_ft.tokenizer.SpecialTokenIds`.
            max_length: Longest sequence allowed, special tokens included.
        """
        raise NotImplementedError

    def example_label(self, example: dict[str, Any]) -> int | float | None:
        """The example's label id or score; None when unlabelled (no field, or -1 as in hub test splits)."""
        value = example.get(self.label)
        if value is None or value == -1 or value == "-1":
            return None
        return self.label_id(value)

    def label_id(self, value: Any) -> int | float:
        """The label of a raw value: a class id, a float score, or a choice index."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise TaskDataError(f"missing value in label field {self.label!r}.")
        if self.regression:
            try:
                score = float(value)
            except (TypeError, ValueError):
                raise TaskDataError(
                    f"regression score {value!r} in field {self.label!r} is not a number."
                ) from None
            if math.isnan(score):
                raise TaskDataError(f"regression score in field {self.label!r} is NaN.")
            return score
        names = self.labels or []
        text = str(value).strip()
        if text in names:
            return names.index(text)
        try:
            as_int = int(text)
        except ValueError:
            as_int = None
        n = self.num_classes_for_labels()
        if as_int is not None and 0 <= as_int < n:
            return as_int
        allowed = names if names else list(range(n))
        raise TaskDataError(f"label {value!r} in field {self.label!r} is not among the labels {allowed}.")

    def num_classes_for_labels(self) -> int:
        return len(self.labels or [])

    def label_name(self, label_id: int) -> str:
        return self.labels[label_id] if self.labels else str(label_id)

    def submission_label(self, label_id: int) -> str:
        """The class as a submission file writes it."""
        return self.submission_labels[label_id] if self.submission_labels else self.label_name(label_id)

    @staticmethod
    def _sequence(specials, *parts: list[int]) -> tuple[list[int], int]:
        """[start] part1 [delim] part2 ... [extract], and the extract token's index."""
        ids = [specials.start]
        for i, part in enumerate(parts):
            if i:
                ids.append(specials.delim)
            ids.extend(part)
        ids.append(specials.extract)
        return ids, len(ids) - 1
