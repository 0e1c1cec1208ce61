"""Decoding for `GPT`: greedy, sampling (temperature, top-k, top-p) and beam search, over a KV cache,
with CTRL's repetition penalty where asked (as transformers applies it).

Pure torch. These functions are also methods: `gpt.generate(...)`, `gpt.stream(...)`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gpt_ft.model import GPT


def check_decoding(
    model: GPT,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    num_beams: int,
    do_sample: bool,
    repetition_penalty: float = 1.0,
) -> None:
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty (batch, length) tensor, got shape {tuple(input_ids.shape)}."
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}.")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}.")
    vocab, low, high = model.config.vocab_size, int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:  # a padding row of the embedding, or an index error, otherwise
        raise ValueError(
            f"input_ids hold token id {low if low < 0 else high}, outside the model's vocabulary of "
            f"{vocab} (ids 0 to {vocab - 1}): use the tokenizer saved with the weights."
        )
    n_ctx = model.config.n_positions
    if input_ids.shape[1] + max_new_tokens > n_ctx:
        raise ValueError(
            f"A prompt of {input_ids.shape[1]} tokens plus max_new_tokens={max_new_tokens} exceeds the "
            f"model's context of {n_ctx} tokens."
        )
    if do_sample and temperature <= 0:  # greedy decoding reads none of the three, as transformers'
        raise ValueError(
            f"temperature must be > 0, got {temperature}; use do_sample=False for greedy decoding."
        )
    if do_sample and top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}.")
    if do_sample and top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}.")
    if num_beams > 1 and do_sample:
        raise ValueError("Beam search is deterministic: use num_beams=1 with do_sample=True.")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1: none), got {repetition_penalty}.")


def penalized(scores: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019), as transformers applies it: the score of each
    token the sequence holds already (`seen`, (B, V) bool) divided by `penalty` where positive,
    multiplied by it where negative (beam search penalises log-probabilities so)."""
    return torch.where(seen, torch.where(scores < 0, scores * penalty, scores / penalty), scores)


def seen_tokens(ids: Tensor, vocab: int) -> Tensor:
    """(B, V) bool: which tokens each row of `ids` holds."""
    return torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device).scatter_(1, ids, True)


