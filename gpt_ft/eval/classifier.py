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

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpt_ft.adapters import TaskAdapter, TaskDataError, TaskHead
from gpt_ft.adapters.cards import as_task, card_from_value
from gpt_ft.adapters.sources import with_paths
from gpt_ft.adapters.truncation import LONGER, TRAINED
from gpt_ft.data.batches import PackedBatch, SharedContextBatch, TaskBatch, collate_batch
from gpt_ft.data.tokenizer import embedding_size, load_tokenizer, special_token_ids
from gpt_ft.errors import FileProblem, about, at_least_one
from gpt_ft.eval.devices import device_named
from gpt_ft.model.decoding import eval_mode
from gpt_ft.training.terms import batch_terms
from gpt_ft.weights.checkpoint import Checkpoint
from gpt_ft.weights.pretrained import GPT, check_tokenizer_fits
from gpt_ft.weights.state_checks import check_real_weights, load_state

CHUNK = 4096  # examples encoded and run at a time (`gpt-ft label` rounds it up to whole batches)


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
        self.device = torch.device(device_named(str(device), option="device"))
        self.packing = packing
        """Run a batch's examples end to end in packed rows (as `--data.packing`); False: padded."""
        self.shared_context = shared_context
        """Run a multiple-choice example's shared context once (as `--data.shared_context`)."""
        if not (
            isinstance(temperature, int | float)
            and not isinstance(temperature, bool)
            and 0 < temperature < math.inf
        ):
            raise ValueError(
                f"temperature must be a positive number (every score is divided by it), got {temperature!r}."
            )
        self.temperature = float(temperature)
        """Divides the head's outputs before probabilities (`gpt-ft calibrate`); 1: as trained."""
        self.gpt, self.head = gpt.to(self.device), head.to(self.device)  # (in eval mode as they score)
        self.task = as_task(task)  # (a card's path, as GPTModule takes it)
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
        gpt = GPT.from_checkpoint(stored)
        tokenizer = saved_tokenizer(stored, gpt.config.vocab_size)
        config = gpt.config
        head = task.head(config.n_embd, dropout=0.0, init_std=config.initializer_range, bias=config.bias)
        state, described = stored.submodule_state("head"), f"the head of task {task.name!r}"
        check_real_weights(stored.state, ["head." + name for name, _ in head.named_parameters()], path)
        load_state(head, state, path, described=described, prefix="head.")
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
        batch = batch.to_device(self.device)
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
        examples = self.examples(examples)
        unlabelled = []
        for i, example in enumerate(examples):
            with about(where or (lambda i: f"example {i}"), i, self.task.name):
                unlabelled.append(self.task.to_predict(example))
        try:
            encoded = self.task.encode_examples(
                unlabelled, self.tokenizer, self.specials, self.max_length, where=where
            )
        except TaskDataError as exc:  # the model's max_length is its training's: no option raises it here
            raise TaskDataError(str(exc).replace(LONGER, TRAINED)) from None
        names = [self.task.output.row_names(example) for example in unlabelled]  # a row's own choices'
        return [
            {**enc.fields(), "label": None, "index": i, "cut": enc.cut, "names": names[i]}
            for i, enc in enumerate(encoded)
        ]

    def examples(self, examples) -> list[dict[str, Any]]:
        """`examples` as a list of dicts, or one sentence on what was given instead."""
        if isinstance(examples, (str, bytes, dict)) or not hasattr(examples, "__iter__"):  # None: no list
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
        return [with_paths(example, self.task.read_fields()) for example in examples]  # `choices.text`

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
        `progress` wraps each chunk's batches. A long list is encoded and run `CHUNK` examples at a
        time, as `gpt-ft label` runs a file (memory stays a chunk's), every example read once before
        any runs (a bad one is named first)."""
        examples, where = self.examples(examples), where or (lambda i: f"example {i}")
        pieces = [(first, examples[first : first + CHUNK]) for first in range(0, len(examples), CHUNK)]
        encode = lambda first, piece: self.encode(piece, where=lambda i: where(first + i))  # noqa: E731
        for first, piece in pieces if len(pieces) > 1 else []:
            encode(first, piece)
        return [
            done
            for first, piece in pieces
            for done in self.run_encoded(encode(first, piece), batch_size=batch_size, progress=progress)
        ]

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
                sequences, names = len(example["input_ids"]), example.get("names")
                named = {"names": names} if names else {}  # (an output kind of a user's own may not take it)
                outcome = self.task.output.row_outcome(
                    predictions[row], probabilities[row], sequences, **named
                )
                text = (
                    outcome["label"]
                    if names
                    else self.task.format_prediction(predictions[row], submission=False)
                )
                out[example["index"]] = (outcome, text)
        return out


def saved_tokenizer(stored: Checkpoint, vocab_size: int):
    """The tokenizer saved beside a checkpoint, refused where the weights' rows do not fit it (a
    folder replaced since: every text would read as other tokens)."""
    tokenizer = load_tokenizer(str(folder := stored.saved_tokenizer()))
    try:
        check_tokenizer_fits(n := embedding_size(tokenizer), vocab_size, str(stored.where))
        if n > vocab_size:  # (the run made a row for each of its tokens)
            raise ValueError
    except ValueError:
        raise FileProblem(
            f"{folder} holds {embedding_size(tokenizer)} tokens, but the weights in {stored.where} have "
            f"{vocab_size} rows: it is not the tokenizer saved with them (replaced since?)."
        ) from None
    return tokenizer
