"""`Classifier`: a fine-tuned checkpoint as a Python function from examples to labels.

    from gpt_ft import Classifier
    clf = Classifier.from_checkpoint("runs/lightning_logs/version_0/checkpoints/last.ckpt")
    clf.predict([{"sentence": "a gripping, funny film"}])
    # [{"label": "positive", "scores": {"negative": 0.03, "positive": 0.97}}]

The checkpoint carries everything: weights, tokenizer and task card. Examples are dicts keyed by
the card's fields, encoded as in training (same truncation, same special tokens); the numbers are
those `gpt-ft predict` computes.
"""

from __future__ import annotations

import base64
import csv
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor

from gpt_ft.adapters import TaskAdapter, TaskDataError, TaskHead
from gpt_ft.adapters.cards import card_from_value
from gpt_ft.adapters.truncation import cut_report
from gpt_ft.data.batches import PackedBatch, SharedContextBatch, TaskBatch, collate_batch
from gpt_ft.data.file_faults import file_format, json_records, record_lines
from gpt_ft.data.files import read_table
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.errors import about, at_least_one, check_output_file, device_named, input_file, writing
from gpt_ft.eval.progress import batches_bar
from gpt_ft.model.decoding import eval_mode
from gpt_ft.training.terms import batch_terms
from gpt_ft.weights.checkpoint import Checkpoint
from gpt_ft.weights.pretrained import GPT


