"""Per-example loss terms of a batch, and the one formula that combines them.

`batch_terms` runs the GPT over a batch and returns, per example, the summed next-token
cross-entropy and its number of targets (`lm_sum`, `lm_count`) and, with a task head, the head's
outputs (`logits`) and task loss (`task_loss`). Sums and counts, not means, so that evaluation can
weigh every example and token exactly once however the batches fall (see `eval_metrics.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters import TaskHead
from gpt_ft.data.batches import IGNORE_INDEX, PackedBatch, SharedContextBatch, TaskBatch, TokenBatch, gold
from gpt_ft.model import GPT, SharedPrefix
from gpt_ft.training.lm_loss import lm_losses


def combined_loss(task_loss: Tensor | None, lm_loss: Tensor | None, lm_coef: float) -> Tensor:
    """GPT-1 §3.2, L3 = L2 + λ·L1: the task loss plus `lm_coef` times the LM loss (the LM loss
    alone for a language model; the task loss alone when λ = 0)."""
    if task_loss is None:
        return lm_loss
    return task_loss + lm_coef * lm_loss if lm_coef > 0 else task_loss


def class_weights_of(task, weights: str | list[float] | Tensor, fit=None) -> Tensor | None:
    """The task loss's class weights a module is given (`class_weights`): one per class in id order,
    or `balanced`, n / (classes x n_k) counted from the training labels of the data module a `fit`
    (a Trainer) runs on, said in a line (None before it)."""
    count = task.output.class_weight_count if task is not None else None
    if count is None:
        raise ValueError("--model.class_weights applies to classification and multi-label tasks only.")
    if isinstance(weights, str):
        if weights != "balanced":
            raise ValueError(f"class_weights must be a weight per class or 'balanced', got {weights!r}.")
        if fit is None:
            return None
        if not hasattr(datamodule := fit.datamodule, "train_labels"):
            raise ValueError(
                "class_weights='balanced' counts the training labels of the run's TaskDataModule: fit with "
                "one (trainer.fit(module, datamodule=data)), or give a weight per class."
            )
        from lightning.pytorch.utilities.rank_zero import rank_zero_info  # (a Classifier: no Lightning)

        weights = task.output.balanced_weights(datamodule.train_labels())
        names = task.output.class_names or task.labels
        shown = ", ".join(f"{name} {w:.3f}" for name, w in zip(names, weights.tolist()))
        rank_zero_info(f"class weights (balanced, from the training labels): {shown}")
    weights = torch.as_tensor(weights, dtype=torch.float32)
    if weights.shape != (count,) or not bool((weights >= 0).all()):
        raise ValueError(
            f"--model.class_weights {weights.tolist()}: give each of the task's {count} classes a "
            "weight >= 0, in id order, or `balanced`."
        )
    return weights


def row_lm_terms(
    gpt: GPT, hidden: Tensor, targets: Tensor, *, padded: bool = True, positions: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Summed next-token cross-entropy and number of targets of each row, (rows,) each.

    `hidden` is (rows, T, C) and `targets` (rows, T) with -100 where there is nothing to predict;
    with `padded`, logits are computed for the positions with a target only: `positions` (the flat
    positions of those targets, from the collator; found here when None, which on a GPU waits for
    their count). The cross-entropy runs a chunk of positions at a time through the head, never
    holding all their logits (`lm_loss.py`).
    """
    rows, T = targets.shape
    keep = targets != IGNORE_INDEX
    if not padded:  # pretraining blocks: every position has a target, no gather needed
        sums = lm_losses(gpt, hidden.flatten(0, 1), targets.flatten()).view(rows, T).sum(dim=1)
    else:
        if positions is None:
            positions = keep.flatten().nonzero().flatten()
        positions = positions.to(hidden.device, non_blocking=True)
        losses = lm_losses(gpt, hidden.flatten(0, 1)[positions], targets.flatten()[positions])
        # The losses' own dtype: under 64-true or 16-true the default dtype is another.
        sums = torch.zeros(rows, device=hidden.device, dtype=losses.dtype)
        sums.index_add_(0, torch.div(positions, T, rounding_mode="floor"), losses)
    return sums, keep.sum(dim=1)


