"""`gpt-ft prepare`: a text corpus -> flat token files for pretraining.

Documents (by default one per file) are cut into pieces of about `piece_chars` characters where
the tokenizer splits anyway (gpt_ft/data/pieces.py), so the token files hold exactly the tokens of the whole
documents. Pieces are tokenized in batches by the tokenizer's thread pool (`workers` threads)
while the next batch is read, and appended in order to `train.bin` or `validation.bin` (a hash of
the piece number picks the split); each document ends with the end-of-text token. Memory stays
bounded (three batches at most). Corpus files must be UTF-8 text, all checked before anything is
written; a refused or interrupted run leaves nothing behind.

Output folder:
    train.bin, validation.bin   flat arrays of token ids (uint16 if the vocabulary fits, else uint32)
    meta.json                   dtype, token counts, tokenizer (and its files' SHA-256), sources
    tokenizer/                  the tokenizer (save_pretrained), with the end-of-text token
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import Tokenizer

from gpt_ft.data.corpus import find_files
from gpt_ft.data.file_faults import check_text_file
from gpt_ft.data.folders import (
    LOCK,
    bar_output,
    missing_folders,
    one_writer,
    put_tokenizer,
    staged_tokenizer,
    tokenizer_digests,
)
from gpt_ft.data.pieces import (
    Partial,
    batches,
    document_end,
    drops_text,
    encode_batch,
    is_validation,
    pieces,
    pre_token_ends,
    text_start,
)
from gpt_ft.data.tokenizer import add_special_tokens, embedding_size, load_tokenizer
from gpt_ft.errors import check_output_dir
from gpt_ft.errors import writing as naming

META = "meta.json"
SPLIT_FILES = {"train": "train.bin", "validation": "validation.bin"}
COMMITTING = ".committing"  # while a folder's files are replaced: what is there is this command's


def file_documents(files: Sequence[Path], split_on: Literal["file", "blank_line", "line"]) -> Iterator[str]:
    """Documents from text files, streamed: a file, a blank-line-separated block, or a line each."""
    for path in files:
        try:
            yield from _documents(path, split_on)
        except UnicodeDecodeError as exc:  # changed since `check_text_file` read it
            raise ValueError(
                f"Corpus file {path} is not UTF-8 text ({exc.reason}); save it as UTF-8 or leave it out."
            ) from None


def _documents(path: Path, split_on: Literal["file", "blank_line", "line"]) -> Iterator[str]:
    with path.open(encoding="utf-8-sig") as f:  # a byte-order mark is not part of the text
        if split_on == "file":
            yield from _file_as_one_document(f)
            return
        block: list[str] = []
        for line in f:
            if split_on == "line":
                if line.strip():
                    yield line.rstrip("\n")
            elif line.strip():
                block.append(line)
            elif block:
                yield "".join(block).rstrip("\n")
                block = []
        if block:
            yield "".join(block).rstrip("\n")


def _file_as_one_document(f) -> Iterator[str]:
    # A whole file is one document, however large: hand it over in line-aligned chunks, marked
    # by a trailing None so that pieces can be cut without holding the file in memory.
    chunk: list[str] = []
    size = 0
    for line in f:
        chunk.append(line)
        size += len(line)
        if size >= 1 << 20:
            yield Partial("".join(chunk))
            chunk, size = [], 0
    yield "".join(chunk)


NO_SPLIT = "--dataset {} has no split {!r}; it has {} (--dataset_split)."


def dataset_documents(name: str, split: str, text_field: str) -> Iterator[str]:
    """Documents from a `datasets` dataset (a folder of data files, one `save_to_disk` wrote, or,
    online, a hub id), streamed; a row whose text is null is an empty document."""
    import datasets

    folder = Path(name).expanduser()
    try:
        if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():  # save_to_disk's
            ds = datasets.load_from_disk(str(folder))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ValueError(NO_SPLIT.format(name, split, sorted(ds)))
                ds = ds[split]
        else:
            ds = datasets.load_dataset(name, split=split, streaming=True)
    except OSError as exc:  # no such folder, offline and not cached, or no such dataset
        raise ValueError(f"--dataset {name} cannot be loaded ({exc}).") from None
    except ValueError as exc:  # datasets' "Bad split: x. Available splits: [...]"
        if (has := re.search(r"Available splits: (\[.*?\])", str(exc))) is None:
            raise
        raise ValueError(NO_SPLIT.format(name, split, has[1])) from None
    for i, row in enumerate(ds):
        if text_field not in row:
            raise ValueError(f"Dataset {name} has no field {text_field!r}; it has {sorted(row)}.")
        if not isinstance(text := row[text_field], str | None):
            raise ValueError(f"Dataset {name}, row {i}: field {text_field!r} holds {type(text).__name__}.")
        yield text or ""


@contextmanager
def tokenizer_threads(workers: int) -> Iterator[None]:
    """Let the tokenizer's thread pool use `workers` threads (1: none) for the duration."""
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if workers > 1 else "false"
    # Read once, when the pool first starts (in `gpt-ft prepare`, at the first batch).
    os.environ.setdefault("RAYON_NUM_THREADS", str(workers))
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def token_dtype(vocab_size: int) -> str:
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise ValueError(f"A vocabulary of {vocab_size} tokens does not fit uint32 token files.")


