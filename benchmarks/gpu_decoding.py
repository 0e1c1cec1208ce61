"""The GPU checklist's decoding rows (benchmarks/gpu_figures.py): greedy decoding at batch 1 on our
caches, and beside transformers' static cache."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import harness
import torch
from harness import Row, interleaved, timed

from gpt_ft import GPT

if TYPE_CHECKING:
    from gpu_figures import Setup

PROMPTS = 16
"""The batch of the padded prompts' row."""
DECODE_GOAL = 2000
"""Batch-1 greedy tokens/s of the preset on one GPU, on the static cache and its CUDA graph (its step
compiled, unless --no-compile), each `generate` call timed whole, its prefill included; the graph is
captured (and its step compiled) by the untimed first call and kept for the next, as transformers
keeps its static cache."""


def generation(setup: Setup, tmp: Path) -> Iterator[Row]:
    """Greedy decoding at batch 1: our KV cache, the static one (on a GPU its decode step replayed
    as a CUDA graph) and no cache; then beside transformers' generate on its static cache (which it
    compiles on a GPU), GPT-2's block order at the same shape (transformers' GPT-1 has no cache)."""
    torch.manual_seed(0)
    gpt = GPT(copy.deepcopy(setup.config)).to(setup.device).eval()
    prompt = torch.randint(0, setup.config.vocab_size, (1, 16), device=setup.device)
    n, out = min(setup.gen_tokens, setup.seq - 16), {}
    kinds = {"cached": {}, "static": {"static_cache": True}, "uncached": {"use_cache": False}}
    if setup.cuda and setup.compile:  # its step compiled, then captured (the untimed first call compiles)
        kinds["compiled"] = {"static_cache": "compiled"}

    def run(model, kind: str):
        return lambda: out.__setitem__(kind, model.generate(prompt, max_new_tokens=n, **kinds.get(kind, {})))

    seconds = {kind: timed(run(gpt, kind), repeat=1 if kind == "uncached" else 2) for kind in kinds}
    same = all(torch.equal(out[kind], out["cached"]) for kind in kinds)
    static = "static cache + CUDA graph (its capture included)" if setup.cuda else "static cache"
    best = "compiled" if "compiled" in kinds else "static"
    status = harness.verdict(n / seconds[best].median >= DECODE_GOAL) if setup.cuda else ""
    compiled = f", its step compiled {seconds['compiled'].rate(n)}" if "compiled" in kinds else ""
    yield Row(
        f"greedy generation, {n} tokens after 16",
        f"cached {seconds['cached'].rate(n)} tokens/s, {static} {seconds['static'].rate(n)}{compiled}, "
        f"uncached {seconds['uncached'].rate(n)}; identical tokens: {same}",
        status,
    )
    graph = "compiled" if "compiled" in kinds else True  # as transformers compiles its step
    if setup.cuda:
        yield from decode_bounds(gpt, prompt, n, graph)
    ours = GPT(dataclasses.replace(copy.deepcopy(setup.config), pre_ln=True)).to(setup.device).eval()
    hf = ours.to_hf().to(setup.device).eval()
    theirs = dict(
        max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static", pad_token_id=0
    )
    both = {
        "ours": lambda: out.__setitem__("ours", ours.generate(prompt, max_new_tokens=n, static_cache=graph)),
        "transformers": lambda: out.__setitem__("transformers", hf.generate(prompt, **theirs)),
    }
    stats = interleaved(both, runs=2)  # the untimed first call compiles transformers' step on a GPU
    yield Row(
        f"greedy generation beside transformers' static cache (GPT-2 blocks), {n} tokens",
        f"ours {stats['ours'].rate(n)} tokens/s, transformers {stats['transformers'].rate(n)}; "
        f"identical tokens: {torch.equal(out['ours'], out['transformers'])}",
    )
    # A batch of prompts of several lengths, padded on the left, as an evaluation decodes them.
    lengths = torch.linspace(4, 16, PROMPTS).long().tolist()
    ids = torch.zeros(PROMPTS, 16, dtype=torch.long, device=setup.device)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, 16 - length :] = torch.randint(1, setup.config.vocab_size, (length,))
        mask[row, 16 - length :] = 1
    batch = {
        "ours": lambda: out.__setitem__(
            "ours", ours.generate(ids, attention_mask=mask, max_new_tokens=n, static_cache=True)
        ),
        "transformers": lambda: out.__setitem__(
            "transformers", hf.generate(ids, attention_mask=mask, **theirs)
        ),
    }
    stats, total = interleaved(batch, runs=2), n * PROMPTS
    yield Row(
        f"greedy generation of {PROMPTS} prompts of 4 to 16 tokens padded on the left, {n} tokens each",
        f"ours {stats['ours'].rate(total)} tokens/s, transformers {stats['transformers'].rate(total)}; "
        f"identical tokens: {torch.equal(out['ours'], out['transformers'])}",
    )