def batch_terms(gpt: GPT, head: TaskHead | None, batch: TokenBatch, *, lm: bool) -> dict[str, Tensor]:
    """Per-example terms of any batch (see the module docstring); `lm` asks for the LM terms."""
    if isinstance(batch, SharedContextBatch):
        return shared_context_terms(gpt, head, batch, lm=lm)
    if isinstance(batch, PackedBatch):
        return packed_terms(gpt, head, batch, lm=lm)
    ids = batch.input_ids
    B, S, T = ids.shape
    # Right padding needs no mask (so SDPA may use its flash kernel): causal attention already
    # keeps real tokens off the pads after them. LongRoPE's factors are each sequence's: by its mask.
    mask = getattr(batch, "attention_mask", None) if gpt.config.rope_type == "longrope" else None
    mask = None if mask is None else mask.view(B * S, T)  # (pretraining's blocks: none, and no padding)
    hidden = gpt(ids.view(B * S, T), mask)  # (B*S, T, C)
    out = {}
    if lm:
        targets, positions = batch.lm_targets.view(B * S, T), getattr(batch, "lm_positions", None)
        sums, counts = row_lm_terms(gpt, hidden, targets, padded=head is not None, positions=positions)
        out["lm_sum"], out["lm_count"] = sums.view(B, S).sum(dim=1), counts.view(B, S).sum(dim=1)
    if head is not None:
        K = batch.extract_index.shape[1]  # reads: one per sequence, or per step
        rows = batch.extract_sequence
        if rows is None:
            rows = torch.arange(K, device=ids.device).expand(B, K)
        index = ((torch.arange(B, device=ids.device)[:, None] * S + rows) * T + batch.extract_index).view(-1)
        positions = torch.arange(T, device=ids.device).repeat(B * S)
        extract = read_states(head, hidden.flatten(0, 1), index, positions).view(B, K, -1)  # (B, K, C)
        out.update(_task_terms(head, extract, batch))
    return out


def read_states(head: TaskHead, hidden: Tensor, index: Tensor, positions: Tensor) -> Tensor:
    """Each sequence's state (len(index), C) from the flattened states `hidden` (N, C): the one at
    `index` (its extract token), or, for a head that `pools_mean`, the mean over the sequence's
    tokens: the `positions[index] + 1` tokens that end at `index` (positions restart at 0 for each
    sequence, in padded rows and packed ones alike). Summed in fp64: a prefix sum's differences."""
    if not head.pools_mean:
        return hidden[index]
    sums = F.pad(hidden.double().cumsum(dim=0), (0, 0, 1, 0))  # sums[i]: the first i states
    count = positions[index] + 1
    return ((sums[index + 1] - sums[index + 1 - count]) / count[:, None]).to(hidden.dtype)


