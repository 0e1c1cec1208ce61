"""Training-step throughput and memory of our GPT vs transformers' model of the same family
(OpenAIGPTLMHeadModel for gpt1, GPT2LMHeadModel, LlamaForCausalLM for llama-mini or
smollm2-135m, Qwen2ForCausalLM for qwen2.5-0.5b), and KV-cache speedup.

Both models hold the same weights (ours converted with `to_hf`), run in training mode with their
dropout, in one process, interleaved run by run, so machine noise hits both alike. Each step is the
library's own training step: ours through gpt_ft's LM loss (`row_lm_terms`, the cross-entropy
chunked through the head), transformers' through `model(input_ids, labels=...).loss`; both with
fused AdamW (`torch.optim.AdamW(..., fused=True)`, on the CPU too: transformers' Trainer uses the
fused one by default from torch 2.8 on). Prints
tokens/s per run, the median ratio, peak memory of a step (each model in a fresh child process),
and cached vs uncached greedy generation. On CUDA it also prints MFU (nanoGPT's FLOP count
6N + 12·L·H·Q·T per token against the dense bf16 peak of the GPU).

    python benchmarks/bench_model.py --preset gpt1 --batch 1 2 4 8 --seq 512 --runs 3 --skip memory generation
    python benchmarks/bench_model.py --preset smollm2-135m --batch 2 --seq 256 --skip memory generation
    python benchmarks/bench_model.py --device cuda --dtype bf16 --batch 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import torch
from harness import device, interleaved, lm_step, measure, synchronize

from gpt_ft import GPT, GPTConfig
from gpt_ft.training.throughput import counted_parameters, dense_peak_tflops, flops_per_token


def ours_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """gpt_ft's own LM loss, as its training step computes it: `row_lm_terms` (the cross-entropy
    chunked through the head, see gpt_ft/training/lm_loss.py), a mean over the tokens."""
    from gpt_ft.training.terms import row_lm_terms

    sums, counts = row_lm_terms(model, model(ids[:, :-1]), ids[:, 1:], padded=False)
    return sums.sum() / counts.sum()


def hf_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own LM loss, `model(input_ids, labels=...).loss`, on the same tokens as
    `ours_loss` (`shift_labels`: the targets already shifted, so no extra input position)."""
    inputs = ids[:, :-1]
    return model(inputs, labels=inputs, shift_labels=ids[:, 1:].contiguous()).loss


def build(args, which: str):
    config = GPTConfig.from_name(args.preset)
    torch.manual_seed(0)
    ours = GPT(config)
    param_dtype = torch.float32
    models = {}
    if which in ("ours", "both"):
        models["ours"] = ours
    if which in ("hf", "both"):
        models["hf"] = ours.to_hf()
    if which == "hf":
        del ours
    for m in models.values():
        m.to(device=args.device, dtype=param_dtype).train()
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for k, m in models.items()}
    return config, models, optimizers


def own_step(name: str, model, optimizer, ids, args):
    """A training step of `model` with its own library's LM loss."""
    return lm_step(model, optimizer, ids, autocast(args), loss_fn=hf_loss if name == "hf" else ours_loss)


def rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_child(args) -> None:
    """Peak memory of a few training steps of one model, printed as JSON (run in a fresh process)."""
    config, models, optimizers = build(args, args.memory_child)
    (name, model), optimizer = next(iter(models.items())), next(iter(optimizers.values()))
    ids = torch.randint(0, config.vocab_size, (args.batch[0], args.seq + 1), device=args.device)
    step = own_step(name, model, optimizer, ids, args)
    step()  # the optimizer state exists after the first step
    synchronize(args.device)
    base = rss_mb("VmRSS")
    if args.device == "cpu":
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark (VmHWM) to the current RSS: measure the steps only
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    for _ in range(2):
        step()
    synchronize(args.device)
    peak = torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else rss_mb("VmHWM")
    print(json.dumps({"model": name, "steady_mb": base, "peak_mb": peak}))


def autocast(args):
    return torch.bfloat16 if args.dtype == "bf16" else None


