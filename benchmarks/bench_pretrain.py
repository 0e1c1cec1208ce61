"""What buys a small GPT the most quality per CPU-hour of pretraining: the laptop recipe's AdamW
run beside one change at a time (Muon, a smaller vocabulary, a bigger batch, a deeper and narrower
shape).

Every variant pretrains on the same books for the same wall-clock --minutes, one at a time on
every core (or --parallel N at a time, each pinned to its share of the cores). Its cosine ends at
the budget: a timed probe of its step (--probe-steps) sets max_steps, and `--trainer.max_time`
stops it should it run slower. Each checkpoint is then scored on the whole validation split in
bits per byte, the measure that vocabularies of different sizes share (they cut the same text into
different numbers of tokens): the summed next-token loss in bits over the UTF-8 bytes those tokens
decode to (end-of-document tokens count in the loss, with no bytes: every vocabulary sees the
same documents). Token perplexity is printed beside it (compare it only within one vocabulary).
A scored variant is kept, so the same command again runs only the rest (an interrupted variant
starts over); the runs go to --out, by default runs/pretrain-MINUTESmin.

    python benchmarks/bench_pretrain.py --books DATA/lm/books --minutes 15 --report runs/pretrain.md
    python benchmarks/bench_pretrain.py --books DATA/lm/books --variants AdamW Muon --minutes 60
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from harness import ROOT, gpt_ft, metrics_rows
from paths import existing

from gpt_ft import GPT
from gpt_ft.data.lm_data import TokenBlocks, read_meta
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.training.checkpointing import find_last_checkpoint

# The laptop recipe (benchmarks/laptop_gpt1.sh): gpt-mini (4 layers, 256 wide) with pre-LN blocks,
# a byte-level BPE of 8192 tokens, 16 sequences of 256 tokens a step, AdamW at 1e-3, 200 warmup steps.
RECIPE = dict(
    vocab=8192, batch=16, shape="pre_ln: true", optimizer="adamw", lr=1e-3, warmup_tokens=200 * 16 * 256
)
VARIANTS = {
    "AdamW": {},
    "Muon": {"optimizer": "muon"},
    "vocabulary 4096": {"vocab": 4096},
    "batch 32": {"batch": 32},
    "8 layers x 192": {"shape": "pre_ln: true, n_layer: 8, n_embd: 192, n_head: 4"},  # the recipe's FLOPs
    "Muon + vocabulary 4096": {"optimizer": "muon", "vocab": 4096},
}  # fmt: skip
CONTEXT = 256


def settings(name: str) -> dict:
    """Variant `name`'s settings: the recipe's, with its changes."""
    return {**RECIPE, **VARIANTS[name]}


def tokens_for(args, vocab: int) -> Path:
    """The books as tokens of a byte-level BPE of `vocab` tokens trained on them (made once)."""
    folder = args.out / f"vocab-{vocab}"
    if not (folder / "tokens" / "meta.json").exists():
        tokenizer = folder / "tokenizer"
        if not (tokenizer / "tokenizer.json").exists():
            gpt_ft("tokenizer", "--inputs", args.books, f"--vocab_size={vocab}", f"--out_dir={tokenizer}")
        workers = f"--workers={min(8, os.cpu_count() or 1)}"
        split = f"--validation_fraction={args.validation_fraction}"
        gpt_ft(
            "prepare",
            "--inputs",
            args.books,
            f"--tokenizer={tokenizer}",
            f"--out_dir={folder / 'tokens'}",
            workers,
            split,
        )
    return folder / "tokens"


def log(args, name: str, stage: str) -> Path:
    return args.out / slug(name) / f"{stage}.log"


def fit_args(args, name: str, steps: int, minutes: float, stage: str) -> list[str]:
    """`gpt-ft fit`'s arguments for variant `name`, writing under OUT/NAME/STAGE."""
    v = settings(name)
    t = math.ceil(minutes * 60)
    return [
        "fit",
        "--config=configs/pretrain/cpu.yaml",
        "--trainer.accelerator=cpu",
        f"--data.token_dir={tokens_for(args, v['vocab'])}",
        f"--data.block_size={CONTEXT}",
        f"--data.batch_size={v['batch']}",
        "--model.preset=gpt-mini",
        f"--model.overrides={{n_positions: {CONTEXT}, {v['shape']}}}",
        f"--model.optimizer={v['optimizer']}",
        f"--model.lr={v['lr']}",
        f"--model.warmup_steps={min(steps // 2, v['warmup_tokens'] // (v['batch'] * CONTEXT))}",
        f"--trainer.max_steps={steps}",
        "--trainer.max_epochs=-1",
        f"--trainer.max_time=00:{t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}",
        "--trainer.limit_val_batches=0",  # scored afterwards, on the whole split
        "--trainer.log_every_n_steps=10",
        "--trainer.callbacks+=gpt_ft.training.throughput.Throughput",
        "--trainer.callbacks.every_n_steps=10",
        f"--trainer.logger.init_args.save_dir={args.out / slug(name) / stage}",
        "--trainer.enable_progress_bar=false",
        f"--seed_everything={args.seed}",
    ]


