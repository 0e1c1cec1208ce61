"""Batches, typed: the one contract between the data modules and the model.

- `TokenBatch`: S token sequences per example, (B, S, T), and their next-token targets
  (pretraining blocks: S = 1, no padding).
- `TaskBatch`: a task's examples, padded, with where to read each sequence's extract token.
- `SharedContextBatch`: multiple-choice examples as one `[start] context [delim]` per example and
  each choice's continuation, so that the context runs once (`--data.shared_context`).
- `PackedBatch`: a task's examples laid end to end in rows, without padding (`--data.packing`,
  the default): positions restart at each sequence and attention stays inside it.

Lightning moves dataclass batches to the device field by field, on CUDA from page-locked memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gpt_ft.data.packing import pack_rows, sharing_pays
from gpt_ft.data.pinning import Pinnable

IGNORE_INDEX = -100  # targets the LM loss skips (padding)


@dataclass
class TokenBatch(Pinnable):
    """Token sequences and their next-token targets."""

    input_ids: Tensor
    """(B, S, T) token ids."""
    lm_targets: Tensor
    """(B, S, T) the next token, or -100 where there is nothing to predict."""
    index: Tensor
    """(B,) example (or block) ids: evaluation counts each once, predictions are written by them."""

    def __len__(self) -> int:
        return len(self.index)


@dataclass
class TaskBatch(TokenBatch):
    """A task's examples, each as S sequences `[start] ... [extract]`, padded to T tokens."""

    attention_mask: Tensor
    """(B, S, T) 1 for real tokens, 0 for padding."""
    extract_index: Tensor
    """(B, K) position of each read extract token in its sequence: K = S, one per sequence, or
    one per step where a sequence has several (`extract_sequence`)."""
    choice_mask: Tensor
    """(B, K) False for reads a row does not have (rows of fewer choices, or fewer steps)."""
    labels: Tensor | None = None
    """(B,) class ids, choice indices or scores, (B, L) label rows (scores: see `gold`); None: unlabelled."""
    split: str = ""
    """The split the examples come from (evaluation and predictions are kept per split)."""
    real_tokens: int = 0
    """Tokens that are not padding (a host count: throughput logs it without a device sync)."""
    extract_sequence: Tensor | None = None
    """(B, K) the sequence each read is in; None: read k is sequence k's extract token."""
    lm_positions: Tensor | None = None
    """(N,) where `lm_targets.flatten()` has a target, found by the collator (on the host, where a
    GPU would have to report the count back); None: found from `lm_targets` when needed."""


@dataclass
class SharedContextBatch(Pinnable):
    """Multiple-choice examples as one shared context and the choices' continuations.

    The LM targets add up to `TaskBatch`'s: the context's, counted once per choice, plus the choices'.
    """

    context_ids: Tensor
    """(B, Tc) `[start] context [delim]`, right-padded."""
    context_length: Tensor
    """(B,) real tokens of each context."""
    context_targets: Tensor
    """(B, Tc) the next context token; -100 at the delim and at padding."""
    answer_ids: Tensor
    """(B, S, Ta) `answer_k [extract]`, right-padded."""
    answer_targets: Tensor
    """(B, S, Ta) the next answer token; -100 at the extract and at padding."""
    delim_targets: Tensor
    """(B, S) each choice's first token, which the delim's state predicts (-100: no such choice)."""
    answer_extract: Tensor
    """(B, S) position of each choice's extract token within its continuation."""
    choice_mask: Tensor
    """(B, S) False for choices a row does not have."""
    index: Tensor
    """(B,) example ids."""
    labels: Tensor | None = None
    """(B,) the right choice; None when unlabelled."""
    split: str = ""
    real_tokens: int = 0
    """Tokens that are not padding, contexts counted once (a host count)."""
    context_positions: Tensor | None = None
    """Where `context_targets.flatten()` has a target (as `TaskBatch.lm_positions`)."""
    answer_positions: Tensor | None = None
    """Where `answer_targets.flatten()` has a target."""
    padded_contexts: bool = True
    """Whether some context is shorter than the longest (their pads are then masked; a host fact)."""

    def __len__(self) -> int:
        return len(self.index)


