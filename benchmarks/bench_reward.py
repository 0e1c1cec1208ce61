"""`gpt-ft fit` against TRL's `RewardTrainer`, end to end, on the same weights, pairs and schedule.

Anthropic's HH-RLHF pairs (a `.jsonl.gz` of {chosen, rejected} dialogues, e.g. helpful-base's
test split) are shuffled once (seed 0) and split into --train-size training pairs and the rest,
held out. One random initialisation of a Llama-shaped (or GPT-1-shaped) model at --layers x
--width is saved as a transformers folder with GPT-2's BPE. Then, one whole process each, in turns:

- `ours`: `gpt-ft fit` with tasks/preference/hh_rlhf.yaml (the shared dialogue encoded once,
  packed batches, Bradley-Terry's loss, no auxiliary LM loss: the defaults), validating once at
  the end of the epoch;
- `TRL`: `RewardTrainer` with `*ForSequenceClassification` (`num_labels=1`) from the same folder,
  on the same token ids: each pair's two whole sequences [start] dialogue [delim] reply [extract],
  as gpt_ft cuts them to --max-length (so that TRL's length filter drops none), padded by its
  collator; then the rewards of the held-out pairs.

Both take the same batch of pairs, learning rate, linear schedule with --warmup of the steps,
weight decay 0.01, gradient clipping at 1.0, epochs and seed; dropout as the model has it (TRL's
`disable_dropout` off) and no activation checkpointing (TRL's default turns it on, a third more
compute for less memory). Neither saves a checkpoint. The wall time is each process's, start to exit;
the held-out metric is pairwise accuracy (a tie counts half). A row's ratio divides its time by ours.

    python benchmarks/bench_reward.py --pairs HH_RLHF/helpful-base/test.jsonl.gz --tokenizer GPT2_BPE_DIR

`pip install -e .[bench]` brings `trl`. `--device cuda` runs bf16 (`bf16-mixed` / `bf16=True`), as
`--bf16` does on a CPU. `--init-from WEIGHTS` (a `.gguf`, a folder, a hub id) starts both from
pretrained weights instead of random ones:

    python benchmarks/bench_reward.py --pairs HH/helpful-base/test.jsonl.gz \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --bf16
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_vs_trainer  # noqa: E402  (the model folders and the timing of whole processes)
import harness  # noqa: E402
import peers  # noqa: E402  (TRL's side: its arguments and schedule)
from paths import existing

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "tasks" / "preference" / "hh_rlhf.yaml"
CONTENDERS = ["ours", "TRL"]


def split_pairs(args, out: Path) -> Path:
    """The pairs shuffled (seed 0) and split: DIR/train.jsonl.gz and DIR/test.jsonl.gz, the card's layout."""
    folder = out / "pairs"
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.pairs, "rt", encoding="utf-8") as f:
        rows = [line for line in f if line.strip()]
    random.Random(0).shuffle(rows)
    if not 0 < args.train_size < len(rows):
        raise SystemExit(f"--train-size {args.train_size}: give fewer than the {len(rows)} pairs.")
    for name, part in (("train", rows[: args.train_size]), ("test", rows[args.train_size :])):
        with gzip.open(folder / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(part)
    return folder


def encoded_pairs(args, base: Path, pairs: Path, out: Path) -> dict[str, Path]:
    """Both splits as gpt_ft encodes them (filling its cache too), as TRL's tokenized columns."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule

    data = TaskDataModule(load_card(CARD), str(base), data_dir=str(pairs), max_length=args.max_length)
    files = {}
    for split in ("train", "validation"):
        path = files[split] = out / f"{base.name}-{split}.jsonl"
        rows = data.encoded(split, labelled=True)
        with path.open("w") as f:
            for chosen, rejected in rows["input_ids"]:
                f.write(json.dumps({"chosen_ids": chosen, "rejected_ids": rejected}) + "\n")
    return files


def ours(args, base: Path, pairs: Path, out: Path) -> list[str]:
    precision = "bf16-mixed" if args.device == "cuda" or args.bf16 else "32-true"
    return [
        sys.executable, "-m", "gpt_ft", "fit",
        f"--data.task={CARD}", f"--data.data_dir={pairs}", f"--data.tokenizer={base}",
        f"--data.max_length={args.max_length}", f"--data.batch_size={args.batch_size}",
        f"--model.init_from={base}", f"--model.lr={args.lr}", f"--model.warmup_fraction={args.warmup}",
        "--model.weight_decay=0.01", "--seed_everything=0",
        f"--trainer.max_epochs={args.epochs}", "--trainer.gradient_clip_val=1.0",
        f"--trainer.precision={precision}", f"--trainer.accelerator={args.device}",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={out}",
    ]  # fmt: skip


def trl(args, base: Path, files: dict[str, Path], out: Path) -> list[str]:
    return [
        sys.executable, __file__, "trl", f"--base={base}", f"--train={files['train']}",
        f"--dev={files['validation']}", f"--out={out}", f"--device={args.device}",
        f"--batch-size={args.batch_size}", f"--lr={args.lr}", f"--warmup={args.warmup}",
        f"--epochs={args.epochs}", *(["--bf16"] if args.bf16 else []),
    ]  # fmt: skip


def run_trl(argv: list[str]) -> None:
    """TRL's side, in its own process: trains, scores the held-out pairs, prints the accuracy."""
    args = peers.peer_parser().parse_args(argv)

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.base)
    data = load_dataset("json", data_files={"train": args.train, "dev": args.dev})
    model = peers.peer_model(AutoModelForSequenceClassification, args, tokenizer, num_labels=1)
    config = RewardConfig(
        **peers.peer_schedule(args, len(data["train"])),
        max_length=None,  # the pairs are cut as gpt_ft cuts them: none is dropped
        disable_dropout=False,
        gradient_checkpointing=False,  # TRL's default is on; gpt_ft recomputes nothing either
    )
    run = RewardTrainer(model=model, args=config, train_dataset=data["train"], processing_class=tokenizer)
    run.train()
    model = run.model.eval()
    gaps = []
    with torch.inference_mode():
        dev = data["dev"]
        for start in range(0, len(dev), args.batch_size):
            rows = [dev[i] for i in range(start, min(start + args.batch_size, len(dev)))]
            batch = run.data_collator(rows)
            batch = {k: v.to(model.device) for k, v in batch.items()}
            rewards = model(**batch).logits.float().squeeze(-1)
            gaps += (rewards[: len(rows)] - rewards[len(rows) :]).tolist()
    accuracy = sum((g > 0) + 0.5 * (g == 0) for g in gaps) / len(gaps)
    print(json.dumps({"accuracy": accuracy}))


