"""TaskDataModule: a task card's splits -> GPT-1 inputs -> padded (B, S, T) batches.

datasets -> adapter.texts -> tokenizer (batched) -> adapter.encode -> cached Arrow -> collate.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any, Literal

import torch
from lightning import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader

from gpt_ft.adapters import TaskAdapter, TaskDataError
from gpt_ft.samplers import EpochSampler, LengthGroupedSampler, ResumableTrainData
from gpt_ft.tokenizer import load_tokenizer, special_token_ids

IGNORE_INDEX = -100  # targets the LM loss skips (padding)
_SLICE = re.compile(r"^(?P<file>.*?)(?P<slice>\[[^\[\]]*\])?$")
_FORMATS = {".tsv": "tsv", ".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_split(task: TaskAdapter, split: str, data_dir: str | Path | None):
    """One split of the task as a `datasets.Dataset`, columns renamed to the adapter's field names.

    From local files under `data_dir` when given (the card's `local` layout), else from the Hub.
    """
    import datasets

    if data_dir is not None:
        return _load_local(task, split, Path(data_dir).expanduser())
    if task.hub is None:
        raise TaskDataError(
            f"Task {task.name!r} has no hub dataset; pass its files with --data.data_dir DIR."
        )
    hub_split = (task.hub.splits or {}).get(split, split)
    config = (task.hub.configs or {}).get(split, task.hub.name)
    try:
        ds = datasets.load_dataset(task.hub.path, config, split=hub_split)
    except ValueError as exc:  # unknown split
        raise TaskDataError(
            f"Hub dataset {task.hub.path} ({config}) has no split {hub_split!r}: {exc}"
        ) from exc
    return _rename(ds, task.hub.columns, f"hub dataset {task.hub.path}")


def _load_local(task: TaskAdapter, split: str, data_dir: Path):
    import datasets

    spec = task.local
    if spec is None:
        raise TaskDataError(
            f"Task {task.name!r} defines no local file layout; drop --data.data_dir to use the hub."
        )
    if split not in spec.splits:
        raise TaskDataError(
            f"Task {task.name!r} has no local split {split!r}; its card defines {sorted(spec.splits)}."
        )
    match = _SLICE.match(spec.splits[split])
    path, selection = data_dir / match["file"], match["slice"] or ""
    if not path.is_file():
        raise TaskDataError(f"{path}: file not found (split {split!r} of task {task.name!r}).")
    if path.stat().st_size == 0:
        raise TaskDataError(f"{path}: file is empty (split {split!r} of task {task.name!r}).")
    fmt = spec.format or _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise TaskDataError(
            f"{path}: unknown file format; set `format` (tsv, csv, json, parquet) in the card."
        )
    if fmt in ("tsv", "csv"):
        headerless = spec.column_names is not None and (
            spec.headerless_splits is None or split in spec.headerless_splits
        )
        sep = "\t" if fmt == "tsv" else ","
        try:
            columns = list(spec.column_names) if headerless else _header(path, sep)
        except UnicodeDecodeError as exc:
            raise TaskDataError(f"{path}: not UTF-8 text ({exc.reason}); save it as UTF-8.") from None
        except OSError as exc:
            raise TaskDataError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
        # Everything is read as text (labels and scores are parsed by the adapter). GLUE's TSVs
        # hold unbalanced quote characters, so TSVs are read with no quoting; BOMs are dropped.
        features = datasets.Features({c: datasets.Value("string") for c in columns})
        kwargs = dict(
            sep=sep,
            quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
            encoding="utf-8-sig",
            keep_default_na=False,
            na_filter=False,
            features=features,
        )
        # Names always given: pandas would rename an empty header cell (SWAG's CSVs start with one).
        kwargs.update(header=None if headerless else 0, column_names=columns)
        builder = "csv"
    else:
        builder, kwargs = fmt, {}
    try:
        files = {"data": str(path)}
        ds = datasets.load_dataset(builder, data_files=files, split="data" + selection, **kwargs)
    except Exception as exc:  # pandas/pyarrow parse errors, an empty selection
        if "corresponds to no data" in str(exc):
            raise TaskDataError(f"{path}: split {split!r} has no examples.") from None
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskDataError(f"{path}: cannot be read as {fmt} ({reason}).") from exc
    return _rename(ds, spec.columns, str(path))


def _header(path: Path, sep: str) -> list[str]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        line = f.readline()
    if sep == "\t":
        return line.rstrip("\r\n").split("\t")
    return next(csv.reader([line]))


def _rename(ds, columns: dict[str, str] | None, source: str):
    renames = {old: new for old, new in (columns or {}).items() if old in ds.column_names and old != new}
    return ds.rename_columns(renames) if renames else ds


def _example_id(example: dict[str, Any], index_field: str | None, row: int) -> int:
    """The example's integer id from the card's index field (GLUE test files), else its row number."""
    value = example.get(index_field) if index_field else None
    try:
        return int(value)
    except (TypeError, ValueError):
        return row


def collate(
    examples: list[dict[str, Any]], pad_id: int, padding_side: Literal["right", "left"] = "right"
) -> dict[str, Tensor]:
    """Pad a list of encoded examples into a batch.

    Returns:
        input_ids (B, S, T), attention_mask (B, S, T), lm_targets (B, S, T) (the next token, or -100
        at padding and at each sequence's last token), extract_index (B, S), choice_mask (B, S)
        (False for choices a row does not have), index (B,), and labels (B,) when every example
        has one (long for classes and choices, float for regression scores).
    """
    B = len(examples)
    S = max(len(e["input_ids"]) for e in examples)
    T = max(len(seq) for e in examples for seq in e["input_ids"])
    input_ids = torch.full((B, S, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, S, T), dtype=torch.long)
    lm_targets = torch.full((B, S, T), IGNORE_INDEX, dtype=torch.long)
    extract_index = torch.zeros((B, S), dtype=torch.long)
    choice_mask = torch.zeros((B, S), dtype=torch.bool)
    for b, example in enumerate(examples):
        for s, seq in enumerate(example["input_ids"]):
            n = len(seq)
            offset = T - n if padding_side == "left" else 0
            ids = torch.tensor(seq, dtype=torch.long)
            input_ids[b, s, offset : offset + n] = ids
            attention_mask[b, s, offset : offset + n] = 1
            lm_targets[b, s, offset : offset + n - 1] = ids[1:]
            extract_index[b, s] = offset + example["extract_index"][s]
            choice_mask[b, s] = True
        if S > len(
            example["input_ids"]
        ):  # missing choices: one pad token each, never attended from real ones
            attention_mask[b, len(example["input_ids"]) :, -1 if padding_side == "left" else 0] = 1
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "lm_targets": lm_targets,
        "extract_index": extract_index,
        "choice_mask": choice_mask,
        "index": torch.tensor([e["index"] for e in examples], dtype=torch.long),
        "left_padded": padding_side == "left",  # the model then needs the attention mask
    }
    labels = [e["label"] for e in examples]
    if all(label is not None for label in labels):
        is_float = any(isinstance(label, float) for label in labels)
        batch["labels"] = torch.tensor(labels, dtype=torch.float if is_float else torch.long)
    return batch


def collate_shared(examples: list[dict[str, Any]], pad_id: int, delim_id: int) -> dict[str, Tensor] | None:
    """Multiple-choice examples as one shared context and the choices' continuations, or None when
    some example's choices do not all start with the same `[start] context [delim]`.

    Returns, besides `choice_mask`, `index` and `labels` as `collate`:
        context_ids (B, Tc): [start] context [delim], right-padded; context_length (B,);
        context_targets (B, Tc): the next context token, -100 at the delim and at padding;
        answer_ids (B, S, Ta): answer_k [extract], right-padded; answer_extract (B, S);
        delim_targets (B, S): each choice's first token, which the delim's state predicts (-100
            for a missing choice); answer_targets (B, S, Ta): the next answer token, -100 at the
            extract and at padding.
    The LM terms add up to `collate`'s: the context's, counted once per choice, plus the choices'.
    """
    prefixes, answers = [], []
    for example in examples:
        first = example["input_ids"][0]
        if delim_id not in first:
            return None
        n = first.index(delim_id) + 1
        if any(seq[:n] != first[:n] for seq in example["input_ids"]):
            return None
        prefixes.append(first[:n])
        answers.append([seq[n:] for seq in example["input_ids"]])
    B = len(examples)
    S = max(len(a) for a in answers)
    Tc = max(len(p) for p in prefixes)
    Ta = max(len(seq) for a in answers for seq in a)
    context_ids = torch.full((B, Tc), pad_id, dtype=torch.long)
    context_targets = torch.full((B, Tc), IGNORE_INDEX, dtype=torch.long)
    answer_ids = torch.full((B, S, Ta), pad_id, dtype=torch.long)
    answer_targets = torch.full((B, S, Ta), IGNORE_INDEX, dtype=torch.long)
    delim_targets = torch.full((B, S), IGNORE_INDEX, dtype=torch.long)
    answer_extract = torch.zeros((B, S), dtype=torch.long)
    choice_mask = torch.zeros((B, S), dtype=torch.bool)
    for b, (prefix, choices) in enumerate(zip(prefixes, answers)):
        ids = torch.tensor(prefix, dtype=torch.long)
        context_ids[b, : len(prefix)] = ids
        context_targets[b, : len(prefix) - 1] = ids[1:]
        for k, seq in enumerate(choices):
            ids = torch.tensor(seq, dtype=torch.long)
            answer_ids[b, k, : len(seq)] = ids
            answer_targets[b, k, : len(seq) - 1] = ids[1:]
            delim_targets[b, k] = ids[0]
            answer_extract[b, k] = len(seq) - 1
            choice_mask[b, k] = True
    batch = {
        "context_ids": context_ids,
        "context_length": torch.tensor([len(p) for p in prefixes], dtype=torch.long),
        "context_targets": context_targets,
        "answer_ids": answer_ids,
        "answer_targets": answer_targets,
        "delim_targets": delim_targets,
        "answer_extract": answer_extract,
        "choice_mask": choice_mask,
        "index": torch.tensor([e["index"] for e in examples], dtype=torch.long),
    }
    labels = [e["label"] for e in examples]
    if all(label is not None for label in labels):
        batch["labels"] = torch.tensor(labels, dtype=torch.long)
    return batch


class TaskDataModule(ResumableTrainData, LightningDataModule):
    """Batches of GPT-1 inputs for one task card.

    Right after construction it exposes what the model needs (linked in cli.py): `vocab_size`,
    `special_ids`, `num_labels`, `head_kind`, `num_sequences`.
    """

    def __init__(
        self,
        task: TaskAdapter | None = None,
        tokenizer: str | None = None,
        *,
        data_dir: str | None = None,
        max_length: int = 512,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        num_proc: int | None = None,
        padding_side: Literal["right", "left"] = "right",
        shuffle: bool = True,
        length_grouped: bool = False,
        shared_context: bool = True,
        seed: int | None = None,
    ) -> None:
        """
        Args:
            task: The task card (a TaskAdapter): a YAML file path or class_path + init_args. May be
                left out by validate/test/predict with a fine-tuned --ckpt_path (it records its card).
            tokenizer: Tokenizer directory (or hub name); the GPT-1 special tokens are added. May be
                left out when --model.init_from names weights that carry their tokenizer.
            data_dir: Folder with the task's local files (e.g. a GLUE download); None: the hub.
            max_length: Longest sequence, special tokens included; longer texts are cut, longest first.
            batch_size: Training examples per batch.
            eval_batch_size: Examples per evaluation batch; default batch_size.
            num_workers: DataLoader worker processes.
            num_proc: Processes for encoding (datasets' map); None encodes in this process.
            padding_side: Pad sequences on the right (default) or the left.
            shuffle: Shuffle the training examples every epoch; False keeps the file's order.
            length_grouped: Batch training examples of similar length (batches shuffled between
                themselves), which cuts padding.
            shared_context: Multiple choice: run each example's `[start] context [delim]` once and
                its choices against the context's keys and values, instead of the whole sequence
                once per choice (same results, a fraction of the compute for long contexts).
            seed: Seed of the training order; default the run's seed_everything.
        """
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if max_length < 4:
            raise ValueError(f"max_length must be >= 4 (room for the special tokens), got {max_length}.")
        self.task = task
        self.data_dir = data_dir
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.num_proc = num_proc
        self.padding_side = padding_side
        self.shuffle, self.length_grouped = shuffle, length_grouped
        self.shared_context = shared_context
        self.seed = seed if seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))
        if task is None:
            raise ValueError("No task: give --data.task CARD (e.g. tasks/glue/rte.yaml).")
        if tokenizer is None:
            raise ValueError(
                "No tokenizer: give --data.tokenizer DIR, or --model.init_from weights that carry one."
            )
        self.tokenizer_path = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self.special_ids = special_token_ids(self.tokenizer)
        self.vocab_size = len(self.tokenizer)
        self.num_labels = task.num_labels
        self.head_kind = task.head_kind
        self.num_sequences = task.num_sequences
        self.datasets: dict[str, Any] = {}

    # ---- loading and encoding ----

    def encoded(self, split: str, *, labelled: bool):
        """The encoded split (cached); `labelled` demands a label on every example."""
        if split not in self.datasets:
            self.datasets[split] = self._encode_split(split)
        ds = self.datasets[split]
        if labelled and None in ds.unique("label"):
            raise TaskDataError(
                f"{self._source(split)}: split {split!r} has examples without a label (field "
                f"{self.task.label!r}); it cannot be used for training or validation."
            )
        return ds

    def _source(self, split: str) -> str:
        if self.data_dir is None:
            return f"hub dataset {self.task.hub.path if self.task.hub else '?'} split {split}"
        return str(Path(self.data_dir).expanduser() / _SLICE.match(self.task.local.splits[split])["file"])

    def _encode_split(self, split: str):
        raw = load_split(self.task, split, self.data_dir)
        source = self._source(split)
        if len(raw) == 0:
            raise TaskDataError(f"{source}: split {split!r} has no examples.")
        missing = [f for f in self.task.text_fields() if f not in raw.column_names]
        if missing:
            raise TaskDataError(
                f"{source}: missing column(s) {missing} needed by task {self.task.name!r}; "
                f"the file has {raw.column_names}."
            )
        index_field = self.task.index if self.task.index in raw.column_names else None
        if self.task.ignore_labels and self.task.label in raw.column_names:
            ignored = set(self.task.ignore_labels)
            raw = raw.filter(lambda row: str(row[self.task.label]) not in ignored, desc="Dropping rows")

        def encode_batch(batch: dict[str, list], rows: list[int]) -> dict[str, list]:
            examples = [dict(zip(batch, values)) for values in zip(*batch.values())]
            texts = []
            for row, example in zip(rows, examples):
                try:
                    texts.append(self.task.texts(example))
                except TaskDataError as exc:
                    raise TaskDataError(f"{source}, row {row}: {exc}") from None
            flat = [t for example_texts in texts for t in example_texts]
            ids = self.tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
            out: dict[str, list] = {k: [] for k in ("input_ids", "extract_index", "label", "index", "length")}
            start = 0
            for row, example, example_texts in zip(rows, examples, texts):
                tokens, start = ids[start : start + len(example_texts)], start + len(example_texts)
                try:
                    enc = self.task.encode(example, tokens, self.special_ids, self.max_length)
                except TaskDataError as exc:
                    raise TaskDataError(f"{source}, row {row}: {exc}") from None
                out["input_ids"].append(enc.sequences)
                out["extract_index"].append(enc.extract_index)
                out["label"].append(enc.label)
                out["index"].append(_example_id(example, index_field, row))
                out["length"].append(max(len(seq) for seq in enc.sequences))
            return out

        return raw.map(
            encode_batch,
            batched=True,
            with_indices=True,
            remove_columns=raw.column_names,
            num_proc=self.num_proc,
            desc=f"Encoding {self.task.name} {split}",
        )

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.encoded("train", labelled=True)
        if stage in ("fit", "validate"):
            for split in self.task.validation_splits:
                self.encoded(split, labelled=True)
        if stage == "test":
            for split in self.task.test_splits:
                self.encoded(split, labelled=True)
        if stage == "predict":
            for split in self.task.test_splits:
                self.encoded(split, labelled=False)

    # ---- loaders ----

    def _loader(self, split: str, *, train: bool, labelled: bool) -> DataLoader:
        dataset = self.encoded(split, labelled=labelled).with_format(None)
        batch_size = self.batch_size if train else self.eval_batch_size
        sampler = self._resumed(self._train_sampler(dataset), batch_size) if train else None
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            # Loader seeds from its own generator, not the global RNG that a resumed run restores.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _train_sampler(self, dataset) -> EpochSampler:
        """Our own sampler, in one process too: the order depends on (seed, epoch) only, so that a
        resumed run sees the same batches, and on DDP each rank takes its share of it.

        Evaluation keeps Lightning's: under DDP it repeats a few examples to even out the ranks,
        and the metrics drop the repeats by example index.
        """
        trainer = getattr(self, "trainer", None)
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if self.length_grouped:
            return LengthGroupedSampler(
                dataset["length"],
                self.batch_size,
                num_replicas=world,
                rank=rank,
                shuffle=self.shuffle,
                seed=self.seed,
            )
        return EpochSampler(dataset, num_replicas=world, rank=rank, shuffle=self.shuffle, seed=self.seed)

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, Tensor]:
        if self.shared_context and self.head_kind == "multiple_choice" and self.padding_side == "right":
            batch = collate_shared(examples, self.special_ids.pad, self.special_ids.delim)
            if batch is not None:
                return batch
        return collate(examples, self.special_ids.pad, self.padding_side)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True, labelled=True)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(s, train=False, labelled=True) for s in self.task.validation_splits]

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(s, train=False, labelled=True) for s in self.task.test_splits]

    def predict_dataloader(self) -> list[DataLoader]:
        return [self._loader(s, train=False, labelled=False) for s in self.task.test_splits]

    # ---- inspection ----

    def explain(self, split: str, index: int) -> dict[str, Any]:
        """Example `index` of `split` as the model sees it: tokens (specials visible), ids, extract index."""
        ds = self.encoded(split, labelled=False)
        if not 0 <= index < len(ds):
            raise TaskDataError(f"--index {index} is out of range: split {split!r} has {len(ds)} examples.")
        example = ds[index]
        label = example["label"]
        if label is not None and self.head_kind == "classification":
            label = self.task.label_name(label)
        sequences = [
            {"tokens": self.tokenizer.convert_ids_to_tokens(ids), "ids": ids, "extract_index": k}
            for ids, k in zip(example["input_ids"], example["extract_index"])
        ]
        return {"label": label, "sequences": sequences}
