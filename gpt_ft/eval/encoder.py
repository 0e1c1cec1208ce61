"""`Encoder`: a fine-tuned embedding model (an `Embedding` card's checkpoint) as a function from
texts to unit vectors, and `gpt-ft embed`, which writes a file's vectors.

Each text is encoded alone and framed as the card's pooling frames it in training
(`Embedding.frame`: `[start] prompt text [extract]` read at the extract token, or `[start] prompt
text` read at the last token or averaged), the card's `query_prompt` or `document_prompt` before
it; its vector is that state through the head: packed batches, the training path's own collation
and forward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from gpt_ft.adapters.cards import card_from_value
from gpt_ft.adapters.sources import needed_text, no_utf8
from gpt_ft.adapters.truncation import TRAINED, cut_report
from gpt_ft.data.file_faults import file_format, place, record_lines, utf8_problem
from gpt_ft.data.files import read_table
from gpt_ft.data.json_faults import json_records
from gpt_ft.errors import TaskDataError, at_least_one, check_output_file, input_file, writing
from gpt_ft.eval.classifier import CHUNK, Classifier
from gpt_ft.eval.devices import device_named
from gpt_ft.eval.labelling import free_name, hidden_beside, jsonable, put_in_place
from gpt_ft.eval.progress import batches_bar
from gpt_ft.weights.checkpoint import Checkpoint


class Encoder:
    """Texts in, unit vectors out, with a fine-tuned embedding checkpoint's GPT, head and tokenizer."""

    def __init__(self, classifier: Classifier) -> None:
        if not classifier.task.output.embeds:
            raise ValueError(
                f"task {classifier.task.name!r} is not an embedding task: use Classifier for its predictions."
            )
        self.classifier = classifier
        self.task = classifier.task

    @classmethod
    def from_checkpoint(cls, path: str | Path | Checkpoint, *, device: str | None = None) -> Encoder:
        """A `.ckpt` of `gpt-ft fit` on an embedding card; on the GPU when there is one, unless
        `device` says."""
        stored = path if isinstance(path, Checkpoint) else Checkpoint.read(path)
        check_embeds(stored)
        return cls(Classifier.from_checkpoint(stored, device=device))

    @property
    def dimensions(self) -> int:
        return self.classifier.head.out_features

    def prompt(self, kind: Literal["query", "document"] | None) -> str:
        """The card's instruction before a text: its `query_prompt` (anchors), `document_prompt`
        (positives and negatives), or none."""
        return {"query": self.task.query_prompt, "document": self.task.document_prompt}.get(kind, "")

    def tokens(self, texts: list[str], prompt: Literal["query", "document"] | None) -> list[list[int]]:
        """Each text's tokens after the prompt's, before the room of a sequence cuts them (a text
        spelling a special token is text)."""
        texts = self.task.as_read([self.prompt(prompt) + t for t in texts])  # as training reads them
        return (
            self.classifier.tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            if texts
            else []
        )

    @torch.no_grad()  # (not inference mode: the vectors are the caller's, for any use)
    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int = 32,
        prompt: Literal["query", "document"] | None = "query",
        convert_to: Literal["numpy", "torch"] = "numpy",
        progress=iter,
    ) -> np.ndarray | Tensor:
        """Each text's unit vector, (len(texts), dimensions), float32, in order; `progress` wraps
        the batches (`gpt-ft embed`'s bar). An empty text's is its framing's alone, as
        sentence-transformers gives it from the exported model (`gpt-ft embed` refuses an empty line
        or field of a file: there it is most often a slip)."""
        at_least_one(batch_size, "batch_size")
        if isinstance(texts, (str, bytes)) or not hasattr(texts, "__iter__"):  # None: no list either
            what = "the text " if isinstance(texts, str) else ""
            raise TypeError(f"encode takes a list of texts, got {what}{texts!r}: put it in a list.")
        if isinstance(texts, dict) or hasattr(texts, "columns"):  # (its keys, a table's column names)
            kind = "a table" if hasattr(texts, "columns") else "a mapping"
            raise TypeError(f"encode takes a list of texts, got {kind}: give its texts' column, as a list.")
        texts = list(texts)
        if bad := [i for i, t in enumerate(texts) if not isinstance(t, str)]:
            raise TypeError(f"encode takes texts; item {bad[0]} is {texts[bad[0]]!r}.")
        if problem := next(((i, said) for i, t in enumerate(texts) if (said := no_utf8(t))), None):
            raise ValueError(f"item {problem[0]} {problem[1]}.")
        if prompt not in ("query", "document", None):
            raise ValueError(f"prompt must be 'query', 'document' or None, got {prompt!r}.")
        if convert_to not in ("numpy", "torch"):
            raise ValueError(f"convert_to must be 'numpy' or 'torch', got {convert_to!r}.")
        clf, room = self.classifier, self.task.text_room(self.classifier.max_length)
        vectors = torch.zeros(len(texts), self.dimensions)
        ticks = iter(progress(range(-(-len(texts) // batch_size))))
        size = batch_size * -(-CHUNK // batch_size)  # a chunk's texts encoded at a time: whole batches
        for first in range(0, len(texts), size):
            encoded = []
            for i, tokens in enumerate(self.tokens(texts[first : first + size], prompt), first):
                sequence, extract = clf.task.frame(clf.specials, tokens[:room])
                encoded.append(
                    {"input_ids": [sequence], "extract_index": [extract], "label": None, "index": i}
                )
            encoded.sort(key=lambda e: -len(e["input_ids"][0]))  # the longest together: the least padding
            for start in range(0, len(encoded), batch_size):
                next(ticks)
                chunk = encoded[start : start + batch_size]
                out = clf.outputs(clf.batch(chunk))[:, 0].float().cpu()
                vectors[[e["index"] for e in chunk]] = out
        next(ticks, None)  # the bar's end
        return vectors.numpy() if convert_to == "numpy" else vectors


def embed(
    *,
    ckpt_path: str,
    input: str,
    output: str,
    field: str = "text",
    prompt: Literal["query", "document", "none"] = "query",
    overwrite: bool = False,
    batch_size: int = 32,
    device: str | None = None,
) -> None:
    """Write each text's vector with a fine-tuned embedding model (`gpt-ft embed`).

    Args:
        ckpt_path: A checkpoint of gpt-ft fit on an embedding card.
        input: A .txt file (one text per line), or csv, tsv, json/jsonl or parquet with the texts in --field.
        output: .npy (the vectors, one row per text) or .jsonl (each row with its `embedding`); a new file.
        field: The column holding the texts (tables only).
        prompt: The card's prompt put before each text: query, document or none.
        overwrite: Replace --output if it exists.
        batch_size: Texts per batch.
        device: Default: cuda when there is one.
    """
    source, target = input_file(input, "--input"), Path(output).expanduser()
    at_least_one(batch_size, "--batch_size")
    if target.suffix.lower() not in (".npy", ".jsonl"):
        raise ValueError(f"--output {target}: write .npy or .jsonl.")
    check_output_file(output, "--output", overwrite=overwrite, reads=source)
    if source.suffix.lower() != ".txt" and file_format(source) is None:
        raise ValueError(
            f"--input {source}: give a .txt, .csv, .tsv, .json/.jsonl or .parquet file (by its extension)."
        )
    stored = Checkpoint.read(ckpt_path)
    check_embeds(stored)  # a wrong checkpoint before the input's rows, the input before the model
    rows, texts = read_texts(source, field)
    if not texts:
        raise ValueError(f"--input {source} holds no texts.")
    encoder = Encoder.from_checkpoint(stored, device=device_named(device))
    prompt = None if prompt == "none" else prompt
    vectors = encoder.encode(texts, batch_size=batch_size, prompt=prompt, progress=batches_bar("embed"))
    column = (
        "embedding"
        if target.suffix.lower() == ".npy"
        else free_name("embedding", {k for r in rows for k in r})
    )
    tmp = hidden_beside(target)
    with writing(target):
        try:
            tmp.parent.mkdir(parents=True, exist_ok=True)
            if target.suffix.lower() == ".npy":
                with tmp.open("wb") as f:
                    np.save(f, vectors)
            else:
                with tmp.open("w", encoding="utf-8") as f:
                    for row, vector in zip(rows, vectors):  # (a row's list at a time: 32 bytes a number)
                        record = {**row, column: vector.tolist()}
                        f.write(json.dumps(record, ensure_ascii=False, default=jsonable) + "\n")
            put_in_place(tmp, target, overwrite=overwrite)
        finally:
            tmp.unlink(missing_ok=True)
    count = f"{len(texts):,} text{'s' * (len(texts) != 1)}"
    moved = f"; as {column}: the rows have an embedding field, kept" if column != "embedding" else ""
    print(f"embedded {count} of {source} into {target} ({encoder.dimensions} dimensions{moved})")
    room, max_length = encoder.task.text_room(encoder.classifier.max_length), encoder.classifier.max_length
    cuts = [
        int(len(t) > room)
        for first in range(0, len(texts), CHUNK)
        for t in encoder.tokens(texts[first : first + CHUNK], prompt)
    ]
    if said := cut_report(str(source), cuts, max_length, items="texts", remedy=TRAINED):
        print(said)  # (as `gpt-ft label` says it: texts longer than a sequence's room lose their end)


def check_embeds(stored: Checkpoint) -> None:
    """Refuses a checkpoint of a task that is no embedding task (one a classifier reads)."""
    task = card_from_value(stored.require_task_card(), f"The task card recorded in {stored.where}")
    if not task.output.embeds:
        raise ValueError(
            f"{stored.where} is a model of task {task.name!r}, not an embedding model: "
            "`gpt-ft label` (or Classifier) gives its predictions."
        )


def read_texts(path: Path, field: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a file and their texts: a .txt file's lines, or a table's `field`; a row without
    a text is named by its line."""
    if path.suffix.lower() == ".txt":  # lines end at \n (or \r\n) alone, not at str.splitlines' others
        data = path.read_bytes()
        if (problem := utf8_problem(data)) is not None:
            raise ValueError(f"{path}{problem}.")
        lines = data.decode("utf-8-sig").replace("\r\n", "\n").split("\n")  # a BOM is no text
        lines = lines[:-1] if lines[-1] == "" else lines
        if (blank := next((i for i, line in enumerate(lines) if not line.strip()), None)) is not None:
            raise TaskDataError(f"{path}, line {blank + 1} is empty: each line is a text to embed.")
        return [{"text": line} for line in lines], lines
    table, fmt = read_table(path), file_format(path) or ""
    rows = json_records(path, table.to_list())  # a record's missing field stays missing
    if fmt != "json" and field not in table.column_names:  # a table's header: no row has it
        raise TaskDataError(
            f"{path} has no column {field!r} to embed; its columns: {', '.join(table.column_names)} "
            "(--field NAME reads another)."
        )
    lines = record_lines(path, fmt)
    texts = []
    for i, row in enumerate(rows):  # a field read as training reads it: a number is its digits
        try:
            texts.append(needed_text(row[field], field, needed="a text to embed"))
        except KeyError:
            raise TaskDataError(
                f"{place(path, lines, i)}: the row has no field {field!r} (a text to embed; --field NAME "
                "reads another)."
            ) from None
        except TaskDataError as exc:
            raise TaskDataError(f"{place(path, lines, i)}: {exc}") from None
    return rows, texts
