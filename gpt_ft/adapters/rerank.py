"""Rerankers: a query and its candidate texts, each pair `[start] query [delim] text [extract]`,
one score each: GPT-1's pair transform with one output, the query run once for all of them
(`--data.shared_context`, packed batches alike).

Trained listwise against hard negatives: the softmax cross-entropy over a row's candidates with the
positive (the first) right, InfoNCE over the list (as sentence-transformers' cross-encoder
`CrossEntropyLoss` over a query's candidates). Pointwise training is the pair shapes' own: a
`TextPair` card with `regression: true` (a graded relevance) or two classes. Scored by the
retrieval metrics over each row's candidates (MRR@10, nDCG@10, recall@1, recall@10), a tie of the
positive with a negative counting each of their places equally (a random order's mean). Served
one pair at a time: `gpt-ft export` writes a one-output `*ForSequenceClassification` that
sentence-transformers' `CrossEncoder` loads.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters.base import Encoded, TaskAdapter, refuse_label_fields
from gpt_ft.adapters.embedding import count_negatives, negative_texts
from gpt_ft.adapters.heads import ChoiceHead, first_best
from gpt_ft.adapters.metrics import RETRIEVAL, ranked_metrics
from gpt_ft.adapters.outputs import LabelSpec, TaskOutput, score_text
from gpt_ft.adapters.sources import needed_text


class RerankHead(ChoiceHead):
    """One score per candidate from one linear layer; cross-entropy over a row's candidates, the
    first right; its predictions are the scores, padded to the card's most candidates with NaN."""

    def __init__(
        self, n_embd: int, *, candidates: int, dropout: float = 0.1, init_std: float = 0.02, bias=True
    ):
        super().__init__(n_embd, dropout=dropout, init_std=init_std, bias=bias)
        self.candidates = candidates

    def predictions(self, outputs: Tensor) -> Tensor:
        missing = outputs == torch.finfo(outputs.dtype).min  # ChoiceHead's mask
        scores = outputs.float().masked_fill(missing, math.nan)
        return F.pad(scores, (0, self.candidates - scores.shape[1]), value=math.nan)

    def probabilities(self, outputs: Tensor) -> Tensor:
        return self.predictions(outputs)


class RerankOutput(TaskOutput):
    """A score per candidate, the positive first: listwise cross-entropy, retrieval metrics."""

    kind = "rerank"
    default_lm_coef = 0.0  # over every candidate it would teach the model to write the negatives too
    problem_type = "regression"  # one score per pair: num_labels 1, as cross-encoders are served
    served_per_sequence = True  # [start] query [delim] text [extract]: one pair's score
    reranks = True
    has_probabilities = False
    allowed_metrics = default_metrics = RETRIEVAL

    def __init__(self, task_name: str, spec: LabelSpec, *, candidates: int) -> None:
        super().__init__(task_name, spec)
        self.candidates = candidates

    @property
    def num_outputs(self) -> int:
        return 1

    def served_labels(self) -> list[str]:
        return ["score"]

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> RerankHead:
        return RerankHead(n_embd, candidates=self.candidates, dropout=dropout, init_std=init_std, bias=bias)

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        """The positive's rank among each row's candidates (NaN: a candidate the row has not), a
        tie with a negative counting at each of their places in turn; a row without a negative has
        nothing to rank, and is left out (it would score as perfect)."""
        ranks = ~predictions[:, 1:].isnan().all(dim=1)
        if len(ranks) and not ranks.any():
            warnings.warn(
                f"Task {self.task_name!r}: no row scored has a negative to rank its positive against: its "
                "retrieval metrics are NaN (a row without a negative is left out).",
                stacklevel=2,
            )
        relevant = torch.zeros_like(predictions, dtype=torch.bool)
        relevant[:, 0] = True  # the positive, first
        present = ~predictions.isnan()
        return ranked_metrics(predictions[ranks], relevant[ranks], metrics, present[ranks])

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        """The candidates' scores, in the row's order."""
        return " ".join(score_text(s) for s in prediction.tolist() if not math.isnan(s))

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """The best candidate's position (the first on a tie) and every candidate's score."""
        scores = [s for s in prediction.tolist() if not math.isnan(s)]
        return {"label": first_best(scores), "scores": scores}

    def example_label(self, example: dict[str, Any]) -> int:
        return 0  # the positive comes first

    def label_id(self, value: Any) -> int:
        return 0


class Reranker(TaskAdapter):
    """A query, its positive and hard negatives: `[start] query [delim] text [extract]` per text,
    one score each, the query run once (see the module docstring)."""

    shares_context = True

    def __init__(
        self,
        *,
        query: str = "query",
        positive: str = "positive",
        negatives: str | list[str] = "negatives",
        num_negatives: int | None = None,
        **kwargs,
    ) -> None:
        """
        Args:
            query: Field holding the query.
            positive: Field holding the relevant text.
            negatives: One field holding a list of texts (or one text), or a list of fields holding
                one text each: the candidates ranked against the positive.
            num_negatives: The most negatives a row has (a field holding a list; default 1).
        """
        no_labels = {"label": "label", "labels": None, "regression": False}
        refuse_label_fields(kwargs, no_labels, "a reranking task takes no `{field}` (the positive is first).")
        self.query, self.positive, self.negatives = query, positive, negatives
        self.num_negatives = count_negatives(kwargs.get("name"), negatives, num_negatives)
        super().__init__(**kwargs)

    @property
    def num_sequences(self) -> int:  # type: ignore[override]
        return 1 + self.num_negatives

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return RerankOutput(self.name, spec, candidates=self.num_sequences)

    def text_fields(self) -> list[str]:
        negatives = [self.negatives] if isinstance(self.negatives, str) else list(self.negatives)
        return [self.query, self.positive, *negatives]

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[query, positive, negative, ...]."""
        needed = "a reranking row needs its query and its positive"  # (a missing field reads as null)
        query, positive = (needed_text(example[f], f, needed) for f in (self.query, self.positive))
        return [query, positive, *negative_texts(example, self.negatives, self.num_negatives)]

    def encode(self, example, tokens, specials, max_length):
        query, *candidates = tokens
        sequences, extract = self.choice_sequences(specials, query, candidates, max_length)
        return Encoded(sequences, extract, self.output.example_label(example))

    def sequence_roles(self, encoded):  # the positive and the negatives
        return [i == 0 for i in range(len(encoded.sequences))]