def shared_context_terms(
    gpt: GPT, head: TaskHead, batch: SharedContextBatch, *, lm: bool
) -> dict[str, Tensor]:
    """`batch_terms` of a `SharedContextBatch`: each `[start] context [delim]` runs once, each
    choice against its keys and values; the results equal those of the plain layout."""
    context, context_length, answers = batch.context_ids, batch.context_length, batch.answer_ids
    B, S, Ta = answers.shape
    Tc = context.shape[1]
    shared = SharedPrefix()
    if (
        gpt.config.rope_type == "longrope"
    ):  # its factors: a question's longest choice's, for context and choices
        ends = (batch.answer_extract + 1).masked_fill(~batch.choice_mask, 0).amax(dim=1)  # (B,)
        shared.lengths = (context_length + ends)[:, None]
    hidden_context = gpt(context, kv_cache=shared)  # (B, Tc, C); right padding needs no mask
    device = answers.device
    # Each choice's positions go on from its own context's length (padding past the table: clamped).
    positions = context_length[:, None] + torch.arange(Ta, device=device)  # (B, Ta)
    positions = positions.clamp(max=gpt.config.n_positions - 1).repeat_interleave(S, dim=0)
    keys = None  # contexts of one length: no mask, causal aligned to the lower right
    if batch.padded_contexts:  # their pads are masked
        context_keys = torch.arange(Tc, device=device)[None] < context_length[:, None]  # (B, Tc)
        keys = torch.cat([context_keys.repeat_interleave(S, dim=0), context_keys.new_ones(B * S, Ta)], 1)
    continued = shared.continued(S)
    if shared.lengths is not None:
        continued.lengths = shared.lengths.repeat_interleave(S, dim=0)
    hidden = gpt(answers.view(B * S, Ta), keys, position_ids=positions, kv_cache=continued)
    rows = torch.arange(B * S, device=device)
    extract = hidden[rows, batch.answer_extract.view(B * S)].view(B, S, -1)  # (B, S, C)
    out = _task_terms(head, extract, batch)
    if lm:
        # The plain layout predicts the context's tokens once per choice: count them so.
        choices = batch.choice_mask.sum(dim=1)
        context_sum, context_count = row_lm_terms(
            gpt, hidden_context, batch.context_targets, positions=batch.context_positions
        )
        answer_targets = batch.answer_targets.view(B * S, Ta)
        answer_sum, answer_count = row_lm_terms(gpt, hidden, answer_targets, positions=batch.answer_positions)
        # The delim's state (shared) predicts each choice's first token.
        delim = hidden_context[torch.arange(B, device=device), context_length - 1]  # (B, C)
        logprobs = F.log_softmax(gpt.lm_logits(delim).float(), dim=-1)  # (B, V)
        targets = batch.delim_targets
        has = targets != IGNORE_INDEX
        delim_losses = -logprobs.gather(1, targets.clamp(min=0)) * has  # (B, S)
        out["lm_sum"] = context_sum * choices + answer_sum.view(B, S).sum(1) + delim_losses.sum(1)
        out["lm_count"] = context_count * choices + answer_count.view(B, S).sum(1) + has.sum(1)
    return out


def packed_terms(gpt: GPT, head: TaskHead | None, batch: PackedBatch, *, lm: bool) -> dict[str, Tensor]:
    """`batch_terms` of a `PackedBatch`: the rows run once, each sequence attending to itself only;
    the results equal those of the padded batch of the same examples."""
    hidden = gpt(
        batch.input_ids,
        position_ids=batch.position_ids,
        documents=batch.documents,
        branches=batch.branches,
        cu_seqlens=batch.cu_seqlens,
        max_seqlen=batch.max_seqlen or None,
    ).flatten(0, 1)  # (R * L, C)
    B, out = len(batch), {}
    if lm:
        losses = lm_losses(gpt, hidden[batch.lm_positions], batch.lm_targets)
        weights = batch.lm_weights
        if weights is not None:  # a shared context's tokens, once per choice as the padded layout has them
            losses = losses * weights
        sums = torch.zeros(B, device=hidden.device, dtype=losses.dtype)
        out["lm_sum"] = sums.index_add_(0, batch.lm_examples, losses)
        counts = torch.zeros(B, device=hidden.device, dtype=torch.long)
        ones = torch.ones_like(batch.lm_examples) if weights is None else weights
        out["lm_count"] = counts.index_add_(0, batch.lm_examples, ones)
    if head is not None:
        K = batch.extract_index.shape[1]
        index = batch.extract_index.view(B * K)
        extract = read_states(head, hidden, index, batch.position_ids.flatten()).view(B, K, -1)  # (B, K, C)
        out.update(_task_terms(head, extract, batch))
    return out


def _task_terms(
    head: TaskHead, extract: Tensor, batch: TaskBatch | SharedContextBatch | PackedBatch
) -> dict[str, Tensor]:
    """The head's outputs and, for a labelled batch, each example's task loss."""
    out = {"logits": head(extract, batch.choice_mask)}
    if batch.labels is not None:
        out["task_loss"] = head.losses(out["logits"], gold(batch.labels))
    return out