def main() -> None:
    if sys.argv[1:2] == ["trl"]:
        return run_trl(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pairs", type=existing, required=True, help="HH-RLHF pairs: a .jsonl.gz of {chosen, rejected}"
    )
    parser.add_argument(
        "--tokenizer", help="GPT-2's BPE (a folder with vocab.json, merges.txt); not with --init-from"
    )
    parser.add_argument("--shapes", nargs="+", default=["llama"], choices=list(bench_vs_trainer.SHAPES))
    parser.add_argument("--contenders", nargs="+", default=CONTENDERS, choices=CONTENDERS)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--train-size", type=int, default=2000, help="training pairs; the rest are held out")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16, help="pairs a batch")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=float, default=0.06, help="share of the steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], type=harness.device)
    parser.add_argument("--bf16", action="store_true", help="bf16 on the CPU too (bf16-mixed; TRL's bf16)")
    parser.add_argument("--init-from", default=None, help="pretrained weights (a .gguf, a folder, a hub id) "
                        "instead of random ones at --layers x --width; --shapes is then ignored")  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_reward"))
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--split-only", action="store_true", help="write OUT/pairs/*.jsonl.gz and stop")
    args = parser.parse_args()
    if not (args.tokenizer or args.init_from or args.split_only):
        parser.error("give --tokenizer (random weights) or --init-from (pretrained ones)")
    out = Path(args.out).resolve()  # (a relative one from where it runs)
    out.mkdir(parents=True, exist_ok=True)
    pairs = split_pairs(args, out)
    if args.split_only:
        return print(f"{pairs}: {args.train_size} training pairs (train.jsonl.gz), the rest held out (test)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    setup = (
        f"{args.batch_size} pairs a batch, max length {args.max_length}, {args.epochs} epoch(s), lr {args.lr}"
    )
    model = args.init_from or f"{args.layers} layers x {args.width}"
    precision = "bf16" if args.bf16 or args.device == "cuda" else "fp32"
    print(f"{model}, {setup}, {args.device}, {precision}, {torch.get_num_threads()} threads")
    if args.init_from:
        args.shapes = ["pretrained"]
    rows = []
    for shape in args.shapes:
        base = bench_vs_trainer.base_folder(args, shape, out)
        files = encoded_pairs(args, base, pairs, out)
        results = {}
        for contender in args.contenders:
            run_dir = out / f"{shape}-{contender.lower()}"
            log = run_dir.with_suffix(".log")
            if contender == "ours":
                seconds = bench_vs_trainer.timed(ours(args, base, pairs, run_dir), log)[0]
                accuracy = bench_vs_trainer.ours_results(run_dir)[0]
            else:
                seconds = bench_vs_trainer.timed(trl(args, base, files, run_dir), log)[0]
                accuracy = bench_vs_trainer.trainer_results(log)[0]
            results[contender] = (seconds, accuracy)
            print(
                f"{shape:6} {contender:5} {seconds:7.1f} s  held-out pairwise accuracy {accuracy:.4f}",
                flush=True,
            )
        mine = results.get("ours", (None,))[0]
        for contender, (seconds, accuracy) in results.items():
            ratio = round(seconds / mine, 2) if mine else None
            rows.append(dict(shape=shape, contender=contender, seconds=round(seconds, 1), accuracy=accuracy,
                             vs_ours=ratio))  # fmt: skip
    print("\n| shape | contender | wall s | pairwise accuracy | its time / ours |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['vs_ours']:.2f}x" if r["vs_ours"] else ""
        print(f"| {r['shape']} | {r['contender']} | {r['seconds']:.0f} | {r['accuracy']:.4f} | {ratio} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