class Classifier:
    """A fine-tuned GPT with its task head, tokenizer and task card."""

    def __init__(
        self,
        gpt: GPT,
        head: TaskHead,
        task: TaskAdapter,
        tokenizer,
        *,
        max_length: int,
        device: str,
        temperature: float = 1.0,
        packing: bool = True,
        shared_context: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.packing = packing
        """Run a batch's examples end to end in packed rows (as `--data.packing`); False: padded."""
        self.shared_context = shared_context
        """Run a multiple-choice example's shared context once (as `--data.shared_context`)."""
        self.temperature = temperature
        """Divides the head's outputs before probabilities (`gpt-ft calibrate`); 1: as trained."""
        self.gpt, self.head = gpt.to(self.device), head.to(self.device)  # (in eval mode as they score)
        self.task = task
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        self.specials = special_token_ids(self.tokenizer)
        self.max_length = min(max_length, gpt.config.n_positions)

    @classmethod
    def from_checkpoint(cls, path: str | Path | Checkpoint, *, device: str | None = None) -> Classifier:
        """A `.ckpt` of `gpt-ft fit` on a task (or one already read); on the GPU when there is one,
        unless `device` says."""
        device = device_named(device, option="device")
        stored = path if isinstance(path, Checkpoint) else Checkpoint.read(path)
        path = stored.where
        task = card_from_value(stored.require_task_card(), f"The task card recorded in {path}")
        if stored.tokenizer is None:
            raise ValueError(f"{path} carries no tokenizer.")
        tokenizer = load_tokenizer(str(stored.saved_tokenizer()))
        gpt = GPT.from_checkpoint(stored)
        config = gpt.config
        head = task.head(config.n_embd, dropout=0.0, init_std=config.initializer_range, bias=config.bias)
        head.load_state_dict(stored.submodule_state("head"))
        return cls(
            gpt,
            head,
            task,
            tokenizer,
            max_length=stored.data_args.get("max_length", 512),
            device=device,
            temperature=stored.temperature,
            packing=stored.data_args.get("packing", True),
            shared_context=stored.data_args.get("shared_context", True),
        )

    def outputs(
        self, batch: PackedBatch | TaskBatch | SharedContextBatch, *, calibrated: bool = True
    ) -> Tensor:
        """The task head's outputs for a batch (on the classifier's device), divided by the
        temperature (`calibrated`)."""
        batch = move_data_to_device(batch, self.device)
        with eval_mode(self.gpt, self.head):  # a model mid-training goes on training after
            logits = batch_terms(self.gpt, self.head, batch, lm=False)["logits"]
        return logits / self.temperature if calibrated else logits

    @torch.no_grad()  # (not inference mode: the outputs are the caller's, for any use)
    def raw_outputs(self, examples: list[dict[str, Any]], *, batch_size: int = 32) -> Tensor:
        """The head's outputs for `examples` in order, at temperature 1 (what calibration fits)."""
        at_least_one(batch_size, "batch_size")
        encoded = self.encode(examples)
        if not encoded:
            return torch.empty(0)
        chunks = [
            self.outputs(self.batch(encoded[i : i + batch_size]), calibrated=False)
            for i in range(0, len(encoded), batch_size)
        ]
        width = max(c.shape[-1] for c in chunks) if chunks[0].dim() > 1 else None
        if width is not None:  # multiple choice: rows of fewer choices padded with the lowest score
            low = torch.finfo(chunks[0].dtype).min
            chunks = [torch.nn.functional.pad(c, (0, width - c.shape[-1]), value=low) for c in chunks]
        return torch.cat(chunks).cpu()

    def batch(self, chunk: list[dict[str, Any]]) -> PackedBatch | TaskBatch | SharedContextBatch:
        shared = self.shared_context and self.task.shares_context  # as TaskDataModule.collator decides
        return collate_batch(chunk, self.specials, packing=self.packing, shared=shared)

    def encode(self, examples: list[dict[str, Any]], *, where=None) -> list[dict[str, Any]]:
        """The examples as the model sees them: the task's own path from examples to tokens, which
        `TaskDataModule` takes in training (labels are not read; a card that groups records, each
        record alone). `where(i)` names example i in an error (default: 'example i')."""
        if isinstance(examples, (str, dict)) or not hasattr(examples, "__iter__"):  # None: no list either
            raise TypeError(f"Classifier takes a list of examples, got {examples!r}: put it in a list.")
        if hasattr(examples, "to_dict") and hasattr(examples, "columns"):  # a table: its column names iterate
            raise TypeError(
                "Classifier takes a list of examples, got a table: give table.to_dict('records')."
            )
        examples = list(examples)
        if bad := [i for i, example in enumerate(examples) if not isinstance(example, dict)]:
            fields = ", ".join(f"{f!r}: ..." for f in self.task.text_fields())
            raise TypeError(f"Classifier takes examples as dicts; example {bad[0]} is {examples[bad[0]]!r}: "
                            f"give {{{fields}}}.")  # fmt: skip
        unlabelled = []
        for i, example in enumerate(examples):
            with about(where or (lambda i: f"example {i}"), i, self.task.name):
                unlabelled.append(self.task.to_predict(example))
        encoded = self.task.encode_examples(
            unlabelled, self.tokenizer, self.specials, self.max_length, where=where
        )
        return [{**enc.fields(), "label": None, "index": i, "cut": enc.cut} for i, enc in enumerate(encoded)]

    def predict(self, examples: list[dict[str, Any]], *, batch_size: int = 32) -> list[dict[str, Any]]:
        """One `{"label": ..., "scores": ...}` per example, in order (see `TaskOutput.outcome`).

        Batches are packed rows (no padding between examples), or with `packing` off, batches of
        examples of similar length, so that little is spent on padding.
        """
        return [outcome for outcome, _ in self.run(examples, batch_size=batch_size)]

    @torch.inference_mode()
    def run(
        self, examples: list[dict[str, Any]], *, batch_size: int = 32, where=None, progress=iter
    ) -> list[tuple[dict[str, Any], str]]:
        """Each example's outcome and its prediction written as text (label names, a score);
        `progress` wraps the batches (`gpt-ft label`'s bar)."""
        return self.run_encoded(self.encode(examples, where=where), batch_size=batch_size, progress=progress)

    @torch.inference_mode()
    def run_encoded(
        self, encoded: list[dict[str, Any]], *, batch_size: int = 32, progress=iter
    ) -> list[tuple[dict[str, Any], str]]:
        """`run` on examples `encode` gave."""
        at_least_one(batch_size, "batch_size")
        order = sorted(range(len(encoded)), key=lambda i: -max(len(s) for s in encoded[i]["input_ids"]))
        out: list[tuple[dict[str, Any], str] | None] = [None] * len(encoded)
        for start in progress(range(0, len(order), batch_size)):
            chunk = [encoded[i] for i in order[start : start + batch_size]]
            # Decided on the raw outputs, as training and `gpt-ft predict` decide (a multi-label
            # head's threshold is the card's, not the calibrated sigmoid's); probabilities calibrated.
            raw = self.outputs(self.batch(chunk), calibrated=False)
            predictions = self.head.predictions(raw).cpu()
            probabilities = self.head.probabilities(raw / self.temperature).cpu()
            for row, example in enumerate(chunk):
                text = self.task.format_prediction(predictions[row], submission=False)
                sequences = len(example["input_ids"])
                outcome = self.task.output.row_outcome(predictions[row], probabilities[row], sequences)
                out[example["index"]] = (outcome, text)
        return out


def label(
    *,
    ckpt_path: str,
    input: str,
    output: str,
    overwrite: bool = False,
    batch_size: int = 32,
    device: str | None = None,
) -> None:
    """Write each example of a file again with the fine-tuned model's prediction beside it.

    `gpt-ft label`.

    Args:
        ckpt_path: A fine-tuned checkpoint of gpt-ft fit.
        input: csv, tsv, json/jsonl or parquet; columns named as the card's fields, or as its
            files name them (the card's `columns` renames apply).
        output: csv, tsv, json (one array), jsonl or parquet (by extension); a new file.
        overwrite: Replace --output if it exists.
        batch_size: Examples per batch.
        device: Default: cuda when there is one.
    """
    source, target = input_file(input, "--input"), Path(output).expanduser()
    at_least_one(batch_size, "--batch_size")
    if target.suffix.lower() not in (".csv", ".tsv", *WHOLE_ROWS):
        raise ValueError(f"--output {target}: write .csv, .tsv, .json, .jsonl or .parquet.")
    check_output_file(target, "--output", overwrite=overwrite, reads=source)
    fmt = file_format(source)
    if fmt is None:
        raise ValueError(
            f"--input {source}: give a .csv, .tsv, .json/.jsonl or .parquet file (by its extension)."
        )
    clf = Classifier.from_checkpoint(ckpt_path, device=device_named(device))
    if clf.task.output.embeds:
        raise ValueError(
            f"{ckpt_path} is an embedding model (task {clf.task.name!r}): `gpt-ft embed` writes its vectors."
        )
    task, table = clf.task, read_table(source)
    renames = {  # a file laid out as the card's files or hub dataset: their renames apply
        **((task.hub.columns if task.hub else None) or {}),
        **((task.local.columns if task.local else None) or {}),
    }
    headerless = fmt in ("tsv", "csv") and reads_as_data(task, table.column_names, renames)
    if headerless:  # a file laid out as the card's without a header (CoLA's train and dev)
        table = read_table(source, column_names=task.local.column_names)
    rows = json_records(source, table.to_list())  # a record's missing field stays missing
    lines = record_lines(source, fmt, header=not headerless) or list(range(1, len(rows) + 1))
    where = lambda i: f"{source}, line {lines[i]}"  # noqa: E731  (the row a message names)
    fields = [
        {renames[k] if k in renames and renames[k] not in row else k: v for k, v in row.items()}
        for row in rows
    ]
    try:
        encoded = clf.encode(fields, where=where)
    except TaskDataError as exc:  # a field no row of a table has: its header's fault, not line 2's
        absent = [f for f in task.text_fields() if fmt != "json" and fields and f not in fields[0]]
        if absent and f"has no field {absent[0]!r}" in str(exc):
            raise TaskDataError(
                f"{source} has no column {absent[0]!r}, which task {task.name!r} reads; its columns: "
                f"{', '.join(table.column_names)}."
            ) from None
        raise
    labelled = clf.run_encoded(encoded, batch_size=batch_size, progress=batches_bar("label"))
    names = write_labelled(target, rows, labelled)
    moved = [got for wanted, got in names.items() if got != wanted]
    renamed = f" (as {' and '.join(moved)}: it has such columns)" if moved else ""
    print(f"labelled {len(rows):,} example{'s' * (len(rows) != 1)} of {source} into {target}{renamed}")
    if said := cut_report(str(source), [e["cut"] for e in encoded], clf.max_length):
        print(said)


def reads_as_data(task: TaskAdapter, header: list[str], renames: dict[str, str]) -> bool:
    """Whether a file's first line, read as its `header`, is a row of the card's files that have
    none (`local.column_names`): as many cells, not every text field named (`renames` applied),
    a label where the label is."""
    names, label = (task.local.column_names if task.local else None) or [], task.label_column
    named = {renames.get(c, c) for c in header}
    if len(header) != len(names) or set(task.text_fields()) <= named or label not in names:
        return False
    try:  # read as the card reads a label cell: GoEmotions' "15,17" split, an empty one unlabelled
        task.output.example_label({task.output.spec.field: header[names.index(label)]})
        return True
    except TaskDataError:  # "label", "gold": a header
        return False


NEW_COLUMNS = {"label": "prediction", "scores": "scores"}  # an outcome's keys, the columns they fill
WHOLE_ROWS = (".json", ".jsonl", ".parquet")  # outputs that take the whole outcome, typed


def write_labelled(
    path,
    rows: list[dict[str, Any]],
    labelled: list[tuple[dict[str, Any], str]],
    columns: dict[str, str] = NEW_COLUMNS,
) -> dict[str, str]:
    """The rows with a `prediction` column (json, jsonl and parquet: the `scores` and the rest of the
    outcome, such as a preference's `probability`, too), written whole or not at all; the name each column
    written got, by the name it wanted (`prediction_1`, ... where the rows have their own). `columns`:
    the outcome's keys and the columns they fill (`gpt-ft generate`'s: its `continuation`)."""
    taken = {key for row in rows for key in row}
    wanted = {
        **columns,
        **{key: key for outcome, _ in labelled for key in outcome if key not in columns},
    }
    names = {key: free_name(name, taken) for key, name in wanted.items()}
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):  # no space left, permission denied: one sentence, the previous file kept
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_rows(tmp, path.suffix.lower(), rows, labelled, names)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    whole = path.suffix.lower() in WHOLE_ROWS  # a csv or tsv gets the prediction alone
    return {wanted[key]: got for key, got in names.items() if whole or key == "label"}


