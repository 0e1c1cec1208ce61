"""A peer's side of a benchmark, run in a process of its own: transformers' Trainer
(bench_vs_trainer.py) or TRL's RewardTrainer (bench_reward.py), on gpt_ft's schedule, with its
speed in steady state (`RealTokenRate`); and the contenders run in turns (`in_rounds`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def peer_parser() -> argparse.ArgumentParser:
    """The arguments of a peer's side, run in a process of its own: its folders and files, device,
    batch, learning rate, warmup and epochs. The process keeps freed memory as every `gpt-ft`
    process does (glibc's thresholds, `keep_freed_memory`: about 7% of a CPU step), so that neither
    side has an allocator setting the other lacks."""
    from gpt_ft.training.memory import keep_freed_memory

    keep_freed_memory()
    parser = argparse.ArgumentParser()
    for name in ("--base", "--train", "--dev", "--out", "--device"):
        parser.add_argument(name, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--bf16", action="store_true", help="bf16 on the CPU too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--attention", default="sdpa", help="attn_implementation (transformers' default: sdpa)"
    )
    return parser


def peer_model(auto_class, args, tokenizer, **kwargs):
    """`auto_class` from the folder --base, its new head drawn from --seed (the `Trainer` seeds its
    own run only, so a model built before it would draw a different head every run), its attention
    --attention's (`eager`: plain matrix products, as gpt_ft's bf16 attention on a CPU)."""
    from transformers import set_seed

    set_seed(args.seed)
    return auto_class.from_pretrained(
        args.base, pad_token_id=tokenizer.pad_token_id, attn_implementation=args.attention, **kwargs
    )


def peer_schedule(args, examples: int) -> dict:
    """`TrainingArguments` (or a subclass's) of gpt_ft's schedule: batch, linear decay after the same
    warmup steps, weight decay, clipping, epochs and seed; no checkpoints, evaluation or reports."""
    cuda = args.device == "cuda"
    steps = -(-examples // args.batch_size) * args.epochs
    return dict(
        output_dir=args.out,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=round(args.warmup * steps),  # as gpt_ft rounds its warmup_fraction
        weight_decay=0.01,
        max_grad_norm=1.0,
        num_train_epochs=args.epochs,
        seed=args.seed,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        logging_steps=50,
        use_cpu=not cuda,
        bf16=cuda or args.bf16,
    )


class RealTokenRate:
    """A peer's training speed in steady state: the real tokens (the ones of its batches' attention
    masks) it trains on a second, from the step `skip` of the way in to the last. Wrap its collator
    with `collator`, hand `callback()` to its Trainer, read `rate()` after training. The collator
    may run a batch ahead of the step that ends (accelerate fetches the next batch), but not at the
    last step, which has none to fetch: the span ends a step before it, so that both of its ends
    are ahead by the same batch, or neither."""

    def __init__(self, skip: float = 0.1) -> None:
        self.skip, self.tokens, self.marks = skip, 0, []  # marks: (seconds, tokens) at each step's end

    def collator(self, collate):
        def counting(features):
            batch = collate(features)
            self.tokens += int(batch["attention_mask"].sum())
            return batch

        return counting

    def callback(self):
        from transformers import TrainerCallback

        rate = self

        class StepEnds(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                rate.marks.append((time.perf_counter(), rate.tokens))

        return StepEnds()

    def rate(self) -> float | None:
        if len(self.marks) < 3:
            return None
        (t0, n0), (t1, n1) = self.marks[int(len(self.marks) * self.skip)], self.marks[-2]
        return (n1 - n0) / (t1 - t0)


def grouping(grouped: bool) -> dict:
    """`TrainingArguments` for length-grouped batches: `train_sampling_strategy` in transformers 5,
    `group_by_length` before."""
    import inspect

    from transformers import TrainingArguments

    if "train_sampling_strategy" in inspect.signature(TrainingArguments.__init__).parameters:
        return {"train_sampling_strategy": "group_by_length" if grouped else "random"}
    return {"group_by_length": grouped}


def pretrained_folder(weights: str, folder: Path) -> Path:
    """`weights` (a GGUF file, a transformers folder, a hub id) as a transformers folder whose table
    already holds GPT-1's framing tokens, their rows started as `gpt-ft fit` starts them (copied
    from the tokenizer's own for the Llama family): both sides then start from the same weights."""
    from gpt_ft import GPT
    from gpt_ft.data.tokenizer import load_tokenizer, own_framing_rows
    from gpt_ft.training.saved import copy_token_rows
    from gpt_ft.weights.hf_llama import is_llama_style

    tokenizer = load_tokenizer(weights)
    gpt = GPT.from_pretrained(weights)
    lacked = gpt.config.vocab_size
    gpt.resize_token_embeddings(len(tokenizer))
    if is_llama_style(gpt.config):
        copy_token_rows(gpt, {row: own for row, own in own_framing_rows(tokenizer).items() if row >= lacked})
    gpt.to_hf().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def in_rounds(args, run, metrics: tuple[str, ...], header: str, extra: dict | None = None) -> None:
    """`run(contender, run_dir)` -> (seconds, metrics) for each contender in turns, --rounds times
    (round r in OUT/round-r): its fastest time and the last round's metrics, printed as a table with
    every round's times and the `extra` rows (name: metrics, untimed); the rows go to --json too.
    A busy machine slows a run, never speeds one up: the fastest of runs in turns is the fair one."""
    times, results = {c: [] for c in args.contenders}, {}
    for r in range(args.rounds):
        for contender in args.contenders:
            slug = contender.replace(", ", "-").replace(" ", "-")
            (folder := args.out / (f"round-{r}" if args.rounds > 1 else "")).mkdir(exist_ok=True)
            seconds, values = run(contender, folder / slug)
            times[contender].append(seconds)
            results[contender] = (min(times[contender]), values)
            shown = "  ".join(f"{m} {values[m]:.4f}" for m in metrics)
            print(f"{contender:20} {seconds:7.1f} s  {shown}", flush=True)
    results.update({name: (None, values) for name, values in (extra or {}).items()})
    mine = results.get("ours", (None,))[0]
    print(f"\n| contender | wall s (fastest of {args.rounds}) | {header} | its time / ours | every run, s |")
    print("|---|---:|" + "---:|" * len(metrics) + "---:|---|")
    for contender, (seconds, values) in results.items():
        ratio = f"{seconds / mine:.2f}x" if seconds and mine else ""
        cells = [f"{seconds:.0f}" if seconds else "", *(f"{values[m]:.4f}" for m in metrics), ratio]
        every = ", ".join(f"{t:.0f}" for t in times.get(contender, []))
        print(f"| {contender} | " + " | ".join(cells) + f" | {every} |")
    if args.json:
        rows = {k: {"seconds": s, "every_run": times.get(k), **v} for k, (s, v) in results.items()}
        Path(args.json).write_text(json.dumps(rows, indent=1))