@dataclass
class PackedBatch(Pinnable):
    """A task's examples laid end to end in rows of L tokens, without padding between them.

    Each sequence is one unit (an example's may lie in different rows), choices sharing a context
    one: the context, then every choice's continuation; units are packed first-fit, longest first,
    into rows (`packing.pack_rows`), and only a row's tail is padding. Every sequence's positions start
    at 0; a token attends to the earlier tokens of its own sequence only (`documents`), and a
    choice's continuation to its shared context and itself (`branches`). The model's results equal
    those of the padded batch of the same examples.
    """

    input_ids: Tensor
    """(R, L) token ids, the pad id in each row's tail."""
    position_ids: Tensor
    """(R, L) each token's position within its sequence (a continuation: after its context)."""
    documents: Tensor
    """(R, L) the unit each token belongs to, numbered within the row; -1 at the tail."""
    branches: Tensor | None
    """(R, L) 0 for a shared context (and whole sequences), k for the k-th choice's continuation;
    None when no unit shares a context."""
    lm_positions: Tensor
    """(M,) positions (into the flattened rows) whose next token is predicted."""
    lm_targets: Tensor
    """(M,) the token each of them predicts."""
    lm_examples: Tensor
    """(M,) the example (batch row) each prediction belongs to."""
    lm_weights: Tensor | None
    """(M,) how many sequences of the padded layout make each prediction (a shared context's
    tokens: one per choice); None: each counts once."""
    extract_index: Tensor
    """(B, K) each read extract token (one per sequence, or per step), a position into the
    flattened rows."""
    choice_mask: Tensor
    """(B, K) False for reads a row does not have."""
    index: Tensor
    """(B,) example ids."""
    labels: Tensor | None = None
    split: str = ""
    real_tokens: int = 0
    """Tokens the rows compute (a host count): no padding, a recurring sequence once."""
    cu_seqlens: Tensor | None = None
    """(N + 1,) int32: where each unit, and each row's padded tail, starts in the flattened rows,
    then R * L: a variable-length attention kernel's offsets."""
    max_seqlen: int = 0
    """The longest of those segments (a host count, so no step reads it back from the device)."""

    def __len__(self) -> int:
        return len(self.index)


Batch = TokenBatch | TaskBatch | SharedContextBatch | PackedBatch


def _labels(examples: list[dict[str, Any]]) -> Tensor | None:
    """The examples' labels as one tensor when every example has one: long for class ids and choice
    indices; scores (and rows of them) as their float32 bits in int32, read back by `gold`, since
    under `bf16-true` Lightning casts a batch's float tensors (a gold 3.8 would read 3.796875)."""
    labels = [e["label"] for e in examples]
    if any(label is None for label in labels):
        return None
    values = [x for label in labels for x in (label if isinstance(label, list) else [label])]
    if any(isinstance(x, float) for x in values):
        return torch.tensor(labels, dtype=torch.float32).view(torch.int32)
    return torch.tensor(labels, dtype=torch.long)


def gold(labels: Tensor | None) -> Tensor | None:
    """A batch's labels as the heads take them: class ids as they are, scores back as float32."""
    return labels.view(torch.float32) if labels is not None and labels.dtype == torch.int32 else labels


def target_positions(targets: Tensor) -> Tensor:
    """(N,) the flat positions of `targets` (on the host) that hold a target, in order."""
    return (targets.flatten() != IGNORE_INDEX).nonzero().flatten()


def reads(example: dict[str, Any]) -> list[tuple[int, int]]:
    """(sequence, position) of each extract token an encoded example reads: one per sequence, or
    where the example names them (`extract_sequence`), several in one sequence."""
    positions = example["extract_index"]
    return list(zip(example.get("extract_sequence") or range(len(positions)), positions))


def collate(examples: list[dict[str, Any]], pad_id: int, split: str = "") -> TaskBatch:
    """Pad a list of encoded examples on the right into a batch; lm_targets hold -100 at padding
    and at each sequence's last token."""
    B = len(examples)
    S = max(len(e["input_ids"]) for e in examples)
    T = max(len(seq) for e in examples for seq in e["input_ids"])
    K = max(len(e["extract_index"]) for e in examples)
    input_ids = torch.full((B, S, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, S, T), dtype=torch.long)
    lm_targets = torch.full((B, S, T), IGNORE_INDEX, dtype=torch.long)
    extract_index = torch.zeros((B, K), dtype=torch.long)
    extract_sequence = torch.zeros((B, K), dtype=torch.long)
    choice_mask = torch.zeros((B, K), dtype=torch.bool)
    for b, example in enumerate(examples):
        for s, seq in enumerate(example["input_ids"]):
            n = len(seq)
            ids = torch.tensor(seq, dtype=torch.long)
            input_ids[b, s, :n] = ids
            attention_mask[b, s, :n] = 1
            lm_targets[b, s, : n - 1] = ids[1:]
        for k, (s, i) in enumerate(reads(example)):
            extract_index[b, k], extract_sequence[b, k], choice_mask[b, k] = i, s, True
        # Missing choices: one pad token each, never attended from real ones.
        attention_mask[b, len(example["input_ids"]) :, 0] = 1
    return TaskBatch(
        input_ids=input_ids,
        lm_targets=lm_targets,
        index=torch.tensor([e["index"] for e in examples], dtype=torch.long),
        attention_mask=attention_mask,
        extract_index=extract_index,
        choice_mask=choice_mask,
        labels=_labels(examples),
        split=split,
        real_tokens=sum(len(seq) for e in examples for seq in e["input_ids"]),
        extract_sequence=extract_sequence if any("extract_sequence" in e for e in examples) else None,
        lm_positions=target_positions(lm_targets),
    )


