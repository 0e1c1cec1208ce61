"""Zero-shot evaluation: a pretrained language model scores a task without fine-tuning.

- Multiple choice: the choice with the highest log-likelihood given the context, summed
  (`accuracy`) or divided by the choice's length in characters (`accuracy_norm`): the `acc` and
  `acc_norm` of lm-evaluation-harness.
- Fill-in (WinoGrande): the option after which the rest of the sentence is likeliest.
- Cloze (ReCoRD): the likeliest query, each candidate in its placeholder, after the passage, scored
  by the task's own metrics of the candidate chosen (`f1`, `exact_match`; `_norm`, `_token`).
- GPT-1's heuristics (§5, "Zero-shot behaviors"), for single-text classification:
  - verbalizers: append a suffix (SST-2: " very"), or write the fields into a template (BoolQ),
    and pick the label whose word (" negative", " positive") is likelier next;
  - threshold: score a text by its average token log-probability and call it the second label
    ("acceptable" for CoLA) above a threshold, chosen on training examples to maximise the
    task's main metric.

The model reads plain text, as in pretraining: no start/delim/extract tokens; a text begins after
the tokenizer's beginning-of-text token where it starts texts with one (Llama, Gemma). Otherwise a
context (a multiple-choice example's, the text before verbalizers) is read as it is, and only an
empty one after the beginning-of-text token, or else the end-of-text token (lm-evaluation-harness's
rule); a text scored whole (the threshold) begins after that token too, as the harness's rolling
log-likelihood reads it, so that its first token is predicted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpt_ft.adapters import TaskAdapter, TaskDataError, metric_value
from gpt_ft.adapters.sources import nested_fields
from gpt_ft.adapters.tokens import unjoined, wholes
from gpt_ft.data.pieces import text_start
from gpt_ft.eval.likelihood import continuation_logprobs, scored_tokens
from gpt_ft.model import GPT


@dataclass
class ZeroShot:
    """How a suite scores a non-multiple-choice task zero-shot (multiple choice needs nothing)."""

    verbalizers: list[str] | None = None
    """One continuation per label, in label order, e.g. [" negative", " positive"]."""
    suffix: str = ""
    """Text appended to the example before the verbalizers, e.g. " very"."""
    template: str | None = None
    """The example's text before the verbalizers, `{field}` standing for a text field's text
    (BoolQ: "{passage}\\nQuestion: {question}?\\nAnswer:", as lm-evaluation-harness asks it); or a
    Jinja template over the example's fields, as the harness's `doc_to_text` (WiC's word as sentence
    1 spells it: `{{sentence1[start1:end1]}}`), a text field's text as the card reads it; default:
    the texts joined by spaces."""
    threshold: bool = False
    """Score by average token log-probability; above a threshold is the second label."""
    calibration_split: str = "train"
    """Split whose examples choose the threshold."""
    calibration_examples: int | None = 2000
    """How many of them (the first ones); None: all."""

    def __post_init__(self) -> None:
        if bool(self.verbalizers) == self.threshold:
            raise ValueError(
                "zero_shot: give either `verbalizers` or `threshold: true`, not both or neither."
            )
        if "" in (self.verbalizers or []):
            raise ValueError("zero_shot: a verbalizer is empty: each is a continuation to score.")
        if self.template is not None and self.threshold:
            raise ValueError(
                "zero_shot: a template goes with verbalizers; a threshold scores the text as it is."
            )
        n = self.calibration_examples  # None: every row of the split
        if self.threshold and n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(
                f"zero_shot: calibration_examples must be at least 1, got {self.calibration_examples!r}."
            )

    def text(self, task: TaskAdapter, row: dict[str, Any]) -> str:
        """The example's text as the verbalizers follow it (`template`), the suffix not yet added."""
        texts = task.card_texts(row)  # (a text of several fields: their parts)
        if self.template is None:
            return " ".join(wholes(texts, task.text_groups)).strip()
        named = dict(zip(task.text_fields(), unjoined(texts, task.text_groups)))
        if not JINJA.search(self.template):
            return FIELD.sub(lambda m: named[m[1]], self.template)
        from jinja2 import TemplateError

        template, names = jinja_template(self.template)
        fields = nested_fields({**row, **named})
        if lacks := sorted(n for n in names if n not in fields):
            raise TaskDataError(
                f"the zero_shot template names {lacks[0]!r}, which the example lacks (its fields: "
                f"{', '.join(map(repr, fields))})."
            )
        try:
            return template.render(fields)
        except (TemplateError, TypeError, ValueError, LookupError) as exc:  # a slice of a text, ...
            raise TaskDataError(f"the zero_shot template cannot be filled in: {exc}.") from None


