"""Examples' texts to token ids, in one tokenizer call: `TaskAdapter.encode_examples`'s first step.

A text in parts (a multiple-choice context of several fields: RACE's article and question) is
tokenized whole and its tokens split where its parts meet (by their offsets in the text), so that
the parts together are the tokens the whole text has. Read alone, a later part (" what is ...")
would start with a token the text never has in a tokenizer that marks every text's start with "▁"
(a `Prepend` normalizer: Llama 2's, Mistral's and Phi-3's tokenizer files), and an exported
model's tokenizer, given the joined text, would read other tokens than training did.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate


def token_ids(
    tokenizer, texts: list[list[str]], joined: int, *, split_special_tokens: bool
) -> list[list[int]]:
    """The tokens of every example's every text (`texts`: each example's), flat, without special
    tokens; an example's first `joined` texts are parts of one text (none below 2)."""
    calls = dict(add_special_tokens=False, split_special_tokens=split_special_tokens)
    offsets = joined > 1 and getattr(tokenizer, "is_fast", False)  # a slow tokenizer's: parts apart
    whole = [n for n, example in enumerate(texts) if offsets and sum(map(bool, example[:joined])) > 1]
    apart = [t for n, example in enumerate(texts) for t in example[joined if n in whole else 0 :]]
    apart = iter(tokenizer(apart, **calls)["input_ids"] if apart else [])
    if whole:
        read = tokenizer(["".join(texts[n][:joined]) for n in whole], return_offsets_mapping=True, **calls)
        wholes = iter(zip(read["input_ids"], read["offset_mapping"]))
    ids = []
    for n, example in enumerate(texts):
        if n in whole:  # each token to the part its first character is in
            tokens, spans = next(wholes)
            starts = list(accumulate(len(part) for part in example[: joined - 1]))  # the later parts'
            part = [bisect_right(starts, start) for start, _ in spans]
            ids += [[t for t, k in zip(tokens, part) if k == p] for p in range(joined)]
        ids += [next(apart) for _ in example[joined if n in whole else 0 :]]
    return ids
