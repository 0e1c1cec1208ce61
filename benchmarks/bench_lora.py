"""Fine-tuning a large model on the CPU: peak memory and step time, every weight vs LoRA.

Each mode runs in a fresh process: a randomly initialised model of the preset's shape (no
download) grown by GPT-1's 4 special tokens, a 2-class head on the last token, GPT-1's loss
(task + 0.5 LM) and AdamW on the trainable weights only, for a few steps of batch x seq tokens.
Peak memory is the process's peak resident set (VmHWM), weights and optimizer state included.

    python benchmarks/bench_lora.py --preset llama-3.2-1b --batch 1 --seq 256
    python benchmarks/bench_lora.py --preset llama-3.2-1b --layers 8      # half the blocks
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from gpt_ft import GPT, GPTConfig
from gpt_ft.model.lora import LoRA, add_lora
from gpt_ft.training.optim import adamw


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(args) -> None:
    config = GPTConfig.from_name(args.preset, **({"n_layer": args.layers} if args.layers else {}))
    torch.manual_seed(0)
    gpt = GPT(config)
    vocab = config.vocab_size
    gpt.resize_token_embeddings(vocab + 4)  # start, delim, extract, pad
    head = nn.Linear(config.n_embd, 2)
    total = gpt.num_parameters() + sum(p.numel() for p in head.parameters())
    if args.mode == "lora":
        add_lora(gpt, LoRA(rank=args.rank, alpha=2 * args.rank), new_tokens_from=vocab)
    params = [p for p in [*gpt.parameters(), *head.parameters()] if p.requires_grad]
    optimizer = adamw(params, lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    ids = torch.randint(0, vocab, (args.batch, args.seq))
    labels = torch.zeros(args.batch, dtype=torch.long)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        hidden = gpt(ids)
        lm = F.cross_entropy(gpt.lm_logits(hidden[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss = F.cross_entropy(head(hidden[:, -1]), labels) + 0.5 * lm
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    trainable = sum(p.numel() for p in params)  # (full: the embedding's padding rows too)
    print(json.dumps(dict(mode=args.mode, peak_mb=peak_mb(), trainable=trainable, total=total,
                          step_s=statistics.median(times[1:] or times))))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, default=None, help="override n_layer (default: the preset's)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args()
    if args.mode:
        return child(args)
    rows = {}
    for mode in args.modes:
        cmd = [sys.executable, __file__, *sys.argv[1:], f"--mode={mode}"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{mode}: failed (exit {out.returncode}; out of memory?)\n{out.stderr[-1500:]}")
            continue
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    layers = f" with {args.layers} layers" if args.layers else ""
    print(
        f"\n{args.preset}{layers}, batch {args.batch} x {args.seq}, fp32, {torch.get_num_threads()} threads"
    )
    print(f"{'mode':<6} {'trainable':>14} {'of':>14} {'peak memory':>12} {'s/step':>8}")
    for mode, r in rows.items():
        memory = f"{r['peak_mb'] / 1024:>9.2f} GB"
        print(f"{mode:<6} {r['trainable']:>14,} {r['total']:>14,} {memory} {r['step_s']:>8.2f}")
    if len(rows) == 2:
        print(
            f"LoRA's peak memory: {rows['lora']['peak_mb'] / rows['full']['peak_mb']:.2f}x full fine-tuning's"
        )


if __name__ == "__main__":
    main()