def cores() -> list[int | None]:
    return (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else [None] * (os.cpu_count() or 1)
    )


def run_together(jobs: list[tuple[list[str], Path]], parallel: int) -> None:
    """`gpt-ft ARGS` for each job at once, job i on the i-th 1/`parallel` of the cores (pinned with
    `taskset` where there is one, one thread per core); every job's output goes to its log."""
    mine = cores()
    share = len(mine) // parallel
    procs = []
    for i, (argv, out) in enumerate(jobs):
        pin = mine[i * share : (i + 1) * share]
        pinned = parallel > 1 and None not in pin and shutil.which("taskset")
        taskset = ["taskset", "-c", ",".join(map(str, pin))] if pinned else []
        env = {**os.environ, "OMP_NUM_THREADS": str(share)}
        with open(out, "w") as f:
            cmd = [*taskset, sys.executable, "-m", "gpt_ft", *argv]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT))
    for proc, (argv, out) in zip(procs, jobs):
        if proc.wait() != 0:
            for other in procs:
                other.terminate()
            raise SystemExit(f"gpt-ft fit failed (exit {proc.returncode}): see {out}")


def pretrain(args, names: list[str]) -> None:
    """Probe each variant's step, then pretrain it for --minutes with its cosine sized to fit."""
    todo = [n for n in names if not (args.out / slug(n) / "score.json").exists()]
    for n in todo:  # the tokens first, one at a time (the tokenizer uses every core)
        tokens_for(args, settings(n)["vocab"])
    for i in range(0, len(todo), args.parallel):
        group = todo[i : i + args.parallel]
        for n in group:
            (args.out / slug(n)).mkdir(parents=True, exist_ok=True)
        probes = [(fit_args(args, n, args.probe_steps, 10, "probe"), log(args, n, "probe")) for n in group]
        run_together(probes, args.parallel)
        jobs = []
        for n in group:
            rates = [float(r["perf/tokens_per_s"]) for r in metrics_rows(args.out / slug(n) / "probe")
                     if r.get("perf/tokens_per_s")]  # fmt: skip
            if not rates:
                raise SystemExit(f"The probe logged no tokens/s: see {log(args, n, 'probe')}.")
            rate = statistics.median(rates[len(rates) // 2 :])  # the warm half of the probe
            v = settings(n)
            steps = int(args.minutes * 60 * rate / (v["batch"] * CONTEXT))
            print(f"{n}: {rate:.0f} tokens/s, {steps} steps in {args.minutes:g} min", flush=True)
            # max_time with 10% to spare: the cosine, not the clock, should end the run
            jobs.append((fit_args(args, n, steps, 1.1 * args.minutes, "run"), log(args, n, "run")))
        run_together(jobs, args.parallel)
        for n in group:
            score(args, n)


@torch.no_grad()
def score(args, name: str) -> dict:
    """Bits per byte and token perplexity of `name`'s last checkpoint over the whole validation split."""
    folder = args.out / slug(name)
    checkpoint = find_last_checkpoint(folder / "run" / "lightning_logs")
    if checkpoint is None:
        raise SystemExit(f"No last.ckpt under {folder / 'run'}: the variant's run did not save one.")
    v = settings(name)
    tokens = tokens_for(args, v["vocab"])
    meta = read_meta(tokens)
    gpt = GPT.from_pretrained(checkpoint).eval()
    blocks = TokenBlocks(tokens / "validation.bin", meta["dtype"], CONTEXT)
    nats, n_tokens, n_bytes = 0.0, 0, 0
    tokenizer = load_tokenizer(str(tokens / meta["tokenizer"]))
    byte_lengths = token_byte_lengths(tokenizer, meta["vocab_size"])
    for start in range(0, len(blocks), 32):
        ids = torch.stack([blocks[i][1] for i in range(start, min(start + 32, len(blocks)))])
        logits = gpt.lm_logits(gpt(ids[:, :-1])).float()
        targets = ids[:, 1:]
        nats += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        n_tokens += targets.numel()
        n_bytes += int(byte_lengths[targets].sum())
    saved = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    step, seconds = saved["global_step"], saved["callbacks"]["Timer"]["time_elapsed"]["train"]
    result = {"variant": name, "budget_minutes": args.minutes, "seed": args.seed, "minutes": seconds / 60,
              "steps": step, "tokens": step * v["batch"] * CONTEXT,
              "tokens_per_s": step * v["batch"] * CONTEXT / seconds,
              "bits_per_byte": nats / math.log(2) / n_bytes, "perplexity": math.exp(nats / n_tokens),
              "validation_tokens": n_tokens, "validation_bytes": n_bytes}  # fmt: skip
    (folder / "score.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def token_byte_lengths(tokenizer, vocab_size: int) -> torch.Tensor:
    """UTF-8 bytes each token id decodes to (a byte-level BPE: one byte per character of its
    token string); special tokens, the end of a document among them, decode to none."""
    lengths = np.zeros(vocab_size, dtype=np.int64)
    special = set(tokenizer.all_special_ids)
    for token, i in tokenizer.get_vocab().items():
        if i < vocab_size and i not in special:
            lengths[i] = len(token)
    return torch.from_numpy(lengths)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table(results: list[dict], minutes: float) -> str:
    base = results[0]
    lines = [
        f"| variant ({minutes:g} min each) | minutes | steps | tokens | tokens/s | bits per byte "
        f"| vs {base['variant']} | token ppl |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        change = 100 * (r["bits_per_byte"] / base["bits_per_byte"] - 1)
        lines.append(
            f"| {r['variant']} | {r['minutes']:.1f} | {r['steps']} | {r['tokens'] / 1e6:.2f}M "
            f"| {r['tokens_per_s']:.0f} | "
            f"{r['bits_per_byte']:.4f} | {change:+.1f}% | {r['perplexity']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--books", type=existing, required=True, help="folder of .txt books to pretrain on")
    p.add_argument("--out", help="everything the runs write (default runs/pretrain-MINUTESmin)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME",
                   help=f"which to run: {', '.join(VARIANTS)}")  # fmt: skip
    p.add_argument("--minutes", type=float, default=15.0, help="training time of each variant")
    p.add_argument(
        "--parallel", type=int, default=1, help="variants at a time, each on its share of the cores"
    )
    p.add_argument(
        "--probe-steps", type=int, default=80, help="steps of the probe that times a variant (>= 20)"
    )
    p.add_argument("--validation-fraction", type=float, default=0.005, help="of the books (gpt-ft prepare)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", help="also write the table as Markdown here")
    args = p.parse_args()
    if not 1 <= args.parallel <= len(cores()):
        p.error(f"--parallel {args.parallel}: give 1 to {len(cores())}, the cores this process may use")
    if args.probe_steps < 20:
        p.error(
            f"--probe-steps {args.probe_steps}: at least 20 (it times its second half, 10 steps a window)"
        )
    args.books = str(Path(args.books).resolve())
    args.out = Path(args.out or f"runs/pretrain-{args.minutes:g}min").resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    for n in args.variants:  # a score of another budget or seed is not this comparison's
        done = args.out / slug(n) / "score.json"
        kept = json.loads(done.read_text()) if done.exists() else {}
        if done.exists() and (kept.get("budget_minutes"), kept.get("seed")) != (args.minutes, args.seed):
            p.error(f"{done} is of another --minutes or --seed ({kept.get('budget_minutes')}, "
                    f"{kept.get('seed')}): give another --out")  # fmt: skip
    pretrain(args, args.variants)
    results = [json.loads((args.out / slug(n) / "score.json").read_text()) for n in args.variants]
    text = table(results, args.minutes)
    print("\n" + text)
    if args.report:
        Path(args.report).write_text(text)


if __name__ == "__main__":
    main()
