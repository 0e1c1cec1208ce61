"""TaskDataModule: a task card's splits -> GPT-1 inputs -> packed rows (or padded (B, S, T) batches).

datasets -> adapter.encode_examples (texts, tokenizer, GPT-1's framing and truncation: the one path
from examples to tokens, which `Classifier` and export take too) -> cached Arrow -> collate.
"""

from __future__ import annotations

import hashlib
import sys
from functools import partial
from typing import Any

import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import DataLoader, DistributedSampler

from gpt_ft.adapters import ENCODING, TaskAdapter, TaskDataError
from gpt_ft.adapters.cards import adapter_code, as_task, card_key
from gpt_ft.adapters.truncation import LONGER, WHOLE, cut_report
from gpt_ft.data.batches import collate_batch, reads
from gpt_ft.data.files import Origin, absent_columns, held_columns, located_split, task_examples
from gpt_ft.data.folders import datasets_bars, first_process
from gpt_ft.data.ids import example_ids, integer_id
from gpt_ft.data.pinning import check_model_fits, leave_stops_to_the_main_process, model_context, pins
from gpt_ft.data.samplers import EpochSampler, LengthGroupedSampler, ResumableTrainData, run_seed
from gpt_ft.data.subsets import ALIKE, left_out, training_subset
from gpt_ft.data.tokenizer import embedding_size, load_tokenizer, special_token_ids
from gpt_ft.errors import check_counts
from gpt_ft.workarounds.data import dataset_fingerprint

# The encoded labels' column while the split is mapped, named "label" after: a file's own "label"
# column would give its type (datasets' Json, for ints and strings mixed) to the new one.
LABEL = "encoded label"


