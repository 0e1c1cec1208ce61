"""The tokenizer a GGUF file carries, as transformers' GGUF conversion builds it, with what this
module adds: the special tokens the file names (by id) over whatever the conversion made of them,
texts split as llama.cpp splits them, llama.cpp's beginning-of-text default, no tokens past the
file's, and a cache of converted tokenizers (a large vocabulary takes minutes to convert)."""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from gpt_ft.weights.gguf_bounds import check_depth
from gpt_ft.weights.gguf_file import TOKENS, field, open_checked
from gpt_ft.weights.gguf_vocab import PHI3_KEPT, SPACE_FIRST
from gpt_ft.workarounds.gguf_files import read_once, split_as_llama_cpp, splits_as_llama_cpp

CACHE = "GPT_FT_CACHE"  # the folder for converted GGUF tokenizers (default ~/.cache/gpt_ft)
# The special tokens a file names by id, as a tokenizer's attributes.
SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}
PRE = "tokenizer.ggml.pre"
ADDS_BOS = ("llama3", "llama-v3", "llama-bpe", "falcon3")
"""Pre-tokenizers whose texts llama.cpp starts with the beginning-of-text token where the file has
no `tokenizer.ggml.add_bos_token` (its llama-vocab.cpp), as Llama 3.2's files have none."""
CONVERSION = 10  # in the cache's keys: entries converted before the special tokens were the file's own (2),
# or from a tokenizer.json beside the file (3), without llama.cpp's beginning-of-text default (4), with tokens
# past the file's (5), without llama.cpp's digit split (6), whole words (7), runs of spaces (8), the check
# of the pre-tokenizer (9), SentencePiece's space before each text or Phi-3's stripping (10) are converted
# again


def load_tokenizer(path: Path):
    """The tokenizer GGUF file `path` carries (its vocabulary, merges, special tokens and chat
    template), as transformers builds it. Converting a large vocabulary takes minutes (Gemma 3's
    262k tokens: about 4 on 2 CPU cores), so the result is kept, as a `save_pretrained` folder, in
    the cache (`$GPT_FT_CACHE`, by default ~/.cache/gpt_ft) under the file's path, size, times
    (modified and changed: a copy that kept the first has a new second) and inode, and within a
    process in memory (each caller gets its own copy)."""
    return copy.deepcopy(_tokenizer(path.resolve(), _stamp(path)))


def _stamp(path: Path) -> str:  # (its size, times and inode)
    return "\0".join(map(str, ((s := path.stat()).st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino)))


def _converted(path: Path, stamp: str) -> Path:  # the cache's tokenizer of file `path` (resolved)
    key = hashlib.sha256(f"{CONVERSION}\0{path}\0{stamp}".encode()).hexdigest()[:16]
    return cache_dir() / f"{path.stem}-{key}"


def carries_tokenizer(path: Path) -> bool:
    """Whether GGUF file `path` holds a tokenizer (llama.cpp's converters write one; not every file
    has): one converted from it is in the cache, or else its metadata says so."""
    converted = (_converted(path.resolve(), _stamp(path)) / "tokenizer.json").is_file()
    return converted or TOKENS in open_checked(path, weights=False).fields


