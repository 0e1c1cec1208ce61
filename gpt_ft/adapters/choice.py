"""Multiple choice: one sequence per answer, a scalar each, softmax over a row's choices."""

from __future__ import annotations

from typing import Any

from gpt_ft.adapters.base import Encoded, TaskAdapter, field_text
from gpt_ft.adapters.outputs import CardError, ChoiceOutput, LabelSpec, TaskDataError, TaskOutput


class MultipleChoice(TaskAdapter):
    """One sequence [start] context [delim] answer_k [extract] per choice; softmax over choices (GPT-1 §3.3).

    Rows may have different numbers of choices (a list field): the batch carries a choice mask.
    The context is cut the same way for every choice, so all choices share it token for token.
    """

    shares_context = True
    choices_in_examples = True

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
        name = kwargs.get("name")
        self.context = [context] if isinstance(context, str) else list(context)
        self.choices = choices
        if isinstance(choices, str):
            if not num_choices:
                raise CardError(f"Task {name!r}: `num_choices` is required when `choices` is a list field.")
            self.max_choices = num_choices
        else:
            self.max_choices = len(choices)
            if num_choices not in (None, len(choices)):
                raise CardError(f"Task {name!r}: num_choices={num_choices} but {len(choices)} choice fields.")
        super().__init__(**kwargs)

    @property
    def num_sequences(self) -> int:  # type: ignore[override]
        return self.max_choices

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return ChoiceOutput(self.name, spec, choices=self.max_choices)

    def text_fields(self) -> list[str]:
        return self.context + ([self.choices] if isinstance(self.choices, str) else list(self.choices))

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[context, choice_1, ..., choice_k]: the context fields joined by spaces, then each choice."""
        context = " ".join(t for t in (field_text(example[f]) for f in self.context) if t)
        if isinstance(self.choices, str):
            choices = example[self.choices]
            if not isinstance(choices, (list, tuple)) or not 1 <= len(choices) <= self.max_choices:
                raise TaskDataError(
                    f"field {self.choices!r} must hold a list of 1 to {self.max_choices} choices, "
                    f"got {choices!r}."
                )
        else:
            choices = [example[c] for c in self.choices]
        return [context, *(field_text(c) for c in choices)]

    def encode(self, example, tokens, specials, max_length):
        context, *answers = tokens
        sequences, extract = self.choice_sequences(specials, context, answers, max_length)
        label = self.output.example_label(example)
        if label is not None and label >= len(answers):
            value = example.get(self.label)
            raise TaskDataError(f"label {value!r} points past the row's {len(answers)} choices.")
        return Encoded(sequences, extract, label)
