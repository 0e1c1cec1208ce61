"""Packed rows laid flat on a CPU against the dense mask: training steps on PRMBench's solutions.

The same packed batches of `tasks/steps/prmbench.yaml` (PRMBench split by question as
bench_steps.py splits it; the first --train-size training solutions, --batch-size a batch) run a
training step (forward, backward, AdamW) two ways, in turns: the model's choice (rows of long
solutions laid flat, each solution's attention on its own flash calls, the rows' tails dropped;
`gpt_ft/model/sequences.py`) and the dense block-diagonal mask over whole rows. Prints each
batch's rows, tokens and seconds both ways, the total, and the largest difference between the
two ways' losses on a batch (the same model before any step, without dropout).

    python benchmarks/bench_flat_rows.py --prmbench PRMBENCH_DIR \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --train-size 64 --bf16
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
from gpt_ft.model import attention  # noqa: E402
from gpt_ft.training.module import GPTModule  # noqa: E402

WAYS = {"flat": None, "dense": "dense"}  # attention.FORCE_KERNEL for each


def main() -> None:
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
        attention.FORCE_KERNEL = WAYS[way]
        try:
            with amp:
                return model.losses(batch)[0]
        finally:
            attention.FORCE_KERNEL = None

    with torch.no_grad():  # without dropout, which draws differently over differently shaped rows
        gap = max(abs(float(loss(b, "flat")) - float(loss(b, "dense"))) for b in batches)
    model.train()

    def step(batch, way: str):
        return lambda: (loss(batch, way).backward(), optimizer.step(), optimizer.zero_grad())

    print(f"{len(batches)} batches of {args.batch_size} solutions, {'bf16' if args.bf16 else 'fp32'}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print(f"{'rows x length':>14} {'tokens':>7} {'flat s':>7} {'dense s':>8}")
    total = dict.fromkeys(WAYS, 0.0)
    for batch in batches:
        times = interleaved({way: step(batch, way) for way in WAYS}, runs=2, warmup=0)
        R, L = batch.input_ids.shape
        for way in WAYS:
            total[way] += times[way].min
        flat, dense = times["flat"].min, times["dense"].min
        print(f"{f'{R} x {L}':>14} {batch.real_tokens:>7} {flat:>7.2f} {dense:>8.2f}")
    ratio = total["dense"] / total["flat"]
    print(f"\ntotal: flat {total['flat']:.1f} s, dense {total['dense']:.1f} s: the dense mask takes "
          f"{ratio:.2f}x; the losses differ by at most {gap:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