def cache_dir() -> Path:
    """Where converted GGUF tokenizers are kept."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "gpt_ft"
    return Path(os.environ.get(CACHE) or cache).expanduser() / "gguf-tokenizers"  # (a service's `~/x`)


@functools.lru_cache(maxsize=4)
@read_once()  # (a conversion: one parse of the file)
def _tokenizer(path: Path, stamp: str):
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoTokenizer

    saved = _converted(path, stamp)
    if (saved / "tokenizer.json").is_file():  # (converted: its pre-tokenizer passed the check below)
        try:
            return AutoTokenizer.from_pretrained(saved)
        except (OSError, ValueError):  # a damaged entry: converted again below
            pass
    reader = open_checked(path, weights=False)
    pre = field(reader, PRE)
    if field(reader, "tokenizer.ggml.model") == "gpt2" and not splits_as_llama_cpp(pre):
        raise ValueError(
            f"{path}: llama.cpp splits its text by the pre-tokenizer {pre!r} (tokenizer.ggml.pre), "
            "which gpt_ft's reading of the file does not reproduce: its token ids would not be "
            "llama.cpp's. Give the tokenizer's folder (its tokenizer.json) instead."
        )
    if TOKENS not in reader.fields:
        raise ValueError(f"{path} carries no tokenizer (no {TOKENS}): give the tokenizer's folder.")
    check_depth(path, reader, field(reader, "general.architecture"))  # (transformers makes its config)
    count = len(reader.fields[TOKENS].data)
    for key in SPECIAL_IDS.values():  # (transformers' conversion looks each up in the tokens)
        index = field(reader, key)
        if index is not None and not (isinstance(index, int) and 0 <= index < count):
            raise ValueError(f"{path}: its {key} is {index!r}, and it holds {count} tokens ({TOKENS}).")
    with tempfile.TemporaryDirectory() as alone:  # the file's own, not a tokenizer.json beside it
        linked = Path(alone) / path.name
        try:
            linked.symlink_to(path.resolve())
        except OSError:  # a file system without links
            shutil.copyfile(path, linked)
        try:
            tokenizer = AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
        except (ValueError, StrictDataclassError, ArithmeticError) as exc:
            # an architecture transformers' GGUF reader does not know (olmoe), or a config (read too)
            # its config class refuses (a head count of 0, a width no head count divides)
            reason = " ".join(str(exc.__cause__ or exc).split()).rstrip(".")
            raise ValueError(
                f"{path}: transformers reads no tokenizer from it ({reason}); give the tokenizer's folder."
            ) from None
        _own_special_tokens(tokenizer, reader)
        split_as_llama_cpp(tokenizer, pre)  # (SmolLM's digits apart, Llama 3's whole words)
        if field(reader, "tokenizer.ggml.add_bos_token") is None and pre in ADDS_BOS:
            tokenizer.add_bos_token = tokenizer.bos_token_id is not None  # as llama.cpp reads such a file
        tokenizer = _as_the_file_holds(tokenizer, reader, Path(alone) / "own")
    partial = saved.with_name(f"{saved.name}.{os.getpid()}.partial")
    try:
        tokenizer.save_pretrained(partial)
        shutil.rmtree(saved, ignore_errors=True)
        os.replace(partial, saved)
    except OSError:  # a read-only or full cache: the next process converts again
        shutil.rmtree(partial, ignore_errors=True)
    return tokenizer


def _as_the_file_holds(tokenizer, reader, folder: Path):
    """The tokenizer without the tokens transformers' conversion added past the file's (a byte-level
    file without `<|endoftext|>`, as Llama 3's, gains it: GPT2Tokenizer's default), and with the runs
    of spaces a SentencePiece file holds as user-defined tokens (Gemma's) taken from the text whole,
    longest first, as llama.cpp and SentencePiece take them: transformers' conversion spells them
    "▁▁" and merges them, 32 spaces as two runs of 16 where the file's are read as 31 and 1.

    A SentencePiece file that puts a space before each text (`add_space_prefix`, llama.cpp's default:
    Llama 2's, Mistral's, TinyLlama's, Phi-3-mini's) gets that space before every piece of text
    between special or user-defined tokens, and before one that starts with a space too, as llama.cpp
    and those models' own tokenizer.json put it (`SPACE_FIRST`); transformers' conversion puts it
    before the first piece only, and none before a space (" hi" read as "▁hi" where they read
    "▁▁hi"). A file named for Phi-3 has its added tokens take the whitespace after them with them but
    `PHI3_KEPT`, as llama.cpp reads such a file and Phi-3-mini's tokenizer.json holds them."""
    import json

    import gguf
    from transformers import AutoTokenizer

    count, runs, kinds = len(reader.fields[TOKENS].data), {}, reader.fields.get("tokenizer.ggml.token_type")
    pieces = field(reader, "tokenizer.ggml.model") == "llama"
    if pieces and kinds is not None and len(kinds.data) == count:
        defined = gguf.TokenType.USER_DEFINED
        pairs = enumerate(zip(reader.fields[TOKENS].contents(), kinds.contents()))
        runs = {i: text for i, (text, kind) in pairs if kind == defined and text and not text.strip(" ")}
    space_first = pieces and field(reader, "tokenizer.ggml.add_space_prefix") in (None, True)
    phi3 = re.search("phi-?3", field(reader, "general.name") or "", re.IGNORECASE) is not None
    if len(tokenizer) <= count and not runs and not space_first and not phi3:
        return tokenizer
    tokenizer.save_pretrained(folder)
    spelled = {"▁" * len(text): text for text in runs.values()}
    flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized", "special"), False)
    added = [{"content": text, **flags} for text in runs.values()]
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        saved = json.loads((folder / name).read_text(encoding="utf-8"))
        if isinstance(tokens := saved.get(key), list):
            saved[key] = [token for token in tokens if token["id"] < count and token["id"] not in runs]
            saved[key] += [{"id": index, **token} for index, token in zip(runs, added)]
        elif isinstance(tokens, dict):
            saved[key] = {index: token for index, token in tokens.items() if int(index) < count}
            saved[key].update({str(index): token for index, token in zip(runs, added)})
        tokens = saved.get(key) or []
        for token in (tokens if isinstance(tokens, list) else list(tokens.values())) if phi3 else []:
            token["rstrip"] = token["content"] not in PHI3_KEPT  # (llama.cpp's reading of a Phi-3 file)
        if name == "tokenizer.json" and space_first:
            saved.update(normalizer=SPACE_FIRST, pre_tokenizer=None)
        if name == "tokenizer.json" and spelled:  # (the runs' pieces, and the merges that made them, go)
            model = saved["model"]
            model["vocab"] = {spelled.get(piece, piece): index for piece, index in model["vocab"].items()}
            pairs = [merge.split(" ") if isinstance(merge, str) else merge for merge in model["merges"]]
            kept = ["".join(pair) not in spelled and not spelled.keys() & set(pair) for pair in pairs]
            model["merges"] = [merge for merge, keep in zip(model["merges"], kept) if keep]
        (folder / name).write_text(json.dumps(saved, ensure_ascii=False), encoding="utf-8")
    return AutoTokenizer.from_pretrained(folder)


def _own_special_tokens(tokenizer, reader) -> None:
    """Make the tokenizer's bos, eos, unknown and padding tokens the ones the file names by id,
    whatever transformers' conversion made of them: transformers 5.17, for one, takes the eos
    token from the bos id and drops the padding token, so generation would stop at the wrong token."""
    for name, key in SPECIAL_IDS.items():
        index = field(reader, key)
        if index is not None and 0 <= int(index) < len(tokenizer):
            token = tokenizer.convert_ids_to_tokens(int(index))
            if getattr(tokenizer, name) != token:
                setattr(tokenizer, name, token)
