"""A query with a placeholder that each candidate fills, several of them perhaps right (ReCoRD).

One sequence per candidate, the passage read once for all of them (as multiple choice's is):

    [start] passage [delim] query, the candidate in the placeholder's place [extract]

Softmax over a row's candidates; the loss is -log of the probability its right candidates share
(an entity may be right under several spellings: "U.S." and "United States"), a candidate right
where it matches an answer exactly after normalization. Scored as ReCoRD's own evaluation scores
it (Zhang et al. 2018): the likeliest candidate's `exact_match` and token `f1` against the row's
answers, the best over them, each text normalized as SQuAD's script does (lowered; punctuation,
"a", "an" and "the" dropped; spaces made one). Each candidate's two credits are computed as the
row is read, so that scoring a split needs no text.

`ReCoRD` reads the release files' layout too: a row a passage, its entities as spans and its
queries nested in it.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any

import torch
from torch import Tensor

from gpt_ft.adapters.base import Encoded, refuse_label_fields
from gpt_ft.adapters.choice import ChoiceOutput, MultipleChoice
from gpt_ft.adapters.heads import ChoiceHead, at_least_fp32
from gpt_ft.adapters.outputs import CardError, LabelSpec, TaskDataError, TaskOutput
from gpt_ft.adapters.sources import field_text, needed_text, short_repr, unnested

CLOZE_METRICS = ("f1", "exact_match")
RELEASE = (
    "{idx, passage: {text, entities: [{start, end}]}, qas: [{query, idx, answers: [{start, end, text}]}]}"
)
"""A ReCoRD release record: a passage, its entities as spans (`end` the last character's index), its
queries."""
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = set(string.punctuation)


def normalized(text: str) -> str:
    """SQuAD's (and ReCoRD's) normalization: lowered, punctuation and articles dropped, spaces one."""
    text = "".join(c for c in text.lower() if c not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, answer: str) -> float:
    """SQuAD's token F1 of two normalized texts (0 with no token in common)."""
    predicted, gold = prediction.split(), answer.split()
    same = sum((Counter(predicted) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def credits(candidates: list[str], answers: list[str]) -> tuple[list[float], list[float]]:
    """Each candidate's exact match and token F1 against the answers, the best over them."""
    gold = [normalized(a) for a in answers]
    said = [normalized(c) for c in candidates]
    exact = [float(any(c == g for g in gold)) for c in said]
    return exact, [max(token_f1(c, g) for g in gold) for c in said]


class AnyRightHead(ChoiceHead):
    """One scalar per candidate, softmax over a row's candidates; the loss -log of the probability
    its right ones share (exact-match credit 1 in `labels`' first columns); a row with none: 0."""

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        logits = at_least_fp32(outputs)
        right = labels[:, : logits.shape[1]] > 0.5  # (NaN, past the row's candidates: not right)
        lowest = torch.finfo(logits.dtype).min  # not -inf: a row with none keeps finite gradients
        shared = logits.masked_fill(~right, lowest).logsumexp(dim=1)
        return torch.where(right.any(dim=1), logits.logsumexp(dim=1) - shared, 0.0)


class ClozeOutput(ChoiceOutput):
    """One of a row's candidates, named by the row (`names`), scored by its credits: labels are
    each candidate's exact match, then each one's token F1, NaN past the row's candidates."""

    kind = "cloze"
    allowed_metrics = default_metrics = CLOZE_METRICS
    has_probabilities = False  # several right candidates: no one class to calibrate against

    def __init__(self, task_name: str, spec: LabelSpec, *, choices: int, names: str, read) -> None:
        super().__init__(task_name, spec, choices=choices, names=names)
        self.read = read  # (an example's candidates and answers: `Cloze.candidates_and_answers`)

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> AnyRightHead:
        return AnyRightHead(n_embd, dropout=dropout, init_std=init_std, bias=bias, choices=self.choices)

    def row_names(self, example: dict[str, Any], choices: int | None = None) -> list[str] | None:
        """The row's candidates, each once (`Cloze.candidates`)."""
        return self.read(example)[0]

    def example_label(self, example: dict[str, Any]) -> list[float] | None:
        """Each candidate's exact match, then its token F1, each padded with NaN to `choices`; None
        (unlabelled) for no answer."""
        candidates, answers = self.read(example)
        if not answers:
            return None
        exact, f1 = credits(candidates, answers)
        pad = [math.nan] * (self.choices - len(candidates))
        return exact + pad + f1 + pad

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        chosen = predictions.long().view(-1, 1)
        values = {
            "exact_match": labels[:, : self.choices].double().gather(1, chosen).mean(),
            "f1": labels[:, self.choices :].double().gather(1, chosen).mean(),
        }
        return {name: values[name].float() for name in metrics}

    def picked_values(self, picked: Tensor, labels: list) -> dict[str, float]:
        """Zero-shot scoring's metrics of the candidates one rule picked: their credits."""
        return {
            k: float(v)
            for k, v in self.metric_values(picked, torch.tensor(labels), list(CLOZE_METRICS)).items()
        }

    def calibration(self, probabilities: Tensor, labels: Tensor) -> dict[str, Tensor]:
        return {}

    def per_class(self, predictions: Tensor, labels: Tensor) -> None:
        return None

    def confusion(self, predictions: Tensor, labels: Tensor) -> None:
        return None

    @property
    def class_weight_count(self) -> None:
        return None

    def label_text(self, label: Any) -> Any:
        """The right candidates' positions (exact match), as `gpt-ft explain` shows a label."""
        return (
            label
            if not isinstance(label, list)
            else [k for k, v in enumerate(label[: self.choices]) if v == 1]
        )


class Cloze(MultipleChoice):
    """A query's placeholder filled by each candidate (see the module docstring)."""

    def __init__(
        self,
        *,
        passage: str = "passage",
        query: str = "query",
        candidates: str = "entities",
        placeholder: str = "@placeholder",
        max_candidates: int = 128,
        label: str = "answers",
        **kwargs,
    ) -> None:
        """
        Args:
            passage: Field holding the passage (the context every candidate shares).
            query: Field holding the query, with the placeholder once.
            candidates: Field holding the candidates (a list of texts; one written twice is one).
            placeholder: What stands in the query where a candidate goes.
            max_candidates: The most candidates a row may have (a row with more is named).
            label: Field holding the right answers (a list of texts, or one text; none: unlabelled).
        """
        refuse_label_fields(
            kwargs,
            {"labels": None, "regression": False, "score_range": None},
            "a cloze task takes no `{field}`: its answers are texts the candidates match.",
        )
        if not placeholder:
            raise CardError(
                f"Task {kwargs.get('name')!r}: `placeholder` must be a text, e.g. '@placeholder'."
            )
        self.passage, self.query, self.placeholder = passage, query, placeholder
        super().__init__(
            context=[passage], choices=candidates, num_choices=max_candidates, label=label, **kwargs
        )

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return ClozeOutput(
            self.name, spec, choices=self.max_choices, names=self.choices, read=self.candidates_and_answers
        )

    def text_fields(self) -> list[str]:
        return [self.passage, self.query, self.choices]

    def candidates_and_answers(self, example: dict[str, Any]) -> tuple[list[str], list[str]]:
        """The row's candidates, each once in the order they first come, and its answers."""
        value = example.get(self.choices)
        value = value.tolist() if hasattr(value, "tolist") else value
        if not isinstance(value, (list, tuple)) or not value:
            raise TaskDataError(
                f"field {self.choices!r} must hold a list of candidates, got {short_repr(value)}."
            )
        if len(value) > self.max_choices and len(set(map(str, value))) > self.max_choices:
            raise TaskDataError(
                f"field {self.choices!r} holds {len(set(map(str, value)))} candidates, more than the card's "
                f"max_candidates {self.max_choices}: raise it."
            )
        candidates = list(
            dict.fromkeys(needed_text(v, self.choices, "a candidate needs a text") for v in value)
        )
        answers = example.get(self.label)
        answers = answers.tolist() if hasattr(answers, "tolist") else answers
        if answers is None or isinstance(answers, str):
            answers = [] if answers is None or not answers.strip() else [answers]
        return candidates, [field_text(a, self.label) for a in answers if field_text(a, self.label).strip()]

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[the passage, the query filled by each candidate]."""
        query = needed_text(example[self.query], self.query, "a cloze row needs its query")
        if self.placeholder not in query:
            raise TaskDataError(
                f"field {self.query!r} holds no placeholder {self.placeholder!r}: {short_repr(query)}."
            )
        candidates, _ = self.candidates_and_answers(example)
        return [self.passage_text(example), *(query.replace(self.placeholder, c) for c in candidates)]

    def passage_text(self, example: dict[str, Any]) -> str:
        """The passage as the model reads it."""
        return field_text(example[self.passage], self.passage)

    def scored_texts(self, example: dict[str, Any]) -> list[tuple[str, str]]:
        context, *choices = self.card_texts(example)
        return [(context, choice) for choice in choices]

    def encode(self, example, tokens, specials, max_length):
        sequences, extract = self.choice_sequences(specials, tokens[:1], tokens[1:], max_length)
        return Encoded(sequences, extract, self.output.example_label(example))


class ReCoRD(Cloze):
    """SuperGLUE's ReCoRD from the hub (aps/super_glue: a row a query; its passage's highlights
    after "@highlight" lines) or from the release files (a row a passage: {idx, passage: {text,
    entities: [{start, end}]}, qas: [{query, idx, answers: [{start, end, text}]}]}; each query one
    example, its candidates the passage's entities, each text once, sorted, as the hub has them).
    The passage is read as lm-evaluation-harness renders it: its text, a blank line, then each
    highlight on a line of its own ("  - highlight.")."""

    def text_fields(self) -> list[str]:
        return []  # one layout or the other: `regroup` names a record that lacks a field

    def read_fields(self) -> list[str]:
        return []

    def regroup(self, records, where=None, alone=False) -> tuple[list[dict[str, Any]], list[int]] | None:
        """The release's passages as the hub's rows, a query each (as datasets' super_glue script
        flattened them); None where every record is a row already (the hub's)."""
        rows, of, nested = unnested(records, where, self.name, self.query_rows, RELEASE)
        return (rows, of) if nested else None

    def query_rows(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A release record's queries, a row each: passage, query, entities, answers and idx; None
        for a hub row."""
        if not isinstance(passage := row.get(self.passage), dict):
            return None
        text, spans = passage["text"], [(e["start"], e["end"]) for e in passage["entities"]]
        if outside := next(((a, b) for a, b in spans if not 0 <= a <= b < len(text)), None):
            raise TaskDataError(
                f"entity span {outside[0]} to {outside[1]} lies outside its passage's {len(text)} characters."
            )
        entities = sorted({text[a : b + 1] for a, b in spans})
        return [
            {
                self.passage: text,
                self.query: qa["query"],
                self.choices: entities,
                self.label: [a["text"] for a in qa.get("answers") or []],
                "idx": {"passage": row.get("idx"), "query": qa.get("idx")},
            }
            for qa in row["qas"]
        ]

    def passage_text(self, example: dict[str, Any]) -> str:
        first, *highlights = super().passage_text(example).strip().split("\n@highlight\n")
        return first + "\n\n" + "".join(f"  - {highlight}.\n" for highlight in highlights)
