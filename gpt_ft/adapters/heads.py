"""Task heads: how an example's extract states become the task's outputs, loss and predictions.

A head is a linear layer on the final state of the extract token (GPT-1 §3.3), with dropout
before it (GPT-1: 0.1). Each output kind builds its head (`TaskOutput.head` in `outputs.py`), so
that a new kind brings its own and the training code stays the same for every task. Heads subclass
`nn.Linear`, so that their parameters are `head.weight` and `head.bias` in every checkpoint. A
model without biases (the Llama family) gets a head without one, as its transformers
`*ForSequenceClassification` has (GPT-1's equation 3, `softmax(h W_y)`, has none either).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def at_least_fp32(t: Tensor) -> Tensor:
    """A loss's input in float32 (bf16 and fp16 raised), or float64 kept: `gpt-ft calibrate` fits its
    temperature on float64 losses, whose changes float32 would not resolve."""
    return t if t.dtype == torch.float64 else t.float()


TIE = 1e-6  # scores this close (relative to the best, or absolutely below 1) tie


def first_best(scores: list[float]) -> int:
    """The position of the best score, the first of those that tie with it (`TIE`): the same reply
    placed elsewhere in a packed row scores a few last bits apart, and which batch it fell in must
    not pick the winner."""
    best = max(scores)
    if math.isinf(best):  # (an overflowed score: only an equal one ties)
        return scores.index(best)
    return next(i for i, score in enumerate(scores) if score >= best - TIE * max(1.0, abs(best)))


def tied(scores: Tensor, best: Tensor) -> Tensor:
    """Where `scores` tie with `best` (`TIE`; an equal one, infinite too; NaN ties with nothing)."""
    tolerance = (TIE * best.abs().clamp(min=1.0)).nan_to_num(posinf=0.0)  # (an infinite best: equal only)
    return (scores == best) | ((scores - best).abs() <= tolerance)


def at_top(rewards: Tensor) -> Tensor:
    """Where each row's rewards (N, K) tie with its best (`tied`; NaN: no reply, never at the top;
    a row all -inf: all of them)."""
    best = rewards.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf).amax(dim=1, keepdim=True)
    return ~rewards.isnan() & tied(rewards, best)


class TaskHead(nn.Linear):
    """Dropout, the S sequences' extract states added (one sequence: itself), a linear layer.

    Subclasses give the loss and the predictions; `forward` is shared by those whose example is
    one point (classes, a score, several labels).
    """

    def __init__(
        self, n_embd: int, outputs: int, *, dropout: float = 0.1, init_std: float = 0.02, bias: bool = True
    ) -> None:
        super().__init__(n_embd, outputs, bias=bias)
        nn.init.normal_(self.weight, std=init_std)
        if bias:
            nn.init.zeros_(self.bias)
        self.dropout = nn.Dropout(dropout)
        self.pools_mean = False
        """Read each sequence's mean state over its tokens, not the state at its extract index."""
        self.register_buffer("class_weights", None, persistent=False)
        """Each class's weight in the loss (multi-label: each label's positives'), or None."""

    def forward(self, extract: Tensor, choice_mask: Tensor | None = None) -> Tensor:
        """Outputs (B, outputs) from extract states (B, S, C).

        Similarity (GPT-1 §3.3): the two orders' states are added before the linear layer, and the
        dropout is the linear layer's input's, one mask on their sum.
        """
        return F.linear(self.dropout(extract.sum(dim=1)), self.weight, self.bias)

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """Each example's task loss, (B,)."""
        raise NotImplementedError

    def predictions(self, outputs: Tensor) -> Tensor:
        """What the task predicts for each example, (B, ...)."""
        raise NotImplementedError

    def probabilities(self, outputs: Tensor) -> Tensor:
        """Each example's probability per class, choice or label (for a score: the score)."""
        raise NotImplementedError


class ClassificationHead(TaskHead):
    """One logit per class; cross-entropy; the likeliest class."""

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        # With class weights, each example's cross-entropy times its class's weight.
        return F.cross_entropy(at_least_fp32(outputs), labels, weight=self.class_weights, reduction="none")

    def predictions(self, outputs: Tensor) -> Tensor:
        return outputs.argmax(dim=-1)

    def probabilities(self, outputs: Tensor) -> Tensor:
        return outputs.float().softmax(dim=-1)  # a masked choice (score: the dtype's minimum) gets 0


