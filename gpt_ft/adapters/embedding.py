"""Embeddings: a text's extract state as its vector (last-token pooling), trained contrastively.

Each text alone is `[start] text [extract]` (an instruction prefix, where the card gives one, before
the text: E5's "query: ", Qwen3-Embedding's "Instruct: ...\\nQuery:"). Its embedding is the extract
token's final state, through a linear projection where the card asks for one, normalised to unit
length. An example is an anchor, its positive and, where the data has them, hard negatives.

Losses, over the whole batch (every process's under DDP, gathered with their gradients, so that
two processes compute the loss of one with both halves):

- InfoNCE (van den Oord et al. 2018; SimCSE, E5, sentence-transformers'
  `MultipleNegativesRankingLoss`): each anchor against every positive and hard negative of the
  batch but other copies of its own positive (known by `text_key`), cross-entropy over cos/τ with
  its own positive right. τ = 0.05 by default: SimCSE's and E5's value, sentence-transformers'
  scale of 20. `symmetric` adds each positive against every anchor and averages the two
  directions (for pairs whose sides play the same part).
- CoSENT (Su 2022; sentence-transformers' `CoSENTLoss`), for pairs with a gold similarity score:
  log(1 + Σ exp(λ(cos_j - cos_i))) over the batch's pairs (i, j) whose gold scores rank i above j,
  λ = 20.

Scored as people judge embeddings: Spearman (and Pearson) of cos(anchor, positive) against gold
scores (MTEB's STS), and retrieval, each anchor text a query against the split's positives, those
of its rows the relevant ones: MRR@10, nDCG@10, recall@1 and recall@10 (`retrieval_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters.base import Encoded, TaskAdapter, refuse_label_fields
from gpt_ft.adapters.contrastive import (
    NO_TEXT,
    TEMPERATURE,
    cosent,
    first_copies,
    gather_rows,
    info_nce,
    left_out,
    text_key,
)
from gpt_ft.adapters.heads import TaskHead
from gpt_ft.adapters.metrics import RETRIEVAL, metric_value, retrieval_metrics
from gpt_ft.adapters.outputs import CardError, LabelSpec, TaskDataError, TaskOutput, score_text
from gpt_ft.adapters.sources import field_text, finite_number, from_array, needed_text

CORRELATIONS = ("spearman", "pearson")
POOLINGS = ("extract", "last", "mean")


def count_negatives(
    task_name: str | None, negatives: str | list[str] | None, num_negatives: int | None
) -> int:
    """The most hard negatives a row has: one per field of a list of fields; for one field,
    `num_negatives` (default 1); none without negatives."""
    if num_negatives is not None and num_negatives < 1:
        raise CardError(f"Task {task_name!r}: num_negatives must be >= 1, got {num_negatives}.")
    if num_negatives is not None and negatives is None:
        raise CardError(f"Task {task_name!r}: num_negatives needs `negatives`, the field(s) holding them.")
    if isinstance(negatives, list):
        if num_negatives not in (None, len(negatives)):
            raise CardError(f"Task {task_name!r}: num_negatives={num_negatives} but {len(negatives)} fields.")
        return len(negatives)
    return 0 if negatives is None else num_negatives or 1


def negative_texts(example: dict[str, Any], negatives: str | list[str] | None, most: int) -> list[str]:
    """A row's hard negatives' texts: each field's of a list of fields, or one field's text or list
    of texts (the field missing, a null, NaN or an empty text, as a table's empty cell reads: none);
    more than `most`, or a value that is no text, is named in one sentence with its field."""
    if isinstance(negatives, list):
        found = [(example[f], f) for f in negatives]
    else:
        value = from_array(example.get(negatives)) if negatives is not None else None  # (a text, or a list)
        found = [(n, negatives) for n in (value if isinstance(value, (list, tuple)) else [value])]
    found = [text for text in (field_text(n, field) for n, field in found) if text]  # null, NaN: ""
    if len(found) > most:
        raise TaskDataError(
            f"field {negatives!r} holds {len(found)} negatives; the card allows {most} (num_negatives)."
        )
    return found


class EmbeddingHead(TaskHead):
    """Dropout, a linear projection where asked (else none), unit length: one vector per text,
    (B, S, D); a text an example does not have is a zero vector. The loss is InfoNCE or CoSENT."""

    def __init__(
        self,
        n_embd: int,
        *,
        dimensions: int | None = None,
        loss: Literal["infonce", "cosent"] = "infonce",
        temperature: float = TEMPERATURE,
        symmetric: bool = False,
        candidates: int = 1,
        pooling: str = "extract",
        dropout: float = 0.1,
        init_std: float = 0.02,
        bias: bool = True,
    ) -> None:
        super().__init__(n_embd, dimensions or n_embd, dropout=dropout, init_std=init_std, bias=bias)
        self.pools_mean = pooling == "mean"
        self.projects = dimensions is not None
        if not self.projects:  # the extract state itself: an identity kept out of training
            with torch.no_grad():
                self.weight.copy_(torch.eye(n_embd))
            self.requires_grad_(False)
        self.loss, self.temperature, self.symmetric = loss, temperature, symmetric
        self.candidates = candidates  # texts after the anchor: the positive and the most negatives

    def forward(self, extract: Tensor, choice_mask: Tensor | None = None) -> Tensor:
        x = self.dropout_per_text(extract)
        if self.projects:
            x = F.linear(x, self.weight, self.bias)
        x = F.normalize(x.float(), dim=-1)
        return x if choice_mask is None else x * choice_mask[..., None]

    def dropout_per_text(self, extract: Tensor) -> Tensor:
        """Dropout with one mask per distinct state: a text that recurs in a packed batch (computed
        once, every copy the same state) stays one vector."""
        p, flat = self.dropout.p, extract.reshape(-1, extract.shape[-1])
        if not self.training or p == 0:
            return extract
        text = first_copies(flat.detach())  # each state's first copy, whose row of `keep` it takes
        keep = torch.rand(flat.shape, device=flat.device) >= p
        return (flat * keep[text] / (1 - p)).view_as(extract)

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """Each example's loss against the whole batch (see the module docstring), (B,); `labels`
        are `EmbeddingOutput`'s rows."""
        anchors, positives = outputs[:, 0], outputs[:, 1]
        if self.loss == "cosent":
            cosines, _ = gather_rows((anchors * positives).sum(dim=-1))
            scores, _ = gather_rows(labels[:, 0].float())
            return cosent(cosines, scores).expand(len(outputs))  # the batch's loss, on every example
        B, C = len(outputs), self.candidates
        candidates = F.pad(outputs[:, 1:], (0, 0, 0, C - (outputs.shape[1] - 1)))  # (B, C, D)
        every, offset = gather_rows(candidates)
        texts, _ = gather_rows(text_keys(labels))  # (all B, 1 + C, K)
        rows = offset + torch.arange(B, device=outputs.device)  # this process's, among all
        forward, backward = left_out(texts, rows)
        losses = info_nce(anchors, every.flatten(0, 1), rows * C, forward, self.temperature)
        if self.symmetric:
            every_anchor, _ = gather_rows(anchors)
            losses = (losses + info_nce(positives, every_anchor, rows, backward, self.temperature)) / 2
        return losses

    def predictions(self, outputs: Tensor) -> Tensor:
        """The anchor's and the positive's vectors, (B, 2, D), fp32."""
        return outputs[:, :2].float()

    def probabilities(self, outputs: Tensor) -> Tensor:
        return self.predictions(outputs)


def text_keys(labels: Tensor) -> Tensor:
    """(B, S, K): which text each of a batch's rows' texts is, from their labels (`EmbeddingOutput`)."""
    return labels[:, 1:].reshape(len(labels), -1, len(NO_TEXT))


class EmbeddingOutput(TaskOutput):
    """Vectors, one per text: trained by InfoNCE or CoSENT, scored by correlations with gold scores
    and by retrieval (module docstring). An example's label is a row: the pair's gold score (1 where
    it has none), then which text each of its texts is (`text_key`; `NO_TEXT` for a hard negative
    it lacks), for the loss and the metrics to know copies of one text."""

    kind = "embedding"
    embeds = True
    has_probabilities = False
    allowed_metrics = (*CORRELATIONS, *RETRIEVAL)
    default_lm_coef = 0.0  # sentence embedding training has no language-model term
    default_dropout = 0.0  # the vector is the output: none on it, as sentence-transformers pools

    def __init__(
        self,
        task_name: str,
        spec: LabelSpec,
        *,
        scored: bool,
        loss: Literal["infonce", "cosent"],
        temperature: float,
        symmetric: bool,
        dimensions: int | None,
        candidates: int,
        pooling: str = "extract",
    ) -> None:
        super().__init__(task_name, spec)
        if not (temperature > 0 and math.isfinite(temperature)):
            raise CardError(f"Task {task_name!r}: temperature must be > 0, got {temperature}.")
        if loss == "cosent" and not scored:
            raise CardError(f"Task {task_name!r}: the cosent loss needs `score`, a field of gold scores.")
        if loss == "cosent" and (candidates > 1 or symmetric or temperature != TEMPERATURE):
            raise CardError(  # it reads each pair's cosine against its gold score alone
                f"Task {task_name!r}: the cosent loss takes no `negatives`, `symmetric` or `temperature` "
                "(InfoNCE's, `loss: infonce`)."
            )
        if dimensions is not None and dimensions < 1:
            raise CardError(f"Task {task_name!r}: dimensions must be >= 1, got {dimensions}.")
        if spec.score_range is not None and not (scored and spec.score_range[0] < spec.score_range[1]):
            raise CardError(  # (what the gold scores span: -1 inside it is a score, not a missing one)
                f"Task {task_name!r}: score_range is the [low, high] of the gold scores of `score`, "
                f"low < high; got {list(spec.score_range)}"
                + ("." if scored else " on a card without `score`.")
            )
        self.scored, self.loss, self.temperature, self.symmetric = scored, loss, temperature, symmetric
        self.dimensions, self.candidates, self.pooling = dimensions, candidates, pooling
        self.default_metrics = CORRELATIONS if scored else RETRIEVAL
        if not scored:  # no gold scores to correlate with
            self.allowed_metrics, self.kind = RETRIEVAL, "embedding without `score`"

    @property
    def num_outputs(self) -> int:
        return self.dimensions or 0

    def served_labels(self) -> list[str]:
        return []

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> EmbeddingHead:
        return EmbeddingHead(
            n_embd,
            dimensions=self.dimensions,
            loss=self.loss,
            temperature=self.temperature,
            symmetric=self.symmetric,
            candidates=self.candidates,
            pooling=self.pooling,
            dropout=dropout,
            init_std=init_std,
            bias=bias,
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        anchors, positives = predictions[:, 0], predictions[:, 1]
        texts = text_keys(labels)[:, :2]
        asked = [m for m in metrics if m in RETRIEVAL]  # (Q x Q scores: none made for correlations alone)
        values = retrieval_metrics(anchors, positives, texts, asked) if asked else {}
        cosines = (anchors.double() * positives.double()).sum(dim=-1)
        for name in (m for m in metrics if m in CORRELATIONS):
            values[name] = metric_value(name, cosines, labels[:, 0], 0).float()
        return {name: values[name] for name in metrics}

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        """The cosine of the anchor and the positive."""
        return score_text(float(prediction[0] @ prediction[1]))

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        cosine = float(prediction[0] @ prediction[1])
        return {"label": cosine, "scores": cosine}

    def label_text(self, label: Any) -> Any:
        """The gold score (the rest of the row says which texts the example's are)."""
        return None if label is None else label[0]

    def example_label(self, example: dict[str, Any]) -> float | None:
        """The gold score; 1 for a pair that has none (a positive is a match)."""
        if not self.scored:
            return 1.0
        return super().example_label(example)

    def takes_minus_one(self) -> bool:
        """-1 is a gold score where the card's `score_range` holds it (a cosine's [-1, 1]); without
        one, the hub's mark of an unlabelled row (GLUE's STS-B test split)."""
        low, high = self.spec.score_range or (0.0, -1.0)
        return low <= -1 <= high

    def label_id(self, value: Any) -> float:
        """A gold score: a finite number, within the card's `score_range` where it has one."""
        self._missing(value)
        return finite_number(value, "score", self.spec.field, self.spec.score_range)


class Embedding(TaskAdapter):
    """An anchor, its positive and optional hard negatives, each `[start] text [extract]` alone,
    one vector per text (see the module docstring)."""

    def __init__(
        self,
        *,
        anchor: str = "anchor",
        positive: str = "positive",
        negatives: str | list[str] | None = None,
        num_negatives: int | None = None,
        score: str | None = None,
        loss: Literal["infonce", "cosent"] | None = None,
        temperature: float = TEMPERATURE,
        symmetric: bool = False,
        dimensions: int | None = None,
        pooling: Literal["extract", "last", "mean"] = "extract",
        query_prompt: str = "",
        document_prompt: str = "",
        **kwargs,
    ) -> None:
        """
        Args:
            anchor: Field holding the anchor (a query, or a pair's first text).
            positive: Field holding the text that matches it.
            negatives: Hard negatives: one field holding a text or a list of texts (a row or a file
                may lack it), or a list of fields holding one text each; None: the batch's other
                texts only.
            num_negatives: The most hard negatives a row has (a field holding a list; default 1).
            score: Field with the pair's gold similarity (STS-B's 0-5): CoSENT trains on it and
                Spearman scores against it; None: every pair is a match. A score of -1 marks an
                unlabelled row (as the hub's test splits do) unless the card's `score_range` (the
                scores' [low, high], e.g. [-1, 1]) holds it.
            loss: infonce (default without a score) or cosent (default with one).
            temperature: InfoNCE's τ (0.05: SimCSE's and E5's).
            symmetric: InfoNCE in both directions, averaged (pairs whose two sides play one part).
            dimensions: Project the pooled state to this many dimensions (a trained linear
                layer); None: the state itself.
            pooling: What a text's vector is read from. extract: GPT-1's extract token's state,
                `[start] text [extract]`; last: the text's last token's, `[start] text` (what
                sentence-transformers' last-token pooling reads from a decoder); mean: the mean of
                every token's state of `[start] text`. Kept with the model; see docs/tasks.md.
            query_prompt: Text put before each anchor (E5: "query: "); kept with the model.
            document_prompt: Text put before each positive and negative (E5: "passage: ").
        """
        no_labels = {"label": "label", "labels": None, "regression": False, "ignore_labels": None}
        refuse_label_fields(kwargs, no_labels, "an embedding task takes no `{field}` (see `score`).")
        self.anchor, self.positive, self.negatives = anchor, positive, negatives
        self.num_negatives = count_negatives(kwargs.get("name"), negatives, num_negatives)
        self.score = score
        self.loss = loss or ("cosent" if score else "infonce")
        self.temperature, self.symmetric, self.dimensions = temperature, symmetric, dimensions
        if self.loss not in ("infonce", "cosent"):  # (a card's is checked by its type; Python's here)
            raise CardError(f"Task {kwargs.get('name')!r}: loss is infonce or cosent, not {self.loss!r}.")
        if pooling not in POOLINGS:
            raise CardError(f"Task {kwargs.get('name')!r}: pooling is one of {POOLINGS}, not {pooling!r}.")
        self.pooling = pooling
        self.query_prompt, self.document_prompt = query_prompt, document_prompt
        super().__init__(label=score or "score", **kwargs)

    @property
    def num_sequences(self) -> int:  # type: ignore[override]
        return 2 + self.num_negatives

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return EmbeddingOutput(
            self.name,
            spec,
            scored=self.score is not None,
            loss=self.loss,
            temperature=self.temperature,
            symmetric=self.symmetric,
            dimensions=self.dimensions,
            candidates=1 + self.num_negatives,
            pooling=self.pooling,
        )

    def text_fields(self) -> list[str]:
        """The anchor, the positive, and the negatives' fields where they are several (one field of
        negatives may be missing from a file or a row: none then)."""
        return [self.anchor, self.positive, *(self.negatives if isinstance(self.negatives, list) else [])]

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[anchor, positive, negative, ...], each with its prompt."""
        needed = "an embedding row needs its anchor and its positive"  # (a missing field reads as null)
        anchor, positive = (needed_text(example[f], f, needed) for f in (self.anchor, self.positive))
        negatives = negative_texts(example, self.negatives, self.num_negatives)
        return [self.query_prompt + anchor] + [self.document_prompt + d for d in (positive, *negatives)]

    def frame(self, specials, *parts: list[int]) -> tuple[list[int], int]:
        """`[start] text [extract]`; pooling the text's own tokens (last, mean), `[start] text`."""
        ids = [specials.start, *parts[0]]
        return TaskAdapter.frame(specials, *parts) if self.pooling == "extract" else (ids, len(ids) - 1)

    def template(self, specials) -> tuple[str, str]:
        single, pair = super().template(specials)
        return (single, pair) if self.pooling == "extract" else (f"{specials[0]} $A", pair)

    def text_room(self, max_length: int) -> int:
        """The most tokens of one text (its prompt included) that fit `max_length` with its frame's
        special tokens: two around an extract token, one (the start) otherwise, as the exported
        tokenizer cuts it."""
        return max_length - (2 if self.pooling == "extract" else 1)

    def encode(self, example, tokens, specials, max_length):
        built = [self.frame(specials, text[: self.text_room(max_length)]) for text in tokens]
        sequences, score = [ids for ids, _ in built], self.output.example_label(example)
        texts = [text_key(ids) for ids in sequences] + [NO_TEXT] * (self.num_sequences - len(sequences))
        label = None if score is None else [score, *(k for key in texts for k in key)]
        return Encoded(sequences, [k for _, k in built], label)

    def sequence_roles(self, encoded):  # the anchor, the positive, the hard negatives
        return [min(i, 2) for i in range(len(encoded.sequences))]
