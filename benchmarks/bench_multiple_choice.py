"""Multiple choice with the shared context computed once vs each choice's whole sequence.

A RACE-shaped batch (by default: contexts of 400 tokens, 4 choices of 20) through GPTModule's
loss, as fine-tuning computes it (task loss + 0.5 x LM loss), in training mode with dropout 0.1:
the training step (forward, backward, AdamW) and the evaluation forward, plain and shared
interleaved run by run in one process, so machine noise hits both alike. Peak memory of one
training step is measured in a fresh child process per path (resident memory growth on a
CPU, sampled every millisecond; max_memory_allocated on CUDA).

    python benchmarks/bench_multiple_choice.py --preset gpt-mini gpt1 --batch 4 --runs 5
    python benchmarks/bench_multiple_choice.py --device cuda --dtype bf16 --batch 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch
from harness import device, interleaved
from lightning.fabric.utilities.apply_func import move_data_to_device

from gpt_ft.adapters import MultipleChoice
from gpt_ft.data.batches import SharedContextBatch, TaskBatch, collate, collate_shared
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.training.module import GPTModule

VOCAB = 40478  # GPT-1's BPE, plus the 4 special tokens below


def batches(args) -> tuple[TaskBatch, SharedContextBatch, MultipleChoice]:
    """The same random examples in both layouts."""
    specials = SpecialTokenIds(start=VOCAB, delim=VOCAB + 1, extract=VOCAB + 2, pad=VOCAB + 3, eos=None)
    task = MultipleChoice(name="race", context=["article"], choices="options", num_choices=args.choices)
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(args.batch):
        context = torch.randint(0, VOCAB, (args.context,), generator=g).tolist()
        answers = [torch.randint(0, VOCAB, (args.answer,), generator=g).tolist() for _ in range(args.choices)]
        enc = task.encode({"label": i % args.choices}, [context, *answers], specials, max_length=512)
        rows.append(
            {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": enc.label, "index": i}
        )
    return collate(rows, specials.pad), collate_shared(rows, specials.pad, specials.delim), task


def build(args, preset: str, task) -> GPTModule:
    torch.manual_seed(0)
    module = GPTModule(preset=preset, vocab_size=VOCAB + 4, task=task, lm_coef=0.5).to(args.device)
    return module.train()


def to(batch, device: str):
    """A collated batch (`TaskBatch`, `SharedContextBatch`) with its tensors on `device`."""
    return move_data_to_device(batch, torch.device(device))


def steps(args, module: GPTModule, batch):
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-5, fused=args.device == "cuda")
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.dtype]

    def train() -> None:
        with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            loss, _ = module.losses(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def evaluate() -> None:
        module.eval()
        with torch.autocast(args.device, dtype=dtype, enabled=dtype is not None):
            module.terms(batch)
        module.train()

    return train, evaluate


def memory_child(args, preset: str, path: str) -> None:
    """One training step of one path; prints the peak memory it took, in MB."""
    plain, shared, task = batches(args)
    module = build(args, preset, task)
    batch = to(plain if path == "plain" else shared, args.device)
    train, _ = steps(args, module, batch)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        train()
        print(json.dumps({"mb": (torch.cuda.max_memory_allocated() - base) / 2**20}))
        return
    # The process's resident memory, sampled every millisecond during the step, minus before it.
    page = os.sysconf("SC_PAGE_SIZE")

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    base, peak, done = resident(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], resident())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    train()
    done.set()
    sampler.join()
    print(json.dumps({"mb": (max(peak[0], resident()) - base) / 2**20}))


def peak_mb(args, preset: str, path: str) -> float:
    cmd = [sys.executable, __file__, "--child", path, "--preset", preset, "--device", args.device]
    cmd += ["--dtype", args.dtype, "--batch", str(args.batch), "--context", str(args.context)]
    cmd += ["--choices", str(args.choices), "--answer", str(args.answer)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["mb"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", nargs="+", default=["gpt-mini", "gpt1"])
    parser.add_argument("--device", default="cpu", type=device)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--answer", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--child", choices=["plain", "shared"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(args, args.preset[0], args.child)
        return

    print(
        f"{args.device} {args.dtype}, batch {args.batch}: context {args.context} tokens, {args.choices} "
        f"choices x {args.answer} tokens; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    summary = []
    for preset in args.preset:
        plain, shared, task = batches(args)
        plain, shared = to(plain, args.device), to(shared, args.device)
        module = build(args, preset, task)
        fns = {}
        for name, batch in (("plain", plain), ("shared", shared)):
            fns[(name, "train")], fns[(name, "eval")] = steps(args, module, batch)
        stats = interleaved(fns, runs=args.runs, warmup=args.warmup)  # noise hits both alike
        med = {key: s.median for key, s in stats.items()}
        row = {
            "preset": preset,
            "train_plain_s": med[("plain", "train")],
            "train_shared_s": med[("shared", "train")],
            "eval_plain_s": med[("plain", "eval")],
            "eval_shared_s": med[("shared", "eval")],
        }
        if not args.skip_memory:
            row["peak_plain_mb"] = peak_mb(args, preset, "plain")
            row["peak_shared_mb"] = peak_mb(args, preset, "shared")
        summary.append(row)
        train_x = row["train_plain_s"] / row["train_shared_s"]
        eval_x = row["eval_plain_s"] / row["eval_shared_s"]
        text = (
            f"{preset}: training step {row['train_plain_s']:.3f} s plain, {row['train_shared_s']:.3f} s "
            f"shared ({train_x:.2f}x); evaluation {row['eval_plain_s']:.3f} s vs "
            f"{row['eval_shared_s']:.3f} s ({eval_x:.2f}x)"
        )
        if "peak_plain_mb" in row:
            text += f"; peak memory of a step {row['peak_plain_mb']:.0f} MB vs {row['peak_shared_mb']:.0f} MB"
        print(text, flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