def collate_shared(
    examples: list[dict[str, Any]], pad_id: int, delim_id: int, split: str = ""
) -> SharedContextBatch | None:
    """Examples whose sequences share `[start] context [delim]` as a `SharedContextBatch`, or None
    when some example's sequences do not all start with the same context."""
    prefixes, answers = [], []
    for example in examples:
        n = shared_prefix(example["input_ids"], delim_id)
        if n is None:
            return None
        prefixes.append(example["input_ids"][0][:n])
        answers.append([seq[n:] for seq in example["input_ids"]])
    B = len(examples)
    S = max(len(a) for a in answers)
    Tc = max(len(p) for p in prefixes)
    Ta = max(len(seq) for a in answers for seq in a)
    context_ids = torch.full((B, Tc), pad_id, dtype=torch.long)
    context_targets = torch.full((B, Tc), IGNORE_INDEX, dtype=torch.long)
    answer_ids = torch.full((B, S, Ta), pad_id, dtype=torch.long)
    answer_targets = torch.full((B, S, Ta), IGNORE_INDEX, dtype=torch.long)
    delim_targets = torch.full((B, S), IGNORE_INDEX, dtype=torch.long)
    answer_extract = torch.zeros((B, S), dtype=torch.long)
    choice_mask = torch.zeros((B, S), dtype=torch.bool)
    for b, (prefix, choices) in enumerate(zip(prefixes, answers)):
        ids = torch.tensor(prefix, dtype=torch.long)
        context_ids[b, : len(prefix)] = ids
        context_targets[b, : len(prefix) - 1] = ids[1:]
        for k, seq in enumerate(choices):
            ids = torch.tensor(seq, dtype=torch.long)
            answer_ids[b, k, : len(seq)] = ids
            answer_targets[b, k, : len(seq) - 1] = ids[1:]
            delim_targets[b, k] = ids[0]
            answer_extract[b, k] = len(seq) - 1
            choice_mask[b, k] = True
    return SharedContextBatch(
        context_ids=context_ids,
        context_length=torch.tensor([len(p) for p in prefixes], dtype=torch.long),
        context_targets=context_targets,
        answer_ids=answer_ids,
        answer_targets=answer_targets,
        delim_targets=delim_targets,
        answer_extract=answer_extract,
        choice_mask=choice_mask,
        index=torch.tensor([e["index"] for e in examples], dtype=torch.long),
        labels=_labels(examples),
        split=split,
        real_tokens=sum(len(p) + sum(len(a) for a in c) for p, c in zip(prefixes, answers)),
        context_positions=target_positions(context_targets),
        answer_positions=target_positions(answer_targets),
        padded_contexts=any(len(p) < Tc for p in prefixes),
    )


def shared_prefix(sequences: list[list[int]], delim_id: int) -> int | None:
    """The length of `[start] context [delim]` when every sequence starts with it, else None."""
    first = sequences[0]
    if delim_id not in first:
        return None
    n = first.index(delim_id) + 1
    return n if all(seq[:n] == first[:n] for seq in sequences) else None


