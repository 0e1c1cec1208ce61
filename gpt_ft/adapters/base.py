"""`TaskAdapter`: a task card read into what it says (data sources, labels, metrics, submission),
and the contract an input shape fulfils for the rest of the toolkit.

A shape says, in its own class, how an example becomes token sequences (`texts`, `encode`). What a
task predicts per example (one class, a score, one of its choices, several labels) is its output
kind (`outputs.py`, or its shape's own module), chosen once, in `TaskAdapter.__init__`; the head,
its loss and predictions, label reading, metrics and written predictions come from it. Nothing
outside the adapters branches on a shape or an output kind, and nothing here branches on a task's
name: what differs between tasks of one shape is in their card.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar

from torch import Tensor

from gpt_ft.adapters.heads import TaskHead
from gpt_ft.adapters.metrics import Scoring
from gpt_ft.adapters.names import Submission
from gpt_ft.adapters.outputs import (
    CardError,
    ClassificationOutput,
    LabelSpec,
    RegressionOutput,
    TaskDataError,
    TaskOutput,
)
from gpt_ft.adapters.sources import HubDataset, LocalFiles, Sources, field_text
from gpt_ft.adapters.tokens import token_ids
from gpt_ft.adapters.truncation import WHOLE, cut_kind, fit_lengths
from gpt_ft.errors import about

ENCODING = 12
"""The version of the path from examples to tokens: cached encodings of another one are not reused
(2: pairs cut as `tokenizers`' `longest_first` does; 3: each example's LM targets counted; 4: a
text that spells a special token is text; 5: multiple choice's earlier context fields cut first; 6:
an embedding's label row says which text each text is; 7: labels mapped under a name of their own;
8: a reward model's prompt keeps its end; 9: each example says whether it was cut; 10: sequences
of one role made alike by a cut are no loss; 11: a text of several fields read as its whole text)."""


@dataclass
class Encoded:
    """One example as the model sees it: S token sequences and where to read each one."""

    sequences: list[list[int]]
    extract_index: list[int]
    label: int | float | list | None
    extract_sequence: list[int] | None = None
    """The sequence each extract index is in, where a sequence has several (one per step); None:
    index k is sequence k's."""
    cut: int = WHOLE
    """Whether `max_length` cut the example: `truncation.WHOLE`, `CUT` or `ALIKE`."""

    def fields(self) -> dict[str, Any]:
        """The example as the collators read it (besides its label and index)."""
        out = {"input_ids": self.sequences, "extract_index": self.extract_index}
        if self.extract_sequence is not None:
            out["extract_sequence"] = self.extract_sequence
        return out


def refuse_label_fields(kwargs: dict[str, Any], fields: dict[str, Any], why: str) -> None:
    """Pops the base's label arguments a shape sets itself (`fields`: defaults); one given is a CardError."""
    for taken, default in fields.items():
        if kwargs.pop(taken, default) not in (default, []):
            raise CardError(f"Task {kwargs.get('name')!r}: {why.format(field=taken)}")


