"""Process rewards: a verdict after every step of a solution.

One sequence a solution, GPT-1's extract token after each step:

    [start] problem [delim] step_1 [extract] step_2 [extract] ... step_n [extract]

One linear layer reads every extract state: the logit that the solution is still right after that
step (a step reads only itself and what came before it, as the causal mask has it). Trained with
binary cross-entropy over the labelled steps, a solution's steps averaged, then the solutions.

A step's label is 1 (right), 0 (wrong), a soft score in between (Math-Shepherd's estimates of how
often a completion from there reaches the answer) or none. The card says how a row gives them
(`label_form`):

- `per_step`: a list, one value per step (true/false, 1/0, "+"/"-", a number in [0, 1], null; a
  row whose steps are all null is unlabelled);
- `first_error`: the index of the first wrong step, -1 for none (ProcessBench), null for an
  unlabelled row: the steps before it right, it wrong, the steps after it unlabelled;
- `error_steps`: the indices of the wrong steps, the others right (PRMBench);
- `tagged`: Math-Shepherd's rows: the steps one text, each ended by `step_tag`, and the label the
  same text with "+" or "-" in each tag's place (text after the last tag: a last step, unlabelled).

Indices count from 0, or from 1 with `one_based: true`. An index outside the solution's steps is
named with its row (with `ignore_outside`, wrong steps listed past its end are left out). Scored
at the decision threshold (a step below it is judged wrong): step accuracy, F1 of the wrong steps,
first-error accuracy, and ProcessBench's F1 (the harmonic mean of first-error accuracy over the
solutions with an error and over those without); on request, PRMBench's PRMScore (the mean of the
F1 of the wrong steps and of the right ones). During `fit`, each
validation of the first validation split chooses the threshold with the best ProcessBench F1
there, for the next validation, the test splits and the saved model (its head keeps it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor

from gpt_ft.adapters.base import Encoded, TaskAdapter, refuse_label_fields
from gpt_ft.adapters.heads import StepHead
from gpt_ft.adapters.metrics import first_below, step_metric_values
from gpt_ft.adapters.outputs import CardError, LabelSpec, TaskDataError, TaskOutput, checked_threshold
from gpt_ft.adapters.preference import reply_templates
from gpt_ft.adapters.sources import cell_list, field_text, short_repr
from gpt_ft.adapters.truncation import LONGER, fit_lengths

STEP_METRICS = ("processbench_f1", "first_error_accuracy", "step_f1", "step_accuracy")
LABEL_FORMS = ("per_step", "first_error", "error_steps", "tagged")
THRESHOLDS = torch.tensor([i / 100 for i in range(1, 100)], dtype=torch.float64)
"""The thresholds validation chooses among: 0.01 to 0.99 as written (linspace's 0.5499999999999999)."""


class StepOutput(TaskOutput):
    """A verdict per step: P(right so far) after each, scored by the step metrics."""

    kind = "steps"
    problem_type = "single_label_classification"  # a *ForTokenClassification of 2 labels at each step
    served_per_token = True
    stratified = False  # a label is a solution's verdicts (a list, or a text with its steps tagged)
    has_probabilities = False
    allowed_metrics, default_metrics = (*STEP_METRICS, "prmscore"), STEP_METRICS
    default_lm_coef = 0.0  # a reward model, as preference pairs train one

    def __init__(
        self,
        task_name: str,
        spec: LabelSpec,
        *,
        label_form: str,
        one_based: bool,
        max_steps: int,
        threshold: float,
        count_steps: Callable[[dict[str, Any]], list[str]],
        ignore_outside: bool = False,
    ) -> None:
        super().__init__(task_name, spec)
        if label_form not in LABEL_FORMS:
            raise CardError(
                f"Task {task_name!r}: label_form {label_form!r} is not one of {list(LABEL_FORMS)}."
            )
        checked_threshold(task_name, threshold)
        if max_steps < 1:
            raise CardError(f"Task {task_name!r}: max_steps must be at least 1, got {max_steps}.")
        self.label_form, self.base, self.max_steps = label_form, int(one_based), max_steps
        self.threshold, self.steps_of = threshold, count_steps
        if ignore_outside and label_form != "error_steps":
            raise CardError(f"Task {task_name!r}: ignore_outside applies to `label_form: error_steps` only.")
        self.ignore_outside = ignore_outside

    @property
    def num_outputs(self) -> int:
        return 1

    def served_labels(self) -> list[str]:
        return ["wrong", "right"]

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> StepHead:
        return StepHead(
            n_embd,
            max_steps=self.max_steps,
            threshold=self.threshold,
            dropout=dropout,
            init_std=init_std,
            bias=bias,
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        values = step_metric_values(
            predictions[:, :-1].double(), predictions[:, -1:].double(), labels.double()
        )
        return {name: values[name].float() for name in metrics}

    def choose(self, predictions: Tensor, labels: Tensor) -> dict[str, float]:
        """The threshold (of `THRESHOLDS`, the lowest on a tie) with the best ProcessBench F1 (with
        solutions all erroneous or all right, its one side: the first-error accuracy)."""
        probabilities, labels = predictions[:, :-1].double(), labels.double()
        scores = [
            float(step_metric_values(probabilities, t.expand(len(labels), 1), labels)["processbench_f1"])
            for t in THRESHOLDS
        ]
        return {"threshold": float(THRESHOLDS[max(range(len(scores)), key=scores.__getitem__)])}

    def first_error(self, prediction: Tensor) -> int:
        """The first step judged wrong, numbered as the card numbers steps; -1 for none."""
        k = int(first_below(prediction[None, :-1], prediction[-1:][None])[0])
        return k + self.base if k >= 0 else -1

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        return str(self.first_error(prediction))

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """The first step judged wrong (`label`, -1 for none) and each step's P(right so far)."""
        steps = [p for p in prediction[:-1].tolist() if not math.isnan(p)]
        return {"label": self.first_error(prediction), "scores": steps}

    def example_label(self, example: dict[str, Any]) -> list[float] | None:
        """The steps' labels, NaN for none, padded with NaN to `max_steps`; None: unlabelled."""
        return self.padded_labels(example.get(self.spec.field), len(self.steps_of(example)))

    def padded_labels(self, value: Any, n: int) -> list[float] | None:
        """The labels of a solution of `n` steps from its label field's value, padded with NaN to
        `max_steps`; None (unlabelled) for no value, or no labelled step (nothing to learn or score)."""
        if value is None or value != value:  # NaN (a float column's null) as a null
            return None
        labels = self.step_labels(value, n)
        return None if all(math.isnan(v) for v in labels) else labels + [math.nan] * (self.max_steps - n)

    def step_labels(self, value: Any, n: int) -> list[float]:
        """The labels of a solution of `n` steps from its label field's value."""
        field, form = self.spec.field, self.label_form
        if form in ("per_step", "tagged"):  # tagged: the marks `Steps` read from the text
            if not isinstance(value, (list, tuple)) or len(value) != n:
                raise TaskDataError(
                    f"field {field!r} must hold one label per step ({n}), got {short_repr(value)}."
                )
            return [_step_label(v, field) for v in value]
        if form == "first_error":
            k = self._index(value, n, allow_none=True)
            return [1.0] * n if k < 0 else [1.0] * k + [0.0] + [math.nan] * (n - k - 1)
        if not isinstance(value, (list, tuple)):
            raise TaskDataError(f"field {field!r} must hold a list of step indices, got {short_repr(value)}.")
        wrong = {self._index(v, n, outside_none=self.ignore_outside) for v in value}
        return [0.0 if i in wrong else 1.0 for i in range(n)]

    def _index(
        self, value: Any, n: int, *, allow_none: bool = False, outside_none: bool = False
    ) -> int | None:
        """A step index counted from `base` as a 0-based one; -1 (none) where `allow_none`; None for
        one past the solution where `outside_none`."""
        try:
            k = int(value)
            if isinstance(value, bool) or (isinstance(value, float) and k != value):
                raise ValueError
        except (TypeError, ValueError):
            raise TaskDataError(
                f"step index {value!r} in field {self.spec.field!r} is not an integer."
            ) from None
        if allow_none and k == -1:
            return -1
        if outside_none and k >= n + self.base:
            return None
        if not self.base <= k < n + self.base:
            numbered = f"{self.base} to {n - 1 + self.base}"
            raise TaskDataError(
                f"step index {value!r} in field {self.spec.field!r} is outside the solution's {n} steps "
                f"(numbered {numbered})."
            )
        return k - self.base


def _step_label(value: Any, field: str) -> float:
    """One step's label as a number in [0, 1], NaN for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return math.nan
    text = str(value).strip().lower()
    named = {"+": 1.0, "-": 0.0, "true": 1.0, "false": 0.0}
    if text in named:
        return named[text]
    try:
        score = float(text)
    except ValueError:
        score = math.nan
    if not 0 <= score <= 1:
        raise TaskDataError(
            f"step label {value!r} in field {field!r} is not true/false, +/- or a number in [0, 1]."
        )
    return score


class Steps(TaskAdapter):
    """A solution's steps, each followed by GPT-1's extract token, a verdict read at each (see the
    module docstring)."""

    def __init__(
        self,
        *,
        problem: str | None = "problem",
        steps: str = "steps",
        label_form: Literal["per_step", "first_error", "error_steps", "tagged"] = "per_step",
        one_based: bool = False,
        step_tag: str | None = None,
        max_steps: int = 64,
        threshold: float = 0.5,
        ignore_outside: bool = False,
        problem_end: str | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            problem: Field holding the problem the solution answers; None: the steps hold it.
            steps: Field holding the steps: a list of texts, or (with `step_tag`) one text.
            label: Field holding the labels, read as `label_form` says.
            label_form: per_step, first_error, error_steps or tagged (see the module docstring).
            one_based: Step indices in the label field count from 1 (PRMBench), not 0 (ProcessBench).
            step_tag: The text that ends each step of a one-text solution (Math-Shepherd: "ки");
                with `label_form: tagged`, the label field holds "+" or "-" in each tag's place.
            max_steps: The most steps a solution may have (a longer one is named).
            threshold: Probability below which a step is judged wrong, until validation chooses.
            ignore_outside: With `label_form: error_steps`, indices past the solution's last step
                are left out (PRMBench's own evaluation reads the solution's steps only), not refused.
            problem_end: With `problem: null`, the text that starts the first step after the problem
                it holds (Math-Shepherd: "Step 1:"): what comes before is framed as the problem.
        """
        name = kwargs.get("name")
        refuse_label_fields(
            kwargs,
            {"labels": None, "regression": False, "score_range": None},
            "a step task takes no `{field}` (a step is right or wrong; `label_form` says how rows say so).",
        )
        if (label_form == "tagged") != (step_tag is not None):
            raise CardError(f"Task {name!r}: `label_form: tagged` and `step_tag` go together.")
        if step_tag == "" or problem_end == "":
            raise CardError(
                f"Task {name!r}: {'step_tag' if step_tag == '' else 'problem_end'} must not be empty."
            )
        if problem and problem_end:
            raise CardError(
                f"Task {name!r}: problem_end splits the problem off the first step: give `problem: null`."
            )
        self.problem, self.steps, self.step_tag, self.problem_end = problem, steps, step_tag, problem_end
        self.label_form, self.one_based = label_form, one_based
        self.max_steps, self.threshold, self.ignore_outside = max_steps, threshold, ignore_outside
        super().__init__(**kwargs)

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return StepOutput(
            self.name,
            spec,
            label_form=self.label_form,
            one_based=self.one_based,
            max_steps=self.max_steps,
            threshold=self.threshold,
            count_steps=self.step_texts,
            ignore_outside=self.ignore_outside,
        )

    def text_fields(self) -> list[str]:
        return [self.problem, self.steps] if self.problem else [self.steps]

    def template(self, specials) -> tuple[str, str]:
        # a solution whose steps hold the problem trains on `[start] [delim] step_1 [extract]`
        return reply_templates(self, specials) if not self.problem else super().template(specials)

    def step_texts(self, example: dict[str, Any]) -> list[str]:
        """The solution's steps: the list, or the text cut after each `step_tag`."""
        value = example[self.steps]
        if self.step_tag is None:
            value = cell_list(value)  # (a NumPy array, a labelled table's JSON list)
            if not isinstance(value, (list, tuple)) or not value:
                kind = "at least one step" if isinstance(value, (list, tuple)) else "a list of steps"
                raise TaskDataError(f"field {self.steps!r} must hold {kind}, got {short_repr(value)}.")
            steps = [field_text(v, self.steps) for v in value]
            missing = next((i for i, (v, text) in enumerate(zip(value, steps), 1) if text == "" != v), None)
            if missing is not None:  # null or NaN: no step to judge, not an empty one
                raise TaskDataError(f"step {missing} in field {self.steps!r} has no value (null).")
        else:
            steps = _split_tagged(field_text(value, self.steps), self.step_tag, self.steps)
        if len(steps) > self.max_steps:
            raise TaskDataError(
                f"field {self.steps!r} holds {len(steps)} steps, more than the card's max_steps "
                f"{self.max_steps}."
            )
        return steps

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[problem, step_1, ..., step_n]."""
        problem = field_text(example[self.problem], self.problem) if self.problem else ""
        steps = self.step_texts(example)
        if self.problem_end and (at := steps[0].find(self.problem_end)) > 0:
            problem, steps[0] = steps[0][:at].rstrip(), steps[0][at:]
        return [problem, *steps]

    def encode(self, example, tokens, specials, max_length):
        problem, *steps = tokens
        n = len(steps)
        if n + 2 > max_length:
            raise TaskDataError(
                f"its {n} steps need {n + 2} special tokens, more than max_length {max_length}."
            )
        kept = fit_lengths([len(problem), *(len(s) for s in steps)], max_length - n - 2)
        if lost := [i for i, (step, k) in enumerate(zip(steps, kept[1:])) if k == 0 < len(step)]:
            raise TaskDataError(  # its verdict would read none of its own text
                f"at max_length {max_length} its {n} steps leave step {lost[0] + self.one_based} none of its "
                f"{len(steps[lost[0]])} tokens; {LONGER}."
            )
        ids, extract = [specials.start, *problem[: kept[0]], specials.delim], []
        for i, (step, k) in enumerate(zip(steps, kept[1:])):
            # a first step that holds the problem (no problem apart) keeps its end: the step itself
            ids += step[len(step) - k :] if i == 0 and self.problem is None and not problem else step[:k]
            extract.append(len(ids))
            ids.append(specials.extract)
        label = self._label(example, n)
        return Encoded([ids], extract, label, extract_sequence=[0] * n)

    def _label(self, example: dict[str, Any], n: int) -> list[float] | None:
        if self.label_form != "tagged" or example.get(self.label) is None:
            return self.output.padded_labels(example.get(self.label), n)
        marks = _tag_marks(
            field_text(example[self.steps], self.steps),
            field_text(example[self.label], self.label),
            self.step_tag,
        )
        if not marks:
            raise TaskDataError(
                f"field {self.label!r} does not repeat field {self.steps!r} with + or - in each "
                f"{self.step_tag!r}'s place."
            )
        return self.output.padded_labels(marks + [None] * (n - len(marks)), n)  # an untagged last step


def _split_tagged(text: str, tag: str, field: str) -> list[str]:
    """A one-text solution's steps, each up to its tag; text after the last tag (a solution whose
    last step has none) is a last step, unlabelled (blanks alone are none)."""
    pieces = text.split(tag)
    if len(pieces) < 2:
        raise TaskDataError(f"field {field!r} holds no step tag {tag!r}.")
    return pieces if pieces[-1].strip() else pieces[:-1]


def _tag_marks(text: str, labelled: str, tag: str) -> list[str]:
    """The "+" or "-" standing in `labelled` where each `tag` stands in `text` (Math-Shepherd)."""
    pieces, marks, at = text.split(tag), [], 0
    for piece in pieces[:-1]:
        at += len(piece)
        if labelled[at : at + 1] not in ("+", "-") or labelled[at - len(piece) : at] != piece:
            return []
        marks.append(labelled[at])
        at += 1
    return marks if labelled[at:] == pieces[-1] else []