FIELD = re.compile(r"\{([^{}]+)\}")
"""A template's `{field}`."""
JINJA = re.compile(r"\{\{|\{%")
"""What makes a template Jinja's: `{{ expression }}`, `{% statement %}`."""


@functools.lru_cache(maxsize=16)
def jinja_template(source: str):
    """A Jinja template as lm-evaluation-harness compiles its prompts (a field it lacks is an error,
    a trailing newline kept, its `regex_replace` filter), in Jinja's sandbox (a suite file's template
    runs no other code), and the fields it names."""
    from jinja2 import StrictUndefined, meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
    environment.filters["regex_replace"] = lambda text, pattern, repl, count=0: re.sub(
        pattern, repl, text, count
    )
    return environment.from_string(source), meta.find_undeclared_variables(environment.parse(source))


def check_method(task: TaskAdapter, spec: ZeroShot, where: str = "") -> None:
    """A `zero_shot` entry against its task's card, before any work; `where`: the suite file."""
    about = f"{where}: " * bool(where) + f"zero_shot of task {task.name!r}"
    names = task.output.class_names
    if task.choices_in_examples:
        raise ValueError(f"{about}: multiple choice is scored on its own choices; leave the entry out.")
    if not names:
        raise ValueError(f"{about}: verbalizers and thresholds need class labels.")
    if spec.verbalizers and len(spec.verbalizers) != len(names):
        raise ValueError(
            f"{about}: {len(spec.verbalizers)} verbalizers given for {len(names)} labels {names}."
        )
    if spec.threshold and len(names) != 2:
        raise ValueError(f"{about}: a threshold needs 2 labels, not {len(names)}.")
    if spec.template and JINJA.search(spec.template):
        from jinja2 import TemplateSyntaxError

        try:
            jinja_template(spec.template)
        except TemplateSyntaxError as exc:
            raise ValueError(
                f"{about}: the template is not Jinja's ({exc.message}, line {exc.lineno})."
            ) from None
    elif unknown := [f for f in FIELD.findall(spec.template or "") if f not in task.text_fields()]:
        raise ValueError(
            f"{about}: the template names {unknown[0]!r}, not a text field of the card: "
            f"{', '.join(map(repr, task.text_fields()))}."
        )


