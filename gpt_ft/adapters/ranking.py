"""Rankings of N replies: the prompt once, a reward per reply, losses over the whole list.

GPT-1's multiple choice with the prompt encoded once (`--data.shared_context`, packed batches
alike): `[start] prompt [delim] reply [extract]` per reply, one linear layer scoring each extract
state. A row's replies carry scores (higher better; ties allowed; null: unranked), ranks (1 the
best), or come as chosen and rejected lists (RewardBench 2's layout: each chosen reply above each
rejected one; `RewardBench2` scores them by its own rules). The loss, over the replies a row ranks:
`plackett_luce` (ties Breslow's way), `softmax` (the best replies as the target) or `pairwise`
(Bradley-Terry over all pairs of different scores), each `Preference`'s loss on two replies; scored
by best-of-N accuracy, pairwise accuracy and Kendall's τ-b, rows averaged (docs/tasks.md). A row
whose replies all score the same orders nothing: it is left out of training and evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters.base import Encoded, TaskAdapter, refuse_label_fields
from gpt_ft.adapters.heads import at_top, first_best, tied
from gpt_ft.adapters.outputs import CardError, LabelSpec, TaskDataError, TaskOutput, score_text
from gpt_ft.adapters.preference import RewardHead, reply_templates
from gpt_ft.adapters.sources import cell_list, field_text, finite_number, short_repr
from gpt_ft.errors import about

LOSSES = ("plackett_luce", "softmax", "pairwise")
RANK_METRICS = ("best_of_n", "pairwise_accuracy", "kendall_tau")
UNSCORED = "__unscored__"  # a grouped record to predict alone: its sides give no scores


def ranking_losses(rewards: Tensor, scores: Tensor, loss: str) -> Tensor:
    """Each row's loss (B,) from rewards (B, K) and scores (B, K), NaN where a row has no reply or
    does not rank it (see the module docstring)."""
    ranked = ~scores.isnan()
    present = ~rewards.isnan()
    r = rewards.nan_to_num(0.0)
    better = scores[:, :, None] > scores[:, None, :]  # [b, i, j]: i above j (NaN: neither)
    if loss == "pairwise":
        pairs = F.softplus(r[:, None, :] - r[:, :, None])  # [b, i, j]: -log σ(r_i - r_j)
        return torch.where(better, pairs, 0.0).sum(dim=(1, 2)) / better.sum(dim=(1, 2)).clamp(min=1)
    low = torch.finfo(r.dtype).min
    if loss == "softmax":
        best = ranked & (scores == scores.nan_to_num(-math.inf).amax(dim=1, keepdim=True))
        everyone = torch.logsumexp(r.masked_fill(~present, low), dim=1)
        return everyone - torch.logsumexp(r.masked_fill(~best, low), dim=1)
    # Plackett-Luce: reply i against every present reply j not ranked above it
    rivals = present[:, None, :] & ~better.transpose(1, 2) & (ranked[:, :, None])
    terms = torch.logsumexp(r[:, None, :].expand_as(rivals).masked_fill(~rivals, low), dim=2) - r
    # replies tied at the bottom are last in any order (likelihood 1): only a reply with a rival
    # below it (ranked lower, or unranked) has a term
    counted = ranked & present & (rivals & (better | ~ranked[:, None, :])).any(dim=2)
    return torch.where(counted, terms, 0.0).sum(dim=1)


def rank_metric_values(rewards: Tensor, scores: Tensor) -> dict[str, Tensor]:
    """Best-of-N accuracy, pairwise accuracy and Kendall's τ-b (see the module docstring) of rows of
    rewards (N, K) against their scores (N, K), NaN where there is no reply or no score."""
    present = ~rewards.isnan()
    ranked = ~scores.isnan() & present
    s, r = scores.masked_fill(~ranked, math.nan), rewards.masked_fill(~ranked, math.nan)
    # best-of-N (unranked replies below ranked ones) in rows with a reply worse than the best; rewards
    # within `TIE` tie (one reply placed elsewhere in a packed row scores a few last bits apart)
    top = at_top(rewards)
    best = ranked & (s == s.nan_to_num(-math.inf).amax(dim=1, keepdim=True))
    best_of_n = (top & best).sum(dim=1) / top.sum(dim=1).clamp(min=1)
    best_of_n = best_of_n.masked_fill(~best.any(dim=1) | ~(present & ~best).any(dim=1), math.nan)
    ds, dr = s[:, :, None] - s[:, None, :], r[:, :, None] - r[:, None, :]  # [b, i, j], i < j counted
    even = tied(r[:, :, None], r[:, None, :])  # (NaN: a reply unranked, ties with none; never counted)
    upper = torch.ones_like(ds, dtype=torch.bool).triu(1) & ranked[:, :, None] & ranked[:, None, :]
    differ, hits = upper & (ds != 0), torch.where(even, 0.5, torch.where(ds * dr > 0, 1.0, 0.0))
    pairwise = torch.where(differ, hits, 0.0).sum(dim=(1, 2)) / differ.sum(dim=(1, 2))
    concordant = (upper & ~even & (ds * dr > 0)).sum(dim=(1, 2)).double()
    discordant = (upper & ~even & (ds * dr < 0)).sum(dim=(1, 2)).double()
    untied_scores, untied_rewards = differ.sum(dim=(1, 2)), (upper & ~even).sum(dim=(1, 2))
    tau = (concordant - discordant) / (untied_scores * untied_rewards).double().sqrt()
    tau = tau.masked_fill((untied_scores > 0) & (untied_rewards == 0), 0.0)  # rewards all tied: no order
    return {
        "best_of_n": best_of_n[~best_of_n.isnan()].double().mean(),
        "pairwise_accuracy": pairwise[~pairwise.isnan()].double().mean(),
        "kendall_tau": tau[~tau.isnan()].mean(),
    }


class RankingHead(RewardHead):
    """One reward per reply from one linear layer (`RewardHead`); a listwise loss over a row's
    ranking, plus `center_rewards`·(Σ r)²."""

    def __init__(self, n_embd: int, *, loss: str, max_replies: int, **kwargs) -> None:
        super().__init__(n_embd, **kwargs)
        self.loss, self.max_replies = loss, max_replies

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        rewards = self.predictions(outputs)[:, : outputs.shape[1]]
        losses = ranking_losses(rewards, labels[:, : outputs.shape[1]].float(), self.loss)
        if self.center_rewards:
            losses = losses + self.center_rewards * rewards.nan_to_num(0.0).sum(dim=1) ** 2
        return losses

    def predictions(self, outputs: Tensor) -> Tensor:
        """The rewards (B, max_replies), fp32; NaN for a reply the row does not have."""
        missing = outputs == torch.finfo(outputs.dtype).min  # ChoiceHead's mask
        rewards = outputs.float().masked_fill(missing, math.nan)
        return F.pad(rewards, (0, self.max_replies - rewards.shape[1]), value=math.nan)


class RankingOutput(TaskOutput):
    """A reward per reply, judged by how it ranks the row's replies."""

    kind = "ranking"
    problem_type = "regression"  # one reward per sequence: num_labels 1, as reward models are served
    served_per_sequence = True
    has_probabilities = False
    allowed_metrics = default_metrics = RANK_METRICS
    default_lm_coef = 0.0
    stratified = False  # a label is a row's scores (or its chosen and rejected replies): no class

    def __init__(
        self, task_name: str, spec: LabelSpec, *, loss: str, max_replies: int, center_rewards: float
    ) -> None:
        super().__init__(task_name, spec)
        if loss not in LOSSES:
            raise CardError(f"Task {task_name!r}: loss {loss!r} is not one of {list(LOSSES)}.")
        if not (center_rewards >= 0 and math.isfinite(center_rewards)):
            raise CardError(f"Task {task_name!r}: center_rewards must be >= 0, got {center_rewards}.")
        self.loss, self.max_replies, self.center_rewards = loss, max_replies, center_rewards

    @property
    def num_outputs(self) -> int:
        return 1

    def served_labels(self) -> list[str]:
        return ["reward"]

    def head(self, n_embd: int, *, dropout: float, init_std: float, bias: bool = True) -> RankingHead:
        return RankingHead(
            n_embd,
            loss=self.loss,
            max_replies=self.max_replies,
            center_rewards=self.center_rewards,
            dropout=dropout,
            init_std=init_std,
            bias=bias,
        )

    def metric_values(self, predictions: Tensor, labels: Tensor, metrics: list[str]) -> dict[str, Tensor]:
        values = rank_metric_values(predictions.double(), labels.double())
        return {name: values[name].float() for name in metrics}

    def format_prediction(self, prediction: Tensor, name: Callable[[int], str]) -> str:
        """The best reply's index; one reply: its reward."""
        label = self.outcome(prediction, prediction)["label"]
        return score_text(label) if isinstance(label, float) else str(label)

    def outcome(self, prediction: Tensor, probabilities: Tensor) -> dict[str, Any]:
        """The best reply's index (the first on a tie) and each reply's reward; one reply: its
        reward (as `label` and `scores`), as a pairwise reward model gives it."""
        rewards = [x for x in prediction.tolist() if not math.isnan(x)]
        if len(rewards) == 1:
            return {"label": rewards[0], "scores": rewards[0]}
        return {"label": first_best(rewards), "scores": rewards}

    def padded(self, scores: list[float] | None) -> list[float] | None:
        return None if scores is None else scores + [math.nan] * (self.max_replies - len(scores))


