"""Tokenizers for GPT-1/GPT-2 pretraining and GPT-1 style fine-tuning.

GPT-1 fine-tuning (Radford et al. 2018) feeds every task as one token stream framed by learned
special tokens: ``start`` opens it, ``delim`` separates its parts and ``extract`` closes it (the
classifier reads the hidden state there). :func:`load_tokenizer` loads a tokenizer and appends
those tokens right after the base vocabulary, so the base ids (and a pretrained embedding table)
keep their meaning; :func:`embedding_size` is the embedding size the model needs.

Three kinds of source are understood:

* a ``save_pretrained`` directory (``tokenizer.json`` / ``tokenizer_config.json``);
* a directory holding only ``vocab.json`` + ``merges.txt`` as OpenAI published them, either the
  GPT-1 BPE (lowercased words, ``</w>`` end-of-word suffix) or the GPT-2 byte-level BPE
  (``Ġ`` marks a leading space); which one is read from the vocabulary itself;
* a GGUF file (or a folder holding one): the tokenizer it carries, chat template included;
* a Hugging Face Hub name, when online.

:func:`train_tokenizer` trains a fresh byte-level BPE for pretraining from scratch.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from huggingface_hub.utils import HFValidationError, validate_repo_id
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoTokenizer,
    GPT2TokenizerFast,
    OpenAIGPTTokenizerFast,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from gpt_ft.data.corpus import file_lines, find_files
from gpt_ft.data.file_faults import check_text_file
from gpt_ft.data.folders import check_tokenizer_files, save_new_tokenizer, stops_at_once, takes_tokenizer
from gpt_ft.errors import absent, check_output_dir
from gpt_ft.weights import gguf_file, gguf_tokenizer, hub
from gpt_ft.weights.pretrained import BPE_FILES, TOKENIZER_FILES, weights_tokenizer

__all__ = ["EOS_TOKEN", "SPECIAL_TOKENS", "SpecialTokenIds", "add_special_tokens",
           "embedding_size", "load_tokenizer", "own_framing_rows", "own_framing_tokens", "special_token_ids",
           "train_tokenizer"]  # fmt: skip

SPECIAL_TOKENS: dict[str, str] = {"start": "<|start|>", "delim": "<|delim|>", "extract": "<|extract|>",
                                  "pad": "<|pad|>"}  # fmt: skip
"""Fine-tuning tokens, appended in this order (pad only when the tokenizer has no pad token)."""

EOS_TOKEN = "<|endoftext|>"
"""Document separator used when packing pretraining text (GPT-2's end-of-text token)."""

# The three framing tokens, in the order their ids are assigned.
_FRAMING = ("start", "delim", "extract")
# Byte-level BPE turns a space into this character, so every GPT-2 style vocabulary contains it.
_BYTE_LEVEL_SPACE = "Ġ"
_GPT1_END_OF_WORD = "</w>"


@dataclass(frozen=True)
class SpecialTokenIds:
    """Ids of the fine-tuning special tokens in one tokenizer."""

    start: int
    delim: int
    extract: int
    pad: int
    eos: int | None
    """End-of-text id if the tokenizer has one (GPT-2, trained tokenizers), else None (GPT-1)."""


def load_tokenizer(path: str | os.PathLike, *, add_specials: bool = True) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local directory or the Hugging Face Hub.

    Args:
        path: A ``save_pretrained`` directory, a directory with OpenAI's GPT-1 or GPT-2
            ``vocab.json`` + ``merges.txt``, a GGUF file (or a folder holding one), a gpt_ft
            ``.ckpt`` (the tokenizer saved beside it), or a Hub name.
        add_specials: Append the fine-tuning special tokens (see :func:`add_special_tokens`).

    Returns:
        The tokenizer; :func:`embedding_size` is the vocabulary size the model needs.

    Raises:
        FileNotFoundError: ``path`` looks like a local path but does not exist.
        ValueError: ``path`` is a file, or a directory without tokenizer files.
    """
    name = os.fspath(path)
    local = Path(name).expanduser()
    gguf = gguf_file.find(local)
    if gguf is not None:
        tokenizer = gguf_tokenizer.load_tokenizer(gguf)
    elif local.is_dir():
        tokenizer = _load_local_dir(local)
    elif local.suffix == ".ckpt" and local.is_file():  # a gpt_ft checkpoint: the tokenizer saved beside it
        if (saved := weights_tokenizer(local)) is None:
            raise ValueError(
                f"{local} has no tokenizer folder beside it (a checkpoint's is saved there): give one."
            )
        tokenizer = _load_local_dir(Path(saved))
    elif local.exists():
        raise ValueError(
            f"Tokenizer path {local} is a file; expected a tokenizer directory, a GGUF file or a gpt_ft "
            ".ckpt."
        )
    elif _looks_like_local_path(name):
        what = {".gguf": "GGUF file", ".ckpt": "Checkpoint"}.get(local.suffix.lower(), "Tokenizer directory")
        raise FileNotFoundError(f"{what} {local} {absent(local)}.")
    else:  # a hub id: its tokenizer files, fetched into (or found in) the hub cache
        tokenizer = _load_local_dir(hub.snapshot(name, weights=False))
    _controls_unread(tokenizer)
    if add_specials:
        add_special_tokens(tokenizer)
    return tokenizer


def _controls_unread(tokenizer: PreTrainedTokenizerBase) -> None:
    """A Unigram model (SentencePiece's) holds its special tokens (`</s>`, `<pad>`) among its pieces,
    and would read one in a text its added tokens leave to it (`split_special_tokens`; a corpus in
    `prepare`): "</s>" written in a text would end a document. Such a piece is scored below every
    other reading of its characters, so text reads as text, as in SentencePiece; but where the
    vocabulary cannot spell them, it is still read (an unknown character scores below every piece)."""
    model = tokenizer.backend_tokenizer.model if tokenizer.is_fast else None
    if not isinstance(model, models.Unigram):
        return
    spec = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    added = tokenizer.added_tokens_decoder.values()
    special = {*tokenizer.all_special_tokens, *(t.content for t in added if t.special)}
    if not special.intersection(piece for piece, _ in spec["vocab"]):
        return
    floor = min(s for p, s in spec["vocab"] if p not in special) - 10  # an unknown character's (loads alike)
    vocab = [(p, floor * (len(p) + 1) if p in special else score) for p, score in spec["vocab"]]
    tokenizer.backend_tokenizer.model = models.Unigram(vocab, spec["unk_id"], spec.get("byte_fallback"))


def add_special_tokens(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Append the start, delim and extract tokens, and a pad token if there is none.

    New tokens get the next free ids in that order; existing ids never change. Calling this again
    adds nothing. The tokens are registered as special, so BPE never splits them.

    Args:
        tokenizer: Tokenizer to extend in place.

    Returns:
        The same tokenizer.
    """
    registered = set(_extra_special_tokens(tokenizer))
    new = [SPECIAL_TOKENS[key] for key in _FRAMING if SPECIAL_TOKENS[key] not in registered]
    if new:
        # Extend rather than replace the tokenizer's own extra special tokens: replacing would
        # silently demote them to ordinary tokens that `skip_special_tokens` no longer drops.
        tokenizer.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": SPECIAL_TOKENS["pad"]})
    return tokenizer


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> SpecialTokenIds:
    """Look up the ids of the fine-tuning special tokens.

    Args:
        tokenizer: A tokenizer that went through :func:`add_special_tokens`.

    Returns:
        The ids of start, delim, extract, pad and (if any) end-of-text.

    Raises:
        ValueError: One of the tokens is missing from the vocabulary.
    """
    # Check the vocabulary, not convert_tokens_to_ids: that maps an unknown token to unk_token,
    # which for GPT-2 is <|endoftext|>, a real id.
    vocab = tokenizer.get_vocab()
    ids: dict[str, int] = {}
    for key in _FRAMING:
        token = SPECIAL_TOKENS[key]
        if token not in vocab:
            raise ValueError(
                f"Tokenizer has no {key} token {token!r}; expected it to be added with add_special_tokens()."
            )
        ids[key] = vocab[token]
    if tokenizer.pad_token_id is None:
        raise ValueError("Tokenizer has no pad token; expected one to be added with add_special_tokens().")
    eos = tokenizer.eos_token_id if tokenizer.eos_token is not None else vocab.get(EOS_TOKEN)
    return SpecialTokenIds(pad=tokenizer.pad_token_id, eos=eos, **ids)


def embedding_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """The embedding rows a model needs for `tokenizer`: one past its largest id (a vocabulary that
    skips ids, a reserved range say, has fewer entries than that; new tokens go past its largest id)."""
    return max(len(tokenizer), 1 + max(tokenizer.get_vocab().values(), default=-1))


def own_framing_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[str, int] | None:
    """The tokens of the tokenizer's own that play GPT-1's framing roles in its pretraining text:
    ``start``: its beginning-of-text token (else its end-of-text one); ``delim``: its newline token,
    when a newline is one token (else end-of-text); ``extract``: its end-of-text token. None when
    it has no end-of-text token (GPT-1's BPE).
    """
    vocab = tokenizer.get_vocab()
    eos = tokenizer.eos_token_id if tokenizer.eos_token is not None else vocab.get(EOS_TOKEN)
    if eos is None:
        return None
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id if tokenizer.bos_token is not None else None
    return {
        "start": bos if bos is not None else eos,
        "delim": newline[0] if len(newline) == 1 else eos,
        "extract": eos,
    }


def own_framing_rows(tokenizer: PreTrainedTokenizerBase) -> dict[int, int]:
    """GPT-1's framing tokens by id, each with the id of the tokenizer's own token in that role
    (:func:`own_framing_tokens`); empty where it has none."""
    own = own_framing_tokens(tokenizer)
    ids = special_token_ids(tokenizer)
    return {getattr(ids, role): source for role, source in own.items()} if own else {}


def train_tokenizer(
    *,
    inputs: list[str] | str,
    vocab_size: int,
    out_dir: str,
    min_frequency: int = 2,
    normalizer: Literal["none", "nfc", "nfkc"] = "none",
    show_progress: bool = True,
    overwrite: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a GPT-2 style byte-level BPE on text files and save it to ``out_dir`` (`gpt-ft tokenizer`).

    Ids 0-4 are ``<|endoftext|>``, start, delim, extract and pad. Every byte is in the initial
    alphabet, so any text encodes without unknown tokens.

    Args:
        inputs: A UTF-8 text file or a folder of them (searched recursively), or a list of both
            (`[a.txt, books/]`); each file is checked whole first: one that is not text is refused,
            naming it, before anything is written.
        vocab_size: Vocabulary size, special tokens included.
        out_dir: Folder for the tokenizer (AutoTokenizer loads it).
        min_frequency: Least count of a pair to merge.
        normalizer: Each text's Unicode form before it is split: none (GPT-2's: as typed, an accent
            typed apart other tokens than the accented letter), nfc (one form for both), or nfkc
            (full-width letters and other compatibility forms as the plain ones, too).
        show_progress: Show the trainer's progress bar and the closing line.
        overwrite: Replace the tokenizer an ``out_dir`` holds (token files prepared with it no longer fit).

    Returns the trained tokenizer, with eos/bos ``<|endoftext|>`` and pad ``<|pad|>``. Raises
    FileNotFoundError for a missing file, ValueError for a bad ``vocab_size``, no files or no text,
    or an ``out_dir`` that is not empty (a tokenizer: unless ``overwrite``).
    """
    specials = [EOS_TOKEN, *(SPECIAL_TOKENS[key] for key in (*_FRAMING, "pad"))]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    min_vocab = len(alphabet) + len(specials)
    if vocab_size < min_vocab:
        raise ValueError(f"vocab_size={vocab_size} is too small; expected at least {min_vocab} "
                         f"({len(alphabet)} bytes + {len(specials)} special tokens).")  # fmt: skip
    if min_frequency < 0:
        raise ValueError(f"--min_frequency must be >= 0, got {min_frequency}.")
    inputs = [inputs] if isinstance(inputs, str | os.PathLike) else inputs  # (a lone path: one file)
    paths: list[Path] = []
    for item in inputs:  # a folder: the text files in it
        path = Path(item).expanduser()
        paths += find_files([path]) if path.is_dir() else [path]
    if not paths:
        raise ValueError("No training files given; expected at least one text file.")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"Training file {p} does not exist or is not a file.")
    if not any([check_text_file(p, "Training file") for p in paths]):  # every file checked
        many = f"None of the {len(paths)} training files contains any text"
        what = f"Training file {paths[0]} contains no text" if len(paths) == 1 else many
        raise ValueError(f"{what}; expected non-empty UTF-8 text.")
    out = check_output_dir(out_dir, "--out_dir")
    takes_tokenizer(out, overwrite)

    backend = Tokenizer(models.BPE())
    backend.normalizer = {"nfc": normalizers.NFC(), "nfkc": normalizers.NFKC()}.get(normalizer)
    # add_prefix_space=False as in GPT-2: the first word of a text is encoded without a space.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)  # GPT-2's: it fixes offsets only
    shown = show_progress and sys.stderr.isatty()  # (in a log or a pipe, its bar was blank lines)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=shown)  # fmt: skip
    with stops_at_once():  # the Rust trainer would hold a stop back until it ended: nothing written yet
        backend.train_from_iterator(file_lines(paths), trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=SPECIAL_TOKENS["pad"],
        additional_special_tokens=[SPECIAL_TOKENS[key] for key in _FRAMING],
    )
    save_new_tokenizer(tokenizer, out, overwrite=overwrite)
    if len(tokenizer) < vocab_size:  # too little text for so many merges
        lower = " or a lower --min_frequency" if min_frequency > 1 else ""
        print(f"note: the corpus gave {len(tokenizer)} tokens, fewer than --vocab_size {vocab_size} (every "
              f"pair seen at least {min_frequency} times is merged): give more text{lower}",
              file=sys.stderr)  # fmt: skip
    if show_progress:
        print(f"trained a {len(tokenizer)}-token byte-level BPE tokenizer into {out_dir}")
    return tokenizer


def _load_local_dir(directory: Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer directory: a ``save_pretrained`` output or OpenAI's vocab/merges files."""
    bpe = all((directory / f).is_file() for f in BPE_FILES)
    if any((directory / f).is_file() for f in TOKENIZER_FILES):
        try:
            return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
        except Exception as error:  # transformers' words: the broken file (config.json too) named instead
            check_tokenizer_files(directory, error)
            if not bpe or (directory / "tokenizer.json").is_file():
                raise  # else a tokenizer_config.json naming no class (openai-gpt's, gpt2's): the BPE files
    if bpe:
        # AutoTokenizer cannot pick a class without a config, so name it from the vocab's format.
        cls = OpenAIGPTTokenizerFast if _bpe_format(directory / "vocab.json") == "gpt1" else GPT2TokenizerFast
        try:
            return cls.from_pretrained(str(directory))
        except Exception as exc:  # the BPE builder's bare Exception, which names no file
            raise ValueError(f"{directory / 'merges.txt'} is not a valid BPE merges file ({exc}).") from None
    raise ValueError(
        f"Directory {directory} holds no tokenizer; expected tokenizer.json or tokenizer_config.json "
        "(a save_pretrained output) or vocab.json + merges.txt (an OpenAI GPT-1/GPT-2 BPE)."
    )


def _bpe_format(vocab_file: Path) -> Literal["gpt1", "gpt2"]:
    """Tell OpenAI's GPT-1 BPE vocabulary from GPT-2's byte-level one by its entries."""
    try:
        with vocab_file.open(encoding="utf-8") as f:
            vocab = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"Vocabulary file {vocab_file} is not valid JSON; expected a token-to-id mapping."
        ) from exc
    if not isinstance(vocab, dict):
        raise ValueError(
            f"Vocabulary file {vocab_file} holds a {type(vocab).__name__}; expected a token-to-id mapping."
        )
    if (bad := next((t for t, i in vocab.items() if type(i) is not int or i < 0), None)) is not None:
        raise ValueError(f"Vocabulary file {vocab_file} gives {bad!r} the id {vocab[bad]!r}; expected a "
                         "token-to-id mapping of non-negative integers.")  # fmt: skip
    # GPT-1 marks word ends with `</w>` and has no byte-level `Ġ`; GPT-2 is the other way round.
    end_of_word = sum(token.endswith(_GPT1_END_OF_WORD) for token in vocab)
    byte_space = sum(_BYTE_LEVEL_SPACE in token for token in vocab)
    if end_of_word > byte_space and "<unk>" not in vocab:  # GPT-1 spells what it cannot split as <unk>
        raise ValueError(f"GPT-1 vocabulary {vocab_file} has no '<unk>' entry, which text outside it needs.")
    if end_of_word != byte_space:
        return "gpt1" if end_of_word > byte_space else "gpt2"
    raise ValueError(
        f"Cannot tell the BPE format of {vocab_file}; expected GPT-1 entries ending in '</w>' "
        "or GPT-2 byte-level entries containing 'Ġ'."
    )


def _looks_like_local_path(name: str) -> bool:
    """Whether a missing ``name`` can only have meant a local path, not a Hub name."""
    if name.startswith((".", "~")) or os.path.isabs(name) or (os.altsep and os.altsep in name):
        return True
    if name.lower().endswith((".gguf", ".ckpt")):  # a file, never a hub id
        return True
    # Hub ids are "name" or "owner/name"; a relative path such as "data/tok" also fits that
    # pattern, so it goes to the Hub and a failure there reports both possibilities.
    try:
        validate_repo_id(name.partition("@")[0])  # ORG/NAME@REVISION (refs/pr/1 too), as `hub.is_hub_id`
    except HFValidationError:
        return True
    return False


def _extra_special_tokens(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tokenizer's extra special tokens."""
    return [str(t) for t in getattr(tokenizer, "extra_special_tokens", None) or []]