class ZeroShotScorer:
    """Scores a task's examples with a language model and its tokenizer."""

    def __init__(self, gpt: GPT, tokenizer, *, batch_size: int = 16, progress=iter) -> None:
        self.gpt = gpt.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.progress = progress
        eos = tokenizer.eos_token_id if tokenizer.eos_token is not None else None
        bos = tokenizer.bos_token_id if tokenizer.bos_token is not None else None
        self.start = text_start(tokenizer)  # every text's first token, where the tokenizer has one
        # what an empty context and a text scored whole begin with, as lm-evaluation-harness reads
        # them (its `prefix_token_id`: bos, else eos)
        self.prefix = self.start or ([bos] if bos is not None else [eos] if eos is not None else [])

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """A context's tokens and its continuation's, as lm-evaluation-harness encodes the pair: the
        context's trailing spaces moved to the continuation, the two encoded as one text and split
        after the context's tokens (so a tokenizer that marks a word's start, SentencePiece's `▁`,
        marks the continuation's first word once, as in the text)."""
        if spaces := len(context) - len(context.rstrip()):
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        read = self.ids(context)
        return read, self.ids(context + continuation)[len(read) :]

    def context(self, read: list[int]) -> list[int]:
        """A context's tokens as lm-evaluation-harness reads them: as they are (after the tokenizer's
        beginning-of-text token where it starts every text with one), an empty one as its prefix
        token (`prefix`)."""
        return (self.start or ([] if read else self.prefix)) + read

    def logprobs(self, requests: list[tuple[list[int], list[int]]]) -> list[float]:
        return continuation_logprobs(self.gpt, requests, batch_size=self.batch_size, progress=self.progress)

    def multiple_choice(
        self, task: TaskAdapter, rows: list[dict[str, Any]], split: str = ""
    ) -> dict[str, float]:
        """accuracy (summed log-likelihood), accuracy_norm (per character of the choice) and
        accuracy_token (per token: GPT-1's §5 rule for RACE); for a cloze, its metrics of the
        choices each rule picks (`f1`, `f1_norm`, `f1_token`, ...)."""
        requests, spans, labels = [], [], []
        n_ctx = self.gpt.config.n_positions
        for number, row in enumerate(rows, 1):
            try:
                pairs = task.scored_texts(row)  # (the text before, the text scored) per choice
            except TaskDataError as exc:
                raise TaskDataError(f"task {task.name!r}: {_where(split)}example {number}: {exc}") from None
            start = len(requests)
            for k, (context, choice) in enumerate(pairs, 1):
                read, scored = self.pair(context, " " + choice)  # (as the file holds it, as the harness)
                if not self.prefix and not read:  # a choice's first token would go unscored
                    raise TaskDataError(
                        f"task {task.name!r}: {_where(split)}example {number} has an empty context, which "
                        "a tokenizer with neither a beginning- nor an end-of-text token leaves nothing to "
                        "score its choices after."
                    )
                requests.append((self.context(read), scored))
                if not requests[-1][1]:
                    raise TaskDataError(
                        f"task {task.name!r}: {_where(split)}example {number}'s choice {k} has no tokens of "
                        "its own to score (empty, or merged into the context's last token)."
                    )
            # acc_norm divides by the choice's length in characters, not counting the space before
            # it (lm-evaluation-harness: `completion_len = len(choice)`).
            chars = [max(1, len(c)) for _, c in pairs]
            tokens = [scored_tokens(len(c), len(t), n_ctx) for c, t in requests[start:]]
            spans.append((start, len(pairs), chars, tokens))
            labels.append(_label(task, row))
            if isinstance(labels[-1], int) and labels[-1] >= len(pairs):  # (fine-tuning refuses it alike)
                raise TaskDataError(
                    f"task {task.name!r}: {_where(split)}example {number}'s label "
                    f"{row.get(task.label)!r} points past its {len(pairs)} choices."
                )
        scores = self.logprobs(requests)
        chosen: dict[str, list[int]] = {"accuracy": [], "accuracy_norm": [], "accuracy_token": []}
        for start, n, chars, tokens in spans:
            s = scores[start : start + n]
            chosen["accuracy"].append(_argmax(s))
            chosen["accuracy_norm"].append(_argmax([v / c for v, c in zip(s, chars)]))
            chosen["accuracy_token"].append(_argmax([v / t for v, t in zip(s, tokens)]))
        return {  # accuracy (a cloze: f1, exact_match), then each with the rule's suffix: accuracy_norm, ...
            name + rule.removeprefix("accuracy"): value
            for rule, picked in chosen.items()
            for name, value in task.output.picked_values(torch.tensor(picked), labels).items()
        }

    def verbalizers(self, task: TaskAdapter, spec: ZeroShot, rows: list[dict[str, Any]]) -> Tensor:
        """Predicted label ids: the likeliest verbalizer after text + suffix."""
        words, requests = spec.verbalizers or [], []
        for number, row in enumerate(rows, 1):
            try:
                text = spec.text(task, row)
            except TaskDataError as exc:
                raise TaskDataError(f"task {task.name!r}: example {number}: {exc}") from None
            pairs = [self.pair(text + spec.suffix, word) for word in words]
            if merged := next((w for w, (_, scored) in zip(words, pairs) if not scored), None):
                raise TaskDataError(
                    f"task {task.name!r}: example {number}: the verbalizer {merged!r} has no tokens of its "
                    "own after the text: the tokenizer merges it into the text's last token (begin it with "
                    "a space)."
                )
            requests += [(self.context(read), scored) for read, scored in pairs]
            if not requests[-1][0] and min(len(scored) for _, scored in pairs) < 2:
                raise TaskDataError(
                    f"task {task.name!r}: example {number}'s text is empty, which a tokenizer with neither a "
                    "beginning- nor an end-of-text token leaves nothing to score one-token verbalizers after."
                )
        scores = torch.tensor(self.logprobs(requests)).view(len(rows), len(words))
        return scores.argmax(dim=1)

    def average_logprobs(self, task: TaskAdapter, rows: list[dict[str, Any]], split: str = "") -> Tensor:
        """Each example's average token log-probability."""
        requests, lengths = [], []
        for number, row in enumerate(rows, 1):
            ids = self.ids(" ".join(wholes(task.card_texts(row), task.text_groups)).strip())
            if not self.prefix and len(ids) < 2:  # its first token is the context
                raise TaskDataError(
                    f"task {task.name!r}: {_where(split)}example {number}'s text of {len(ids)} token(s) "
                    "cannot be scored by a tokenizer with neither a beginning- nor an end-of-text token to "
                    "start it."
                )
            context, continuation = (self.prefix, ids) if self.prefix else (ids[:1], ids[1:])
            requests.append((context, continuation))
            lengths.append(scored_tokens(len(context), len(continuation), self.gpt.config.n_positions))
        return torch.tensor(self.logprobs(requests)) / torch.tensor(lengths, dtype=torch.float)


