"""Texts and pairs of texts: one classification or score per example (GPT-1 §3.3). A text may be
made of several fields (`text: [title, body]`), joined by a space."""

from __future__ import annotations

from typing import Any

from gpt_ft.adapters.base import Encoded, TaskAdapter
from gpt_ft.adapters.outputs import CardError
from gpt_ft.adapters.tokens import field_parts
from gpt_ft.adapters.truncation import fit_lengths


class Texts(TaskAdapter):
    """What single texts and pairs share: each text a field, or several joined by a space."""

    null_is_empty_text = True

    def read_texts(self, *fields: str | list[str]) -> None:
        """The card's text fields, each one field or a list of them (`groups`)."""
        self.groups = [[f] if isinstance(f, str) else list(f) for f in fields]
        if (empty := next((i for i, group in enumerate(self.groups) if not group), None)) is not None:
            raise CardError(f"Task {self.name!r}: text {empty + 1} names no field.")

    @property
    def text_groups(self) -> list[int]:
        return [len(group) for group in self.groups]

    def text_fields(self) -> list[str]:
        return [f for group in self.groups for f in group]

    def texts(self, example: dict[str, Any]) -> list[str]:
        """Each field's part of its text (`field_parts`: stripped first with `strip_texts`)."""
        return [part for group in self.groups for part in field_parts(example, group, self.strip_texts)]

    def card_texts(self, example: dict[str, Any]) -> list[str]:
        return self.texts(example)  # stripped field by field, before the parts join

    def joined(self, tokens: list[list[int]]) -> list[list[int]]:
        """Each text's tokens, of its fields' parts."""
        ends = [sum(self.text_groups[: i + 1]) for i in range(len(self.groups))]
        return [[t for part in tokens[end - len(g) : end] for t in part] for end, g in zip(ends, self.groups)]


class SingleText(Texts):
    """[start] text [extract] (GPT-1 §3.3, classification)."""

    def __init__(self, *, text: str | list[str] = "sentence", **kwargs) -> None:
        """
        Args:
            text: Field holding the text, or fields whose texts, joined by a space, make it.
        """
        super().__init__(**kwargs)
        self.text = text
        self.read_texts(text)

    def encode(self, example, tokens, specials, max_length):
        (text,) = self.joined(tokens)
        (n,) = fit_lengths([len(text)], max_length - 2)
        ids, extract = self.frame(specials, text[:n])
        return Encoded([ids], [extract], self.output.example_label(example))


class TextPair(Texts):
    """[start] premise [delim] hypothesis [extract] (GPT-1 §3.3, textual entailment)."""

    def __init__(
        self, *, premise: str | list[str] = "premise", hypothesis: str | list[str] = "hypothesis", **kwargs
    ) -> None:
        """
        Args:
            premise: Field holding the first text, or fields whose texts, joined by a space, make it.
            hypothesis: Field holding the second text, or fields that make it.
        """
        super().__init__(**kwargs)
        self.premise, self.hypothesis = premise, hypothesis
        self.read_texts(premise, hypothesis)

    def encode(self, example, tokens, specials, max_length):
        a, b = self.joined(tokens)
        na, nb = fit_lengths([len(a), len(b)], max_length - 3)
        ids, extract = self.frame(specials, a[:na], b[:nb])
        return Encoded([ids], [extract], self.output.example_label(example))


class Similarity(TextPair):
    """Both orders, [start] a [delim] b [extract] and [start] b [delim] a [extract] (GPT-1 §3.3).

    The model adds the two extract representations element-wise before the head, since a
    similarity has no inherent order.
    """

    num_sequences = 2
    pair_in_both_orders = True

    def __init__(
        self, *, first: str | list[str] = "sentence1", second: str | list[str] = "sentence2", **kwargs
    ) -> None:
        """
        Args:
            first: Field holding one text, or fields whose texts, joined by a space, make it.
            second: Field holding the other, or fields that make it.
        """
        super().__init__(premise=first, hypothesis=second, **kwargs)

    def encode(self, example, tokens, specials, max_length):
        a, b = self.joined(tokens)
        na, nb = fit_lengths([len(a), len(b)], max_length - 3)
        ab, extract_ab = self.frame(specials, a[:na], b[:nb])
        ba, extract_ba = self.frame(specials, b[:nb], a[:na])
        return Encoded([ab, ba], [extract_ab, extract_ba], self.output.example_label(example))
