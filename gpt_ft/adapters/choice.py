"""Multiple choice: one sequence per answer, a scalar each, softmax over a row's choices."""

from __future__ import annotations

from typing import Any

from gpt_ft.adapters.base import Encoded, TaskAdapter, TaskDataError, field_text, fit_lengths
from gpt_ft.adapters.heads import ChoiceHead, TaskHead
from gpt_ft.adapters.metrics import metric_value


class MultipleChoice(TaskAdapter):
    """One sequence [start] context [delim] answer_k [extract] per choice; softmax over choices (GPT-1 §3.3).

    Rows may have different numbers of choices (a list field): the batch carries a choice mask.
    The context is cut the same way for every choice, so all choices share it token for token.
    """

    needs_label_names = False
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

    def head(self, n_embd: int, *, dropout: float, init_std: float) -> TaskHead:
        return ChoiceHead(n_embd, dropout=dropout, init_std=init_std)

    @property
    def num_labels(self) -> int:
        return 1

    @property
    def class_names(self) -> list[str] | None:
        return None

    def metric_values(self, predictions, labels):
        # A prediction is the index of a choice: as many classes as a row has choices at most.
        return {name: metric_value(name, predictions, labels, self.max_choices) for name in self.metrics}

    def label_text(self, label: Any) -> Any:
        return label

    def num_classes_for_labels(self) -> int:
        return len(self.labels) if self.labels else self.max_choices

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