class TaskAdapter:
    """Base class: a task's card, read into its parts, and what every input transform shares.

    Subclasses name their text fields and implement `encode`; a shape whose outputs are its own
    (several labels, one of its choices) returns its output kind from `own_output`.
    """

    num_sequences: ClassVar[int] = 1
    """Sequences per example (S): 1 for single texts and pairs, 2 for similarity, C for multiple choice."""
    shares_context: ClassVar[bool] = False
    """An example's sequences start with the same `[start] context [delim]` (multiple choice), so
    the context can run once for all of them (`--data.shared_context`)."""
    null_is_empty_text: ClassVar[bool] = False
    """Each of `text_fields` is read with a null as an empty text (a table's empty cell); a JSON
    record that lacks one of them altogether is then refused, by its line, not read as a null."""
    pair_in_both_orders: ClassVar[bool] = False
    """An example is one pair read in both orders, their states added (similarity): an exported
    model builds the second order from the first itself."""
    choices_in_examples: ClassVar[bool] = False
    """Each example carries its own answer choices (multiple choice): zero-shot scoring ranks them
    by likelihood; other shapes need a verbalizer or threshold method from the suite file."""
    renders_chats: ClassVar[bool] = False
    """Chat messages are rendered through the tokenizer's chat template (preference pairs): an
    exported model's tokenizer keeps the template, which its prompts are rendered with."""
    text_groups: ClassVar[list[int]] = []
    """The sizes of the groups an example's first texts come in, each group the parts of one text
    (a context of several fields), tokenized as the whole text reads (`tokens.token_ids`)."""
    keeps_context_end: ClassVar[bool] = False
    """A context too long loses its start, not its end (a prompt keeps the turn its replies answer,
    as TRL's preference trainers keep it): an exported model's tokenizer cuts texts on the left."""

    def __init__(
        self,
        *,
        name: str,
        label: str = "label",
        labels: list[str] | None = None,
        regression: bool = False,
        score_range: tuple[float, float] | None = None,
        ignore_labels: list[str] | None = None,
        metrics: list[str] | None = None,
        main_metric: str | None = None,
        index: str | None = "idx",
        hub: HubDataset | None = None,
        local: LocalFiles | None = None,
        validation_splits: list[str] | None = None,
        test_splits: list[str] | None = None,
        submission_files: dict[str, str] | None = None,
        submission_labels: list[str] | None = None,
        strip_texts: bool = False,
    ) -> None:
        """
        Args:
            name: Task name, used in logs and file names.
            label: Field holding the label (class, score, or index of the right choice).
            labels: Class names in id order. A label value matches a name, or else is an integer id.
            regression: Predict one real number (STS-B) instead of a class.
            score_range: (low, high) of regression scores; predictions are clipped to it.
            ignore_labels: Label values that mark rows to drop (e.g. SNLI's '-': no gold label).
            metrics: Metric names among accuracy, f1, matthews, pearson, spearman.
            main_metric: The metric that picks the best checkpoint; default the first of `metrics`.
            index: Field with the example's id in test files, which names its row of a submission file
                (an integer, or a text such as a UUID); None: row numbers.
            hub: Where the dataset lives on the Hugging Face Hub.
            local: Where its files live under `--data.data_dir`, and how to read them.
            validation_splits: Splits evaluated during fit and by `validate`.
            test_splits: Splits evaluated by `test` and written by `predict`.
            submission_files: Split -> file name a leaderboard expects (e.g. test: RTE.tsv).
            submission_labels: How each class is written in submission files, in id order, when the
                leaderboard wants other names than `labels` (GLUE: '0', '1' for SST-2).
            strip_texts: Each text without the spaces around it (SST-2's train and dev texts end in one).
        """
        self.name, self.strip_texts = name, strip_texts
        spec = LabelSpec(
            field=label,
            names=list(labels) if labels is not None else None,
            regression=regression,
            score_range=tuple(score_range) if score_range is not None else None,
            ignore=[str(v) for v in ignore_labels or []],
        )
        self.output = self._output_kind(spec)
        self.scoring = Scoring.from_card(
            name,
            metrics,
            main_metric,
            allowed=self.output.allowed_metrics,
            default=self.output.default_metrics,
            kind=getattr(self.output, "kind", None),
        )
        val = ["validation"] if validation_splits is None else list(validation_splits)
        test = ["test"] if test_splits is None else list(test_splits)  # (an empty list: refused)
        self.sources = Sources(hub=hub, local=local, validation_splits=val, test_splits=test, index=index)
        self.submission = Submission.from_card(name, submission_files, submission_labels, spec.names)

    def own_output(self, spec: LabelSpec) -> TaskOutput | None:
        """The output kind this shape always has (e.g. `MultiLabelOutput`); None lets the card choose.

        Called from `TaskAdapter.__init__` once `name` is set: a subclass sets what its output
        kind needs before calling `super().__init__`.
        """
        return None

    def _output_kind(self, spec: LabelSpec) -> TaskOutput:
        """The one place a task's output kind is chosen: the shape's own, or else as the card says,
        a score (`regression: true`) or one class per example."""
        own = self.own_output(spec)
        if not spec.regression and spec.score_range is not None and not (own is not None and own.embeds):
            raise CardError(
                f"Task {self.name!r}: score_range bounds a regression's scores; set `regression: true`."
            )
        if not spec.regression:
            return own if own is not None else ClassificationOutput(self.name, spec)
        if own is not None:
            raise CardError(f"Task {self.name!r}: a {own.kind} task cannot be a regression.")
        return RegressionOutput(self.name, spec)

    # The card's fields under the card's names, as the data, training and evaluation code reads them.
    label = property(attrgetter("output.spec.field"))
    labels = property(attrgetter("output.spec.names"))
    regression = property(attrgetter("output.spec.regression"))
    score_range = property(attrgetter("output.spec.score_range"))
    ignore_labels = property(attrgetter("output.spec.ignore"))
    metrics = property(attrgetter("scoring.metrics"))
    main_metric = property(attrgetter("scoring.main_metric"))
    index = property(attrgetter("sources.index"))
    hub = property(attrgetter("sources.hub"))
    local = property(attrgetter("sources.local"))
    validation_splits = property(attrgetter("sources.validation_splits"))
    test_splits = property(attrgetter("sources.test_splits"))
    submission_files = property(attrgetter("submission.files"))
    submission_labels = property(attrgetter("submission.labels"))
    label_column = label
    """The column a file holds the labels in; None: a shape makes them of other fields (`label_source`)."""

    @property
    def label_source(self) -> str:
        """What gives an example its label, as a message names it."""
        return f"field {self.label!r}"

    # ---- where the card's fields meet the output kind (everything else: `task.output`) ----

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> TaskHead:
        """The layer that turns an example's extract states into this task's outputs (GPT-1 §3.3)."""
        # `bias` only where it is False: an output kind of a user's own may not take it.
        return self.output.head(
            n_embd, dropout=dropout, init_std=init_std, **({} if bias else {"bias": False})
        )

    def metric_values(self, predictions: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """The card's metrics over a whole split's predictions and labels."""
        return self.output.metric_values(predictions, labels, self.metrics)

    def format_prediction(self, prediction: Tensor, *, submission: bool = True) -> str:
        """One prediction as text: a score, or the class's name (as the leaderboard names it, or,
        with `submission=False`, as the card does)."""
        return self.output.format_prediction(
            prediction, self.submission_label if submission else self.output.label_name
        )

    def submission_label(self, label_id: int) -> str:
        """The class as a submission file writes it."""
        return (
            self.submission.labels[label_id] if self.submission.labels else self.output.label_name(label_id)
        )

    # ---- encoding ----

    def text_fields(self) -> list[str]:
        """Every field the adapter reads text from (checked to exist in the data)."""
        raise NotImplementedError

    def read_fields(self) -> list[str]:
        """The fields examples are read from (texts, label, ids): any of them may name a nested
        field by its path (`choices.text`), which loading makes a field of its own."""
        return [*self.text_fields(), *filter(None, [self.label_column, self.index])]

    def regroup(
        self, records: Iterable[dict[str, Any]], where=None, alone: bool = False
    ) -> tuple[list[dict[str, Any]], list[int]] | None:
        """Examples that span several records (NLI triplets: a premise's entailed and contradicted
        hypotheses): the new rows and, for each, the record that names it in messages; None (the
        default): each record is one example. `where(i)` names record i in an error; `alone`: one
        record to predict, unlabelled."""
        return None

    def orders_nothing(self, records: Iterable[dict[str, Any]], where=None) -> list[int]:
        """The labelled records with nothing to learn or score (a ranking's replies all tied), left
        out of training and evaluation; none by default."""
        return []

    def to_predict(self, record: dict[str, Any]) -> dict[str, Any]:
        """One record of a file or a caller as the example to predict (`Classifier`, `gpt-ft label`):
        as `regroup` makes a split's examples, but alone, and without its label."""
        grouped = self.regroup([record], alone=True)
        if grouped is not None:
            if len(grouped[0]) != 1:
                raise TaskDataError(f"the record makes no example for task {self.name!r} on its own.")
            record = grouped[0][0]
        return {k: v for k, v in record.items() if k != self.label}

    def texts(self, example: dict[str, Any]) -> list[str]:
        """The texts of one example to tokenize, in the order `encode` reads their tokens."""
        return [field_text(example[f], f) for f in self.text_fields()]

    def label_text(self, label: Any) -> Any:
        """An encoded label as `gpt-ft explain` shows it: its output kind's way (`TaskOutput.label_text`)."""
        return self.output.label_text(label)

    def card_texts(self, example: dict[str, Any]) -> list[str]:
        """`texts` as the card reads them (`as_read`)."""
        return self.as_read(self.texts(example))

    def as_read(self, texts: list[str]) -> list[str]:
        """Texts (a prompt before one included) as the card reads them: each without the spaces
        around it with `strip_texts`."""
        return [t.strip() for t in texts] if self.strip_texts else texts

    def encode_examples(
        self, examples: list[dict[str, Any]], tokenizer, specials, max_length: int, *, where=None
    ) -> list[Encoded]:
        """The one path from examples to tokens, taken by the data module, `Classifier` and export:
        every example's `card_texts`, tokenized without special tokens (`token_ids`), then each
        example framed and cut by `encode` (cut as the tokenizer's `longest_first` would: `fit_lengths`).

        A missing field or a bad value is a `TaskDataError` naming the example: `where(i)` (default
        "example i").
        """
        name = where or (lambda i: f"example {i}")
        texts = []
        for i, example in enumerate(examples):
            with about(name, i, self.name):
                texts.append(self.card_texts(example))
        # A text that spells a special token (`<|extract|>`, `<|endoftext|>`) is text; a chat's
        # rendering is markup (`renders_chats`: its template's tokens are meant).
        ids = token_ids(tokenizer, texts, self.text_groups, split_special_tokens=not self.renders_chats)
        encoded, start = [], 0
        for i, (example, example_texts) in enumerate(zip(examples, texts)):
            tokens, start = ids[start : start + len(example_texts)], start + len(example_texts)
            try:
                encoded.append(self.encode(example, tokens, specials, max_length))
            except TaskDataError as exc:
                raise TaskDataError(f"{name(i)}: {exc}") from None
            if (n := len(encoded[-1].sequences)) > self.num_sequences:  # (a shape of one's own)
                raise ValueError(
                    f"Task {self.name!r} ({type(self).__name__}) built {n} sequences, past its num_sequences "
                    f"({self.num_sequences}): set it, and give the output that reads them (docs/tasks.md)."
                )
            encoded[-1].cut = cut_kind(self, example, tokens, specials, max_length, encoded[-1])
        return encoded

    def sequence_roles(self, encoded: Encoded) -> list | None:
        """What each of an encoded example's sequences stands for, where several may stand for one
        thing (`truncation.cut_kind`); None: each its own."""
        return None

    def template(self, specials) -> tuple[str, str]:
        """GPT-1's input transform as a tokenizer's post-processing templates (single, pair) over
        the special tokens' names: what `frame` builds, for a tokenizer that frames texts
        itself (`gpt-ft export`). A template holds one or two texts ($A, $B): a sequence of more is
        refused (served by `Classifier`); a shape that frames two otherwise gives its own."""
        if self.num_sequences == 1 and (n := len(self.text_groups or self.text_fields())) > 2:
            raise ValueError(
                f"Task {self.name!r} ({type(self).__name__}) frames {n} texts in its sequence, and a "
                "tokenizer frames one or two: serve it with gpt_ft's Classifier or `gpt-ft label`."
            )
        start, delim, extract = specials
        return f"{start} $A {extract}", f"{start} $A {delim} $B {extract}"

    def encode(self, example: dict[str, Any], tokens: list[list[int]], specials, max_length: int) -> Encoded:
        """Build the token sequences of one example.

        Args:
            example: The raw row (fields by name), for the label.
            tokens: Token ids of each of `texts(example)`, without special tokens.
            specials: `gpt_ft.data.tokenizer.SpecialTokenIds`.
            max_length: Longest sequence allowed, special tokens included.
        """
        raise NotImplementedError

    def choice_sequences(
        self,
        specials,
        context: list[int] | list[list[int]],
        answers: list[list[int]],
        max_length: int,
    ) -> tuple[list[list[int]], list[int]]:
        """[start] context [delim] answer [extract] per answer, and each extract index; the context
        cut once for all (longest first against the longest answer), so all share its tokens. A
        context in parts (several fields) loses its earlier parts' ends first: the later kept whole;
        `keeps_context_end`: it loses its start instead."""
        parts = context if context and isinstance(context[0], list) else [context]
        lengths = [sum(map(len, parts)), max(len(a) for a in answers)]
        n_context, n_answer = fit_lengths(lengths, max_length - 3)
        kept, room = [], n_context
        for part in reversed(parts):
            cut = max(0, room)
            kept[:0] = part[max(0, len(part) - cut) :] if self.keeps_context_end else part[:cut]
            room -= len(part)
        built = [self.frame(specials, kept, answer[:n_answer]) for answer in answers]
        return [ids for ids, _ in built], [k for _, k in built]

    @staticmethod
    def frame(specials, *parts: list[int]) -> tuple[list[int], int]:
        """[start] part1 [delim] part2 ... [extract], and the extract token's index."""
        ids = [specials.start]
        for i, part in enumerate(parts):
            ids += [specials.delim, *part] if i else part
        ids.append(specials.extract)
        return ids, len(ids) - 1