def unknown_token(tok) -> str | None:
    """The tokenizer's unknown token, or its model's where transformers names none (a bare
    tokenizer.json of the `tokenizers` library: WordPiece's [UNK], Unigram's by its id)."""
    if tok.unk_token is not None:
        return tok.unk_token
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    return (
        tok.convert_ids_to_tokens(model["unk_id"])
        if model.get("unk_id") is not None
        else model.get("unk_token")
    )


def prepare(
    *,
    inputs: list[str] | str = "",
    out_dir: str,
    tokenizer: str,
    dataset: str = "",
    dataset_split: str = "train",
    text_field: str = "text",
    split_on: Literal["file", "blank_line", "line"] = "file",
    validation_fraction: float = 0.005,
    piece_chars: int = 1 << 16,
    workers: int = 1,
    progress: bool = True,
) -> dict:
    """Tokenize a corpus into train and validation token files for pretraining.

    `gpt-ft prepare`; returns the metadata written to meta.json.

    Args:
        inputs: A text file or a folder of them (searched recursively), or a list of both
            (`[a.txt, books/]`); none with --dataset.
        out_dir: Output folder (created; must be empty or an earlier output of this command).
        tokenizer: Tokenizer folder or hub id (e.g. the GPT-1 or GPT-2 BPE folder).
        dataset: Instead of files, a `datasets` dataset: a folder of data files or one
            `save_to_disk` wrote (a DatasetDict's --dataset_split), or, online, a hub id.
        dataset_split: The dataset's split to read.
        text_field: The dataset's text column.
        split_on: What one document is: a `file`, a `blank_line`-separated block, or a `line`.
        validation_fraction: Share of pieces written to validation.bin.
        piece_chars: Characters per piece (the unit of the train/validation split).
        workers: Tokenizer threads (1: tokenize in this thread only).
        progress: Show a progress bar and the closing line.
    """
    from tqdm import tqdm

    out = check_output_dir(out_dir, "--out_dir")
    # (typed without None: jsonargparse would read '#notes.txt' or 'null' as YAML's None)
    files = ([inputs] if inputs else []) if isinstance(inputs, str | os.PathLike) else list(inputs or [])
    if bool(files) == bool(dataset):
        raise ValueError("Give either text files/folders or --dataset, not both and not neither.")
    if dataset and Path(dataset).expanduser().is_file():  # datasets would look for it on the hub
        raise ValueError(
            f"--dataset {dataset} is a file: give a dataset's folder or hub id, or the file as --inputs."
        )
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}.")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}.")
    if piece_chars < 2:
        raise ValueError(f"piece_chars must be >= 2, got {piece_chars}.")
    # What a killed run leaves: a lock, temporary files; cut short while committing (marked), part
    # of its commit, a tokenizer folder among them (token files alone, or a tokenizer, are a user's).
    traces = {LOCK, *(name + ".tmp" for name in SPLIT_FILES.values())}
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    traces |= {name for name in names if name.startswith(".tokenizer.") and name.endswith(".partial")}
    if COMMITTING in names:
        traces |= {COMMITTING, "tokenizer", *SPLIT_FILES.values()}
    if out.exists() and not (out / META).exists() and names - traces:
        raise ValueError(
            f"Output folder {out} is not empty and holds no token files of gpt-ft prepare (no {META}); "
            "choose an empty folder."
        )
    tok = load_tokenizer(tokenizer, add_specials=False)
    lead, end = text_start(tok), document_end(tok)  # each document: [its bos] text end
    if end not in tok.get_vocab():  # (before the framing tokens: they stay the last rows, which a
        tok.add_special_tokens({"eos_token": end})  # language model's next tokens leave out)
    add_special_tokens(tok)
    eos = tok.convert_tokens_to_ids(end)
    rows = embedding_size(tok)  # the model's embedding rows
    dtype = token_dtype(rows)
    if files:
        paths = find_files(files)
        for path in paths:  # all of them, before anything is written
            check_text_file(path, "Corpus file")
        documents, sources = file_documents(paths, split_on), [str(p.resolve()) for p in paths]  # (anywhere)
    else:
        sources = [f"{dataset}:{dataset_split}"]
        documents = dataset_documents(dataset, dataset_split, text_field)
    created = missing_folders(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "validation": 0}
    n_docs = unknown = 0
    unk_token = unknown_token(tok)  # a vocabulary without bytes for every character (GPT-1's) has one
    unk = None if unk_token is None else tok.convert_tokens_to_ids(unk_token)
    unk = None if unk == eos else unk  # GPT-2's is its end of text, which ends every document here
    tmp = {split: out / (name + ".tmp") for split, name in SPLIT_FILES.items()}
    # The corpus's own text is text: a page that writes "<|endoftext|>" gets no document boundary
    # (nor "<|extract|>" a fine-tuning token); the one boundary is the end-of-text token added here.
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.encode_special_tokens = True
    ends = pre_token_ends(backend)
    dropped = Counter() if drops_text(backend) else None  # characters no token stands for
    # No pre-tokenizer (SentencePiece's layout, Llama 2's and Mistral's: the normalizer puts "▁" before
    # every text it reads): no cut is exact, so documents are tokenized whole.
    cut_at = piece_chars if ends is not None else sys.maxsize
    done = committed = writing = False  # tokenized; written whole (meta.json last); the folder held
    staging = None  # the new tokenizer, saved before the folder's commit begins
    had_tokenizer, replaces = (out / "tokenizer").exists(), (out / META).exists() or COMMITTING in names
    try:
        with one_writer(out, "`gpt-ft prepare`"):
            writing = True  # (refused: the files are another run's)
            for staged in out.glob(".tokenizer.*.partial"):  # a killed run's tokenizer, half saved
                shutil.rmtree(staged, ignore_errors=True)
            handles = {split: open(path, "wb") for split, path in tmp.items()}
            start = time.perf_counter()
            # Over the files' bytes where it knows them (how far, and an ETA), the tokens written beside.
            size = sum(path.stat().st_size for path in paths) if files else None
            bar = tqdm(total=size, unit="B" if size else " tok", unit_scale=True, desc="Tokenizing",
                       disable=not progress, **bar_output())  # fmt: skip
            try:
                with tokenizer_threads(workers), ThreadPoolExecutor(1) as executor:
                    # One batch is encoded (outside the GIL) while the next is read and the last written.
                    pending = None
                    for batch in chain(batches(pieces(documents, cut_at, ends), 16 * piece_chars), [None]):
                        submitted = batch and (
                            batch,
                            executor.submit(
                                encode_batch, backend, batch, eos, dtype, lead, validation_fraction, dropped
                            ),
                        )
                        if pending is not None:
                            encoded, result = pending
                            for piece, ids in zip(encoded, result.result()):
                                drawn = is_validation(piece.number, validation_fraction)
                                split = "validation" if drawn else "train"
                                with naming(out / SPLIT_FILES[split]):  # (a full disk: the file named)
                                    handles[split].write(ids.tobytes())
                                counts[split] += len(ids)
                                unknown += int(np.count_nonzero(ids == unk)) if unk is not None else 0
                                n_docs += piece.ends_document
                                bar.update(len(piece.text.encode()) if size else len(ids))
                                bar.set_postfix_str(f"{sum(counts.values()):,} tokens", refresh=False)
                        pending = submitted
                done = counts["train"] > 0
            finally:
                bar.n = bar.total if done and size else bar.n  # (blank lines and line breaks not read)
                bar.close()
                for split, f in handles.items():  # (the last bytes, written out now, may not fit)
                    with naming(out / SPLIT_FILES[split]):
                        f.close()
            if dropped and backend.normalizer is not None:  # what it takes out on purpose (accents) aside
                dropped = Counter({c: n for c, n in dropped.items() if backend.normalizer.normalize_str(c)})
            if done:  # meta.json first: a folder cut short here reads as unprepared, not as the old one
                staging = staged_tokenizer(tok, out / "tokenizer")  # (a full disk: the old folder whole)
                (out / COMMITTING).touch()
                (out / META).unlink(missing_ok=True)
                put_tokenizer(staging, out / "tokenizer")
                for split, path in tmp.items():
                    path.replace(out / SPLIT_FILES[split])
                    tmp[split] = out / SPLIT_FILES[split]  # (in place now: it goes too if the commit fails)
                seconds = time.perf_counter() - start
                meta = {"dtype": dtype, "vocab_size": rows, "eos_token_id": eos, "tokens": counts,
                        "documents": n_docs, "unknown_tokens": unknown,
                        **({"dropped_characters": dropped.total()} if dropped is not None else {}),
                        "tokenizer": "tokenizer",
                        "tokenizer_files": tokenizer_digests(out / "tokenizer"),
                        "sources": sources, "seconds": round(seconds, 2)}  # fmt: skip
                (out / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
                (out / COMMITTING).unlink()
                committed = True
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if writing and not committed:  # interrupted, even while committing: leave nothing behind
            for path in tmp.values():
                path.unlink(missing_ok=True)
            if not had_tokenizer:
                shutil.rmtree(out / "tokenizer", ignore_errors=True)
            if not replaces:  # nothing of an earlier corpus to mark
                (out / COMMITTING).unlink(missing_ok=True)
        if not committed:
            for folder in created:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
    more = (  # more pieces to draw from; where no cut is exact, each document is one piece
        f"a smaller --piece_chars ({piece_chars:,})"
        if ends is not None
        else "smaller documents (--split_on blank_line or line: this tokenizer reads each whole)"
    )
    if not done:
        corpus = f"The corpus ({', '.join(sources[:3])}{', ...' if len(sources) > 3 else ''})"
        if counts["validation"]:  # every piece drawn for validation: too little text for the split
            raise ValueError(
                f"{corpus} gave all its {counts['validation']:,} tokens to the validation split and none "
                f"to train: give {more}, a lower --validation_fraction ({validation_fraction}) or more text."
            )
        raise ValueError(f"{corpus} holds no text.")
    if progress:
        t, rate = counts, (counts["train"] + counts["validation"]) / max(seconds, 1e-9)
        print(
            f"wrote {t['train']:,} train and {t['validation']:,} validation tokens ({dtype}, "
            f"{n_docs:,} documents) to {out_dir} in {seconds:.1f} s ({rate:,.0f} tokens/s)"
        )
    if replaces:
        print(
            f"note: the token files {out_dir} held before are replaced (a pretraining run resumed on them "
            "is told its data changed).",
            file=sys.stderr,
        )
    if unknown > 0.001 * (counts["train"] + counts["validation"]):  # the model would learn to write it
        print(
            f"warning: {unknown:,} of the tokens ({unknown / sum(counts.values()):.2%}) are the tokenizer's "
            f"unknown token {unk_token}: the corpus holds characters its vocabulary lacks (GPT-1's: "
            "curly quotes, dashes, ellipses); write them in ASCII first (GPT-1 ran ftfy), or use a "
            "byte-level tokenizer.",
            file=sys.stderr,
        )
    if dropped:  # (its text gone from the token files, where an unknown token at least shows)
        most = ", ".join(f"{c!r} ×{n:,}" for c, n in dropped.most_common(5))
        print(
            f"warning: {dropped.total():,} characters of the corpus ({len(dropped):,} distinct; most often "
            f"{most}) are left out of the token files: the tokenizer's vocabulary lacks them and it has no "
            "unknown token or byte fallback to stand for them. Use a byte-level tokenizer (`gpt-ft "
            "tokenizer` trains one) or one with an unknown token.",
            file=sys.stderr,
        )
    if validation_fraction > 0 and not counts["validation"]:  # too few pieces for one to be drawn
        note = f"{more} or a larger --validation_fraction gives it some"
        print(f"note: no piece of the corpus went to the validation split: {note}", file=sys.stderr)
    return meta
