"""Task adapters: a labelled example in, GPT-1's delimited token sequences out (paper §3.3).

One concrete class per input transform:

- `SingleText`:     [start] text [extract]                               (CoLA, SST-2)
- `TextPair`:       [start] premise [delim] hypothesis [extract]         (MNLI, QNLI, RTE, SNLI, ...)
- `Similarity`:     both orders [start] a [delim] b [extract], summed    (MRPC, STS-B, QQP)
- `MultipleChoice`: [start] context [delim] answer_k [extract] per k     (Story Cloze, RACE, SWAG)

A task card (tasks/*.yaml) is a `class_path` + `init_args` value for a `TaskAdapter`-typed
argument, so a user's own adapter class works with nothing registered. Nothing here branches on
a task's name: what differs between tasks is in the card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

HeadKind = Literal["classification", "regression", "multiple_choice"]
METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")


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


def _text(value: Any) -> str:
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
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"Task {name!r}: unknown metric(s) {unknown}; allowed: {', '.join(METRICS)}.")
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
        if not regression and self.head_kind == "classification" and not labels:
            raise ValueError(
                f"Task {name!r}: a classification task needs `labels` (class names in id order)."
            )

    # ---- what the model needs to know (linked in cli.py) ----

    @property
    def head_kind(self) -> HeadKind:
        return "regression" if self.regression else "classification"

    @property
    def num_labels(self) -> int:
        """Outputs of the task head: classes, 1 for regression, 1 score per choice for multiple choice."""
        return len(self.labels) if self.head_kind == "classification" else 1

    # ---- encoding ----

    def text_fields(self) -> list[str]:
        """Every field the adapter reads text from (checked to exist in the data)."""
        raise NotImplementedError

    def required_fields(self, with_label: bool) -> list[str]:
        return self.text_fields() + ([self.label] if with_label else [])

    def texts(self, example: dict[str, Any]) -> list[str]:
        """The texts of one example to tokenize, in the order `encode` reads their tokens."""
        return [_text(example[f]) for f in self.text_fields()]

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


class SingleText(TaskAdapter):
    """[start] text [extract] (GPT-1 §3.3, classification)."""

    def __init__(self, *, text: str = "sentence", **kwargs) -> None:
        """
        Args:
            text: Field holding the text.
        """
        super().__init__(**kwargs)
        self.text = text

    def text_fields(self) -> list[str]:
        return [self.text]

    def encode(self, example, tokens, specials, max_length):
        (text,) = tokens
        (n,) = fit_lengths([len(text)], max_length - 2)
        ids, extract = self._sequence(specials, text[:n])
        return Encoded([ids], [extract], self.example_label(example))


class TextPair(TaskAdapter):
    """[start] premise [delim] hypothesis [extract] (GPT-1 §3.3, textual entailment)."""

    def __init__(self, *, premise: str = "premise", hypothesis: str = "hypothesis", **kwargs) -> None:
        """
        Args:
            premise: Field holding the first text.
            hypothesis: Field holding the second text.
        """
        super().__init__(**kwargs)
        self.premise, self.hypothesis = premise, hypothesis

    def text_fields(self) -> list[str]:
        return [self.premise, self.hypothesis]

    def encode(self, example, tokens, specials, max_length):
        a, b = tokens
        na, nb = fit_lengths([len(a), len(b)], max_length - 3)
        ids, extract = self._sequence(specials, a[:na], b[:nb])
        return Encoded([ids], [extract], self.example_label(example))


class Similarity(TextPair):
    """Both orders, [start] a [delim] b [extract] and [start] b [delim] a [extract] (GPT-1 §3.3).

    The model adds the two extract representations element-wise before the head, since a
    similarity has no inherent order.
    """

    num_sequences = 2

    def __init__(self, *, first: str = "sentence1", second: str = "sentence2", **kwargs) -> None:
        """
        Args:
            first: Field holding one text.
            second: Field holding the other.
        """
        super().__init__(premise=first, hypothesis=second, **kwargs)

    def encode(self, example, tokens, specials, max_length):
        a, b = tokens
        na, nb = fit_lengths([len(a), len(b)], max_length - 3)
        ab, extract_ab = self._sequence(specials, a[:na], b[:nb])
        ba, extract_ba = self._sequence(specials, b[:nb], a[:na])
        return Encoded([ab, ba], [extract_ab, extract_ba], self.example_label(example))


class MultipleChoice(TaskAdapter):
    """One sequence [start] context [delim] answer_k [extract] per choice; softmax over choices (GPT-1 §3.3).

    Rows may have different numbers of choices (a list field): the batch carries a choice mask.
    The context is cut the same way for every choice, so all choices share it token for token.
    """

    def __init__(
        self,
        *,
        context: list[str],
        choices: list[str] | str,
        num_choices: int | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            context: Fields whose texts, joined by spaces, make the context (e.g. [article, question]).
            choices: One field per choice, or one field holding a list of choices.
            num_choices: The most choices a row has (required when `choices` is a list field).
            label: Field with the right choice: its index, or a name in `labels` (e.g. '1', '2').
        """
        super().__init__(**kwargs)
        self.context = [context] if isinstance(context, str) else list(context)
        self.choices = choices
        if isinstance(choices, str):
            if not num_choices:
                raise ValueError(
                    f"Task {self.name!r}: `num_choices` is required when `choices` is a list field."
                )
            self.max_choices = num_choices
        else:
            self.max_choices = len(choices)
            if num_choices not in (None, len(choices)):
                raise ValueError(
                    f"Task {self.name!r}: num_choices={num_choices} but {len(choices)} choice fields."
                )

    @property
    def num_sequences(self) -> int:  # type: ignore[override]
        return self.max_choices

    @property
    def head_kind(self) -> HeadKind:
        return "multiple_choice"

    def num_classes_for_labels(self) -> int:
        return len(self.labels) if self.labels else self.max_choices

    def text_fields(self) -> list[str]:
        return self.context + ([self.choices] if isinstance(self.choices, str) else list(self.choices))

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[context, choice_1, ..., choice_k]: the context fields joined by spaces, then each choice."""
        context = " ".join(t for t in (_text(example[f]) for f in self.context) if t)
        if isinstance(self.choices, str):
            choices = example[self.choices]
            if not isinstance(choices, (list, tuple)) or not 1 <= len(choices) <= self.max_choices:
                raise TaskDataError(
                    f"field {self.choices!r} must hold a list of 1 to {self.max_choices} choices, "
                    f"got {choices!r}."
                )
        else:
            choices = [example[c] for c in self.choices]
        return [context, *(_text(c) for c in choices)]

    def encode(self, example, tokens, specials, max_length):
        context, *answers = tokens
        # Cut the context once for all choices (longest first against the longest answer), so
        # every choice sees the same context tokens.
        n_context, n_answer = fit_lengths([len(context), max(len(a) for a in answers)], max_length - 3)
        sequences, extract = [], []
        for answer in answers:
            ids, k = self._sequence(specials, context[:n_context], answer[:n_answer])
            sequences.append(ids)
            extract.append(k)
        label = self.example_label(example)
        if label is not None and label >= len(answers):
            value = example.get(self.label)
            raise TaskDataError(f"label {value!r} points past the row's {len(answers)} choices.")
        return Encoded(sequences, extract, label)
