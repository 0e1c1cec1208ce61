"""Padding: SST-2 fine-tuning with length-grouped batches vs plain shuffled batches.

Prints, for each, the share of padded positions over a whole training epoch (from the data
module's batches) and the epoch's training time through `gpt-ft fit`, measured over --batches
batches after a warm-up and scaled to the epoch's number of batches (batches come in random
order in both modes, so a stretch of them stands for the epoch). Runs alternate plain/grouped.

    python benchmarks/bench_padding.py --glue GLUE_DIR \\
        --tokenizer OPENAI_GPT_DIR
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from jsonargparse import ArgumentParser

from gpt_ft.adapters import TaskAdapter
from gpt_ft.cli import main as gpt_ft
from gpt_ft.data.task_data import TaskDataModule

ROOT = Path(__file__).resolve().parents[1]


def load_card(path: Path) -> TaskAdapter:
    parser = ArgumentParser()
    parser.add_subclass_arguments(TaskAdapter, "task")
    return parser.instantiate(parser.parse_args(["--task", str(path)])).task


def padding_share(args, length_grouped: bool) -> tuple[float, int]:
    """Share of padded positions over one training epoch, and its number of batches."""
    data = TaskDataModule(
        load_card(ROOT / "tasks/glue/sst2.yaml"),
        args.tokenizer,
        data_dir=args.glue,
        batch_size=args.batch_size,
        length_grouped=length_grouped,
    )
    data.setup("fit")
    real = total = batches = 0
    for batch in data.train_dataloader():
        real += int(batch.attention_mask.sum())
        total += batch.attention_mask.numel()
        batches += 1
    return 1 - real / total, batches


def seconds_per_batch(args, length_grouped: bool, out: Path) -> float:
    gpt_ft(
        [
            "fit",
            "--data.task=tasks/glue/sst2.yaml",
            f"--data.data_dir={args.glue}",
            f"--data.tokenizer={args.tokenizer}",
            f"--data.batch_size={args.batch_size}",
            f"--data.length_grouped={str(length_grouped).lower()}",
            "--seed_everything=0",
            f"--model.preset={args.preset}",
            "--trainer.max_epochs=1",
            f"--trainer.limit_train_batches={args.warmup + args.batches}",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.logger.init_args.save_dir={out}",
            "--trainer.callbacks+=bench_overhead.StepTimer",
            f"--trainer.callbacks.warmup={args.warmup}",
        ]
    )
    import bench_overhead

    return bench_overhead.TIMES[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--preset", default="gpt-mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=100, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"SST-2, {args.preset}, batch {args.batch_size}, {torch.get_num_threads()} threads")
    shares = {mode: padding_share(args, mode) for mode in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in (False, True) if r % 2 == 0 else (True, False):
                times[mode].append(seconds_per_batch(args, mode, Path(tmp) / f"{r}-{mode}"))
    print(f"\n{'batches':<14} {'padding':>8} {'s/batch':>8} {'epoch s':>8}")
    epoch = {}
    for mode, name in ((False, "plain shuffled"), (True, "length-grouped")):
        share, n = shares[mode]
        per_batch = statistics.median(times[mode])
        epoch[mode] = per_batch * n
        print(f"{name:<14} {share:>8.1%} {per_batch:>8.3f} {epoch[mode]:>8.0f}")
    print(f"length-grouped epoch is {epoch[False] / epoch[True]:.2f}x faster")


if __name__ == "__main__":
    main()
