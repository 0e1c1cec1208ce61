"""Texts and pairs of texts: one classification or score per example (GPT-1 §3.3)."""

from __future__ import annotations

from gpt_ft.adapters.base import Encoded, TaskAdapter
from gpt_ft.adapters.truncation import fit_lengths


class SingleText(TaskAdapter):
    """[start] text [extract] (GPT-1 §3.3, classification)."""

    null_is_empty_text = True

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
        ids, extract = self.frame(specials, text[:n])
        return Encoded([ids], [extract], self.output.example_label(example))


class TextPair(TaskAdapter):
    """[start] premise [delim] hypothesis [extract] (GPT-1 §3.3, textual entailment)."""

    null_is_empty_text = True

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
        ids, extract = self.frame(specials, a[:na], b[:nb])
        return Encoded([ids], [extract], self.output.example_label(example))


class Similarity(TextPair):
    """Both orders, [start] a [delim] b [extract] and [start] b [delim] a [extract] (GPT-1 §3.3).

    The model adds the two extract representations element-wise before the head, since a
    similarity has no inherent order.
    """

    num_sequences = 2
    pair_in_both_orders = True

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
        ab, extract_ab = self.frame(specials, a[:na], b[:nb])
        ba, extract_ba = self.frame(specials, b[:nb], a[:na])
        return Encoded([ab, ba], [extract_ab, extract_ba], self.output.example_label(example))
