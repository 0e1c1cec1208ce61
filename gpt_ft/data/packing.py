"""How a batch's units are laid into packed rows: whether choices run their shared context once,
the row length and first-fit placement at the least estimated cost."""

from __future__ import annotations

ROW_TOKENS = 256
"""Rows are as long as the longest unit, or up to this many tokens where that packs them tighter."""
ATTENTION_COST = 1 / 4096
"""A row position's attention work per key, relative to the rest of its work (~1/(6·width))."""


def row_cost(length: int) -> float:
    """A row of `length` positions: every position's matmuls, and attention over its keys (masked or
    not, a dense kernel computes them)."""
    return length * (1 + length * ATTENTION_COST)


def sharing_pays(sequences: list[list[int]], n: int) -> bool:
    """Whether one unit of the shared `n`-token context and every continuation costs less than the
    sequences apart, a row's attention counted dense (`row_cost`); the losses are the same."""
    return row_cost(n + sum(len(s) - n for s in sequences)) <= sum(row_cost(len(s)) for s in sequences)


def pack_rows(items: list, lengths: list[int]) -> tuple[int, list[list]]:
    """The row length L and the rows, each `[used, [(offset, item), ...]]`, that pack `items` of
    `lengths` tokens first fit, longest first, at the least estimated cost.

    A row of L positions costs L·(1 + L·ATTENTION_COST): every position's matmuls, and attention
    over the row's L keys (masked or not, a dense kernel computes them). L is the longest item, or
    up to `ROW_TOKENS` where fewer, fuller rows cost less: R·L² (attention's memory) stays within
    max(longest, ROW_TOKENS) per token.
    """
    order = sorted(range(len(items)), key=lambda i: -lengths[i])
    longest, total = lengths[order[0]], sum(lengths)
    best = None
    for R in range(1, -(-total // longest) + 1):  # as few rows as the tokens allow, up to one per item
        L = max(longest, -(-total // R))
        if L > max(longest, ROW_TOKENS):
            continue
        rows: list[list] = []
        for i in order:
            row = next((r for r in rows if r[0] + lengths[i] <= L), None)
            if row is None:
                row = [0, []]
                rows.append(row)
            row[1].append((row[0], items[i]))
            row[0] += lengths[i]
        cost = len(rows) * row_cost(L)
        if best is None or cost < best[0]:
            best = (cost, L, rows)
    return best[1], best[2]
