"""Several answers to one question, each judged right or wrong on its own (MultiRC).

One sequence per answer, the context read once for all of them (as multiple choice's is):

    [start] paragraph question [delim] answer_k [extract]

One linear layer reads each answer's extract state: the logit that the answer is right, trained
with binary cross-entropy averaged over a question's answers, then over the questions. An answer
is judged right where its probability reaches the card's `threshold`. Scored as SuperGLUE scores
MultiRC (Khashabi et al. 2018): `f1` over every answer of the split, the right ones the positive
class (its F1a); `exact_match`, the share of questions whose every answer is judged as labelled
(its EM); `accuracy` over the answers.

Rows come one a question (its answers a list, their verdicts a list of as many) or one an answer,
as the hub's MultiRC has them: `group_by` names the fields whose values make one question, its
answers in the order they come. `MultiRC` reads the release files' layout too: a row a passage,
its questions and their answers nested in it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from torch import Tensor

from gpt_ft.adapters.base import Encoded, refuse_label_fields
from gpt_ft.adapters.choice import MultipleChoice
from gpt_ft.adapters.heads import StepHead
from gpt_ft.adapters.outputs import CardError, LabelSpec, TaskDataError, TaskOutput, checked_threshold
from gpt_ft.adapters.sources import field_text, path_value, short_repr, unnested
from gpt_ft.errors import about

ANSWER_METRICS = ("f1", "exact_match", "accuracy")
RELEASE = "{idx, passage: {text, questions: [{question, idx, answers: [{text, idx, label}]}]}}"
"""A MultiRC release record: a passage, its questions and their answers."""
RIGHT = {"true": 1.0, "1": 1.0, "1.0": 1.0, "false": 0.0, "0": 0.0, "0.0": 0.0}
NONE = ("", "-1", "-1.0", "none", "nan")  # no verdict: null, an empty cell, the hub's -1


def answer_metric_values(probabilities: Tensor, threshold: Tensor, labels: Tensor) -> dict[str, Tensor]:
    """The answer metrics (see the module docstring) of questions' answer probabilities (N, W) judged
    at `threshold` (N, 1), against their verdicts (N, W): 1 right, 0 wrong, NaN none. An answer at
    or above the threshold is judged right; F1 with no right answer judged or labelled is 0
    (scikit-learn's `zero_division=0`, as SuperGLUE's scorer has it)."""
    labelled = ~labels.isnan()
    gold, judged = labelled & (labels >= 0.5), labelled & (probabilities >= threshold)
    agree = judged == gold
    tp, both = (judged & gold).sum().double(), (judged.sum() + gold.sum()).double()
    asked = labelled.any(dim=1)
    return {
        "f1": 2 * tp / both.clamp(min=1),
        "exact_match": (agree | ~labelled).all(dim=1)[asked].double().mean(),
        "accuracy": agree[labelled].double().mean(),
    }


class AnswerOutput(TaskOutput):
    """A verdict per answer: P(right) after each, judged at the card's threshold."""

    kind = "answers"
    problem_type = "multi_label_classification"  # served one answer at a time: σ(its logit), P(right)
    served_per_sequence = True
    stratified = False  # a label is a question's verdicts
    has_probabilities = False
    allowed_metrics, default_metrics = ANSWER_METRICS, ("f1", "exact_match")

    def __init__(
        self,
        task_name: str,
        spec: LabelSpec,
        *,
        max_answers: int,
        threshold: float,
        count_answers: Callable[[dict[str, Any]], list[str]],
    ) -> None:
        names = list(spec.names or ["False", "True"])
        if len(names) != 2:
            raise CardError(
                f"Task {task_name!r}: `labels` names a wrong answer's verdict, then a right one's "
                f"(default: [False, True]), got {names}."
            )
        super().__init__(task_name, dataclasses.replace(spec, names=names))
        checked_threshold(task_name, threshold)
        self.max_answers, self.threshold, self.answers_of = max_answers, threshold, count_answers

    @property
    def num_outputs(self) -> int:
        return 1

    def served_labels(self) -> list[str]:
        return [self.spec.names[1]]

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> StepHead:
        return StepHead(  # a logit per sequence, binary cross-entropy over the labelled ones
            n_embd,
            max_steps=self.max_answers,
            threshold=self.threshold,
            dropout=dropout,
            init_std=init_std,
            bias=bias,
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        values = answer_metric_values(
            predictions[:, :-1].double(), predictions[:, -1:].double(), labels.double()
        )
        return {name: values[name].float() for name in metrics}

    def verdicts(self, prediction: Tensor) -> list[int]:
        """Each answer's verdict (1: right) of a prediction: probabilities, then the threshold."""
        *probabilities, threshold = prediction.tolist()
        return [int(p >= threshold) for p in probabilities if not math.isnan(p)]

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        """The answers' verdicts in order, joined by commas (a row of one answer: its verdict)."""
        return ",".join(name(v) for v in self.verdicts(prediction))

    def submission_record(self, idx: Any, prediction: Tensor, name) -> dict[str, Any]:
        """The answers' verdicts, 1 right, 0 wrong; a question whose id names its paragraph and
        answers (`MultiRC`'s) as a record of its paragraph, as SuperGLUE's MultiRC.jsonl nests them
        (a passage's questions are merged into one line)."""
        verdicts = self.verdicts(prediction)
        if not (isinstance(idx, dict) and {"paragraph", "question", "answers"} <= set(idx)):
            return {"idx": idx, "label": verdicts}
        if len(verdicts) != len(idx["answers"]):  # (a NaN probability reads as no answer)
            raise ValueError(
                f"Task {self.task_name!r}: question {idx['question']} has {len(idx['answers'])} answers "
                f"and a probability for {len(verdicts)}: the others' are NaN."
            )
        answers = [{"idx": a, "label": v} for a, v in zip(idx["answers"], verdicts)]
        return {
            "idx": idx["paragraph"],
            "passage": {"questions": [{"idx": idx["question"], "answers": answers}]},
        }

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """Each answer's verdict (`label`, by the card's names) and P(right)."""
        scores = [p for p in prediction[:-1].tolist() if not math.isnan(p)]
        return {"label": [self.spec.names[v] for v in self.verdicts(prediction)], "scores": scores}

    def label_text(self, label: Any) -> Any:
        if not isinstance(label, list):
            return label
        return [None if math.isnan(v) else self.spec.names[int(v)] for v in label]

    def example_label(self, example: dict[str, Any]) -> list[float] | None:
        """The answers' verdicts (1.0 right, 0.0 wrong, NaN none), padded with NaN to `max_answers`;
        None (unlabelled) for no value or no verdict."""
        value = example.get(self.spec.field)
        if value is None or value != value:  # (NaN: a float column's null)
            return None
        value = value.tolist() if hasattr(value, "tolist") else value
        n = len(self.answers_of(example))
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise TaskDataError(
                f"field {self.spec.field!r} must hold one verdict per answer ({n}), got {short_repr(value)}."
            )
        verdicts = [self.verdict(v) for v in value]
        return None if all(map(math.isnan, verdicts)) else verdicts + [math.nan] * (self.max_answers - n)

    def verdict(self, value: Any) -> float:
        """One answer's verdict: a card's name, true/false, 1/0; NaN for none (null, -1, empty)."""
        text = str(int(value) if isinstance(value, float) and value.is_integer() else value).strip()
        if value is None or text.lower() in NONE:
            return math.nan
        if text in self.spec.names:
            return float(self.spec.names.index(text))
        if text.lower() in RIGHT:
            return RIGHT[text.lower()]
        raise TaskDataError(
            f"verdict {value!r} in field {self.spec.field!r} is none of {self.spec.names}, true/false, 1/0."
        )


class Answers(MultipleChoice):
    """A question's answers, each judged right or wrong (see the module docstring)."""

    choices_in_examples = False  # no one right answer to rank: zero-shot scoring needs a verbalizer

    def __init__(
        self,
        *,
        context: list[str],
        answers: str = "answers",
        max_answers: int = 32,
        group_by: list[str] | str | None = None,
        threshold: float = 0.5,
        **kwargs,
    ) -> None:
        """
        Args:
            context: Fields whose texts, joined by spaces, make the context (MultiRC: [paragraph,
                question]).
            answers: Field holding the question's answers (a list), or with `group_by` one answer.
            max_answers: The most answers a question may have (a question with more is named).
            group_by: Fields whose values make one question, for rows of one answer each (the hub's
                MultiRC: [idx.paragraph, idx.question]); their rows must share the context.
            threshold: Probability at or above which an answer is judged right.
            label: Field holding the verdicts: a list, one per answer, or with `group_by` the row's
                answer's. A verdict is one of `labels` (default: False, True), true/false or 1/0;
                null, -1 or empty is none.
        """
        refuse_label_fields(
            kwargs,
            {"regression": False, "score_range": None},
            "an answers task takes no `{field}`: an answer is right or wrong.",
        )
        self.group_by = [group_by] if isinstance(group_by, str) else list(group_by or [])
        self.threshold = threshold
        super().__init__(context=context, choices=answers, num_choices=max_answers, **kwargs)

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return AnswerOutput(
            self.name,
            spec,
            max_answers=self.max_choices,
            threshold=self.threshold,
            count_answers=self.answers,
        )

    def text_fields(self) -> list[str]:
        return [*super().text_fields(), *self.group_by]

    def texts(self, example: dict[str, Any]) -> list[str]:
        value = example.get(self.choices)
        if listed(value) and len(value) > self.max_choices:
            raise TaskDataError(
                f"field {self.choices!r} holds {len(value)} answers to one question, more than the card's "
                f"max_answers {self.max_choices}: raise it."
            )
        return super().texts(example)

    def answers(self, example: dict[str, Any]) -> list[str]:
        """The question's answers, as the card reads them."""
        return self.context_and_choices(example)[1]

    def regroup(self, records, where=None, alone=False) -> tuple[list[dict[str, Any]], list[int]] | None:
        """With `group_by`: one row per question, its answers and their verdicts lists in the order
        the records come, with its first record (for messages); a record `alone` is its question
        (its answers a list) or its answer."""
        if not self.group_by:
            return None
        questions = self.questions(records, where, alone)
        return [row for row, _ in questions], [members[0] for _, members in questions]

    def questions(self, records, where=None, alone=False) -> list[tuple[dict[str, Any], list[int]]]:
        """`regroup`'s questions, each with its records in order."""
        answers, label = self.choices, self.label
        if alone:
            return [
                (row if listed(row.get(answers)) else {**row, answers: [row.get(answers)]}, [i])
                for i, row in enumerate(records)
            ]
        groups: dict[tuple[str, ...], tuple[dict[str, Any], list[int]]] = {}
        for i, row in enumerate(records):
            with about(where, i, self.name):
                key = tuple(
                    field_text(field(row, f), f, "it names the row's question") for f in self.group_by
                )
                group, members = groups.setdefault(key, ({**row, answers: [], label: []}, []))
                if differs := next((f for f in self.context if row[f] != group[f]), None):
                    question = ", ".join(f"{f} {v!r}" for f, v in zip(self.group_by, key))
                    other = where(members[0]) if where else f"record {members[0]}"
                    same_file, _, place = other.rpartition(", ")  # "FILE, line 3": its line alone
                    other = place if where and where(i).startswith(f"{same_file}, ") else other
                    raise TaskDataError(
                        f"its field {differs!r} differs from that of {other}, "
                        f"an answer to the same question ({question}): `group_by` must name a question."
                    )
                group[answers].append(row[answers])
                group[label].append(verdict_text(row.get(label)))
                members.append(i)
        return list(groups.values())

    def encode(self, example, tokens, specials, max_length):
        parts, answers = tokens[: len(self.context)], tokens[len(self.context) :]
        sequences, extract = self.choice_sequences(specials, parts, answers, max_length)
        return Encoded(sequences, extract, self.output.example_label(example))

    def sequence_roles(self, encoded):  # each answer judged on its own
        return None


def verdict_text(value: Any) -> str | None:
    """A verdict as a text (true, 1 and "yes" alike in one column: a table holds one type)."""
    return None if value is None else str(value)


def listed(value: Any) -> bool:
    """Whether a field's value is a list (pandas' numpy arrays too)."""
    return isinstance(value, (list, tuple)) or hasattr(value, "tolist")


def field(row: dict[str, Any], name: str) -> Any:
    """A record's field by its name, or else by its path (`idx.question`); a KeyError names it."""
    if name in row:
        return row[name]
    value = path_value(row, name, missing=KeyError)
    if value is KeyError:
        raise KeyError(name)
    return value


class MultiRC(Answers):
    """SuperGLUE's MultiRC from the hub (aps/super_glue: a row an answer, its question `idx.question`
    of passage `idx.paragraph`) or from the release files (a row a passage: {idx, passage: {text,
    questions: [{question, idx, answers: [{text, label, idx}]}]}}), each question one example."""

    def __init__(
        self,
        *,
        context: list[str] | None = None,
        answers: str = "answer",
        group_by: list[str] | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            context: The paragraph's field and the question's (default: paragraph, question), which
                a release record's passage text and question become.
            answers: The answer's field (default: answer).
            group_by: The fields naming a row's question (default: idx.paragraph, idx.question).
            **kwargs: `Answers`'.
        """
        context = context or ["paragraph", "question"]
        if len(context) != 2:
            raise CardError(
                f"Task {kwargs.get('name')!r}: MultiRC's context is two fields, the paragraph's and the "
                f"question's; got {context}."
            )
        group_by = group_by or ["idx.paragraph", "idx.question"]
        super().__init__(context=context, answers=answers, group_by=group_by, **kwargs)

    def text_fields(self) -> list[str]:
        return []  # one layout or the other: `regroup` names a record that lacks a field

    def read_fields(self) -> list[str]:
        return []

    def regroup(self, records, where=None, alone=False) -> tuple[list[dict[str, Any]], list[int]]:
        """The release's passages as the hub's rows (as datasets' super_glue script flattened them),
        then `Answers.regroup`; a question's `idx` names its paragraph, itself and its answers
        ({paragraph, question, answers: [...]}), as SuperGLUE's submission file does."""
        rows, of, _ = unnested(records, where, self.name, self.answer_rows, RELEASE)
        named = (lambda k: where(of[k])) if where else None
        questions = self.questions(rows, where=named, alone=alone)
        for question, members in questions:
            ids = [rows[k].get("idx") for k in members]
            if all(isinstance(i, dict) for i in ids):  # each answer's {paragraph, question, answer}
                question["idx"] = {
                    "paragraph": ids[0].get("paragraph"),
                    "question": ids[0].get("question"),
                    "answers": [i.get("answer") for i in ids],
                }
        return [question for question, _ in questions], [of[members[0]] for _, members in questions]

    def answer_rows(self, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A release record's answers, a row each: the context's two fields, the answer's, the label's
        and idx ({paragraph, question, answer}), as the hub has them; None for a hub row."""
        if not isinstance(row.get("passage"), dict):
            return None
        passage, (paragraph, question) = row["passage"], self.context
        return [
            {
                paragraph: passage["text"],
                question: asked["question"],
                self.choices: given["text"],
                self.label: verdict_text(given.get("label")),
                "idx": {
                    "paragraph": row.get("idx"),
                    "question": asked.get("idx"),
                    "answer": given.get("idx"),
                },
            }
            for asked in passage["questions"]
            for given in asked["answers"]
        ]
