"""Multiple choice: one sequence per answer, a scalar each, softmax over a row's choices."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from gpt_ft.adapters.base import Encoded, TaskAdapter
from gpt_ft.adapters.heads import ChoiceHead, TaskHead
from gpt_ft.adapters.outputs import CardError, ClassificationOutput, LabelSpec, TaskDataError, TaskOutput
from gpt_ft.adapters.sources import cell_list, field_text, short_repr
from gpt_ft.adapters.tokens import field_parts


class ChoiceOutput(ClassificationOutput):
    """One of a row's answer choices: a score per choice, softmax over the row's choices (GPT-1 §3.3).

    A label is the right choice's index, its name in `labels` (e.g. '1', '2'), or, where each row
    names its own choices (`names`: ARC's `choices.label`, A to E or 1 to 4), one of the row's names.
    """

    kind = "multiple-choice"
    problem_type = None  # one score per choice: exported as GPT-1's and GPT-2's *DoubleHeadsModel
    needs_names = False

    def __init__(self, task_name: str, spec: LabelSpec, *, choices: int, names: str | None = None) -> None:
        super().__init__(task_name, spec)
        self.choices, self.names_field = choices, names
        if names is not None and spec.names:
            raise CardError(
                f"Task {task_name!r}: give `labels` (the choices' names, the same in every row) or "
                f"`choice_names` (a field naming each row's own), not both."
            )
        if spec.names and len(spec.names) != choices:  # (a choice past them had no name to predict)
            raise CardError(
                f"Task {task_name!r}: `labels` names {len(spec.names)} choices {spec.names}, but its rows "
                f"have {choices}: give each choice its name, in order."
            )
        self.stratified = names is None  # a name (A, 1) means a position in its own row only

    def example_label(self, example: dict[str, Any]) -> Any:
        names = self.row_names(example)
        if names is None:
            return super().example_label(example)
        value = example.get(self.spec.field)
        if self.unlabelled(value):
            return None
        if (text := str(value).strip()) not in names:
            raise TaskDataError(
                f"label {value!r} in field {self.spec.field!r} names none of the row's choices {names} "
                f"(field {self.names_field!r})."
            )
        return names.index(text)

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def num_classes(self) -> int:
        # A prediction is the index of a choice: as many classes as a row has choices at most.
        return self.choices

    @property
    def class_names(self) -> list[str] | None:
        return None

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> TaskHead:
        return ChoiceHead(n_embd, dropout=dropout, init_std=init_std, bias=bias, choices=self.choices)

    def submission_record(self, idx: Any, prediction: Tensor, name) -> dict[str, Any]:
        """A choice that neither the card nor its row names is written as its number (COPA's 0, 1)."""
        if self.names_field is None and not self.spec.names:
            return {"idx": idx, "label": int(prediction.item())}
        return super().submission_record(idx, prediction, name)

    def label_text(self, label: Any) -> Any:  # the card's name of the right choice (Story Cloze's '1')
        return None if label is None else self.label_name(label) if self.spec.names else label

    def row_outcome(
        self, prediction: Tensor, probabilities: Tensor, sequences: int, names: list[str] | None = None
    ) -> dict[str, Any]:
        """The row's own choices only (`sequences` of them), whatever its batch's widest row, by
        the row's own `names` where it has them."""
        outcome = self.outcome(prediction, probabilities[:sequences])
        if names is None:
            return outcome
        return {"label": names[int(prediction)], "scores": dict(zip(names, outcome["scores"].values()))}


class MultipleChoice(TaskAdapter):
    """One sequence [start] context [delim] answer_k [extract] per choice; softmax over choices (GPT-1 §3.3).

    Rows may have different numbers of choices (a list field): the batch carries a choice mask.
    The context is cut the same way for every choice, so all choices share it token for token; of
    several context fields ([article, question]) the earlier ones are cut first, from their ends,
    so that a long article never costs the question after it.
    """

    null_is_empty_text = True
    shares_context = True
    choices_in_examples = True

    def __init__(
        self,
        *,
        context: list[str],
        choices: list[str] | str,
        num_choices: int | None = None,
        choice_names: str | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            context: Fields whose texts, joined by spaces, make the context (e.g. [article, question]).
            choices: One field per choice, or one field holding a list of choices.
            num_choices: The most choices a row has (required when `choices` is a list field).
            choice_names: A field holding the names of the row's own choices, in order (ARC's
                `choices.label`: A to E, or 1 to 4), one of which the label gives.
            label: Field with the right choice: its index, a name in `labels` (e.g. '1', '2'), or
                one of the row's `choice_names`.
        """
        name = kwargs.get("name")
        self.context = [context] if isinstance(context, str) else list(context)
        self.choices, self.choice_names = choices, choice_names
        if isinstance(choices, str):
            if not num_choices or num_choices < 1:
                raise CardError(
                    f"Task {name!r}: `num_choices` (>= 1) is required when `choices` is a list field, got "
                    f"{num_choices}."
                )
            self.max_choices = num_choices
        elif not choices:
            raise CardError(f"Task {name!r}: `choices` names no field.")
        else:
            self.max_choices = len(choices)
            if num_choices not in (None, len(choices)):
                raise CardError(f"Task {name!r}: num_choices={num_choices} but {len(choices)} choice fields.")
        super().__init__(**kwargs)

    @property
    def num_sequences(self) -> int:  # type: ignore[override]
        return self.max_choices

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return ChoiceOutput(self.name, spec, choices=self.max_choices, names=self.choice_names)

    @property
    def text_groups(self) -> list[int]:  # the context's fields, one text
        return [len(self.context)]

    def text_fields(self) -> list[str]:
        return self.context + ([self.choices] if isinstance(self.choices, str) else list(self.choices))

    def read_fields(self) -> list[str]:
        return [*super().read_fields(), *filter(None, [self.choice_names])]

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[context part per context field, choice_1, ..., choice_k]: the parts join into the context
        text (each after the first non-empty one opens with a space), then each choice; with
        `strip_texts`, each field's text stripped before."""
        strip = str.strip if self.strip_texts else str
        parts = field_parts(example, self.context, self.strip_texts)
        if isinstance(self.choices, str):
            choices = cell_list(example[self.choices])
            if not isinstance(choices, (list, tuple)) or not 1 <= len(choices) <= self.max_choices:
                raise TaskDataError(
                    f"field {self.choices!r} must hold a list of 1 to {self.max_choices} choices, "
                    f"got {short_repr(choices)}."
                )
            texts = [strip(field_text(c, self.choices)) for c in choices]
        else:
            texts = [strip(field_text(example[c], c)) for c in self.choices]
        if empty := next((k for k, text in enumerate(texts, 1) if not text.strip()), None):
            field = self.choices if isinstance(self.choices, str) else self.choices[empty - 1]
            raise TaskDataError(f"choice {empty} (field {field!r}) is empty: a choice needs a text to score.")
        return [*parts, *texts]

    def card_texts(self, example: dict[str, Any]) -> list[str]:
        return self.texts(example)  # stripped field by field, before the parts join

    def context_and_choices(self, example: dict[str, Any]) -> tuple[str, list[str]]:
        """The context's text and each choice's, as the card reads them."""
        texts = self.card_texts(example)
        return "".join(texts[: len(self.context)]), texts[len(self.context) :]

    def scored_texts(self, example: dict[str, Any]) -> list[tuple[str, str]]:
        """Each choice as zero-shot scoring reads it: the text before it, and the text scored after
        that (the choice's own)."""
        context, choices = self.context_and_choices(example)
        return [(context, choice) for choice in choices]

    def encode(self, example, tokens, specials, max_length):
        parts, answers = tokens[: len(self.context)], tokens[len(self.context) :]
        sequences, extract = self.choice_sequences(specials, parts, answers, max_length)
        self.output.row_names(example, len(answers))  # as many as the choices, each once
        label = self.output.example_label(example)
        if label is not None and label >= len(answers):
            value = example.get(self.label)
            raise TaskDataError(f"label {value!r} points past the row's {len(answers)} choices.")
        return Encoded(sequences, extract, label)

    def sequence_roles(self, encoded):  # the right choice and the others
        return None if encoded.label is None else [i == encoded.label for i in range(len(encoded.sequences))]


class FillIn(MultipleChoice):
    """A sentence with a blank, and the options that may fill it (WinoGrande): per option,
    [start] the sentence up to the blank [delim] the option and the rest of the sentence [extract]
    (split at the blank as the WinoGrande paper's baseline reads it, the context shared), softmax
    over the options. Zero-shot scoring scores the rest of the sentence after each option (partial
    scoring: Trinh and Le 2018, as lm-evaluation-harness scores WinoGrande), the same text for
    every option: `accuracy_norm` is `accuracy` there.
    """

    def __init__(self, *, sentence: str, options: list[str] | str, blank: str = "_", **kwargs) -> None:
        """
        Args:
            sentence: Field holding the sentence, with the blank once.
            options: One field per option, or one field holding a list of options.
            blank: What marks the blank in the sentence.
        """
        if not blank:
            raise CardError(f"Task {kwargs.get('name')!r}: `blank` must be a text, e.g. '_'.")
        self.sentence, self.options, self.blank = sentence, options, blank
        super().__init__(context=[sentence], choices=options, **kwargs)

    def split(self, example: dict[str, Any]) -> tuple[str, list[str], str]:
        """The sentence before the blank, the options, and the sentence after the blank."""
        sentence, *options = super().texts(example)
        if self.blank not in sentence:
            raise TaskDataError(
                f"field {self.sentence!r} holds no blank {self.blank!r}: {short_repr(sentence)}."
            )
        before, _, after = sentence.partition(self.blank)  # at the first blank, as lm-evaluation-harness
        return before, options, after

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[the sentence up to the blank (its space before the blank dropped), each option followed
        by the rest of the sentence]."""
        before, options, after = self.split(example)
        return [before.rstrip(), *(option + after for option in options)]

    def scored_texts(self, example: dict[str, Any]) -> list[tuple[str, str]]:
        before, options, after = self.split(example)  # (the rest without its spaces: the harness's)
        return [(before + option, after.strip()) for option in options]


class CauseEffect(MultipleChoice):
    """Which choice is the premise's cause, or its effect (COPA): per choice, [start] the premise,
    its closing stop dropped, then "because" or "therefore" [delim] the choice, its first letter
    lowered [extract], so that premise and choice read as one sentence (the sentence
    lm-evaluation-harness builds for COPA; zero-shot, the choice is scored after one space, where
    the harness's own choices carry a space before its delimiter's: two); softmax over the choices.
    """

    def __init__(
        self,
        *,
        premise: str = "premise",
        question: str = "question",
        choices: list[str] | str | None = None,
        connectives: dict[str, str] | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            premise: Field holding the premise.
            question: Field saying what the right choice is to the premise: a key of `connectives`.
            choices: One field per choice, or one field holding a list of them (default: choice1,
                choice2).
            connectives: The word each question joins the premise and a choice with.
        """
        self.premise, self.question = premise, question
        self.connectives = dict(connectives or {"cause": "because", "effect": "therefore"})
        super().__init__(context=[premise], choices=choices or ["choice1", "choice2"], **kwargs)

    def text_fields(self) -> list[str]:
        return [*super().text_fields(), self.question]

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[the premise and the question's connective, each choice with its first letter lowered]."""
        premise, *choices = super().texts(example)
        asked = field_text(example.get(self.question), self.question).strip()
        if asked not in self.connectives:
            raise TaskDataError(
                f"field {self.question!r} is {asked!r}, which the card's connectives do not name: "
                f"{', '.join(map(repr, self.connectives))}."
            )
        premise = premise.rstrip()
        premise = premise[:-1] if premise[-1:] in (".", "!", "?") else premise
        return [f"{premise} {self.connectives[asked]}", *(c[:1].lower() + c[1:] for c in choices)]