def measure_memory(args) -> dict:
    out = {}
    for which in ("ours", "hf"):
        cmd = [sys.executable, __file__, "--memory-child", which, "--preset", args.preset]
        cmd += [
            "--batch",
            str(args.batch[0]),
            "--seq",
            str(args.seq),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
        ]
        cmd += ["--threads", str(args.threads)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[which] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def bench_training(args, batch: int) -> tuple[float, float, float]:
    """Median tokens/s of ours and hf, and the median of the per-run ratios, at one batch size."""
    config, models, optimizers = build(args, "both")
    n_params = counted_parameters(models["ours"])
    ids = torch.randint(0, config.vocab_size, (batch, args.seq + 1), device=args.device)
    steps = {name: own_step(name, models[name], optimizers[name], ids, args) for name in ("ours", "hf")}
    tokens = batch * args.seq
    print(
        f"\n{args.preset}, batch {batch} x {args.seq} tokens, {args.dtype}, {args.device}, "
        f"{torch.get_num_threads()} threads, training mode (dropout {config.resid_pdrop}), "
        "each library's own LM loss, fused AdamW"
    )
    # Interleaved run by run, the order alternating, so that machine noise hits both alike.
    stats = interleaved(steps, runs=args.runs, number=args.steps_per_run, warmup=args.warmup)
    rates = {name: [tokens / t for t in s.times] for name, s in stats.items()}
    print(f"{'run':>4} {'ours tok/s':>12} {'hf tok/s':>12} {'ratio':>7}")
    for run, (ours, hf) in enumerate(zip(rates["ours"], rates["hf"])):
        print(f"{run:>4} {ours:>12.0f} {hf:>12.0f} {ours / hf:>7.3f}")
    ratios = [o / h for o, h in zip(rates["ours"], rates["hf"])]
    med_ours, med_hf = statistics.median(rates["ours"]), statistics.median(rates["hf"])
    ratio = statistics.median(ratios)
    print(f"median tokens/s: ours {med_ours:.0f}, hf {med_hf:.0f}; median ratio ours/hf {ratio:.3f}")
    if args.device == "cuda":
        name = torch.cuda.get_device_name()
        peak_tflops = args.peak_tflops or dense_peak_tflops(name)
        peak = peak_tflops * 1e12 if peak_tflops else None
        fpt = flops_per_token(config, n_params, args.seq)
        if peak:
            print(
                f"MFU on {name} (dense peak {peak / 1e12:.0f} TFLOP/s): ours {med_ours * fpt / peak:.1%}, "
                f"hf {med_hf * fpt / peak:.1%}"
            )
        else:
            print(f"no dense peak known for {name!r}: pass --peak-tflops")
    del models, optimizers, steps
    return med_ours, med_hf, ratio


def bench_generation(args) -> None:
    config = GPTConfig.from_name(args.preset)
    torch.manual_seed(0)
    gpt = GPT(config).to(args.device).eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=args.device)
    outputs = {}
    if args.prompt_len + args.gen_tokens > config.n_positions:  # a small preset's context: what fits
        args.gen_tokens = config.n_positions - args.prompt_len
        print(
            f"(--gen-tokens cut to {args.gen_tokens}: {args.preset}'s context is {config.n_positions} tokens)"
        )

    def generate(use_cache: bool):
        return lambda: outputs.__setitem__(
            use_cache, gpt.generate(prompt, max_new_tokens=args.gen_tokens, use_cache=use_cache)
        )

    for use_cache in (True, False):
        gpt.generate(prompt, max_new_tokens=4, use_cache=use_cache)  # warm-up
    times = {use_cache: measure(generate(use_cache)) for use_cache in (True, False)}
    same = torch.equal(outputs[True], outputs[False])
    print(f"\ngreedy generation of {args.gen_tokens} tokens, {args.prompt_len}-token prompt ({args.preset}):")
    print(
        f"  cached {times[True]:.2f} s ({args.gen_tokens / times[True]:.1f} tok/s), "
        f"uncached {times[False]:.2f} s ({args.gen_tokens / times[False]:.1f} tok/s), "
        f"speedup {times[False] / times[True]:.1f}x, identical output: {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gpt1")
    parser.add_argument("--batch", type=int, nargs="+", default=[4], help="one or more batch sizes")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps-per-run", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], type=device)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense peak of the GPU, TFLOP/s")
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--skip", nargs="*", default=[], choices=["training", "memory", "generation"])
    parser.add_argument("--memory-child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.memory_child:
        memory_child(args)
        return
    print(f"torch {torch.__version__}, {args.threads} threads")
    if "training" not in args.skip:
        results = {batch: bench_training(args, batch) for batch in args.batch}
        if len(results) > 1:
            print(f"\n{'batch':>5} {'ours tok/s':>12} {'hf tok/s':>12} {'ratio':>7}")
            for batch, (ours, hf, ratio) in results.items():
                print(f"{batch:>5} {ours:>12.0f} {hf:>12.0f} {ratio:>7.3f}")
            print(f"slowest ratio over batch sizes: {min(r for _, _, r in results.values()):.3f}")
    if "memory" not in args.skip:
        mem = measure_memory(args)
        unit = "GPU MiB allocated" if args.device == "cuda" else "MiB RSS"
        print(f"\npeak memory over training steps ({unit}, fresh process each):")
        for name, m in mem.items():
            print(f"  {name:>4}: peak {m['peak_mb']:.0f} (after setup and first step {m['steady_mb']:.0f})")
        print(f"  ours/hf peak: {mem['ours']['peak_mb'] / mem['hf']['peak_mb']:.3f}")
    if "generation" not in args.skip:
        bench_generation(args)


if __name__ == "__main__":
    main()