def _filter_logits(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering of (B, V) logits."""
    logits = logits / temperature  # sampling from softmax(l / T) is q ∝ p^(1/T)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the tokens ranked above it already hold top_p of the mass (the top one stays).
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def stop_ids(eos_token_id: int | list[int] | None) -> list[int]:
    """The end-of-text ids decoding stops at: none, one, or several."""
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, (str, bytes)):  # (its characters would be read as ids)
        raise ValueError(f"eos_token_id is a token's id or a list of them, got the text {eos_token_id!r}.")
    try:  # an int, or one as NumPy or torch holds it
        return [operator.index(eos_token_id)]
    except TypeError:
        return [int(i) for i in eos_token_id]


@contextmanager
def decoding(model: GPT) -> Iterator[None]:
    """The model in eval mode (no dropout) while it decodes, then back in the mode it was in: a
    model fresh from `from_pretrained` is in training mode."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


@torch.no_grad()
def stream(
    model: GPT,
    input_ids: Tensor,
    *,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    static_cache: bool = False,
    repetition_penalty: float = 1.0,
) -> Iterator[Tensor]:
    """Yield the next token of every sequence, (B,), one step at a time (greedy or sampled), with
    dropout off (the model's mode is restored after).

    Sequences that produced an `eos_token_id` (one id, or several: instruct models end turns with
    more than one) keep yielding the first; the stream ends when all have. `static_cache`: keys and
    values in a `StaticKVCache`; on CUDA the decode step is then captured once as a CUDA graph and
    replayed for every token (the same tokens, a fraction of the launches). `repetition_penalty`
    > 1 makes the tokens of the prompt and of what came since less likely (`penalized`).
    """
    check_decoding(
        model, input_ids, max_new_tokens, temperature, top_k, top_p, 1, do_sample, repetition_penalty
    )
    if static_cache and not use_cache:
        raise ValueError("static_cache=True needs use_cache=True.")
    with decoding(model):
        yield from _stream(model, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p,
                           stop_ids(eos_token_id), use_cache, generator, static_cache,
                           repetition_penalty)  # fmt: skip


def _stream(model, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, stops, use_cache,
            generator, static_cache, repetition_penalty) -> Iterator[Tensor]:  # fmt: skip
    B, T0 = input_ids.shape
    cache = model.new_kv_cache(B, T0 + max_new_tokens, static=static_cache) if use_cache else None
    ids, step_input = input_ids, input_ids
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    stop_set = torch.tensor(
        stops, dtype=input_ids.dtype, device=input_ids.device
    )  # copied once, not per token
    replay = None
    seen = seen_tokens(input_ids, model.config.vocab_size) if repetition_penalty != 1.0 else None
    for i in range(max_new_tokens):
        if replay is not None:
            logits = replay(step_input)
        else:
            hidden = model(step_input, kv_cache=cache) if use_cache else model(ids)
            logits = model.lm_logits(hidden[:, -1]).float()  # (B, V)
            if static_cache and input_ids.is_cuda and i + 1 < max_new_tokens:
                replay = decode_graph(model, cache, B)
        if seen is not None:
            logits = penalized(logits, seen, repetition_penalty)
        if do_sample:
            probs = _filter_logits(logits, temperature, top_k, top_p).softmax(dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
        else:
            token = logits.argmax(dim=-1)  # (B,)
        if stops:
            token = token.masked_fill(finished, stops[0])
            finished |= torch.isin(token, stop_set)
        yield token
        if stops and bool(finished.all()):
            return
        if seen is not None:
            seen.scatter_(1, token[:, None], True)
        step_input = token[:, None]
        if not use_cache:
            ids = torch.cat([ids, step_input], dim=1)


def decode_graph(model: GPT, cache, batch_size: int):
    """The decode step, one token a sequence over a `StaticKVCache`, captured as a CUDA graph:
    returns `replay(tokens (B, 1)) -> logits (B, V)`, valid until the next replay.

    Two warm-up steps on a side stream first (allocations, library workspaces); they write
    the slots the next two real steps overwrite before reading, and the cache's position is put
    back, so the cache is as it was.
    """
    device = cache.k.device
    tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=device)

    def step() -> Tensor:
        return model.lm_logits(model(tokens, kv_cache=cache)[:, -1]).float()

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


@torch.no_grad()
def generate(
    model: GPT,
    input_ids: Tensor,
    *,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    static_cache: bool = False,
    repetition_penalty: float = 1.0,
) -> Tensor:
    """Continue `input_ids` (B, T) by up to `max_new_tokens`; returns (B, T + n).

    Greedy by default; `do_sample=True` samples with `temperature`, `top_k`, `top_p`;
    `num_beams > 1` runs beam search scored by sum of log-probabilities / length**length_penalty.
    Sequences that stop early are padded with (the first) `eos_token_id`. `static_cache`: see
    `stream` (on CUDA, the decode step as a CUDA graph); `repetition_penalty`: `penalized`.
    Dropout is off while it decodes.
    """
    check_decoding(
        model, input_ids, max_new_tokens, temperature, top_k, top_p, num_beams, do_sample, repetition_penalty
    )
    if num_beams > 1:
        if static_cache:
            raise ValueError(
                "Beam search reorders its cache each step: use static_cache=False with num_beams > 1."
            )
        return beam_search(
            model,
            input_ids,
            num_beams=num_beams,
            max_new_tokens=max_new_tokens,
            length_penalty=length_penalty,
            eos_token_id=eos_token_id,
            repetition_penalty=repetition_penalty,
        )
    tokens = stream(
        model,
        input_ids,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        use_cache=use_cache,
        generator=generator,
        static_cache=static_cache,
        repetition_penalty=repetition_penalty,
    )
    return torch.cat([input_ids, *(t[:, None] for t in tokens)], dim=1)


@torch.no_grad()
def beam_search(
    model: GPT,
    input_ids: Tensor,
    *,
    num_beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    repetition_penalty: float = 1.0,
) -> Tensor:
    """Beam search over the KV cache, dropout off; returns the best hypothesis per prompt, (B, T + n).

    A hypothesis ending in an `eos_token_id` is scored sum(log p) / (generated length)**length_penalty.
    A prompt is done once it has `num_beams` finished hypotheses and no running beam can beat the
    worst of them at the current length (the usual heuristic, as in transformers).
    """
    check_decoding(model, input_ids, max_new_tokens, 1.0, None, None, num_beams, False, repetition_penalty)
    with decoding(model):
        return _beam_search(
            model, input_ids, num_beams, max_new_tokens, length_penalty, stop_ids(eos_token_id),
            repetition_penalty,
        )  # fmt: skip


def _beam_search(model, input_ids, num_beams, max_new_tokens, length_penalty, stops, penalty) -> Tensor:
    pad = stops[0] if stops else 0
    B, T0 = input_ids.shape
    K, device = num_beams, input_ids.device
    if max_new_tokens == 0:
        return input_ids
    cache = model.new_kv_cache(B, T0 + max_new_tokens)
    logits = model.lm_logits(model(input_ids, kv_cache=cache)[:, -1]).float()  # (B, V)
    V = logits.shape[-1]
    # Every beam starts as the prompt; only beam 0 may expand at the first step, or the K beams
    # would all pick the same tokens.
    cache.reorder(torch.arange(B, device=device).repeat_interleave(K))
    logits = logits.repeat_interleave(K, dim=0)  # (B*K, V)
    beam_scores = torch.zeros(B, K, device=device)
    beam_scores[:, 1:] = float("-inf")
    seqs = input_ids.repeat_interleave(K, dim=0)  # (B*K, T0)
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(B)]
    done = [False] * B

    def score(total_logprob: float, length: int) -> float:
        return total_logprob / length**length_penalty

    for step in range(1, max_new_tokens + 1):
        log_probs = logits.log_softmax(dim=-1)
        if penalty != 1.0:
            log_probs = penalized(log_probs, seen_tokens(seqs, V), penalty)
        candidates = (beam_scores[:, :, None] + log_probs.view(B, K, V)).view(B, K * V)
        # enough for K that end in no stop token, however many of the best do (transformers' width)
        top_scores, top_index = candidates.topk(max(2, 1 + len(stops)) * K, dim=1)
        src_beam, token = top_index // V, top_index % V
        next_src, next_token = torch.zeros(B, K, dtype=torch.long), torch.zeros(B, K, dtype=torch.long)
        next_scores = torch.full((B, K), float("-inf"))
        for b in range(B):
            if done[b]:  # keep a placeholder beam going; it is never chosen
                next_token[b] = pad
                continue
            n = 0
            for rank in range(top_scores.shape[1]):
                s, beam, tok = top_scores[b, rank].item(), src_beam[b, rank].item(), token[b, rank].item()
                if tok in stops:
                    if rank < K:  # an eos outside the top K would not have survived as a beam
                        hyp = torch.cat([seqs[b * K + beam], seqs.new_tensor([tok])])
                        finished[b].append((score(s, step), hyp))
                    continue
                next_src[b, n], next_token[b, n], next_scores[b, n] = beam, tok, s
                n += 1
                if n == K:
                    break
            finished[b] = sorted(finished[b], key=lambda h: h[0], reverse=True)[:K]
            if len(finished[b]) == K:
                # the best beam still running cannot beat the worst finished one
                done[b] = finished[b][-1][0] >= score(next_scores[b, 0].item(), step)
        if all(done):
            break
        flat_src = (torch.arange(B)[:, None] * K + next_src).view(-1).to(device)  # (B*K,)
        cache.reorder(flat_src)
        seqs = torch.cat([seqs[flat_src], next_token.view(-1, 1).to(device)], dim=1)
        beam_scores = next_scores.to(device)
        if step < max_new_tokens:
            logits = model.lm_logits(model(seqs[:, -1:], kv_cache=cache)[:, -1]).float()

    n_gen = seqs.shape[1] - T0
    for b in range(B):
        if not done[b]:
            for k in range(K):
                finished[b].append((score(beam_scores[b, k].item(), n_gen), seqs[b * K + k]))
    best = [max(finished[b], key=lambda h: h[0])[1] for b in range(B)]
    width = max(len(h) for h in best)
    out = torch.full((B, width), pad, dtype=input_ids.dtype, device=device)
    for b, hyp in enumerate(best):
        out[b, : len(hyp)] = hyp
    return out
