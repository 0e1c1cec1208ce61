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
    max(longest, ROW_TOKENS) per token. The lengths tried are those R rows would need, R = 1, 2, ...
    (`row_lengths`); on a tie the longer rows are kept.
    """
    order = sorted(range(len(items)), key=lambda i: -lengths[i])
    longest, total = lengths[order[0]], sum(lengths)
    best = None
    for L in row_lengths(longest, total):  # the longest rows first: they keep a tie
        if best is not None and -(-total // L) * row_cost(L) >= best[0]:
            continue  # even rows filled to the last token cost no less than the best found
        placed = first_fit([lengths[i] for i in order], L)
        cost = (max(placed) + 1) * row_cost(L)
        if best is None or cost < best[0]:
            best = (cost, L, placed)
    _, L, placed = best
    rows: list[list] = [[0, []] for _ in range(max(placed) + 1)]
    for i, r in zip(order, placed):
        rows[r][1].append((rows[r][0], items[i]))
        rows[r][0] += lengths[i]
    return L, rows


MOST_TRIED = 24
"""Row lengths tried at most for one batch (a batch of many short units offers one per length
between its longest and `ROW_TOKENS`, whose costs differ by a few percent)."""


def row_lengths(longest: int, total: int) -> list[int]:
    """The row lengths to try, longest first: the shortest that holds `total` tokens in R rows, for
    every R, within max(longest, `ROW_TOKENS`); where there are more than `MOST_TRIED`, as many
    evenly spread over them, the shortest and the longest among them."""
    cap = max(longest, ROW_TOKENS)
    found = sorted(
        {max(longest, -(-total // R)) for R in range(max(1, total // cap), -(-total // longest) + 1)}
    )
    found = [L for L in found if L <= cap][::-1]
    if len(found) <= MOST_TRIED:
        return found
    step = (len(found) - 1) / (MOST_TRIED - 1)
    return [found[round(k * step)] for k in range(MOST_TRIED)]


def first_fit(lengths: list[int], L: int) -> list[int]:
    """Each item's row, first fit in the given order into rows of `L` positions (each item at most
    L long): the first row with room, found in log(items) steps in a tree of the rows' free room."""
    size = 1 << max(0, len(lengths) - 1).bit_length()
    room = [L] * (2 * size)  # leaves size..2·size-1: each row's room (a row not opened yet: L); nodes: max
    placed = []
    for n in lengths:
        node = 1
        while node < size:
            node = 2 * node if room[2 * node] >= n else 2 * node + 1
        placed.append(node - size)
        room[node] -= n
        node //= 2
        while node and room[node] != max(room[2 * node], room[2 * node + 1]):
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return placed
