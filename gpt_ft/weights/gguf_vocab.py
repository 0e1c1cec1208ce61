"""A tokenizer as a GGUF file's metadata, as llama.cpp reads it, from the tokenizer.json of a
transformers folder (transformers' AutoTokenizer may rebuild a qwen2 folder's pre-tokenizer; the file
is what it holds).

Byte-level BPE goes in as llama.cpp's "gpt2" model: the vocabulary by id, merges, and the
pre-tokenizer's llama.cpp name, read from tokenizer.json's pre-tokenizer (GPT-2's pattern, SmolLM's
digits first, Llama 3's, Qwen2's or GPT-4o's split). SentencePiece's BPE as Gemma's tokenizer.json holds it
(spaces as "▁", no space put before a text, unknown characters as byte tokens), or Llama 2's (a space
put before each piece of text between added tokens), goes in as llama.cpp's
"llama" model: each piece with its score (llama.cpp merges the pair whose piece scores highest,
transformers by its merges' order, which for these vocabularies is the pieces' by id: the score is
minus that rank), byte tokens `<0xNN>` as bytes, and runs of spaces as the tokenizer holds them:
user-defined tokens, which llama.cpp takes from the text whole, longest first (as gpt_ft reads Gemma's
own files, which hold them so), or pieces of the merges ("▁▁", merged by rank: 32 spaces as two
runs of 16). Either way ids the model has and the tokenizer lacks are unused
`[PAD{id}]`, special tokens control tokens, other added ones user-defined, with gguf's `SpecialVocab`
for bos/eos/padding ids and the chat template. A tokenizer llama.cpp would read otherwise is refused
(`check_added_tokens`: added tokens that strip the whitespace beside them, which llama.cpp does only in
files named for Phi-3).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

GPT2 = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}  # (llama.cpp adds no space)
BYTES = dict(GPT2, use_regex=False)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}", 1)  # each digit apart
_WORD = r"[^\r\n\p{L}\p{N}]?"  # (GPT-4o's words: a capital run and a lower-case run, a contraction)
_UPPER, _LOWER, _ENDS = (
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]",
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
)
GPT4O_SPLIT = (f"{_WORD}{_UPPER}*{_LOWER}+{_ENDS}|{_WORD}{_UPPER}+{_LOWER}*{_ENDS}|"
               r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
"""GPT-4o's pattern (o200k), Phi-4-mini's: words split at their capitals, contractions kept on."""
ISOLATED = {"behavior": "Isolated", "invert": False}  # each match a piece of its own
PRE_TOKENIZERS = {  # llama.cpp's name: (tokenizer.json's normalizer, its pre-tokenizer's steps)
    "gpt-2": (None, [GPT2]),
    "smollm": (None, [{"type": "Digits", "individual_digits": True}, GPT2]),
    "llama-bpe": (None, [{"type": "Split", "Regex": LLAMA3_SPLIT, **ISOLATED}, BYTES]),
    "dbrx": (None, [{"type": "Split", "Regex": LLAMA3_SPLIT, **ISOLATED}, BYTES]),  # (GPT-4's: OLMo 2's)
    "qwen2": ("NFC", [{"type": "Split", "Regex": QWEN2_SPLIT, **ISOLATED}, BYTES]),
    "gpt-4o": (None, [{"type": "Split", "Regex": GPT4O_SPLIT, **ISOLATED}, BYTES]),
}
SPACE = "\u2581"  # SentencePiece's space
SPACES = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}  # and no space put first
SPACE_FIRST = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, SPACES]}
"""SentencePiece's spaces as Llama 2's, Mistral's and Phi-3-mini's tokenizer.json read them: one put before
each piece of text between added tokens, as llama.cpp's `add_space_prefix` does."""
AT_SPACES = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def write_vocabulary(writer, folder: Path, vocab_size: int, frame: tuple[int, int | None] | None = None):
    """The tokenizer of transformers folder `folder` into GGUF writer `writer`, for a model of
    `vocab_size` rows; with `frame` (start, extract), GPT-1's start and extract tokens as the bos and
    eos llama.cpp adds around each text."""
    import gguf
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec = json.loads(backend.to_str())
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    for kind in ("bos", "eos", "pad", "unk"):  # (any other token past the model's rows is left out)
        token = config.get(f"{kind}_token")
        token = token.get("content") if isinstance(token, dict) else token
        if token is not None and (index := backend.token_to_id(token) or 0) >= vocab_size:
            raise ValueError(
                f"{folder}: the tokenizer's {kind} token {token} (id {index}) is past the model's "
                f"{vocab_size} ids: the model has no row for it."
            )
    pieces = _sentencepiece(spec)
    if pieces:
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_add_space_prefix(spec["normalizer"] == SPACE_FIRST)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_pre_tokenizer(spec, folder))
    by_id = {index: token for token, index in backend.get_vocab(with_added_tokens=True).items()}
    added = backend.get_added_tokens_decoder()
    tokens, scores, types, rank = [], [], [], 0
    for index in range(vocab_size):
        token, kind, score = by_id.get(index), "NORMAL", -1000.0
        if token is None or token == f"[PAD{index}]":  # (as read from a file that has it unused)
            token, kind = f"[PAD{index}]", "UNUSED"
        elif index in added and not (pieces and set(token) == {SPACE}):  # (runs spelled "▁": merged)
            kind = "CONTROL" if added[index].special else "USER_DEFINED"  # (matched in the text first)
            token = token if added[index].special or not pieces else token.replace(SPACE, " ")
        elif pieces and BYTE_PIECE.fullmatch(token):
            kind, score = "BYTE", 0.0
        else:
            score, rank = -float(rank), rank + 1
        tokens.append(token)
        scores.append(score)
        types.append(getattr(gguf.TokenType, kind))
    writer.add_token_list(tokens)
    if pieces:
        writer.add_token_scores(scores)
    writer.add_token_types(types)
    said = logging.getLogger("gguf.vocab")
    said.addFilter(no_template_guesses)
    try:
        vocab = gguf.SpecialVocab(folder, load_merges=not pieces, n_vocab=vocab_size)
    finally:
        said.removeFilter(no_template_guesses)
    if frame is not None:  # GPT-1's transform: start before each text, extract after it
        vocab.special_token_ids["bos"] = frame[0]
        if frame[1] is not None:
            vocab.special_token_ids["eos"] = frame[1]
        vocab.add_special_token.update(bos=True, eos=frame[1] is not None)
    else:  # whether texts start with bos and end with eos, as llama.cpp frames them
        framed = backend.encode("x").ids or [None]  # (none: a vocabulary without "x")
        for kind in ("bos", "eos"):
            index = vocab.special_token_ids.get(kind)
            vocab.add_special_token[kind] = index is not None and framed[0 if kind == "bos" else -1] == index
    vocab.add_to_gguf(writer, quiet=True)


