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

from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.data.batches import collate, collate_shared
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.model.weights import safe_load, weights_tokenizer
from gpt_ft.training.module import GPTModule


class Classifier:
    """A fine-tuned GPT with its task head, tokenizer and task card."""

    def __init__(self, module: GPTModule, tokenizer, *, max_length: int, device: str | torch.device) -> None:
        if module.task is None:
            raise ValueError("A Classifier needs a fine-tuned model: this one has no task.")
        self.module = module.to(device).eval()
        self.task: TaskAdapter = module.task
        self.tokenizer = tokenizer
        self.specials = special_token_ids(tokenizer)
        self.max_length = min(max_length, module.gpt.config.n_positions)
        self.device = torch.device(device)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str | None = None) -> Classifier:
        """A `.ckpt` of `gpt-ft fit` on a task; on the GPU when there is one, unless `device` says."""
        stored = safe_load(path)
        data = (stored.get("data_config") or {}).get("init_args", {})
        if "gpt_config" not in stored or not data.get("task"):
            raise ValueError(f"{path} is not a fine-tuned gpt_ft checkpoint: it records no task card.")
        parser = ArgumentParser(exit_on_error=False)
        parser.add_argument("--task", type=TaskAdapter)
        task = parser.instantiate_classes(parser.parse_object({"task": data["task"]})).task
        tokenizer_dir = weights_tokenizer(path)
        if tokenizer_dir is None:
            raise ValueError(f"{path} carries no tokenizer.")
        tokenizer = load_tokenizer(tokenizer_dir)
        hparams = stored.get("hyper_parameters", {})
        module = GPTModule(
            init_from=str(path),
            vocab_size=len(tokenizer),
            task=task,
            classifier_dropout=hparams.get("classifier_dropout", 0.1),
        )
        head = {k.removeprefix("head."): v for k, v in stored["state_dict"].items() if k.startswith("head.")}
        module.head.load_state_dict(head)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        return cls(module, tokenizer, max_length=data.get("max_length", 512), device=device)

    def encode(self, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The examples as the model sees them (as `TaskDataModule` encodes a split)."""
        texts = []
        for i, example in enumerate(examples):
            try:
                texts.append(self.task.texts(example))
            except KeyError as exc:
                raise TaskDataError(
                    f"example {i} has no field {exc.args[0]!r} (task {self.task.name!r})."
                ) from None
        flat = [t for example_texts in texts for t in example_texts]
        ids = self.tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
        encoded, start = [], 0
        for i, (example, example_texts) in enumerate(zip(examples, texts)):
            tokens, start = ids[start : start + len(example_texts)], start + len(example_texts)
            unlabelled = {k: v for k, v in example.items() if k != self.task.label}
            enc = self.task.encode(unlabelled, tokens, self.specials, self.max_length)
            encoded.append(
                {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": None, "index": i}
            )
        return encoded

    def predict(self, examples: list[dict[str, Any]], *, batch_size: int = 32) -> list[dict[str, Any]]:
        """One `{"label": ..., "scores": ...}` per example, in order (see `TaskAdapter.outcome`).

        Examples of similar length are batched together, so little is spent on padding.
        """
        return [outcome for outcome, _ in self.run(examples, batch_size=batch_size)]

    @torch.inference_mode()
    def run(
        self, examples: list[dict[str, Any]], *, batch_size: int = 32
    ) -> list[tuple[dict[str, Any], str]]:
        """Each example's outcome and its prediction written as text (label names, a score)."""
        encoded = self.encode(list(examples))
        order = sorted(range(len(encoded)), key=lambda i: -max(len(s) for s in encoded[i]["input_ids"]))
        out: list[tuple[dict[str, Any], str] | None] = [None] * len(encoded)
        for start in range(0, len(order), batch_size):
            chunk = [encoded[i] for i in order[start : start + batch_size]]
            batch = None
            if self.task.shares_context:
                batch = collate_shared(chunk, self.specials.pad, self.specials.delim)
            if batch is None:
                batch = collate(chunk, self.specials.pad)
            batch = self.module.transfer_batch_to_device(batch, self.device, 0)
            outputs = self.module(batch)
            head = self.module.head
            predictions, probabilities = head.predictions(outputs).cpu(), head.probabilities(outputs).cpu()
            for row, example in enumerate(chunk):
                text = self.task.format_prediction(predictions[row], submission=False)
                out[example["index"]] = (self.task.outcome(predictions[row], probabilities[row]), text)
        return out