class RegressionHead(TaskHead):
    """One score; squared error; the score, clipped to the task's range."""

    def __init__(
        self,
        n_embd: int,
        *,
        score_range: tuple[float, float] | None = None,
        dropout: float = 0.1,
        init_std: float = 0.02,
        bias: bool = True,
    ) -> None:
        super().__init__(n_embd, 1, dropout=dropout, init_std=init_std, bias=bias)
        self.score_range = score_range

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        return F.mse_loss(outputs.squeeze(-1).float(), labels.float(), reduction="none")

    def predictions(self, outputs: Tensor) -> Tensor:
        scores = outputs.squeeze(-1).float()
        return scores.clamp(*self.score_range) if self.score_range is not None else scores

    def probabilities(self, outputs: Tensor) -> Tensor:
        return self.predictions(outputs)


class ChoiceHead(ClassificationHead):
    """One scalar per choice from the same linear layer, softmax over a row's choices; a choice the
    row does not have is masked out (GPT-1 §3.3, multiple choice)."""

    def __init__(
        self,
        n_embd: int,
        *,
        dropout: float = 0.1,
        init_std: float = 0.02,
        bias: bool = True,
        choices: int | None = None,
    ) -> None:
        super().__init__(n_embd, 1, dropout=dropout, init_std=init_std, bias=bias)
        self.choices = choices

    def probabilities(self, outputs: Tensor) -> Tensor:
        """(B, `choices`): a batch's rows have as many columns as its widest, then 0s, so that
        batches of rows with fewer choices line up (a list field's rows differ)."""
        p = super().probabilities(outputs)
        return p if self.choices is None else F.pad(p, (0, self.choices - p.shape[1]))

    def forward(self, extract: Tensor, choice_mask: Tensor | None = None) -> Tensor:
        """Scores (B, S), one per choice, from extract states (B, S, C)."""
        scores = F.linear(self.choices_dropout(extract), self.weight, self.bias).squeeze(-1)  # (B, S)
        if choice_mask is None:
            return scores
        return scores.masked_fill(~choice_mask, torch.finfo(scores.dtype).min)

    def choices_dropout(self, extract: Tensor) -> Tensor:
        """Dropout of a row's states (B, S, C) with one mask for all of its S choices, as OpenAI's
        GPT-1 code (its `clf` dropout's noise shape: 1 across choices), which scores each choice by
        the same features."""
        if not self.training or self.dropout.p == 0:
            return extract
        return extract * self.dropout(extract.new_ones(extract.shape[0], 1, extract.shape[2]))


class StepHead(ChoiceHead):
    """One logit per step from one linear layer; binary cross-entropy over the labelled steps.

    Its `threshold` is the probability below which a step is judged wrong: a Python float, saved
    in the state dict as a float64 `threshold`, so that no cast of the module's floating tensors
    (bf16-true, FSDP's buffer dtype) rounds it (bf16 made 0.37 0.3691)."""

    def __init__(
        self,
        n_embd: int,
        *,
        max_steps: int,
        threshold: float,
        dropout: float = 0.1,
        init_std: float = 0.02,
        bias: bool = True,
    ) -> None:
        super().__init__(n_embd, dropout=dropout, init_std=init_std, bias=bias)
        self.max_steps, self.threshold = max_steps, float(threshold)
        self.register_state_dict_post_hook(_save_threshold)
        self.register_load_state_dict_pre_hook(_load_threshold)

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        """Each solution's mean binary cross-entropy over its labelled steps, (B,); `labels` (B,
        max_steps), NaN where a step has no label or the solution no step."""
        target = labels[:, : outputs.shape[1]].float()
        labelled = ~target.isnan()
        bce = F.binary_cross_entropy_with_logits(
            at_least_fp32(outputs), target.nan_to_num(0.0), reduction="none"
        )
        return torch.where(labelled, bce, 0.0).sum(dim=1) / labelled.sum(dim=1).clamp(min=1)

    def probabilities(self, outputs: Tensor) -> Tensor:
        """P(right so far) per step, (B, max_steps), NaN past a solution's steps."""
        missing = outputs == torch.finfo(outputs.dtype).min  # ChoiceHead's mask
        probabilities = outputs.float().sigmoid().masked_fill(missing, math.nan)
        return F.pad(probabilities, (0, self.max_steps - probabilities.shape[1]), value=math.nan)

    def predictions(self, outputs: Tensor) -> Tensor:
        """The probabilities, then the threshold they are judged at: (B, max_steps + 1)."""
        probabilities = self.probabilities(outputs)
        threshold = probabilities.new_full((len(probabilities), 1), self.threshold)
        return torch.cat([probabilities, threshold], dim=1)


def _save_threshold(head: StepHead, state: dict[str, Any], prefix: str, metadata) -> None:
    state[prefix + "threshold"] = torch.tensor(head.threshold, dtype=torch.float64)


def _load_threshold(
    head: StepHead, state, prefix: str, metadata, strict, missing, unexpected, errors
) -> None:
    saved = state.pop(prefix + "threshold", None)
    if saved is not None:
        head.threshold = float(saved)
    elif strict:
        missing.append(prefix + "threshold")