class Ranking(TaskAdapter):
    """N replies to one prompt, a reward each, a listwise loss (see the module docstring)."""

    shares_context = True
    keeps_context_end = True
    renders_chats = True  # replies written out with a template's tokens, as a `Preference` card's

    def __init__(
        self,
        *,
        prompt: str | None = "prompt",
        replies: str = "replies",
        scores: str | None = "scores",
        ranks: str | None = None,
        chosen: str | None = None,
        rejected: str | None = None,
        reply_text: str | None = None,
        reply_score: str | None = None,
        group_by: str | None = None,
        rejected_errors: str | None = None,
        loss: Literal["plackett_luce", "softmax", "pairwise"] = "plackett_luce",
        max_replies: int = 4,
        center_rewards: float = 0.0,
        **kwargs,
    ) -> None:
        """
        Args:
            prompt: Field holding the prompt; None: none.
            replies: Field holding the replies: a list of texts, or of records (`reply_text`).
            scores: Field holding each reply's score, higher better (null: unranked).
            ranks: Field holding each reply's rank instead, 1 the best.
            chosen: With `rejected`: fields holding lists of the chosen and the rejected replies
                (RewardBench 2), each chosen one above each rejected one; `replies` is then not read.
            rejected: See `chosen`.
            reply_text: Where the replies are records (UltraFeedback's completions): the key of the text.
            reply_score: The key of the score in those records.
            group_by: Records that share this field's value make one row (with `chosen` and
                `rejected`, each a reply or a list of steps, joined by lines): PRMBench's original
                solution above its modified ones, the duplicates once.
            rejected_errors: With `group_by`: a record's field listing the errors of its `rejected`
                reply; an empty list, the reply has none and ranks with the chosen (PRMBench's
                alternative right solutions: `error_steps: []`). Not read to score records.
            loss: plackett_luce, softmax or pairwise.
            max_replies: The most replies a row may have (a longer row is named).
            center_rewards: c of c·(Σ rewards)² added to each row's loss (0: none).
        """
        name = kwargs.get("name")
        refuse_label_fields(
            kwargs,
            {"labels": None, "regression": False, "score_range": None, "label": "label"},
            "a ranking task takes no `{field}` (`scores`, `ranks` or chosen/rejected lists say the order).",
        )
        if (chosen is None) != (rejected is None):
            raise CardError(f"Task {name!r}: give `chosen` and `rejected` together.")
        if (reply_text is None) != (reply_score is None):
            raise CardError(f"Task {name!r}: give `reply_text` and `reply_score` together.")
        if group_by is not None and chosen is None:
            raise CardError(f"Task {name!r}: `group_by` gathers `chosen` and `rejected` replies: give both.")
        if rejected_errors is not None and group_by is None:
            raise CardError(f"Task {name!r}: `rejected_errors` sorts what `group_by` gathers: give it.")
        if max_replies < 2:
            raise CardError(f"Task {name!r}: max_replies must be at least 2, got {max_replies}.")
        self.prompt, self.replies, self.scores, self.ranks, self.loss = prompt, replies, scores, ranks, loss
        self.chosen, self.rejected, self.group_by = chosen, rejected, group_by
        self.reply_text, self.reply_score, self.max_replies = reply_text, reply_score, max_replies
        self.rejected_errors, self.center_rewards = rejected_errors, center_rewards
        super().__init__(label="order" if chosen else ranks or scores or "scores", **kwargs)

    template = reply_templates

    def label_text(self, label: Any) -> Any:  # ranks as the card gives them (it trains on -rank)
        shown = super().label_text(label)
        return [None if x is None else -x for x in shown] if self.ranks and isinstance(shown, list) else shown

    @property
    def num_sequences(self) -> int:  # type: ignore[override]
        return self.max_replies

    @property
    def label_column(self) -> str | None:  # type: ignore[override]
        return None if self.chosen or self.reply_score else self.label

    @property
    def label_source(self) -> str:
        if self.chosen:
            return f"fields {self.chosen!r} and {self.rejected!r}"
        return f"each reply's {self.reply_score!r}" if self.reply_score else f"field {self.label!r}"

    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return RankingOutput(
            self.name, spec, loss=self.loss, max_replies=self.max_replies, center_rewards=self.center_rewards
        )

    def text_fields(self) -> list[str]:
        fields = [self.chosen, self.rejected] if self.chosen else [self.replies]
        return ([self.group_by or self.prompt] if self.group_by or self.prompt else []) + fields

    def regroup(self, records, where=None, alone=False) -> tuple[list[dict[str, Any]], list[int]] | None:
        """With `group_by`: one row per value, {prompt, chosen, rejected}, each reply once, with the
        first record of its group (for messages). A group whose replies are all chosen or all
        rejected orders nothing and is left out (23 of PRMBench's questions: 20 whose records are all
        other right solutions, 3 whose 'modified' solution is the original); a record `alone` is
        scored whatever its sides (`UNSCORED`)."""
        if self.group_by is None:
            return None
        groups: dict[str, tuple[dict[str, list[str]], int]] = {}
        for i, row in enumerate(records):
            with about(where, i, self.name):
                key = field_text(row[self.group_by], self.group_by)
                group, _ = groups.setdefault(key, ({"chosen": [], "rejected": []}, i))
                right = not alone and self.rejected_errors is not None and row[self.rejected_errors] == []
                for side, field in (
                    ("chosen", self.chosen),
                    ("chosen" if right else "rejected", self.rejected),
                ):
                    text = _reply_text(row[field], field)
                    if text not in group["chosen"] + group["rejected"]:
                        group[side].append(text)
        kept = [
            (key, g, first) for key, (g, first) in groups.items() if alone or g["chosen"] and g["rejected"]
        ]
        unscored = {UNSCORED: True} if alone else {}
        rows = [
            {self.group_by: key, self.chosen: g["chosen"], self.rejected: g["rejected"], **unscored}
            for key, g, _ in kept
        ]
        return rows, [first for _, _, first in kept]

    def orders_nothing(self, records, where=None) -> list[int]:
        """Records whose replies are all scored, alike (one reply with a score too): a loss of 0 dilutes
        the others', as the metrics."""
        found = []
        for i, row in enumerate(records):
            with about(where, i, self.name):
                scores = [s for _, s in self._replies(row)]
            found += [i] * (None not in scores and len(set(scores)) == 1)
        return found

    def to_predict(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record without its scores (`reply_score`'s too; chosen and rejected sides unscored)."""
        example = {**super().to_predict(record), **({UNSCORED: True} if self.chosen else {})}
        if self.reply_text and isinstance(replies := example.get(self.replies), (list, tuple)):
            keyed = [isinstance(v, dict) and self.reply_text in v for v in replies]  # (else as written)
            example[self.replies] = [
                {**v, self.reply_score: None} if k else v for v, k in zip(replies, keyed)
            ]
        return example

    def texts(self, example: dict[str, Any]) -> list[str]:
        """[prompt, reply_1, ..., reply_n]."""
        field = self.group_by or self.prompt
        prompt = field_text(example[field], field) if field else ""
        return [prompt, *(text for text, _ in self._replies(example))]

    def _replies(self, example: dict[str, Any]) -> list[tuple[str, float | None]]:
        """Each reply's text and score (None: unranked)."""
        if self.chosen:
            scored = not example.get(UNSCORED)
            sides = [
                (example[self.chosen], 1.0 if scored else None),
                (example[self.rejected], 0.0 if scored else None),
            ]
            fields = (self.chosen, self.rejected)
            replies = [(_reply_text(t, f), s) for (v, s), f in zip(sides, fields) for t in _as_list(v, f)]
        else:
            value = _as_list(example[self.replies], self.replies)
            if self.reply_text:
                f = self.replies
                replies = [
                    (_reply_text(_key(v, self.reply_text, f), f), _score(_key(v, self.reply_score, f), f))
                    for v in value
                ]
            else:
                field = self.ranks or self.scores
                given = example.get(field) if field else None
                given = [None] * len(value) if given is None else _as_list(given, field)
                if len(given) != len(value):
                    raise TaskDataError(
                        f"field {field!r} holds {len(given)} values for {len(value)} replies."
                    )
                order = [_score(g, field, rank=bool(self.ranks)) for g in given]
                replies = [(_reply_text(v, self.replies), o) for v, o in zip(value, order)]
        if not 1 <= len(replies) <= self.max_replies:
            raise TaskDataError(
                f"the row has {len(replies)} replies; the card takes 1 to max_replies {self.max_replies}."
            )
        return replies

    def encode(self, example, tokens, specials, max_length):
        prompt, *replies = tokens
        sequences, extract = self.choice_sequences(specials, prompt, replies, max_length)
        scores = [s for _, s in self._replies(example)]
        labelled = any(s is not None for s in scores)  # (one reply with a score: `orders_nothing`'s)
        label = self.output.padded([math.nan if s is None else s for s in scores]) if labelled else None
        return Encoded(sequences, extract, label)

    def sequence_roles(self, encoded):  # replies of one score (NaN: unscored, each its own)
        return None if encoded.label is None else encoded.label[: len(encoded.sequences)]


def _as_list(value: Any, field: str) -> list:
    value = cell_list(value)
    if not isinstance(value, (list, tuple)):
        raise TaskDataError(f"field {field!r} must hold a list, got {type(value).__name__}.")
    return list(value)


def _reply_text(value: Any, field: str) -> str:
    """A reply: a text, or a list of steps joined by lines."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if value is None or isinstance(value, (list, tuple, dict)):
        raise TaskDataError(f"field {field!r} holds a reply that is not a text: {short_repr(value)}.")
    return field_text(value, field)


def _key(record: Any, key: str, field: str) -> Any:
    if not isinstance(record, dict) or key not in record:
        raise TaskDataError(f"field {field!r} holds a reply without {key!r}: {short_repr(record)}.")
    return record[key]


def _score(value: Any, field: str, rank: bool = False) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    number = finite_number(value, "rank" if rank else "score", field)
    if rank and not (number >= 1 and number.is_integer()):
        raise TaskDataError(f"rank {value!r} in field {field!r} is not a whole number from 1 (the best).")
    return -number if rank else number  # rank 1 the best: the highest score
