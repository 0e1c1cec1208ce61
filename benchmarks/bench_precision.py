"""fp32 vs bf16-mixed training steps on the CPU: tokens/s, interleaved, same weights, same batches.

bf16-mixed is what `--trainer.precision bf16-mixed` runs: weights and optimizer in fp32, the
forward pass under `torch.autocast("cpu", dtype=torch.bfloat16)`. Both models start from the same
weights and take the same batches, run by run in alternating order, so machine noise hits both
alike. Also prints the loss of one batch in both precisions (same weights) and their difference.

    python benchmarks/bench_precision.py --shape gpt-mini:16x256 gpt1:2x512 --runs 5
    python benchmarks/bench_precision.py --shape gpt-mini:16x256 --vocab 8192
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
import torch.nn.functional as F
from harness import interleaved, lm_step

from gpt_ft import GPT, GPTConfig


def bench(preset: str, batch: int, seq: int, vocab: int | None, runs: int) -> tuple[float, float]:
    overrides = {"n_positions": max(seq, GPTConfig.from_name(preset).n_positions)}
    if vocab:
        overrides["vocab_size"] = vocab
    config = GPTConfig.from_name(preset, **overrides)
    torch.manual_seed(0)
    models = {"fp32": GPT(config).train()}
    models["bf16-mixed"] = copy.deepcopy(models["fp32"])
    ids = torch.randint(0, config.vocab_size, (batch, seq + 1))
    with torch.no_grad():
        eval_losses = {}
        for name, model in models.items():
            model.eval()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name != "fp32"):
                logits = model.lm_logits(model(ids[:, :-1])).float()
            eval_losses[name] = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).item()
            model.train()
    steps = {
        name: lm_step(
            m, torch.optim.AdamW(m.parameters(), lr=1e-4), ids, None if name == "fp32" else torch.bfloat16
        )
        for name, m in models.items()
    }
    print(f"\n{preset} (vocab {config.vocab_size}), batch {batch} x {seq}, {torch.get_num_threads()} threads")
    stats = interleaved(steps, runs=runs)  # run by run in alternating order: noise hits both alike
    rates = {name: [batch * seq / t for t in s.times] for name, s in stats.items()}
    print(f"{'run':>4} {'fp32 tok/s':>11} {'bf16 tok/s':>11} {'ratio':>6}")
    for run, (f, b) in enumerate(zip(rates["fp32"], rates["bf16-mixed"])):
        print(f"{run:>4} {f:>11.0f} {b:>11.0f} {b / f:>6.2f}")
    ratio = statistics.median(b / f for f, b in zip(rates["fp32"], rates["bf16-mixed"]))
    fp32, bf16 = eval_losses["fp32"], eval_losses["bf16-mixed"]
    print(f"median tokens/s fp32 {statistics.median(rates['fp32']):.0f}, bf16-mixed "
          f"{statistics.median(rates['bf16-mixed']):.0f}; median ratio {ratio:.2f}x")  # fmt: skip
    print(f"loss of one batch (eval, same weights): fp32 {fp32:.5f}, bf16-mixed {bf16:.5f} "
          f"(relative difference {abs(bf16 - fp32) / fp32:.2e})")  # fmt: skip
    return ratio, abs(bf16 - fp32) / fp32


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", nargs="+", default=["gpt-mini:16x256", "gpt1:2x512"], help="PRESET:BxT")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the preset's)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for shape in args.shape:
        preset, dims = shape.split(":")
        batch, seq = (int(x) for x in dims.split("x"))
        results[shape] = bench(preset, batch, seq, args.vocab, args.runs)
    print(f"\n{'shape':>18} {'bf16/fp32 tokens/s':>19} {'loss rel. diff':>15}")
    for shape, (ratio, diff) in results.items():
        print(f"{shape:>18} {ratio:>19.2f} {diff:>15.1e}")


if __name__ == "__main__":
    main()
