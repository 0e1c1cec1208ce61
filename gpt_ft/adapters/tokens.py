"""A text made of several fields, and examples' texts to token ids in one tokenizer call
(`TaskAdapter.encode_examples`'s first step).

A card may make one text of several fields (a multiple-choice context `[article, question]`, a
text `[title, body]`): `field_parts` reads each field's part, those after the first that is not
empty opening with a space, and `token_ids` tokenizes the joined text whole and splits its tokens
where the parts meet (by their offsets in the text), so that the parts together are the tokens the
whole text has. Read alone, a later part (" what is ...") would start with a token the text never
has in a tokenizer that marks every text's start with "▁" (a `Prepend` normalizer: Llama 2's,
Mistral's and Phi-3's tokenizer files), and an exported model's tokenizer, given the joined text,
would read other tokens than training did.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Any

from gpt_ft.adapters.sources import field_text


def field_parts(example: dict[str, Any], fields: list[str], strip: bool) -> list[str]:
    """The parts of one text made of `fields`: each field's text (stripped first with `strip`),
    those after the first that is not empty opening with a space, so that they join into the text."""
    parts, joined = [], False
    for text in (field_text(example[f], f) for f in fields):
        text = text.strip() if strip else text
        parts.append(f" {text}" if joined and text else text)
        joined = joined or bool(text)
    return parts


def unjoined(texts: list[str], groups: list[int]) -> list[str]:
    """`texts` (each field's part, `field_parts`, in `groups` of parts) as each field holds them:
    without the space a part opens with to join its text."""
    fields, at = [], 0
    for size in [*groups, *[1] * (len(texts) - sum(groups))]:
        parts, joined = texts[at : at + size], False
        for part in parts:
            fields.append(part[1:] if joined and part else part)
            joined = joined or bool(part)
        at += size
    return fields


def wholes(texts: list[str], groups: list[int]) -> list[str]:
    """`texts` with each group's parts joined into its text."""
    sizes = [*groups, *[1] * (len(texts) - sum(groups))]
    return ["".join(texts[at - size : at]) for at, size in zip(accumulate(sizes), sizes)]


def token_ids(
    tokenizer, texts: list[list[str]], groups: list[int], *, split_special_tokens: bool
) -> list[list[int]]:
    """The tokens of every example's every text (`texts`: each example's), flat, without special
    tokens; an example's first texts come in `groups` (their sizes) of parts of one text each, the
    rest one text each."""
    calls = dict(add_special_tokens=False, split_special_tokens=split_special_tokens)
    offsets = getattr(tokenizer, "is_fast", False)  # (a slow tokenizer has none: its parts read apart)
    alone, whole, plan = [], [], []  # each text (or part) read alone; each text in parts; where each goes
    for example in texts:
        at = 0
        for size in [*groups, *[1] * (len(example) - sum(groups))]:
            parts = example[at : at + size]
            if offsets and sum(map(bool, parts)) > 1:
                plan.append(("whole", len(whole), parts))
                whole.append("".join(parts))
            else:
                plan += [("alone", len(alone) + k, None) for k in range(size)]
                alone += parts
            at += size
    alone = tokenizer(alone, **calls)["input_ids"] if alone else []
    read = tokenizer(whole, return_offsets_mapping=True, **calls) if whole else {}
    ids = []
    for kind, k, parts in plan:
        if kind == "alone":
            ids.append(alone[k])
            continue
        tokens, spans = read["input_ids"][k], read["offset_mapping"][k]
        starts = list(accumulate(len(part) for part in parts[:-1]))  # where each later part starts
        part = []  # each token's: its first character's (a token trimmed to nothing, its forerunner's)
        for start, end in spans:
            part.append(part[-1] if start == end and part else bisect_right(starts, start))
        ids += [[t for t, p in zip(tokens, part) if p == n] for n in range(len(parts))]
    return ids