def _where(split: str) -> str:
    """A split named in a message, its examples counted among its labelled ones."""
    return f"split {split!r}, labelled " if split else ""


def best_threshold(scores: Tensor, labels: Tensor, metric: Callable[[Tensor, Tensor], float]) -> float:
    """The cut between sorted scores that maximises metric(predictions, labels); above it is label 1."""
    values = torch.unique(scores)  # sorted
    cuts = torch.cat([values[:1] - 1, (values[1:] + values[:-1]) / 2, values[-1:] + 1])
    best, best_cut = -float("inf"), float(cuts[0])
    for cut in cuts.tolist():
        value = metric((scores > cut).long(), labels)
        if value > best:
            best, best_cut = value, cut
    return best_cut


def evaluate(
    task: TaskAdapter,
    scorer: ZeroShotScorer,
    load_rows: Callable[[str], list[dict[str, Any]]],
    spec: ZeroShot | None = None,
) -> dict[str, float]:
    """Zero-shot metrics on every validation split, keyed `split/metric` like fine-tuning's."""
    if spec is None and not task.choices_in_examples:
        raise ValueError(
            f"Task {task.name!r} has no zero-shot method: multiple choice is scored as is, other tasks "
            "need a `zero_shot` entry (verbalizers or threshold) in the suite file."
        )
    if spec is not None:
        check_method(task, spec)

    def scored(split: str) -> list[dict[str, Any]]:
        if not (rows := load_rows(split)):  # every row's label ignored (`ignore_labels`)
            raise TaskDataError(f"task {task.name!r}: split {split!r} has no labelled examples to score.")
        return rows

    threshold = None
    if spec is not None and spec.threshold:
        rows = scored(spec.calibration_split)[: spec.calibration_examples]
        labels = torch.tensor([_label(task, row) for row in rows])
        main = task.main_metric
        threshold = best_threshold(
            scorer.average_logprobs(task, rows, spec.calibration_split),
            labels,
            lambda p, y: float(metric_value(main, p, y, 2)),
        )
    results = {}
    for split in task.validation_splits:
        rows = scored(split)
        if spec is None:  # the examples' own answer choices
            results.update({f"{split}/{k}": v for k, v in scorer.multiple_choice(task, rows, split).items()})
            continue
        labels = torch.tensor([_label(task, row) for row in rows])
        if threshold is not None:
            predictions = (scorer.average_logprobs(task, rows, split) > threshold).long()
        else:
            predictions = scorer.verbalizers(task, spec, rows)
        for name, value in task.metric_values(predictions, labels).items():
            results[f"{split}/{name}"] = float(value)
    return results


def score(
    task: TaskAdapter,
    init_from: str,
    tokenizer: str | None,
    load_rows: Callable[[str], list[dict[str, Any]]],
    spec: ZeroShot | None,
    name: str,
) -> dict[str, float]:
    """`evaluate` with the model of `init_from` (on the GPU where there is one) and `tokenizer`
    (default: the weights' own), a progress bar named after the task's `name`."""
    from tqdm.auto import tqdm

    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.weights.pretrained import GPT, refuse_fresh_head, resolve_tokenizer

    gpt = GPT.from_pretrained(init_from).to("cuda" if torch.cuda.is_available() else "cpu")
    refuse_fresh_head(gpt, init_from, "zero-shot scoring")
    scorer = ZeroShotScorer(
        gpt,
        load_tokenizer(resolve_tokenizer(tokenizer, init_from), add_specials=False),
        progress=lambda it: tqdm(it, leave=False, desc=f"zero-shot {name}", unit="batch"),
    )
    return evaluate(task, scorer, load_rows, spec)


def _label(task: TaskAdapter, row: dict[str, Any]) -> int | list[float]:
    """The row's label: a class or choice id, or each choice's credits (a cloze's)."""
    label = task.output.example_label(row)
    if label is None:
        raise TaskDataError(f"task {task.name!r}: zero-shot evaluation needs labelled examples.")
    return label if isinstance(label, list) else int(label)


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)