def free_name(name: str, taken: set[str]) -> str:
    """`name`, or the first of name_1, name_2, ... not `taken`."""
    return next(
        n for n in itertools.chain([name], (f"{name}_{i}" for i in itertools.count(1))) if n not in taken
    )


def jsonable(value: Any) -> Any:
    """A value JSON has no type for, written as text: a date or time as ISO 8601 (a parquet column's),
    bytes as their UTF-8 text (as training reads a binary column), else base64."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity (a parquet float column's missing cell) as None: JSON has
    no such numbers, and strict readers refuse Python's `NaN`."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return [finite(v) for v in value] if isinstance(value, list) else value


def _cell(value: Any) -> str:
    """A table cell: a list or mapping (a row's steps, its replies) as JSON, not Python's repr; a
    missing value (None, a parquet float column's NaN) as an empty cell, as spreadsheets write it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return (
        json.dumps(finite(value), ensure_ascii=False, default=jsonable)
        if isinstance(value, (list, dict))
        else jsonable(value)
        if isinstance(value, (bytes, bytearray))
        else str(value)
    )


def _write_rows(tmp, suffix: str, rows: list[dict[str, Any]], labelled, names: dict[str, str]) -> None:
    prediction = names["label"]
    columns = list(dict.fromkeys(key for row in rows for key in row))  # records may differ in their keys
    records = [  # the whole outcome beside each row, for the outputs that take it
        finite({**row, **{name: outcome[key] for key, name in names.items() if key in outcome}})
        for row, (outcome, _) in zip(rows, labelled)
        if suffix in WHOLE_ROWS
    ]
    if suffix == ".parquet":  # each column typed as its values are (a parquet input's kept)
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.write_table(pa.Table.from_pylist(records), tmp)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # a column of several types (JSON records')
            output = tmp.with_name(tmp.name[1:].removesuffix(".tmp"))
            raise ValueError(
                f"--output {output}: parquet cannot hold these rows ({exc}); write .jsonl."
            ) from None
    with tmp.open("w", encoding="utf-8", newline="") as f:
        if suffix in (".jsonl", ".json"):
            if suffix == ".json":  # one array, as a .json input is read
                f.write(json.dumps(records, ensure_ascii=False, indent=1, default=jsonable) + "\n")
            for record in records if suffix == ".jsonl" else []:
                f.write(json.dumps(record, ensure_ascii=False, default=jsonable) + "\n")
        elif suffix == ".tsv":  # read back without quoting, as GLUE's files are
            f.write("\t".join(re.sub(r"[\t\r\n]", " ", c) for c in [*columns, prediction]) + "\n")
            for row, (_, text) in zip(rows, labelled):
                cells = [_cell(row.get(c)) for c in columns] + [text]
                f.write("\t".join(re.sub(r"[\t\r\n]", " ", c) for c in cells) + "\n")
        else:
            writer = csv.writer(f)
            writer.writerow([*columns, prediction])
            for row, (_, text) in zip(rows, labelled):
                writer.writerow([*(_cell(row.get(c)) for c in columns), text])
