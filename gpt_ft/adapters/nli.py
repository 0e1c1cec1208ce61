"""NLI records as embedding triplets: a premise, a hypothesis it entails, one it contradicts."""

from __future__ import annotations

from typing import Any

from gpt_ft.adapters.embedding import Embedding
from gpt_ft.adapters.sources import field_text, label_spelling, needed_text
from gpt_ft.errors import TaskDataError, about

NEEDED = "a triplet needs a premise and the hypotheses it is made of"
NO_GOLD = ("-", "-1", "None", "nan", "")  # SNLI's records without a consensus, the hub's -1; null, empty


class NliTriplets(Embedding):
    """Natural-language-inference rows (premise, hypothesis, label; SNLI's and MNLI's own layouts) as
    embedding triplets, as SBERT and SimCSE train: each premise the anchor, a hypothesis it entails
    the positive, one it contradicts the hard negative (its first of each: one example a premise).
    A premise with no entailed hypothesis gives no example; one with no contradiction, a pair
    without a hard negative."""

    def __init__(
        self,
        *,
        premise: str = "premise",
        hypothesis: str = "hypothesis",
        nli_label: str = "label",
        entailment: list[str] | None = None,
        contradiction: list[str] | None = None,
        neutral: list[str] | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            premise: Field holding the premise (the anchor).
            hypothesis: Field holding the hypothesis.
            nli_label: Field holding the inference label.
            entailment: The label values that mean entailment (default: entailment, 0: the release
                files' name and the hub's id).
            contradiction: The label values that mean contradiction (default: contradiction, 2).
            neutral: The label values that mean neither (default: neutral, 1). A record whose label is
                none of these three nor "-", -1, null or empty (no gold label: SNLI's, the hub's) is refused.
        """
        self.premise, self.hypothesis, self.nli_label = premise, hypothesis, nli_label
        self.entailment = [str(v) for v in (entailment or ["entailment", "0"])]
        self.contradiction = [str(v) for v in (contradiction or ["contradiction", "2"])]
        self.neutral = [str(v) for v in (neutral or ["neutral", "1"])]
        super().__init__(
            anchor="anchor", positive="positive", negatives="negatives", num_negatives=1, **kwargs
        )

    def text_fields(self) -> list[str]:
        return [self.premise, self.hypothesis, self.nli_label]

    def regroup(self, records, where=None, alone=False) -> tuple[list[dict[str, Any]], list[int]]:
        """One row per premise that entails a hypothesis: {anchor, positive, negatives}, with the
        record of its positive (for messages); premises in the order they first come. A record
        `alone` (to predict) is its pair, whatever its label, if it has one."""
        if alone:
            pairs = [
                {
                    "anchor": field_text(row[self.premise], self.premise),
                    "positive": field_text(row[self.hypothesis], self.hypothesis),
                    "negatives": [],
                }
                for row in records
            ]
            return pairs, list(range(len(pairs)))
        grouped: dict[str, dict[str, Any]] = {}
        known = {*self.entailment, *self.contradiction, *self.neutral, *NO_GOLD}
        for i, row in enumerate(records):
            with about(where, i, self.name):
                premise, label = needed_text(row[self.premise], self.premise, NEEDED), row[self.nli_label]
                if (label := label_spelling(label).strip()) not in known:
                    raise TaskDataError(
                        f"label {row[self.nli_label]!r} in field {self.nli_label!r} is none of entailment "
                        f"{self.entailment}, contradiction {self.contradiction} and neutral {self.neutral}, "
                        "nor '-', -1, null or empty (no gold label); a card names a file's own values in "
                        "`entailment`, `contradiction` and `neutral`."
                    )
                group = grouped.setdefault(premise, {"positive": None, "negative": None, "record": None})
                if label in self.entailment and group["positive"] is None:
                    group["record"] = i
                    group["positive"] = needed_text(row[self.hypothesis], self.hypothesis, NEEDED)
                elif label in self.contradiction and group["negative"] is None:
                    group["negative"] = needed_text(row[self.hypothesis], self.hypothesis, NEEDED)
        kept = [(p, g) for p, g in grouped.items() if g["positive"] is not None]
        triplets = [
            {
                "anchor": p,
                "positive": g["positive"],
                "negatives": [g["negative"]] if g["negative"] is not None else [],
            }
            for p, g in kept
        ]
        return triplets, [g["record"] for _, g in kept]
