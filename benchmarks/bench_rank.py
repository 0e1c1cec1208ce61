"""Reward models from rankings of N replies: `gpt-ft fit` with a listwise loss against TRL's
`RewardTrainer` on the same lists expanded into pairs, end to end, on the same weights.

The lists are PRMBench's solutions grouped by question (each question's original solution above
every solution with planted errors, steps joined by lines: tasks/ranking/prmbench.yaml), split by
question as benchmarks/bench_steps.py splits them. Then, one whole process each, in turns:

- `ours`: `gpt-ft fit` on tasks/ranking/prmbench.yaml (the question encoded once per list where
  that saves work, packed rows, Plackett-Luce over the rewards: the card's defaults) without
  validating, then `gpt-ft test` from last.ckpt;
- `TRL`: `RewardTrainer` with `*ForSequenceClassification` (`num_labels=1`) from the same folder, on
  every (chosen, rejected) pair of every list, gpt_ft's token ids, as many optimizer steps as ours
  (its batch holds the pairs of --batch-size lists, on average); then each test list's replies are
  scored one sequence at a time, in batches.

Both take the same learning rate, linear schedule with --warmup of the steps, weight decay 0.01,
clipping at 1.0, epochs and seed; dropout as the model has it and no activation checkpointing.
Scored on the test lists: best-of-N accuracy (the top reward on the original solution), pairwise
accuracy and Kendall's τ-b.

    python benchmarks/bench_rank.py --prmbench PRMBENCH_DIR \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf

`--tokenizer DIR --layers L --width W` starts from random weights instead. `pip install -e .[bench]`
brings `trl`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_steps  # noqa: E402  (PRMBench split by question)
import bench_vs_trainer  # noqa: E402  (the model folders and the timing of whole processes)
import harness  # noqa: E402
import peers  # noqa: E402  (TRL's side: its arguments and schedule)

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "tasks" / "ranking" / "prmbench.yaml"
CONTENDERS = ["ours", "TRL"]
METRICS = ("best_of_n", "pairwise_accuracy", "kendall_tau")


def encoded_lists(args, base: Path, data: Path, out: Path) -> tuple[dict[str, Path], float]:
    """TRL's files as gpt_ft encodes the lists: training pairs (each chosen reply against each
    rejected one) and the test lists' sequences with their scores; and the pairs a list gives on
    average."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule

    module = TaskDataModule(load_card(CARD), str(base), data_dir=str(data), max_length=args.max_length)
    files, pairs = {"train": out / f"{base.name}-pairs.jsonl", "test": out / f"{base.name}-lists.jsonl"}, 0
    train = module.encoded("train", labelled=True)
    with files["train"].open("w") as f:
        for sequences, scores in zip(train["input_ids"], train["label"]):
            for i, better in enumerate(scores[: len(sequences)]):
                for j, worse in enumerate(scores[: len(sequences)]):
                    if better > worse:  # NaN never is
                        f.write(json.dumps({"chosen_ids": sequences[i], "rejected_ids": sequences[j]}) + "\n")
                        pairs += 1
    test = module.encoded("test", labelled=True)
    with files["test"].open("w") as f:
        for sequences, scores in zip(test["input_ids"], test["label"]):
            f.write(json.dumps({"sequences": sequences, "scores": scores[: len(sequences)]}) + "\n")
    return files, pairs / len(train)


def trl(args, base: Path, files: dict[str, Path], out: Path, pair_batch: int) -> list[str]:
    return [
        sys.executable, __file__, "trl", f"--base={base}", f"--train={files['train']}",
        f"--dev={files['test']}", f"--out={out}", f"--device={args.device}",
        f"--batch-size={pair_batch}", f"--lr={args.lr}", f"--warmup={args.warmup}",
        f"--epochs={args.epochs}", *(["--bf16"] if args.bf16 else []),
    ]  # fmt: skip