def collate_packed(
    examples: list[dict[str, Any]], pad_id: int, delim_id: int | None = None, split: str = ""
) -> PackedBatch:
    """Encoded examples packed into rows (see `PackedBatch`); with `delim_id`, an example whose
    sequences all start with the same `[start] context [delim]` runs its context once.

    A sequence that recurs in the batch (a shared hard negative, a premise with two hypotheses, a
    document two queries retrieve) runs once: its every occurrence reads the same positions, for
    its extract state and its LM terms alike, so the losses equal the padded batch's."""
    units = []  # per computed sequence: [tokens, positions, branches, lm (b, i, target, weight), extracts]
    seen: dict[tuple[int, ...], list] = {}  # a lone sequence's tokens -> its unit
    for b, example in enumerate(examples):
        sequences = example["input_ids"]
        n = shared_prefix(sequences, delim_id) if delim_id is not None and len(sequences) > 1 else None
        if n is not None and not sharing_pays(sequences, n):
            n = None  # many long continuations: apart, each attends over its own length only
        read = reads(example)
        if n is None:  # each sequence its own unit, or a read of the same sequence's
            for s, seq in enumerate(sequences):
                lm = [(b, i, seq[i + 1], 1) for i in range(len(seq) - 1)]
                extract = [(b, k, i) for k, (of, i) in enumerate(read) if of == s]
                if (unit := seen.get(tuple(seq))) is not None:
                    unit[3] += lm
                    unit[4] += extract
                    continue
                seen[tuple(seq)] = unit = [seq, list(range(len(seq))), [0] * len(seq), lm, extract]
                units.append(unit)
            continue
        context, k = sequences[0][:n], len(sequences)
        tokens, positions, branches = list(context), list(range(n)), [0] * n
        lm = [(b, i, context[i + 1], k) for i in range(n - 1)]  # the padded layout: once per choice
        extract, laid = [], {}  # an answer given twice (chosen = rejected) runs once: equal scores, a tie
        for s, seq in enumerate(sequences):
            answer = seq[n:]
            start = laid.setdefault(tuple(answer), len(tokens))
            lm.append((b, n - 1, answer[0], 1))  # the delim predicts each choice's first token
            lm += [(b, start + i, answer[i + 1], 1) for i in range(len(answer) - 1)]
            extract += [(b, k, start + i - n) for k, (of, i) in enumerate(read) if of == s]
            if start == len(tokens):
                tokens += answer
                positions += range(n, n + len(answer))
                branches += [s + 1] * len(answer)
        units.append([tokens, positions, branches, lm, extract])
    L, rows = pack_rows(units, [len(unit[0]) for unit in units])
    R, B = len(rows), len(examples)
    K = max(len(e["extract_index"]) for e in examples)
    input_ids = [[pad_id] * L for _ in range(R)]
    position_ids = [[0] * L for _ in range(R)]
    documents = [[-1] * L for _ in range(R)]
    branches = [[0] * L for _ in range(R)]
    lm_positions, lm_targets, lm_examples, lm_weights = [], [], [], []
    extract_index = [[0] * K for _ in range(B)]
    choice_mask = [[False] * K for _ in range(B)]
    starts = []  # of each unit and each row's tail, in the flattened rows
    for r, (used, placed) in enumerate(rows):
        starts += [r * L + offset for offset, _ in placed] + ([r * L + used] if used < L else [])
        for d, (offset, (tokens, positions, branch, lm, extract)) in enumerate(placed):
            end = offset + len(tokens)
            input_ids[r][offset:end], position_ids[r][offset:end] = tokens, positions
            documents[r][offset:end], branches[r][offset:end] = [d] * len(tokens), branch
            base = r * L + offset
            for b, i, target, weight in lm:
                lm_positions.append(base + i)
                lm_targets.append(target)
                lm_examples.append(b)
                lm_weights.append(weight)
            for b, k, i in extract:
                extract_index[b][k], choice_mask[b][k] = base + i, True
    shared = any(max(u[2]) > 0 for u in units)
    weighted = any(w != 1 for w in lm_weights)
    long = dict(dtype=torch.long)
    return PackedBatch(
        input_ids=torch.tensor(input_ids, **long),
        position_ids=torch.tensor(position_ids, **long),
        documents=torch.tensor(documents, **long),
        branches=torch.tensor(branches, **long) if shared else None,
        lm_positions=torch.tensor(lm_positions, **long),
        lm_targets=torch.tensor(lm_targets, **long),
        lm_examples=torch.tensor(lm_examples, **long),
        lm_weights=torch.tensor(lm_weights, **long) if weighted else None,
        extract_index=torch.tensor(extract_index, **long),
        choice_mask=torch.tensor(choice_mask, dtype=torch.bool),
        index=torch.tensor([e["index"] for e in examples], **long),
        labels=_labels(examples),
        split=split,
        real_tokens=sum(len(u[0]) for u in units),
        cu_seqlens=torch.tensor(starts + [R * L], dtype=torch.int32),
        max_seqlen=max(b - a for a, b in zip(starts, starts[1:] + [R * L])),
    )


def collate_batch(
    examples: list[dict[str, Any]], specials, *, packing: bool = True, shared: bool = False, split: str = ""
) -> PackedBatch | TaskBatch | SharedContextBatch:
    """A task's batch as training, evaluation and `Classifier` take it: packed rows, or padded
    (B, S, T), with `shared` (multiple choice) each example's context once where its choices share
    one. `specials`: the tokenizer's special token ids (pad, delim)."""
    if packing:
        return collate_packed(examples, specials.pad, specials.delim if shared else None, split)
    batch = collate_shared(examples, specials.pad, specials.delim, split) if shared else None
    return batch if batch is not None else collate(examples, specials.pad, split=split)


def collate_blocks(blocks: list[tuple[int, Tensor]]) -> TokenBatch:
    """Pretraining blocks of T + 1 tokens as inputs (B, 1, T), next-token targets and block numbers."""
    stacked = torch.stack([tokens for _, tokens in blocks])  # (B, T + 1)
    index = torch.tensor([i for i, _ in blocks], dtype=torch.long)
    return TokenBatch(input_ids=stacked[:, None, :-1], lm_targets=stacked[:, None, 1:], index=index)
