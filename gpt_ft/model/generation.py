"""Decoding for `GPT`: greedy, sampling (temperature, top-k, top-p) and beam search (beams.py), over
a KV cache (`static_cache` on CUDA: the decode step replayed as a CUDA graph), with CTRL's repetition
penalty where asked (decoding.py). Prompts of several lengths in one batch are padded on the left
(`attention_mask`, as transformers takes them): each is continued as it would be alone.

Pure torch. These functions are also methods: `gpt.generate(...)`, `gpt.stream(...)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gpt_ft.model.beams import beam_search
from gpt_ft.model.decoding import (
    check_decoding,
    eval_mode,
    grown,
    left_padding,
    longrope_crossings,
    penalized,
    restarted,
    seen_tokens,
    stop_ids,
)
from gpt_ft.model.graphs import decode_graph, decoder

if TYPE_CHECKING:
    from gpt_ft.model import GPT


def _filter_logits(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering of (B, V) logits."""
    logits = logits / temperature  # sampling from softmax(l / T) is q ∝ p^(1/T)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # Drop a token while the tokens up to it, the least likely first, hold at most 1 - top_p of
        # the mass (the top one stays): transformers' sums in its order, ties and the edge alike.
        sorted_logits, order = logits.sort(dim=-1)
        drop_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.no_grad()
def stream(
    model: GPT,
    input_ids: Tensor,
    *,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    static_cache: bool | str = False,
    repetition_penalty: float = 1.0,
    suppress_tokens: list[int] | None = None,
) -> Iterator[Tensor]:
    """Yield the next token of every sequence, (B,), one step at a time (greedy or sampled), with
    dropout off (the model's mode is restored after).

    Sequences that produced an `eos_token_id` (one id, or several: instruct models end turns with
    more than one) keep yielding the first; the stream ends when all have. `static_cache`: keys and
    values in a `StaticKVCache`; on CUDA the decode step is then captured once as a CUDA graph and
    replayed for every token (the same tokens, a fraction of the launches); `static_cache="compiled"`
    compiles that step (`torch.compile`) before capturing it: its norms, residuals and activations
    fused into fewer kernels, the first call of a shape spending the compile. `repetition_penalty`
    > 1 makes the tokens of the prompt and of what came since less likely (`penalized`).
    `suppress_tokens`: ids never produced (gpt-ft generate's: the task framing tokens, which a
    fine-tuned model's head may score above the end-of-turn token they were copied from).
    `attention_mask` (B, T), 0 at padding: prompts of several lengths, padded on the left.
    On CUDA a token is yielded once the next step is queued, and nothing in the loop waits for the
    GPU: with stop tokens, the last step is computed for nothing.
    """
    input_ids, real, positions = left_padding(input_ids, attention_mask)
    check_decoding(
        model, input_ids, max_new_tokens, temperature, top_k, top_p, 1, do_sample, repetition_penalty
    )
    if static_cache not in (False, True, "compiled"):
        raise ValueError(f"static_cache={static_cache!r}: give True, False or 'compiled'.")
    if static_cache and not use_cache:
        raise ValueError("static_cache=True needs use_cache=True.")
    with eval_mode(model):
        yield from _stream(model, input_ids, real, positions, max_new_tokens, do_sample, temperature,
                           top_k, top_p, stop_ids(eos_token_id, model.config.vocab_size), use_cache,
                           generator, static_cache, repetition_penalty, suppress_tokens)  # fmt: skip


def _stream(model, input_ids, real, positions, max_new_tokens, do_sample, temperature, top_k, top_p, stops,
            use_cache, generator, static_cache, repetition_penalty,
            suppress) -> Iterator[Tensor]:  # fmt: skip
    B, T0 = input_ids.shape
    kept = decoder(model, B, T0 + max_new_tokens, static_cache) if static_cache else None
    if kept is not None:
        kept.busy = True  # a second stream at once decodes on a cache of its own
    try:
        cache = kept.cache if kept else model.new_kv_cache(B, T0 + max_new_tokens) if use_cache else None
        yield from _steps(model, input_ids, real, positions, max_new_tokens, do_sample, temperature, top_k,
                          top_p, stops, generator, repetition_penalty, suppress, cache, kept)  # fmt: skip
    finally:
        if kept is not None:
            kept.busy = False