PHI3_TOKENS = ("<unk>", "<s>", "</s>", "<|endoftext|>")
"""What llama.cpp looks up in a file whose name holds "phi3" or "phi-3", which it takes for Phi-3's: it
cannot load one without them, and takes the whitespace after every added token of it with the token
but after `PHI3_KEPT` (as Phi-3-mini's tokenizer.json does); in any other file, after none."""
PHI3_KEPT = ("<unk>", "<s>", "<|endoftext|>")


def check_added_tokens(name: str, folder: Path) -> None:
    """Refuse, in one sentence, the tokenizer of transformers folder `folder` where llama.cpp would read
    its added tokens otherwise in a GGUF file named `name`: a token taking the whitespace beside it
    (lstrip, rstrip) or matched as a whole word only (single_word) where llama.cpp's would not, or the
    reverse (see `PHI3_TOKENS`); and, named for Phi-3, a vocabulary lacking one of `PHI3_TOKENS`."""
    if not (folder / "tokenizer.json").is_file():
        return
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    added, phi3 = spec.get("added_tokens") or [], re.search("phi-?3", name, re.IGNORECASE) is not None
    held = set((spec.get("model") or {}).get("vocab", {})) | {token.get("content") for token in added}
    if phi3 and (missing := [token for token in PHI3_TOKENS if token not in held]):
        raise ValueError(
            f"llama.cpp reads a GGUF file named {name!r} (general.name) as Phi-3's and looks up its tokens "
            f"{', '.join(PHI3_TOKENS)}, of which this vocabulary lacks {', '.join(missing)}, so it could not "
            "load the file: give --out another name."
        )
    kept = ", ".join(PHI3_KEPT[:-1]) + f" and {PHI3_KEPT[-1]}"
    holds = "and matches each wherever the text holds it"
    rule = (f"llama.cpp takes the whitespace after every added token of a file named for Phi-3 ({name!r}) "
            f"with it, but after {kept}, {holds}") if phi3 else (
            "llama.cpp takes no whitespace beside an added token (but after those of a file named for "
            f"Phi-3: \"phi3\" or \"phi-3\" in --out's name), {holds}")  # fmt: skip
    pieces = _sentencepiece(spec)  # (the text normalized: a "▁" for each space, one put first)
    for token in added:
        strips = phi3 and token.get("content") not in PHI3_KEPT
        wrong = [flag for flag in ("lstrip", "single_word") if token.get(flag)]
        wrong += ["normalized"] * bool(pieces and token.get("normalized"))
        wrong += ["whitespace alone"] * (phi3 and not str(token.get("content")).strip())  # (taken after one)
        if bool(token.get("rstrip")) != strips:
            wrong.append("rstrip" if token.get("rstrip") else "no rstrip")
        if wrong:
            raise ValueError(
                f"{folder}: the tokenizer's added token {token.get('content')!r} has {' and '.join(wrong)}, "
                f"and {rule}: llama.cpp's token ids would not be the tokenizer's."
            )