def run_trl(argv: list[str]) -> None:
    """TRL's side, in its own process: trains on the pairs, scores every test list's replies,
    prints the ranking metrics."""
    args = peers.peer_parser().parse_args(argv)

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from gpt_ft.adapters.ranking import rank_metric_values

    tokenizer = AutoTokenizer.from_pretrained(args.base)
    train = load_dataset("json", data_files={"train": args.train})["train"]
    model = peers.peer_model(AutoModelForSequenceClassification, args, tokenizer, num_labels=1)
    config = RewardConfig(
        **peers.peer_schedule(args, len(train)),
        max_length=None,  # cut as gpt_ft cuts them: none is dropped
        disable_dropout=False,
        gradient_checkpointing=False,
    )
    run = RewardTrainer(model=model, args=config, train_dataset=train, processing_class=tokenizer)
    run.train()
    model = run.model.eval()
    lists = [json.loads(line) for line in Path(args.dev).read_text().splitlines()]
    width = max(len(row["sequences"]) for row in lists)
    rewards = torch.full((len(lists), width), float("nan"), dtype=torch.float64)
    scores = torch.full_like(rewards, float("nan"))
    flat = [(i, k, seq) for i, row in enumerate(lists) for k, seq in enumerate(row["sequences"])]
    with torch.inference_mode():
        for start in range(0, len(flat), args.batch_size):
            chunk = flat[start : start + args.batch_size]
            batch = tokenizer.pad({"input_ids": [seq for _, _, seq in chunk]}, return_tensors="pt")
            logits = model(**{k: v.to(model.device) for k, v in batch.items()}).logits.float().squeeze(-1)
            for (i, k, _), value in zip(chunk, logits.tolist()):
                rewards[i, k] = value
    for i, row in enumerate(lists):
        scores[i, : len(row["scores"])] = torch.tensor(
            [float("nan") if s is None else s for s in row["scores"]]
        )
    values = rank_metric_values(rewards, scores)
    print(json.dumps({k: float(v) for k, v in values.items()}))  # best_of_n first


def main() -> None:
    if sys.argv[1:2] == ["trl"]:
        return run_trl(sys.argv[2:])
    args = bench_steps.prmbench_arguments(__doc__, CONTENDERS, batch=4, unit="lists", out="runs/bench_rank")
    out = args.out
    import torch

    data, dropped = bench_steps.split_prmbench(args, out)
    if args.split_only:
        return print(f"wrote {data}/train.jsonl, validation.jsonl and test.jsonl")
    base = bench_vs_trainer.base_folder(args, "pretrained" if args.init_from else "llama", out)
    files, per_list = encoded_lists(args, base, data, out)
    pair_batch = max(1, round(args.batch_size * per_list))
    weights, threads = args.init_from or "random weights", torch.get_num_threads()
    print(f"PRMBench lists by question ({dropped} rows dropped), {per_list:.1f} pairs a list: TRL takes "
          f"{pair_batch} pairs a batch, ours {args.batch_size} lists; {weights}, {args.epochs} epoch(s), "
          f"lr {args.lr}, {args.device}, {threads} threads")  # fmt: skip

    def run(contender: str, run_dir: Path) -> tuple[float, dict]:
        log = run_dir.with_suffix(".log")
        if contender == "ours":  # as TRL's side: train without validating, then score the test lists
            commands = bench_steps.ours(args, base, data, run_dir, card=CARD, validate=False)
            seconds = bench_steps.timed_commands(commands, log)
            rows = harness.metrics_rows(run_dir)
            return seconds, {m: harness.last_value(rows, f"test/{m}") for m in METRICS}
        seconds = bench_vs_trainer.timed(trl(args, base, files, run_dir, pair_batch), log)[0]
        return seconds, json.loads(
            [x for x in log.read_text().splitlines() if x.startswith('{"best_of_n"')][-1]
        )

    peers.in_rounds(args, run, METRICS, "best-of-N accuracy | pairwise accuracy | Kendall's τ-b")


if __name__ == "__main__":
    main()
