"""Padding: SST-2 fine-tuning with packed batches (the default), padded shuffled batches and
padded length-grouped batches.

Prints, for each, the share of padded positions over a whole training epoch (from the data
module's batches) and the epoch's training time through `gpt-ft fit`, measured over --batches
batches after a warm-up and scaled to the epoch's number of batches (batches come in random
order in every mode, so a stretch of them stands for the epoch). The modes take turns.

    python benchmarks/bench_padding.py --glue GLUE_DIR \\
        --tokenizer OPENAI_GPT_DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from jsonargparse import ArgumentParser
from paths import existing

from gpt_ft.adapters import TaskAdapter
from gpt_ft.cli import main as gpt_ft
from gpt_ft.data.task_data import TaskDataModule

ROOT = Path(__file__).resolve().parents[1]


def load_card(path: Path) -> TaskAdapter:
    parser = ArgumentParser()
    parser.add_subclass_arguments(TaskAdapter, "task")
    return parser.instantiate(parser.parse_args(["--task", str(path)])).task


MODES = {  # name: (length_grouped, packing)
    "plain shuffled": (False, False),
    "length-grouped": (True, False),
    "packed": (False, True),
}


def padding_share(args, mode: str) -> tuple[float, int]:
    """Share of padded positions over one training epoch, and its number of batches."""
    length_grouped, packing = MODES[mode]
    data = TaskDataModule(
        load_card(ROOT / "tasks/glue/sst2.yaml"),
        args.tokenizer,
        data_dir=args.glue,
        batch_size=args.batch_size,
        max_length=args.max_length,
        length_grouped=length_grouped,
        packing=packing,
    )
    data.setup("fit")
    real = total = batches = 0
    for batch in data.train_dataloader():
        real += batch.real_tokens
        total += batch.input_ids.numel()
        batches += 1
    return 1 - real / total, batches


def seconds_per_batch(args, mode: str, out: Path) -> float:
    length_grouped, packing = MODES[mode]
    out.mkdir(parents=True, exist_ok=True)
    timing = out / "seconds.json"
    gpt_ft(
        [
            "fit",
            "--data.task=tasks/glue/sst2.yaml",
            f"--data.data_dir={args.glue}",
            f"--data.tokenizer={args.tokenizer}",
            f"--data.batch_size={args.batch_size}",
            f"--data.length_grouped={str(length_grouped).lower()}",
            f"--data.packing={str(packing).lower()}",
            "--seed_everything=0",
            f"--model.preset={args.preset}",
            f"--data.max_length={args.max_length}",
            "--trainer.max_epochs=1",
            f"--trainer.limit_train_batches={args.warmup + args.batches}",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.logger.init_args.save_dir={out}",
            "--trainer.callbacks+=bench_overhead.StepTimer",
            f"--trainer.callbacks.out={timing}",
            f"--trainer.callbacks.warmup={args.warmup}",
        ]
    )
    return json.loads(timing.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", type=existing, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--preset", default="gpt-mini")
    parser.add_argument("--max-length", type=int, default=512, help="at most the preset's context")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=100, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"SST-2, {args.preset}, batch {args.batch_size}, {torch.get_num_threads()} threads")
    shares = {mode: padding_share(args, mode) for mode in MODES}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in list(MODES)[:: 1 if r % 2 == 0 else -1]:
                times[mode].append(seconds_per_batch(args, mode, Path(tmp) / f"{r}-{mode.replace(' ', '-')}"))
    print(f"\n{'batches':<14} {'padding':>8} {'s/batch':>8} {'epoch s':>8}")
    epoch = {}
    for mode in MODES:
        share, n = shares[mode]
        per_batch = statistics.median(times[mode])
        epoch[mode] = per_batch * n
        print(f"{mode:<14} {share:>8.1%} {per_batch:>8.3f} {epoch[mode]:>8.0f}")
    for mode in ("length-grouped", "packed"):
        print(f"{mode} epoch is {epoch['plain shuffled'] / epoch[mode]:.2f}x faster than plain shuffled")


if __name__ == "__main__":
    main()
