"""The decode step captured as a CUDA graph, and kept between `generate` calls.

A `StaticKVCache` keeps every shape and address of a decode step fixed and its length on the
device, so one step (one new token a sequence) is captured once as a CUDA graph and replayed for
every token: one launch instead of a few hundred. Capturing costs two warm-up steps and the capture
itself (and, `compiled`, the compile of the first call of a shape), so the last graph a model made
is kept (`decoder`) with its cache, and the next call of the same batch size, cache length bucket,
weights and autocast takes it again, its cache emptied, as transformers keeps its static cache
(`release` drops it).

Pure torch.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gpt_ft.model.cache import StaticKVCache

if TYPE_CHECKING:
    from gpt_ft.model import GPT

BUCKET = 64
"""A kept cache's length is rounded up to a multiple of this (at most the model's context), so that
prompts of a few more or fewer tokens take the same graph."""


def decode_logits(model: GPT, tokens: Tensor, cache) -> Tensor:
    """One decode step: the logits (B, V), in float32, of one new token a sequence over `cache`."""
    return model.lm_logits(model(tokens, kv_cache=cache)[:, -1]).float()


@functools.cache
def compiled_decode_logits():
    """`decode_logits` compiled (made on first use: importing dynamo costs time), with static shapes:
    a model of another shape, another batch size or cache length compiles again."""
    return torch.compile(decode_logits, dynamic=False)


STEP_COMPILES = 64
"""How many shapes (batch size, cache length, dtype, model) a process may compile the decode step
for: torch.compile stops at 8 a function and runs the others eager, unfused, without a word."""


def compiled_step(model: GPT, tokens: Tensor, cache) -> Tensor:
    """`compiled_decode_logits()(model, tokens, cache)`, compiled for this shape where it was not
    yet, up to `STEP_COMPILES` shapes (each is compiled once, then captured and replayed)."""
    with torch.compiler.config.patch(recompile_limit=STEP_COMPILES):
        return compiled_decode_logits()(model, tokens, cache)


def decode_graph(model: GPT, cache: StaticKVCache, batch_size: int, *, compiled: bool = False):
    """The decode step, one token a sequence over a `StaticKVCache`, captured as a CUDA graph:
    returns `replay(tokens (B, 1)) -> logits (B, V)`, valid until the next replay. `compiled`: the
    step is `compiled_decode_logits`, its kernels fused by inductor, compiled in the warm-up.

    Two warm-up steps on a side stream first (allocations, library workspaces, the compile); they
    write the slots the next two real steps overwrite before reading, and the cache's position is
    put back, so the cache is as it was. The replay holds no reference to the model.
    """
    device = cache.k.device
    tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
    run = compiled_step if compiled else decode_logits

    # Under autocast, capture with its cache of cast weights off (as torch.cuda.make_graphed_callables
    # asks): each cast is then a kernel in the graph, not a tensor cached from outside it.
    amp = torch.is_autocast_enabled("cuda")
    dtype = torch.get_autocast_dtype("cuda")

    def step() -> Tensor:
        with torch.autocast("cuda", dtype=dtype, enabled=amp, cache_enabled=False):
            return run(model, tokens, cache)

    position = cache.position.clone()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    cache.position.copy_(position)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    cache.position.copy_(position)  # capture records the step's kernels; it runs none

    def replay(new: Tensor) -> Tensor:
        tokens.copy_(new)
        graph.replay()
        return logits

    return replay


@dataclass
class Decoder:
    """A static cache and, once captured, the graph of its decode step (`replay`); `busy` while a
    stream decodes on it."""

    key: tuple
    cache: StaticKVCache
    replay: Callable[[Tensor], Tensor] | None = None
    busy: bool = False


KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Each model's last `Decoder` (dropped with the model)."""


def decoder(model: GPT, batch_size: int, length: int, mode: bool | str) -> Decoder:
    """A `Decoder` for `batch_size` sequences of up to `length` tokens, its cache empty: the model's
    kept one where it fits (the same batch size, length bucket, step kind, weights at the same
    addresses, autocast state), otherwise a new one, kept in its place. One a stream still decodes
    on is never taken: a second stream at once gets one of its own, not kept."""
    length = max(length, min(-(-length // BUCKET) * BUCKET, model.config.n_positions))
    weights = tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))
    p = next(model.parameters())
    autocast = torch.is_autocast_enabled(p.device.type) and torch.get_autocast_dtype(p.device.type)
    modes = (autocast, torch.is_inference_mode_enabled())  # an inference tensor is written in it only
    key = (batch_size, length, mode, p.device, p.dtype, modes, id(model.config), weights)
    kept = KEPT.get(model)
    if kept is not None and kept.key == key and not kept.busy:
        kept.cache.reset()
        return kept
    made = Decoder(key, model.new_kv_cache(batch_size, length, static=True))
    if kept is None or not kept.busy:
        KEPT[model] = made
    return made


def release(model: GPT) -> None:
    """Drop the model's kept decoder: its cache's and graph's memory back to the allocator (a kept
    cache of a large batch holds what training may need next)."""
    KEPT.pop(model, None)