def _steps(model, input_ids, real, positions, max_new_tokens, do_sample, temperature, top_k, top_p, stops,
           generator, repetition_penalty, suppress, cache, kept) -> Iterator[Tensor]:  # fmt: skip
    B = input_ids.shape[0]
    ids, step_input = input_ids, input_ids
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    stop_set = torch.tensor(
        stops, dtype=input_ids.dtype, device=input_ids.device
    )  # copied once, not per token
    replay = None
    suppress = [
        t for t in suppress or () if 0 <= t < model.config.vocab_size
    ]  # (others: no token, as in transformers)
    suppress = torch.tensor(suppress, dtype=torch.long, device=input_ids.device) if suppress else None
    seen = seen_tokens(input_ids, model.config.vocab_size, real) if repetition_penalty != 1.0 else None
    # On CUDA each token is handed out once the next step is queued (`runs_ahead`): the GPU works on
    # while the host reads whether every sequence has stopped, and whoever takes the token reads it.
    ahead, held = runs_ahead(input_ids.device), None
    ended = [HostFlag(input_ids.device) for _ in range(2)] if stops else None
    crossings = longrope_crossings(model, input_ids, real, max_new_tokens) if cache is not None else set()
    for i in range(max_new_tokens):
        if i in crossings:  # LongRoPE: the text run anew, its keys with the long factors
            hidden = model(ids, real, position_ids=positions, kv_cache=restarted(cache))
            logits = model.lm_logits(hidden[:, -1]).float()
        elif replay is not None:
            logits = replay(step_input)
        else:
            if cache is None:
                hidden = model(ids, real, position_ids=positions)
            elif kept is not None and i > 0:  # the cache keeps the prompts' padding and counts past it
                hidden = model(step_input, kv_cache=cache)
            else:
                new = None if positions is None else positions[:, -step_input.shape[1] :]
                hidden = model(step_input, real, position_ids=new, kv_cache=cache)
            logits = model.lm_logits(hidden[:, -1]).float()  # (B, V)
            if kept is not None and input_ids.is_cuda and i + 1 < max_new_tokens:
                if kept.replay is None:  # captured once, then replayed by every call that takes it
                    kept.replay = decode_graph(model, cache, B, compiled=kept.key[2] == "compiled")
                replay = kept.replay
        if suppress is not None:
            logits = logits.index_fill(1, suppress, float("-inf"))
        if seen is not None:
            logits = penalized(logits, seen, repetition_penalty)
        if do_sample:
            probs = _filter_logits(logits, temperature, top_k, top_p).softmax(dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
        else:
            token = logits.argmax(dim=-1)  # (B,)
        done = None
        if stops:
            token = token.masked_fill(finished, stops[0])
            finished |= torch.isin(token, stop_set)
            done = ended[i % 2].set(finished.all())
        if ahead and held is not None:  # the previous token, now that this step is queued
            yield held[0]
            if held[1] is not None and held[1].read():
                return
        if not ahead:
            yield token
            if done is not None and done.read():
                return
        held = token, done
        if seen is not None:
            seen.scatter_(1, token[:, None], True)
        step_input = token[:, None]
        real, positions = grown(real, positions)
        if cache is None or crossings:
            ids = torch.cat([ids, step_input], dim=1)
    if ahead and held is not None:
        yield held[0]


def runs_ahead(device: torch.device) -> bool:
    """Whether decoding queues the next step before it hands out a token: on CUDA, where kernels run
    asynchronously (on a CPU the last step would be computed for nothing)."""
    return device.type == "cuda"


class HostFlag:
    """A boolean on the device, copied to the host without waiting for it: `read` then waits for the
    work queued before `set` only, not for what was queued after (CUDA: pinned memory and an event)."""

    def __init__(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.value = torch.zeros((), dtype=torch.bool, pin_memory=cuda)
        self.event = torch.cuda.Event() if cuda else None

    def set(self, flag: Tensor) -> HostFlag:
        self.value.copy_(flag, non_blocking=self.event is not None)
        if self.event is not None:
            self.event.record()
        return self

    def read(self) -> bool:
        if self.event is not None:
            self.event.synchronize()
        return bool(self.value)


@torch.no_grad()
def generate(
    model: GPT,
    input_ids: Tensor,
    *,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    static_cache: bool | str = False,
    repetition_penalty: float = 1.0,
    suppress_tokens: list[int] | None = None,
) -> Tensor:
    """Continue `input_ids` (B, T) by up to `max_new_tokens`; returns (B, T + n).

    Greedy by default; `do_sample=True` samples with `temperature`, `top_k`, `top_p`;
    `num_beams > 1` runs beam search scored by sum of log-probabilities / length**length_penalty.
    Sequences that stop early are padded with (the first) `eos_token_id`. `static_cache`: see
    `stream` (on CUDA, the decode step as a CUDA graph); `repetition_penalty`: `penalized`;
    `suppress_tokens`: ids never produced.
    `attention_mask` (B, T), 0 at padding: prompts of several lengths, padded on the left, each
    continued as it would be alone (its padding stays in the output). Dropout is off while it decodes.
    """
    check_decoding(
        model,
        left_padding(input_ids, attention_mask)[0],
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        num_beams,
        do_sample,
        repetition_penalty,
    )
    if num_beams > 1:
        if static_cache:
            raise ValueError(
                "Beam search reorders its cache each step: use static_cache=False with num_beams > 1."
            )
        return beam_search(
            model,
            input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            max_new_tokens=max_new_tokens,
            length_penalty=length_penalty,
            eos_token_id=eos_token_id,
            repetition_penalty=repetition_penalty,
            suppress_tokens=suppress_tokens,
        )
    tokens = stream(
        model,
        input_ids,
        max_new_tokens=max_new_tokens,
        attention_mask=attention_mask,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        use_cache=use_cache,
        generator=generator,
        static_cache=static_cache,
        repetition_penalty=repetition_penalty,
        suppress_tokens=suppress_tokens,
    )
    return torch.cat([input_ids, *(t[:, None] for t in tokens)], dim=1)
