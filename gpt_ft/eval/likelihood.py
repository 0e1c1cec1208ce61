"""log P(continuation | context) of many (context, continuation) requests, in packed rows: requests
that share their context (a multiple-choice example's choices, one after another) run it once, each
continuation attending to it and to itself (the model's `branches`), and no row holds padding
between requests; the vocabulary's logits are taken at the scored positions only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from gpt_ft.data.packing import pack_rows, sharing_pays
from gpt_ft.model import GPT


def scored_tokens(context: int, continuation: int, n_ctx: int) -> int:
    """How many continuation tokens `continuation_logprobs` scores: all, unless the input is longer
    than the model's context and loses its earliest tokens."""
    return min(continuation, min(context + continuation, n_ctx + 1) - 1)


def units(requests: Sequence[tuple[list[int], list[int]]], n_ctx: int) -> list[tuple[list, list, list, list]]:
    """The requests as units to pack, each (tokens, positions, branches, scored), `scored` holding
    (request, position in the unit, target) for every scored token. Consecutive requests of one
    context that fits with each continuation share it (where that costs less, `sharing_pays`): the
    context's last token predicts each continuation's first, whose other tokens are a branch of
    their own; any other request is its own unit, cut to the model's context from the left."""
    out, start = [], 0
    while start < len(requests):
        context, end = list(requests[start][0]), start + 1
        while end < len(requests) and list(requests[end][0]) == context:
            end += 1
        group = range(start, end)
        n, whole = len(context), [context + list(requests[i][1]) for i in group]
        if n and len(group) > 1 and all(len(t) - 1 <= n_ctx for t in whole) and sharing_pays(whole, n):
            tokens, positions, branches, scored, laid = list(context), list(range(n)), [0] * n, [], {}
            for s, i in enumerate(group):
                answer = list(requests[i][1])
                at = laid.setdefault(tuple(answer), len(tokens))  # a continuation given twice runs once
                scored.append((i, n - 1, answer[0]))
                scored += [(i, at + j, answer[j + 1]) for j in range(len(answer) - 1)]
                if at == len(tokens):
                    tokens += answer[:-1]
                    positions += range(n, n + len(answer) - 1)
                    branches += [s + 1] * (len(answer) - 1)
            out.append((tokens, positions, branches, scored))
        else:
            for i, text in zip(group, whole):
                text = text[-(n_ctx + 1) :]
                k = scored_tokens(n, len(requests[i][1]), n_ctx)
                inputs = text[:-1]
                if not inputs:
                    raise ValueError(
                        "A request of no context and a one-token continuation has nothing to score."
                    )
                scored = [(i, j, text[j + 1]) for j in range(len(inputs) - k, len(inputs))]
                out.append((inputs, list(range(len(inputs))), [0] * len(inputs), scored))
        start = end
    return out


@torch.no_grad()
def continuation_logprobs(
    gpt: GPT,
    requests: Sequence[tuple[list[int], list[int]]],
    *,
    batch_size: int = 16,
    progress: Callable[[Iterable], Iterable] = iter,
) -> list[float]:
    """log P(continuation | context), summed over the continuation's tokens, for each request.

    A request is (context ids, continuation ids); the context may be empty only if the
    continuation has more than one token (its first token then goes unscored). Inputs longer than
    the model's context lose their earliest tokens. About `batch_size` requests run at a time.
    """
    if any(not continuation for _, continuation in requests):
        raise ValueError("A continuation to score has no tokens.")
    device, n_ctx = next(gpt.parameters()).device, gpt.config.n_positions
    laid = units(requests, n_ctx)
    batches, count = [[]], 0  # units of about `batch_size` requests each
    for unit in laid:
        if count >= batch_size:
            batches.append([])
            count = 0
        batches[-1].append(unit)
        count += len({i for i, _, _ in unit[3]})
    out = torch.zeros(len(requests), dtype=torch.float64, device=device)  # read back once, at the end
    for batch in progress([b for b in batches if b]):
        L, rows = pack_rows(batch, [len(unit[0]) for unit in batch])
        R = len(rows)
        ids, positions = torch.zeros(R, L, dtype=torch.long), torch.zeros(R, L, dtype=torch.long)
        documents, branches = torch.full((R, L), -1, dtype=torch.long), torch.zeros(R, L, dtype=torch.long)
        flat, targets, owners, starts = [], [], [], []
        for r, (used, placed) in enumerate(rows):
            starts += [r * L + offset for offset, _ in placed] + ([r * L + used] if used < L else [])
            for d, (offset, (tokens, at, branch, scored)) in enumerate(placed):
                end = offset + len(tokens)
                ids[r, offset:end], positions[r, offset:end] = torch.tensor(tokens), torch.tensor(at)
                documents[r, offset:end], branches[r, offset:end] = d, torch.tensor(branch)
                flat += [r * L + offset + j for _, j, _ in scored]
                targets += [t for _, _, t in scored]
                owners += [i for i, _, _ in scored]
        hidden = gpt(
            ids.to(device),
            position_ids=positions.to(device),
            documents=documents.to(device),
            branches=branches.to(device) if branches.any() else None,
            cu_seqlens=torch.tensor(starts + [R * L], dtype=torch.int32, device=device),
            max_seqlen=max(b - a for a, b in zip(starts, starts[1:] + [R * L])),
        )
        # The head at the scored positions only (the vocabulary's matrix product is most of a small
        # model's work), as (N, V) rows: over (B, V, T) the CPU's sums were 1e-3 nats off.
        logits = gpt.lm_logits(hidden.flatten(0, 1)[torch.tensor(flat, device=device)]).float()
        logprobs = -F.cross_entropy(logits, torch.tensor(targets, device=device), reduction="none")
        out.index_add_(0, torch.tensor(owners, device=device), logprobs.double())
    return out.tolist()
