"""Packed rows laid flat on a CPU against the dense mask, and the fused elementwise work against
the eager ops: training steps on PRMBench's solutions.

The same packed batches of `tasks/steps/prmbench.yaml` (PRMBench split by question as
bench_steps.py splits it; the first --train-size training solutions, --batch-size a batch) run a
training step (forward, backward, AdamW) three ways, in turns: the model's choice (rows of long
solutions laid flat, each solution's attention on its own flash calls, the rows' tails dropped,
`gpt_ft/model/sequences.py`; the blocks' elementwise work fused, `gpt_ft/model/fused.py`), the
same with the eager ops (`fused.ENABLED = False`), and the dense block-diagonal mask over whole
rows (fused), and flat with every sequence's attention backward on the flash kernel
(`sequences.SCORES_LONGEST = 0`; the model's choice takes sequences of up to 640 positions as
matmuls over their scores, `scores_backward`). One untimed step of each way on the first batch
compiles the fused kernels first.
Prints each batch's rows, tokens and seconds each way (the faster of two runs), the totals, and
the largest difference between the flat and dense losses on a batch (the same model before any
step, without dropout).

    python benchmarks/bench_flat_rows.py --prmbench PRMBENCH_DIR \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --train-size 64 --bf16

`--backward` instead times one sequence's attention backward at SmolLM2-135M's heads (9 query
heads of 64, 3 key/value heads, bf16) at lengths from 64 to 1,024: the flash kernel's backward
against `scores_backward`, and each one's error against fp64 (no PRMBench needed), with freed
memory kept as `gpt-ft` keeps it (`keep_freed_memory`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_steps  # noqa: E402  (PRMBench's split and the arguments)
import bench_vs_trainer  # noqa: E402  (the model folder)
from harness import interleaved  # noqa: E402

from gpt_ft.adapters.cards import load_card  # noqa: E402
from gpt_ft.data.task_data import TaskDataModule  # noqa: E402
from gpt_ft.model import attention, fused, sequences  # noqa: E402
from gpt_ft.training.memory import keep_freed_memory  # noqa: E402
from gpt_ft.training.module import GPTModule  # noqa: E402
from gpt_ft.workarounds.kernels import cpu_flash_backward, cpu_flash_forward  # noqa: E402

LONGEST = sequences.SCORES_LONGEST
WAYS = {
    "flat": (None, True, LONGEST),
    "flat, eager": (None, False, LONGEST),
    "dense": ("dense", True, LONGEST),
    "flat, flash backward": (None, True, 0),
}
"""attention.FORCE_KERNEL, fused.ENABLED and sequences.SCORES_LONGEST for each way."""


def backward_lengths(lengths=(64, 128, 256, 410, 550, 700, 1024), heads=(9, 3), hs=64) -> None:
    """One sequence's attention backward, the flash kernel's against `scores_backward`."""
    keep_freed_memory()
    nh, nkv = heads
    print(f"{'positions':>9} {'flash ms':>9} {'scores ms':>9} {'ratio':>6}   error vs fp64: flash | scores")
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        q, k, v, grad = (torch.randn(1, h, n, hs, generator=gen).bfloat16() for h in (nh, nkv, nkv, nh))
        q = q * 3
        out, lse = cpu_flash_forward(q, k, v, hs**-0.5)[:2]
        k_rep, v_rep = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)

        def flash():
            dq, dk, dv = cpu_flash_backward(grad, q, k_rep, v_rep, out, lse, hs**-0.5)
            return dq, dk.unflatten(1, (nkv, -1)).sum(2), dv.unflatten(1, (nkv, -1)).sum(2)

        ways = {
            "flash": flash,
            "scores": lambda: sequences.scores_backward(grad, q, k, v, out, lse, hs**-0.5),
        }
        times = interleaved(ways, runs=7, warmup=2)
        exact = [t.double().requires_grad_() for t in (q, k_rep, v_rep)]
        y = torch.nn.functional.scaled_dot_product_attention(*exact, is_causal=True)
        y.backward(grad.double())
        ref = [exact[0].grad] + [t.grad.unflatten(1, (nkv, -1)).sum(2) for t in exact[1:]]
        errors = {
            w: " ".join(f"{float((a.double() - r).norm() / r.norm()):.1e}" for a, r in zip(f(), ref))
            for w, f in ways.items()
        }
        flash_ms, scores_ms = times["flash"].median * 1e3, times["scores"].median * 1e3
        print(f"{n:>9} {flash_ms:>9.2f} {scores_ms:>9.2f} {flash_ms / scores_ms:>5.2f}x   "
              f"{errors['flash']} | {errors['scores']}")  # fmt: skip


def main() -> None:
    if sys.argv[1:] == ["--backward"]:
        return backward_lengths()
    args = bench_steps.prmbench_arguments(
        __doc__, list(WAYS), batch=8, unit="solutions", out="runs/bench_flat_rows"
    )
    data, _ = bench_steps.split_prmbench(args, args.out)
    base = str(bench_vs_trainer.base_folder(args, "pretrained" if args.init_from else "llama", args.out))
    card = load_card(bench_steps.CARD)
    module = TaskDataModule(
        card, base, data_dir=str(data), max_length=args.max_length, batch_size=args.batch_size
    )
    module.setup("fit")
    batches = list(module.train_dataloader())
    torch.manual_seed(0)
    model = GPTModule(init_from=base, task=card, tokenizer=base, lr=args.lr).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16)

    def loss(batch, way: str) -> torch.Tensor:
        attention.FORCE_KERNEL, fused.ENABLED, sequences.SCORES_LONGEST = WAYS[way]
        try:
            with amp:
                return model.losses(batch)[0]
        finally:
            attention.FORCE_KERNEL, fused.ENABLED, sequences.SCORES_LONGEST = None, True, LONGEST

    with torch.no_grad():  # without dropout, which draws differently over differently shaped rows
        gap = max(abs(float(loss(b, "flat")) - float(loss(b, "dense"))) for b in batches)
    model.train()

    def step(batch, way: str):
        return lambda: (loss(batch, way).backward(), optimizer.step(), optimizer.zero_grad())

    print(f"{len(batches)} batches of {args.batch_size} solutions, {'bf16' if args.bf16 else 'fp32'}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    names = {
        "flat": "flat s",
        "flat, eager": "eager s",
        "dense": "dense s",
        "flat, flash backward": "flash s",
    }
    print(f"{'rows x length':>14} {'tokens':>7} " + " ".join(f"{n:>8}" for n in names.values()))
    for way in WAYS:  # the fused kernels compiled before any timing
        step(batches[0], way)()
    total = dict.fromkeys(WAYS, 0.0)
    for batch in batches:
        times = interleaved({way: step(batch, way) for way in WAYS}, runs=2, warmup=0)
        R, L = batch.input_ids.shape
        for way in WAYS:
            total[way] += times[way].min
        print(f"{f'{R} x {L}':>14} {batch.real_tokens:>7} " + " ".join(f"{times[w].min:>8.2f}" for w in WAYS))
    flat, eager, dense, flash = total.values()
    print(f"\ntotal: flat {flat:.1f} s, flat with the eager ops {eager:.1f} s ({eager / flat:.2f}x), "
          f"dense {dense:.1f} s ({dense / flat:.2f}x), flat with the flash backward {flash:.1f} s "
          f"({flash / flat:.2f}x); the flat and dense losses differ by at most {gap:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
