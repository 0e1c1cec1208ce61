"""How an example longer than `max_length` is cut, and how the cuts are told: `fit_lengths` (the
tokenizer's `longest_first`), each encoded example's `cut` kind, and a split's count of them."""

from __future__ import annotations

from typing import Any

WHOLE, CUT, ALIKE = 0, 1, 2
"""`Encoded.cut`: the example fits; it was cut; it was cut and two of its sequences, different
whole, became the same tokens (choices, replies or texts the model cannot tell apart)."""


def fit_lengths(lengths: list[int], budget: int) -> list[int]:
    """The lengths texts are cut to so that together they fit `budget` tokens: transformers'
    `truncation="longest_first"` (the `tokenizers` library's), so that a tokenizer exported with the
    input transform (`gpt-ft export`) keeps token for token what training kept.

    One text is cut to the budget. Of two, the shorter (the first, on a tie) keeps up to half the
    budget, rounded down, and the other the rest: [9, 9] with budget 5 gives [2, 3], [10, 9] gives
    [3, 2], [40, 30] with 62 gives [32, 30], [3, 9] with 8 gives [3, 5]. Three or more
    texts (no tokenizer cuts those) lose one token at a time from the longest, ties cutting the
    later text: [10, 3, 7] with budget 12 gives [5, 3, 4].
    """
    if budget < 0:
        raise ValueError(f"No room for text: the special tokens alone exceed the maximum length ({budget}).")
    if sum(lengths) <= budget:
        return list(lengths)
    if len(lengths) == 1:
        return [budget]
    if len(lengths) == 2:
        first, second = lengths
        if first > second:
            kept = min(second, budget // 2)
            return [budget - kept, kept]
        kept = min(first, budget // 2)
        return [kept, budget - kept]
    # Find the largest cap c with sum(min(l, c)) <= budget, then hand leftover tokens to the
    # longest texts (earliest first), which is what cutting one token at a time from the longest gives.
    lo, hi = 0, max(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            lo = mid
        else:
            hi = mid - 1
    out = [min(n, lo) for n in lengths]
    spare = budget - sum(out)
    for i, n in enumerate(lengths):
        if spare and n > lo:
            out[i] += 1
            spare -= 1
    return out


def cut_kind(
    adapter, example: dict[str, Any], tokens: list[list[int]], specials, max_length: int, encoded
) -> int:
    """`WHOLE`, `CUT` or `ALIKE` for `encoded`, `example` as `adapter` encoded it at `max_length`
    from `tokens`. A cut fills the longest sequence to `max_length` exactly, so only an example
    with one so long is encoded again, with room for every token (each text framed by at most
    3 special tokens), and compared. Sequences of one role (`TaskAdapter.sequence_roles`: two
    wrong choices, two replies of one score) that become alike lose nothing."""
    if max(map(len, encoded.sequences), default=0) < max_length:
        return WHOLE
    room = sum(map(len, tokens)) + 3 * len(tokens) + 3
    whole = adapter.encode(example, tokens, specials, max(room, max_length)).sequences
    if whole == encoded.sequences:
        return WHOLE
    roles = adapter.sequence_roles(encoded) or range(len(whole))
    seen: dict[tuple[int, ...], list[int]] = {}
    for i, ids in enumerate(encoded.sequences):
        alike = seen.setdefault(tuple(ids), [])
        if any(whole[j] != whole[i] and roles[j] != roles[i] for j in alike):
            return ALIKE
        alike.append(i)
    return CUT


LONGER = "raise --data.max_length"
"""The remedy an example too long for `max_length` names where a model trains (`cut_report`, the
adapters' refusals); a trained model reads at its own, and its readers name `TRAINED` instead."""
TRAINED = "a model reads at most the max_length it was trained at: train one at a larger --data.max_length"


def cut_report(
    what: str, kinds: list[int], max_length: int, items: str = "examples", remedy: str = LONGER
) -> str | None:
    """The line saying how many of `what`'s `items` (a split's examples, a file's texts) `max_length`
    cut (`kinds`: each one's `cut`), and how many lost what told their sequences apart (`remedy`);
    None where none was cut."""
    cut = sum(kind != WHOLE for kind in kinds)
    if not cut:
        return None
    share = cut / len(kinds)
    shown = "<0.1%" if share < 0.0005 else ">99.9%" if 0.9995 <= share < 1 else f"{share:.1%}"
    line = f"{what}: {cut:,} of {len(kinds):,} {items} ({shown}) are longer than max_length {max_length}"
    line += " and are cut"
    if alike := sum(kind == ALIKE for kind in kinds):
        line += (
            f"; in {alike:,} of them two of their sequences (choices, replies, texts) become the same "
            f"tokens, which no model can tell apart: {remedy}"
        )
    return line + "."