def decode_bounds(gpt: GPT, prompt: torch.Tensor, n: int, graph: bool | str) -> Iterator[Row]:
    """What bounds batch-1 decoding on a GPU: one decode step's CUDA graph replayed `n` times with
    nothing between (the GPU's own time a token), beside `generate`'s time a token; in fp32 and with
    bf16 weights (and cache), whose tokens are checked against the bf16 model's eager cache."""
    from gpt_ft.model.graphs import decode_graph

    for dtype in (torch.float32, torch.bfloat16):
        model = copy.deepcopy(gpt).to(dtype)
        kind = "fp32" if dtype == torch.float32 else "bf16 weights"
        cache = model.new_kv_cache(1, prompt.shape[1] + n + 1, static=True)
        with torch.no_grad():
            model(prompt, kv_cache=cache)
            replay = decode_graph(model, cache, 1, compiled=graph == "compiled")
            token = prompt[:, -1:]
            replay(token)  # once untimed
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(n - 1):  # each replay advances the cache by one slot: n in all fit
                replay(token)
            end.record()
            torch.cuda.synchronize()
        alone = begin.elapsed_time(end) / 1000 / (n - 1)
        kernels = step_kernels(model, prompt, graph == "compiled", cache.max_len)
        out = {}
        runs = {
            kind: lambda: out.__setitem__(kind, model.generate(prompt, max_new_tokens=n, static_cache=graph)),
            "eager": lambda: out.__setitem__("eager", model.generate(prompt, max_new_tokens=n)),
        }
        stats = interleaved(runs, runs=2)
        same = torch.equal(out[kind], out["eager"])
        yield Row(
            f"greedy decoding, {kind}, {'its step compiled, ' if graph == 'compiled' else ''}what bounds it",
            f"the step's graph replayed alone {alone * 1e6:,.0f} µs a token ({1 / alone:,.0f} tokens/s); "
            f"`generate` {stats[kind].median / n * 1e6:,.0f} µs a token ({stats[kind].rate(n)} tokens/s), "
            f"the eager cache {stats['eager'].rate(n)}; identical tokens: {same}",
        )
        yield Row(f"greedy decoding, {kind}, one step's kernels", kernels)


def step_kernels(model: GPT, prompt: torch.Tensor, compiled: bool, length: int, steps: int = 8) -> str:
    """The kernels of one decode step (as its graph replays them: their own GPU time is the same
    outside it), from torch.profiler over `steps` steps: how many, their time, by kind. The cache
    holds `length` positions, as the graph measured beside: its compiled step is reused."""
    from gpu_profile import kind_of
    from torch.profiler import ProfilerActivity, profile

    from gpt_ft.model.graphs import compiled_step, decode_logits

    run = compiled_step if compiled else decode_logits
    cache = model.new_kv_cache(1, length, static=True)
    token = prompt[:, -1:]
    with torch.no_grad():
        model(prompt, kv_cache=cache)
        run(model, token, cache)  # compiled for this cache's shapes before the profile (if it was not)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                run(model, token, cache)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kinds: dict[str, float] = {}
    for e in kernels:
        kinds[kind_of(e.name)] = kinds.get(kind_of(e.name), 0.0) + e.self_device_time_total / steps
    busy = sum(kinds.values())
    split = ", ".join(f"{k} {us:,.0f}" for k, us in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return f"{len(kernels) / steps:.0f} kernels a token, {busy:,.0f} µs of GPU time: {split} (µs)"


if __name__ == "__main__":  # a group of gpu_figures.py's rows, run there
    raise SystemExit(
        f"{__file__} holds rows of gpu_figures.py; run them with: "
        "python benchmarks/gpu_figures.py --only generation"
    )
