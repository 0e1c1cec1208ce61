"""Peak memory and step time of fine-tuning a large model: every weight, LoRA, LoRA on 4-bit NF4
base weights (QLoRA), and that with activation checkpointing.

Each configuration runs in a process of its own (forked, so that the imports are paid once): a
randomly initialised model of the preset's shape (no download), grown by GPT-1's 4 special tokens,
LoRA of rank 8 on every attention and feed-forward matrix (dropout 0.05), and language-modelling
steps on random tokens: forward, loss, backward, AdamW over the trainable weights. The model is
built on the CPU and moved to the device, as a run does; peak memory is then taken over the
training steps (CUDA: `torch.cuda.max_memory_allocated`; CPU: the process's peak resident set,
VmHWM on Linux, reset once the model is built). `built` is the peak up to then: on the CPU the
4-bit rows hold the full-precision weights until they are quantized. `weights` counts the
model's tensors, the 4-bit ones at their stored size.

    python benchmarks/bench_memory.py --preset llama-3.2-1b --layers 4 --seq-len 256 --batch-size 1
    python benchmarks/bench_memory.py --device cuda --dtype bfloat16 --seq-len 1024
    python benchmarks/bench_memory.py --preset llama-micro --steps 1 --seq-len 32   # a quick check
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import statistics

import torch
from harness import device, lm_step, measure

from gpt_ft import GPT, GPTConfig
from gpt_ft.model.lora import LoRA, add_lora, torchao_to_nf4
from gpt_ft.training.optim import adamw

CONFIGS = {  # name: (LoRA, its quantization, activation checkpointing)
    "every weight trained": (False, None, False),
    "LoRA": (True, None, False),
    "4-bit LoRA": (True, "nf4", False),
    "4-bit LoRA + activation checkpointing": (True, "nf4", True),
}
GIB = 1024**3


def peak_bytes(device: str) -> int:
    """The peak memory since the last `reset_peak`: allocated on the GPU, resident on the CPU."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    ctypes.CDLL(None).malloc_trim(0)  # hand memory the building freed back to the system
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)


def stored_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds; a tensor subclass (torchao's NF4Tensor) the sum of its inner tensors."""
    if hasattr(tensor, "__tensor_flatten__"):
        return sum(stored_bytes(getattr(tensor, name)) for name in tensor.__tensor_flatten__()[0])
    return tensor.numel() * tensor.element_size()


def measure_config(name: str, args: argparse.Namespace) -> dict[str, float]:
    """One configuration's figures, in this process."""
    lora, quantize, recompute = CONFIGS[name]
    config = GPTConfig.from_name(args.preset, **({"n_layer": args.layers} if args.layers else {}))
    torch.manual_seed(0)
    gpt = GPT(config).to(getattr(torch, args.dtype))
    vocab = config.vocab_size
    gpt.resize_token_embeddings(vocab + 4)  # start, delim, extract, pad (GPT-1 §3.3)
    if lora:
        add_lora(gpt, LoRA(rank=args.rank, alpha=2 * args.rank, quantize=quantize), new_tokens_from=vocab)
    gpt.activation_checkpointing = recompute
    gpt.to(args.device).train()
    trainable = [p for p in gpt.parameters() if p.requires_grad]
    optimizer = adamw(trainable, lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    ids = torch.randint(0, vocab, (args.batch_size, args.seq_len + 1), device=args.device)
    built = peak_bytes(args.device)
    reset_peak(args.device)
    step = lm_step(gpt, optimizer, ids, autocast=None)
    times = [measure(step) for _ in range(args.steps)]
    return dict(
        trainable=sum(p.numel() for p in trainable),
        weights=sum(stored_bytes(p) for p in gpt.parameters()) / GIB,
        built=built / GIB,
        peak=peak_bytes(args.device) / GIB,
        step_s=statistics.median(times[1:] or times),  # the first step warms up
    )


def child(name: str, args: argparse.Namespace, send) -> None:
    send.send(measure_config(name, args))


def isolated(name: str, args: argparse.Namespace) -> dict[str, float] | None:
    """`measure_config` in a forked process (its own peak memory); None if it failed."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(name, args, send))
    process.start()
    process.join()
    if process.exitcode != 0 or not receive.poll():
        print(f"{name}: failed (exit {process.exitcode}; out of memory?)", flush=True)
        return None
    return receive.recv()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, default=None, help="override n_layer (default: the preset's)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps; the median leaves out the first")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", type=device)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), metavar="NAME",
                        help=f"of {list(CONFIGS)} (default: all)")  # fmt: skip
    args = parser.parse_args()
    if any(CONFIGS[name][1] for name in args.configs):
        torchao_to_nf4()  # imported once, before the forks: the same baseline for every configuration
    rows = {name: isolated(name, args) for name in args.configs}
    layers = f", {args.layers} layers" if args.layers else ""
    threads = f", {torch.get_num_threads()} threads" if args.device == "cpu" else ""
    print(f"\n{args.preset}{layers}, batch {args.batch_size} x {args.seq_len}, {args.dtype}, {args.device}"
          f"{threads}, LoRA rank {args.rank}, AdamW\n")  # fmt: skip
    print("| configuration | trainable | weights (GiB) | built (GiB) | peak (GiB) | s/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        if r is not None:
            print(f"| {name} | {r['trainable']:,} | {r['weights']:.2f} | {r['built']:.2f} | {r['peak']:.2f} "
                  f"| {r['step_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
