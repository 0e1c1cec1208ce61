"""A corpus's documents cut into pieces where the tokenizer splits anyway, so that tokenizing the
pieces one by one gives the tokens of the whole documents; each piece drawn for train or validation,
and tokenized with the tokens that frame a document."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from tokenizers import PreTokenizedString
from tokenizers.pre_tokenizers import ByteLevel


@dataclass
class Piece:
    number: int
    text: str
    ends_document: bool
    starts_document: bool = False


class Partial(str):
    """A chunk of a document that continues in the next chunk."""


# Between a non-space character and one space followed by a non-space, or between a letter or
# digit and one newline followed by a non-space: GPT-2's split, Llama 3's and Qwen2's (which keep
# the line breaks after punctuation with it: ".\n" is one piece) and GPT-1's whitespace/punctuation
# pre-tokenizer all split there, so a cut there changes no token.
_EXACT_CUT = re.compile(r"(?<=\S)(?= \S)|(?<=[^\W_])(?=\n\S)")
_LOOKAHEAD = 8  # characters past a pre-token that decide where it ends (GPT-2's "'ll": 3)


def cut_point(text: str, limit: int, ends: Ends | None = None) -> int | None:
    """Where to end a piece of about `limit` characters (`limit` < len(text)), the text going on
    after it; None where it holds no exact cut (the piece grows with the text that follows).

    The last exact cut (see `_EXACT_CUT`) in the second half of the window, searched from its end;
    else (a stretch with no such break, e.g. unspaced scripts) the last end of a pre-token that is
    no whitespace (`ends`, see `pre_token_ends`) up to `limit`, read with what follows it in view;
    else (one pre-token longer than half the window: a DNA sequence, a run of digits) the first
    exact cut past `limit`.
    """
    for width in (256, 8192, limit // 2):  # searched 2 characters on: a cut at `limit` sees what follows
        cuts = [m.start() for m in _EXACT_CUT.finditer(text, max(limit - width, limit // 2), limit + 2)]
        if at := next((at for at in reversed(cuts) if at <= limit and _separable(text, at, ends)), None):
            return at
    # read `_LOOKAHEAD` on: "'" ends a pre-token in "you'r" and not in "you're"
    exact = _pre_token_cuts(text[: limit + _LOOKAHEAD], ends)
    if before := [end for end in exact if limit // 2 <= end <= limit]:
        return before[-1]
    after = (m.start() for m in _EXACT_CUT.finditer(text, limit) if _separable(text, m.start(), ends))
    first = next(after, len(text))  # or a pre-token's end before it (the text up to it read alone)
    first = next((end for end in _pre_token_cuts(text[: first + _LOOKAHEAD], ends) if end > limit), first)
    return first if first < len(text) else None


def _pre_token_cuts(text: str, ends: Ends | None) -> list[int]:
    """The ends of `text`'s pre-tokens that end in no whitespace, `_LOOKAHEAD` or more from its end."""
    found = ends(text) if ends else []
    return [
        end
        for end in found
        if end + _LOOKAHEAD <= len(text) and not text[end - 1].isspace() and _separable(text, end, ends)
    ]


def _separable(text: str, at: int, ends: Ends | None) -> bool:
    """Whether the tokenizer's normalizer (`ends.normalize`, if any) reads the text around `at` as
    its two sides apart (NFC joins a letter and a combining mark after it)."""
    normalize = getattr(ends, "normalize", None)
    if normalize is None:
        return True
    left, right = text[max(0, at - _LOOKAHEAD) : at], text[at : at + _LOOKAHEAD]
    return normalize(left) + normalize(right) == normalize(left + right)


Ends = Callable[[str], list[int]]


def pre_token_ends(backend) -> Ends | None:
    """Where a tokenizer's pre-tokens of a text end, but the last (the text may cut it short, or
    its last whitespace run: "。\n\n" alone is one pre-token where "。\n\n这" has two).

    The text starts where a document or an exact cut does, so the matches are the whole document's
    up to the last; a cut after a pre-token ending in no whitespace changes no token: its left part
    matches as it did (no pre-tokenizer reads past such a match), and its right part starts a match.
    None where no cut is exact: the tokenizer has no pre-tokenizer, or starts every text it reads with
    "▁" or a space (a `Prepend` normalizer; a `Metaspace` pre-tokenizer that prepends, as transformers
    writes Llama 2's and Mistral's, or that does not split; a `ByteLevel` one that adds a prefix
    space): a piece cut at "\nMar" would read "▁\nMar".
    """
    pre, normalizer = backend.pre_tokenizer, backend.normalizer
    if pre is None or any(_prepends(json.loads(part.__getstate__())) for part in (pre, normalizer) if part):
        return None

    def ends(text: str) -> list[int]:  # pre-tokens of the normalized text, by their original offsets
        split = PreTokenizedString(text)
        if normalizer is not None:
            split.normalize(normalizer.normalize)
        pre.pre_tokenize(split)
        return [end for _, (_, end), _ in split.get_splits("original", "char")[:-1]]

    ends.normalize = normalizer.normalize_str if normalizer is not None else None
    return ends


def _prepends(spec) -> bool:
    """Whether a normalizer's or pre-tokenizer's specification (JSON), or one it holds, prepends."""
    if isinstance(spec, list):
        return any(map(_prepends, spec))
    if not isinstance(spec, dict):
        return False
    kind, scheme = spec.get("type"), spec.get("prepend_scheme")
    metaspace = kind == "Metaspace" and (scheme != "never" or not spec.get("split"))
    byte_level = kind == "ByteLevel" and spec.get("add_prefix_space")  # a space before every text: "Ġ\n"
    return kind == "Prepend" or metaspace or byte_level or any(map(_prepends, spec.values()))