class TaskDataModule(ResumableTrainData, LightningDataModule):
    """Batches of GPT-1 inputs for one task card.

    Right after construction it exposes what the model needs (linked by the command line):
    `task`, `vocab_size`, `tokenizer_path`.
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
        packing: bool = True,
        shuffle: bool = True,
        length_grouped: bool = False,
        shared_context: bool = True,
        seed: int | None = None,
        train_size: int | None = None,
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
            packing: Lay a batch's examples end to end in rows, without padding between them
                (positions restart at each example, attention stays inside it): the same results
                as padded batches, without computing the padding. False: padded (B, S, T) batches.
            shuffle: Shuffle the training examples every epoch; False keeps the file's order.
            length_grouped: Batch training examples of similar length (batches shuffled between
                themselves), which cuts padding.
            shared_context: Multiple choice: run each example's `[start] context [delim]` once and
                its choices against the context's keys and values, instead of the whole sequence
                once per choice (same results, a fraction of the compute for long contexts).
            seed: Seed of the training order; default the run's seed_everything.
            train_size: Fine-tune on this many training examples, a class-stratified subset drawn
                with `seed` (the same rows for every model at one seed: learning curves); the whole
                split where it has no more. None: the whole split.
        """
        super().__init__()
        check_counts(("batch_size", batch_size, 1), ("max_length", max_length, 4),
                     ("eval_batch_size", eval_batch_size, 1), ("num_workers", num_workers, 0),
                     ("num_proc", num_proc, 1))  # fmt: skip
        self.task, self.data_dir, self.max_length = as_task(task), data_dir, max_length
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.num_proc, self.packing = num_workers, num_proc, packing
        self.shuffle, self.length_grouped = shuffle, length_grouped
        self.shared_context = shared_context
        self.seed = run_seed(seed)
        if train_size is not None and train_size < 1:
            raise ValueError(f"train_size must be a positive number of examples, got {train_size}.")
        self.train_size = train_size
        if task is None:
            raise ValueError(
                "No task: give --data.task CARD (e.g. tasks/glue/rte.yaml), or --data LMDataModule "
                "--data.token_dir DIR (gpt-ft prepare's token files) for a language model."
            )
        if tokenizer is None:
            raise ValueError(
                "No tokenizer: give --data.tokenizer DIR, or --model.init_from weights that carry one."
            )
        self.tokenizer_path = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self.special_ids = special_token_ids(self.tokenizer)
        self.vocab_size = embedding_size(self.tokenizer)
        self.datasets: dict[str, Any] = {}
        self.origins: dict[str, Origin] = {}  # where each split's rows come from, for messages
        self.no_label_column: dict[str, str] = {}  # a split whose file has no label column: why, for messages
        self.id_names: dict[str, dict[int, str | dict]] = {}  # a test split's ids, by row: predictions' names
        self.predicted: list[str] | None = None  # the splits `predict_dataloader` was asked for
        self.choice_names: dict[str, dict[int, list[str]]] = {}  # its rows' own names of their choices
        self.alike: dict[str, list[int]] = {}  # a split's rows that order nothing: evaluated without them

    # ---- loading and encoding ----

    def encoded(self, split: str, *, labelled: bool):
        """The encoded split (cached); `labelled` demands a label on every example."""
        if split not in self.datasets:
            self.datasets[split], self.origins[split] = self._encode_split(split)
            cuts = self.datasets[split].data.column("cut").to_pylist()  # (a datasets Column: slow)
            whole = self.max_length >= (model_context(self) or self.max_length + 1)  # the model's context
            longer = (
                f"max_length {self.max_length} is the model's context: shorten the texts" if whole else LONGER
            )
            if said := cut_report(f"{self.task.name} {split}", cuts, self.max_length, remedy=longer):
                rank_zero_info(said)
        ds = self.datasets[split]
        if labelled and ds.data.column("label").null_count:
            if split in self.no_label_column:
                raise TaskDataError(self.no_label_column[split])
            first = self.origins[split].of(ds.data.column("label").to_pylist().index(None))
            raise TaskDataError(
                self.origins[split].explain(
                    f"{first}: no label ({self.task.label_source}); split {split!r} is used "
                    "for training or evaluation, so every example needs one."
                )
            )
        # evaluated, a split's rows that order nothing are left out (`alike`); predicted, kept
        if labelled and self.alike.get(split):
            if (scored := f"{split} (scored)") not in self.datasets:
                self.datasets[scored], self.origins[scored] = left_out(
                    ds, self.origins[split], split, self.alike[split], ALIKE, said=True
                )
            ds = self.datasets[scored]
        return ds

    def _encode_split(self, split: str):
        """The split encoded, and where its rows come from (to name one in a message)."""
        raw, origin = located_split(self.task, split, self.data_dir)
        source = origin.source
        if len(raw) == 0:
            raise TaskDataError(f"{source}: split {split!r} has no examples.")
        renamed = (self.task.local if self.data_dir is not None else self.task.hub).columns or {}
        asked = {field: column for column, field in renamed.items()}  # the file's names, as the card says
        if said := absent_columns(self.task, raw, origin, self.task.text_fields()):
            raise TaskDataError(said)
        label = self.task.label_column
        if label is not None and label not in raw.column_names:  # a test split's; refused where needed
            missing = asked.get(label, label)
            has = held_columns(raw, origin, [missing])
            self.no_label_column[split] = (
                f"{source}: missing column {missing!r} (the labels); split {split!r} is used for training or "
                f"evaluation, so every example needs one; the file has {has}."
            )
        raw, origin = task_examples(self.task, split, raw, origin, scored=split == "train")  # (regrouped)
        if split != "train":  # its rows that order nothing: left out where it is evaluated (`encoded`)
            self.alike[split] = self.task.orders_nothing(raw, origin.of)
        raw, index_field, names = example_ids(self.task, split, raw, origin)
        if names:  # ids that are not all integers (ProcessBench's "gsm8k-0"): rows numbered, and
            self.id_names[split] = names  # predictions named by the ids as the file writes them
        if split == "train" and self.train_size is not None:
            kept = training_subset(self.task, raw, self.train_size, self.seed)
            raw, origin = raw.select(kept), origin.keep(kept)

        def encode_batch(batch: dict[str, list], rows: list[int]) -> dict[str, list]:
            examples = [dict(zip(batch, values)) for values in zip(*batch.values())]
            where = lambda i: origin.of(rows[i])  # noqa: E731  (the row's file and line, in messages)
            try:
                encoded = self.task.encode_examples(
                    examples, self.tokenizer, self.special_ids, self.max_length, where=where
                )
            except TaskDataError as exc:
                raise TaskDataError(origin.explain(str(exc))) from None
            fields = [enc.fields() for enc in encoded]
            return {
                **{name: [f[name] for f in fields] for name in (fields[0] if fields else ["input_ids"])},
                LABEL: [enc.label for enc in encoded],
                "index": [
                    origin.index(row) if index_field is None else integer_id(ex[index_field])
                    for ex, row in zip(examples, rows)
                ],
                "length": [max(len(seq) for seq in enc.sequences) for enc in encoded],
                # next-token targets: every token but each sequence's last (the accumulation windows')
                "targets": [sum(len(seq) - 1 for seq in enc.sequences) for enc in encoded],
                "cut": [enc.cut for enc in encoded],
            }

        with datasets_bars(sys.stderr.isatty() and first_process()):
            encoded = raw.map(
                encode_batch,
                batched=True,
                with_indices=True,
                remove_columns=raw.column_names,
                num_proc=self.num_proc,
                desc=f"Encoding {self.task.name} {split}",
                new_fingerprint=self._fingerprint(raw, split),
            ).rename_column(LABEL, "label")
        if index_field is not None:  # an id names its example's prediction and counts it once
            column, first = origin.in_file(index_field), {}
            for i, value in enumerate(encoded.data.column("index").to_pylist()):
                if (j := first.setdefault(value, i)) != i:
                    raise TaskDataError(
                        f"{origin.of(i)} repeats the {column} of {origin.of(j)} ({value}): each "
                        "example needs an id of its own (predictions and metrics count each id once)."
                    )
        if (names := self.task.output.names_field) in raw.column_names:  # predictions, explain: a row's
            rows = zip(encoded["index"], raw.select_columns([names]))  # own name of its choice
            self.choice_names[split] = {i: self.task.output.row_names(row) for i, row in rows}
        return encoded, origin

    def _fingerprint(self, raw, split: str) -> str:
        """What the encoded split depends on: the raw rows, the card, the tokenizer, the length, the
        toolkit's version and its way from examples to tokens (`ENCODING`). (Left to datasets, the
        fingerprint would hash the whole data module, its trainer and model included: most of a
        small run's setup time.)"""
        from importlib.metadata import version

        parts = [
            dataset_fingerprint(raw),
            split,
            card_key(self.task),
            adapter_code(type(self.task)),
            self.tokenizer.backend_tokenizer.to_str() if self.tokenizer.is_fast else repr(self.tokenizer),
            getattr(self.tokenizer, "chat_template", None) or "",  # renders chat messages (preference)
            repr(self.special_ids),
            str(self.max_length),
            version("gpt_ft"),
            f"encoding {ENCODING}",
        ]
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]

    def setup(self, stage: str) -> None:
        for split, labelled in self.stage_splits(stage):
            self.encoded(split, labelled=labelled)

    def stage_splits(self, stage: str) -> list[tuple[str, bool]]:
        """The splits a stage (fit, validate, test, predict) reads, each with whether it needs labels."""
        evaluated = [*[("train", True)] * (stage == "fit"), *((s, True) for s in self.task.validation_splits)]
        asked = self.predicted if stage == "predict" and self.predicted is not None else self.task.test_splits
        tested = [(s, stage == "test") for s in asked]
        return evaluated if stage in ("fit", "validate") else tested if stage in ("test", "predict") else []

    def train_labels(self) -> torch.Tensor:
        """Every training example's label (multi-label: a row of 0/1 per example)."""
        return torch.tensor(self.encoded("train", labelled=True)["label"])

    # ---- loaders ----

    def _loader(self, split: str, *, train: bool, labelled: bool) -> DataLoader:
        check_model_fits(self)  # with the model of the call that reads it (Python's wiring)
        dataset = self.encoded(split, labelled=labelled).with_format(None)
        batch_size = self.batch_size if train else self.eval_batch_size
        sampler = self._resumed(self._train_sampler(dataset), batch_size) if train else None
        world, rank = self._ranks()
        if not labelled and world > 1:  # predict: Lightning's sampler would leave a rank without
            # any of a split smaller than the ranks, and the ranks' gathers out of step; this one
            # repeats a few, each written once (by index)
            sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        if train:
            self._windows, self._train_order = None, sampler
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            worker_init_fn=leave_stops_to_the_main_process,
            collate_fn=self.collator(split),
            pin_memory=pins(self),
            # Loader seeds from its own generator, not the global RNG that a resumed run restores.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _train_sampler(self, dataset) -> EpochSampler:
        """Our own sampler, in one process too: the order depends on (seed, epoch) only, so that a
        resumed run sees the same batches, and on DDP each rank takes its share of it.

        Evaluation keeps Lightning's: under DDP it repeats a few examples to even out the ranks,
        and the metrics drop the repeats by example index.
        """
        world, rank = self._ranks()
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

    def _ranks(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def collator(self, split: str) -> partial:
        """`collate_batch` for a loader of `split`: a function of the examples alone, which workers
        started afresh (spawn; forkserver, Python 3.14's default) take pickled, as a method would
        not be (the data module would bring its trainer and model along)."""
        shared = self.shared_context and self.task.shares_context
        return partial(
            collate_batch, specials=self.special_ids, packing=self.packing, shared=shared, split=split
        )

    def window_counts(self, batch_idx: int, accumulate: int, batches: int, sampler) -> tuple[int, int] | None:
        """(examples, LM targets) on this rank in the gradient-accumulation window of `accumulate`
        training batches that holds batch `batch_idx` of the current epoch (of `batches`). The
        order is the sampler's, a function of (seed, epoch); the targets are each example's, counted
        when it was encoded as the collators count them. None where the loader's `sampler` is not
        ours (`--trainer.overfit_batches` puts its own in)."""
        order = getattr(self, "_train_order", None)
        if sampler is not order or order is None:
            return None
        key = (order.epoch, accumulate, batches, done := order.batches_done())  # (resumed: from `done` on)
        if self._windows is None or self._windows[0] != key:
            targets = self.encoded("train", labelled=True).with_format(None)["targets"]
            counts = [(len(c), sum(targets[i] for i in c)) for c in order.epoch_batches(self.batch_size)]
            counts = [(0, 0)] * done + counts[: batches - done]
            windows = [counts[i : i + accumulate] for i in range(0, len(counts), accumulate)]
            self._windows = key, [tuple(map(sum, zip(*w))) for w in windows]  # the current epoch's
        return self._windows[1][batch_idx // accumulate]

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True, labelled=True)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(s, train=False, labelled=True) for s in self.task.validation_splits]

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(s, train=False, labelled=True) for s in self.task.test_splits]

    def predict_dataloader(self, splits: list[str] | None = None) -> list[DataLoader]:
        """Loaders of the test splits (or of `splits`, then the splits a predict stage sets up: a
        suite's, its unreadable test files left out), whose predictions `predict` writes."""
        self.predicted = splits = self.task.test_splits if splits is None else splits
        return [self._loader(s, train=False, labelled=False) for s in splits]

    # ---- inspection ----

    def explain(self, split: str, index: int) -> dict[str, Any]:
        """Example `index` of `split` as the model sees it: each sequence's text, tokens (specials
        visible), ids, extract index (None where an embedding's vector is the mean of its tokens);
        whether `max_length` cut it.
        A split that trains or evaluates needs its labels here too, as `fit` does."""
        ds = self.encoded(split, labelled=split == "train" or split in self.task.validation_splits)
        if not 0 <= index < len(ds):
            raise TaskDataError(f"--index {index} is out of range: split {split!r} has {len(ds)} examples.")
        example, names = ds[index], self.choice_names.get(split, {}).get(ds[index]["index"])
        label, read = self.task.label_text(example["label"]), reads(example)
        if names and label is not None:  # ARC's '3', not the position; a cloze's right candidates
            label = [names[k] for k in label] if isinstance(label, list) else names[label]
        if isinstance(label, list):  # one a reply or step (None: unlabelled); the padding after, cut
            label = label[: max([len(read), *(i + 1 for i, v in enumerate(label) if v is not None)])]
        sequences, pooling = [], getattr(self.task, "pooling", "extract")
        for s, ids in enumerate(example["input_ids"]):
            at = [i for of, i in read if of == s]  # one extract token, or one per step
            tokens = self.tokenizer.convert_ids_to_tokens(ids)
            at = None if pooling == "mean" else at[0] if len(at) == 1 else at
            text = self.tokenizer.decode(ids)  # (a byte-level token's pieces: no script read whole)
            sequences.append({"text": text, "tokens": tokens, "ids": ids, "extract_index": at})
        return {"label": label, "cut": example["cut"] != WHOLE, "pooling": pooling, "sequences": sequences}
