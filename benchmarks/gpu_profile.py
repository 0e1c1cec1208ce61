"""Two groups of benchmarks/gpu_figures.py's rows, on the preset's training step as its `training_throughput`
rows run it (on a GPU the GPT compiled with its loss, in bf16-mixed, fused AdamW):

- `profile`: where a step's time goes. torch.profiler records a few steps; each kernel's own time
  (on a CPU, each operator's) is put in one kind (`KINDS`, the first pattern its name matches), and
  the device's idle share is the wall time its kernels leave uncovered: time spent waiting for the
  host (Python, launches, a read back). The longest kernels follow.
- `shapes`: the same step's tokens/s and MFU on today's decoder shapes, SmolLM2-135M and
  Qwen3-0.6B (random weights; on a CPU the tiny llama-micro, to check the rows run), and on
  GPT-1's without dropout (llm.c's GPT-2, whose MFU the goal takes, trains without; its FLOP count
  is 3.5% below ours at this size: docs/gpus.md).

    python benchmarks/gpu_figures.py --only profile shapes
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Iterator

import harness
import torch
from harness import Row, interleaved, lm_step, measure
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from gpt_ft import GPT, GPTConfig
from gpt_ft.training.throughput import counted_parameters, flops_per_token

KINDS = [  # (kind, pattern on a kernel's or an operator's name, lower case); the first match wins
    # a softmax, not the loss's (CUDA's log-softmax: `cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>`)
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|cudnn|^(?!.*log_?softmax).*softmax"),
    ("matmuls", r"gemm|matmul|(?<![a-z])mm(?![a-z])|addmm|bmm|linear|cutlass|xmma|nvjet|cublas|sm\d+_"),
    ("optimizer", r"adam|foreach|multi_tensor"),
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter"),
    ("the loss (log-softmax, NLL)", r"softmax|nll|cross_entropy"),
    ("norms", r"norm"),
    ("dropout", r"bernoulli|dropout|philox"),
    ("copies, casts and fills", r"copy|memcpy|memset|fill|clone|contiguous|\bcat\b"),
    ("other elementwise and reductions", r"triton|inductor|cpp_fused|elementwise|reduce|\b(add|mul|sum)"),
]
NO_DROPOUT = {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
SHAPES = {
    "cuda": [("smollm2-135m", 2048, 8, {}), ("qwen3-0.6b", 2048, 8, {}), ("gpt1", 512, 64, NO_DROPOUT)],
    "cpu": [("llama-micro", 128, 4, {})],
}
"""Preset, context, batch and overrides of the `shapes` rows on each device: today's decoders, and
GPT-1's step without its dropout, as llm.c trains GPT-2 (the MFU it is compared with)."""


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, lowered)), "other")


def step_for(setup, config: GPTConfig, batch: int, seq: int):
    """The training step `training_throughput` times at its fastest: on a GPU the GPT compiled with
    its loss (one static graph), eager on a CPU; and the tokens it trains on."""
    torch.manual_seed(0)
    model = GPT(copy.deepcopy(config)).to(setup.device).train()
    loss = None
    if setup.compile:
        model.compile(dynamic=False)
        loss = torch.compile(harness.logits_loss(hf=False), dynamic=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=setup.cuda)
    ids = torch.randint(0, config.vocab_size, (batch, seq + 1), device=setup.device)
    return model, lm_step(model, optimizer, ids, setup.autocast, loss_fn=loss), batch * seq


def profile(setup, tmp) -> Iterator[Row]:
    batch, steps = max(setup.batches), 3
    _, step, _ = step_for(setup, setup.config, batch, setup.seq)
    for _ in range(3 if setup.compile else 1):  # compiling is in the warm-up
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.cuda else [])
    with torch_profile(activities=activities) as prof:
        wall = measure(step, number=steps) * steps
    own = Counter()  # microseconds of each kernel (device) or operator (CPU), its own time
    for event in prof.key_averages():
        on_device = event.device_type == torch.autograd.DeviceType.CUDA
        if setup.cuda and on_device:
            own[event.key] += event.self_device_time_total
        elif not setup.cuda and not on_device and not event.key.startswith(("ProfilerStep", "##")):
            own[event.key] += event.self_cpu_time_total
    busy = sum(own.values()) / 1e6
    where = "the GPU's kernels" if setup.cuda else "the CPU's operators (self time)"
    head = f"training step {batch} x {setup.seq}{', compiled with its loss' if setup.compile else ''}"
    yield Row(f"profile, {head}", f"{wall / steps * 1e3:.1f} ms a step; {where} busy {busy / wall:.0%} of it")
    kinds = Counter()
    for name, us in own.items():
        kinds[kind_of(name)] += us / 1e6
    for kind in [kind for kind, _ in KINDS] + ["other"]:  # in one order, run after run
        seconds = kinds[kind]
        yield Row(f"profile, {kind}", f"{seconds / wall:.1%} ({seconds / steps * 1e3:.2f} ms a step)")
    idle = max(0.0, 1 - busy / wall)
    yield Row(f"profile, {'device idle (waiting for the host)' if setup.cuda else 'outside the operators'}",
              f"{idle:.1%}")  # fmt: skip
    top = ", ".join(f"{name[:48]} {us / 1e6 / wall:.0%}" for name, us in own.most_common(5))
    yield Row(
        "profile, longest kernels" if setup.cuda else "profile, longest operators", top.replace("|", "/")
    )


def shapes(setup, tmp) -> Iterator[Row]:
    for preset, seq, batch, overrides in SHAPES[setup.device]:
        overrides = overrides if setup.cuda else {"vocab_size": 8192, **overrides}
        config = GPTConfig.from_name(preset, n_positions=max(seq, 128), **overrides)
        model, step, tokens = step_for(setup, config, batch, seq)
        stats = interleaved({preset: step}, runs=setup.runs, warmup=3 if setup.compile else 1)[preset]
        figure = f"{stats.rate(tokens)} tokens/s"
        if setup.peak_tflops:
            fpt = flops_per_token(config, counted_parameters(model), seq)
            figure += f", MFU {tokens / stats.median * fpt / (setup.peak_tflops * 1e12):.1%}"
        how = "compiled with its loss" if setup.compile else "eager"
        shape = f"{preset} shape{', no dropout' if overrides.get('resid_pdrop') == 0 else ''}"
        yield Row(f"training step, {shape}, batch {batch} x {seq}, {how}", figure)
        del model, step
        if setup.cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":  # a group of gpu_figures.py's rows, run there
    raise SystemExit(
        f"{__file__} holds rows of gpu_figures.py; run them with: "
        "python benchmarks/gpu_figures.py --only profile shapes"
    )