def pieces(documents: Iterator[str], piece_chars: int, ends: Ends | None = None) -> Iterator[Piece]:
    """Cut documents into pieces of about `piece_chars` characters (see `cut_point`)."""
    number = 0
    buffer = ""
    has_text = was_cut = False  # the current document so far holds more than whitespace; was cut
    for doc in documents:
        buffer += doc
        has_text = has_text or not doc.isspace() and doc != ""
        while len(buffer) > piece_chars and (cut := cut_point(buffer, piece_chars, ends)) is not None:
            yield Piece(number, buffer[:cut], False, not was_cut)
            number += 1
            buffer, was_cut = buffer[cut:], True
        if not isinstance(doc, Partial):
            if has_text or was_cut:  # the end-of-text token closes every document with text, or cut
                yield Piece(number, buffer, True, not was_cut)
                number += 1
            buffer, has_text, was_cut = "", False, False


# The tokens tokenizers end a document with, by their names (GPT-2's and its heirs', Llama 3's,
# Gemma's, Llama 2's and Mistral's); `EOS_TOKEN` is added to one that holds none of them.
DOCUMENT_ENDS = ("<|endoftext|>", "<|end_of_text|>", "<eos>", "</s>")


def document_end(tok) -> str:
    """The token that ends each document: the tokenizer's own end of text where it holds one as a
    special token (a pretrained model's, which it learned to predict there), else `<|endoftext|>`."""
    special = {*tok.all_special_tokens, *(t.content for t in tok.added_tokens_decoder.values() if t.special)}
    return next((t for t in DOCUMENT_ENDS if t in special), DOCUMENT_ENDS[0])


def text_start(tok) -> list[int]:
    """[its beginning-of-text token] where the tokenizer starts every text with one (Llama, Gemma:
    as the model read texts in training), else []."""
    lead = tok("a")["input_ids"][:1]
    return lead if tok.bos_token_id is not None and lead == [tok.bos_token_id] else []


def encode_batch(
    backend,
    batch: list[Piece],
    eos: int,
    dtype: str,
    lead: list[int],
    fraction: float,
    dropped: Counter | None = None,
) -> list[np.ndarray]:
    """Token ids of each piece, framed as a document in its split: `lead` (the tokenizer's bos, or
    none) before a document's first piece, the end-of-text token after its last; and so where the
    document goes on in the other split (`continues_elsewhere`), so that no two documents run
    together in a split and each part of one reads as a document does. With `dropped`, the
    characters no token stands for are counted in it (see `drops_text`)."""
    fast = getattr(backend, "encode_batch_fast", None) if dropped is None else None  # fast: no offsets
    encodings = (fast or backend.encode_batch)([piece.text for piece in batch], add_special_tokens=False)
    encoded = []
    for piece, encoding in zip(batch, encodings):
        if dropped is not None:
            dropped.update(left_out(piece.text, encoding.offsets))
        here = is_validation(piece.number, fraction)
        opens = piece.starts_document or is_validation(piece.number - 1, fraction) != here
        closes = piece.ends_document or continues_elsewhere(piece, fraction)
        ids = [*(lead if opens else ()), *encoding.ids, *((eos,) if closes else ())]
        encoded.append(np.asarray(ids, dtype=dtype))
    return encoded


def drops_text(backend) -> bool:
    """Whether the tokenizer may leave characters out of the tokens, unsaid: a BPE model with
    neither an unknown token nor byte fallback skips each character (or byte) its vocabulary lacks,
    where a WordLevel, WordPiece or Unigram model gives its unknown token or refuses the text."""
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE" or model.get("unk_token") is not None or model.get("byte_fallback"):
        return False
    # a byte-level BPE whose vocabulary spells every byte (GPT-2's, Llama 3's) drops nothing
    return not (
        _holds(spec.get("pre_tokenizer"), "ByteLevel") and set(ByteLevel.alphabet()) <= set(model["vocab"])
    )


def _holds(spec, kind: str) -> bool:
    """Whether a pre-tokenizer's specification (JSON) is, or holds, one of `kind`."""
    if isinstance(spec, list):
        return any(_holds(s, kind) for s in spec)
    return isinstance(spec, dict) and (
        spec.get("type") == kind or any(_holds(v, kind) for v in spec.values())
    )


_SPACES = np.array([c for c in range(0x3000 + 1) if chr(c).isspace()], dtype=np.uint32)


def left_out(text: str, offsets: list[tuple[int, int]]) -> str:
    """The characters of `text` no token's offsets cover, but whitespace (a pre-tokenizer's to drop)."""
    edges = np.zeros(len(text) + 1, np.int32)
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    np.add.at(edges, spans[:, 0], 1)
    np.add.at(edges, spans[:, 1], -1)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    bare = (np.cumsum(edges[:-1]) == 0) & ~np.isin(codes, _SPACES)
    return "".join(map(chr, codes[bare])) if bare.any() else ""


def is_validation(number: int, fraction: float) -> bool:
    """Deterministic split of piece `number`: validation with probability `fraction`."""
    digest = hashlib.blake2b(number.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def continues_elsewhere(piece: Piece, fraction: float) -> bool:
    """Whether the piece's document goes on in the other split: its part in this one then ends with
    an end-of-text token as a document does, so no two documents' texts run together in a split."""
    if piece.ends_document:
        return False
    return is_validation(piece.number + 1, fraction) != is_validation(piece.number, fraction)


def batches(items: Iterator[Piece], max_chars: int) -> Iterator[list[Piece]]:
    """Consecutive pieces grouped into lists of about `max_chars` characters."""
    batch: list[Piece] = []
    size = 0
    for item in items:
        batch.append(item)
        size += len(item.text)
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