def _sentencepiece(spec: dict) -> bool:
    """Whether tokenizer.json holds SentencePiece's BPE as llama.cpp's "llama" model reads it: merges
    over characters with bytes for the rest, spaces read as "▁" and none put before a text."""
    model = spec.get("model") or {}
    return (
        model.get("type") == "BPE"
        and model.get("byte_fallback", False)
        and not model.get("ignore_merges", False)
        and spec.get("normalizer") in (SPACES, SPACE_FIRST)
        and spec.get("pre_tokenizer") in (None, AT_SPACES)  # (no space is left to split at)
    )


def _pre_tokenizer(backend: dict, folder: Path) -> str:
    """llama.cpp's name for a byte-level BPE tokenizer's pre-tokenizer (and normalizer)."""
    pre = backend.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    shape = [
        {k: v for k, v in step.items() if k in ("type", "add_prefix_space", "use_regex", "individual_digits")}
        for step in steps
    ]
    if steps and steps[0].get("type") == "Split":
        split = steps[0]
        shape[0].update(Regex=(split.get("pattern") or {}).get("Regex"), behavior=split.get("behavior"),
                        invert=split.get("invert", False))  # fmt: skip
    normalizer, model = (backend.get("normalizer") or {}).get("type"), backend.get("model") or {}
    if model.get("type") == "BPE":
        for name, wanted in PRE_TOKENIZERS.items():  # (llama.cpp's Llama 3 takes a word it has whole)
            if wanted == (normalizer, shape) and model.get("ignore_merges", False) == (name == "llama-bpe"):
                return name
    raise ValueError(
        f"{folder}: llama.cpp has no pre-tokenizer this toolkit can name for this tokenizer's "
        f"({json.dumps(pre)}); GGUF files are written for byte-level BPE with GPT-2's pattern, SmolLM's, "
        "Llama 3's, Qwen2's or GPT-4o's, and for SentencePiece's BPE as Gemma's (no space put first) or "
        "Llama 2's tokenizer.json holds it (a space put first by its normalizer; a Metaspace pre-tokenizer, "
        "as transformers rebuilds Llama's tokenizer class, puts none before a text that starts with one, "
        "where llama.cpp does)."
    )


def no_template_guesses(record: logging.LogRecord) -> bool:
    """gguf's warnings about what tokenizer.json's post-processor says of bos and eos, which
    `write_vocabulary` reads from the tokenizer's own ids instead (Gemma's pair template, bos put
    twice, drew "Unknown separator token '<bos>'" on every export)."""
    return "TemplateProcessing" not in record.getMessage()
