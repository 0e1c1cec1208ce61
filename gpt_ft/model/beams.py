"""Beam search for `GPT` (`gpt.generate(..., num_beams=K)`), over a KV cache, as transformers scores
it; prompts of several lengths padded on the left (`attention_mask`). Pure torch."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

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

if TYPE_CHECKING:
    from gpt_ft.model import GPT


@torch.no_grad()
def beam_search(
    model: GPT,
    input_ids: Tensor,
    *,
    num_beams: int,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    length_penalty: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    repetition_penalty: float = 1.0,
    suppress_tokens: list[int] | None = None,
) -> Tensor:
    """Beam search over the KV cache, dropout off; returns the best hypothesis per prompt, (B, T + n).

    A hypothesis ending in an `eos_token_id` is scored sum(log p) / (generated length)**length_penalty.
    A prompt is done once it has `num_beams` finished hypotheses and no running beam can beat the
    worst of them at the current length (the usual heuristic, as in transformers). `attention_mask`
    (B, T), 0 at padding: prompts padded on the left, each searched as it would be alone.
    `suppress_tokens`: ids never produced (their log-probabilities -inf, as transformers' processor).
    """
    ids, real, positions = left_padding(input_ids, attention_mask)
    check_decoding(model, ids, max_new_tokens, 1.0, None, None, num_beams, False, repetition_penalty)
    if isinstance(length_penalty, bool) or not math.isfinite(length_penalty):  # (NaN scores every beam)
        raise ValueError(f"length_penalty must be a finite number (1: none), got {length_penalty!r}.")
    with eval_mode(model):
        out = _beam_search(
            model, ids, real, positions, num_beams, max_new_tokens, length_penalty,
            stop_ids(eos_token_id, model.config.vocab_size), repetition_penalty, suppress_tokens,
        )  # fmt: skip
    out[:, : input_ids.shape[1]] = input_ids  # the padding as given
    return out


def _beam_search(
    model, input_ids, real, positions, num_beams, max_new_tokens, length_penalty, stops, penalty, suppress
) -> Tensor:
    pad = stops[0] if stops else 0
    suppress = [
        t for t in suppress or () if 0 <= t < model.config.vocab_size
    ]  # (others: no token, as in transformers)
    B, T0 = input_ids.shape
    K, device = num_beams, input_ids.device
    if max_new_tokens == 0:
        return input_ids.clone()
    cache = model.new_kv_cache(B, T0 + max_new_tokens)
    logits = model.lm_logits(model(input_ids, real, position_ids=positions, kv_cache=cache)[:, -1]).float()
    V = logits.shape[-1]
    # Every beam starts as the prompt; only beam 0 may expand at the first step, or the K beams
    # would all pick the same tokens.
    cache.reorder(torch.arange(B, device=device).repeat_interleave(K))
    logits = logits.repeat_interleave(K, dim=0)  # (B*K, V)
    if real is not None:  # a prompt's beams share its padding, and keep it: a beam stays its prompt's
        real, positions = real.repeat_interleave(K, dim=0), positions.repeat_interleave(K, dim=0)
    beam_scores = torch.zeros(B, K, device=device)
    beam_scores[:, 1:] = float("-inf")
    seqs = input_ids.repeat_interleave(K, dim=0)  # (B*K, T0)
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(B)]
    done = [False] * B

    def score(total_logprob: float, length: int) -> float:
        return total_logprob / length**length_penalty

    crossings = longrope_crossings(model, input_ids, real, max_new_tokens)
    for step in range(1, max_new_tokens + 1):
        log_probs = logits.log_softmax(dim=-1)
        if penalty != 1.0:
            log_probs = penalized(log_probs, seen_tokens(seqs, V, real), penalty)
        if suppress:
            log_probs[:, suppress] = float("-inf")
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
        real, positions = grown(real, positions)
        beam_scores = next_scores.to(device)
        if step in crossings:  # LongRoPE: the beams run anew, their keys with the long factors
            hidden = model(seqs, real, position_ids=positions, kv_cache=restarted(cache))
            logits = model.lm_logits(hidden[:, -1]).float()
        elif step < max_new_tokens:
            new = None if positions is None else positions[:, -1:]
            logits = model.lm_logits(
                model(seqs[:, -1:], real, position_ids=new, kv_cache=cache)[:, -1]
            ).float()

    n_gen = seqs.shape[1] - T0
    for b in range(B):
        if not done[b]:
            for k in range(K):
                finished[b].append((score(beam_scores[b, k].item(), n_gen), seqs[b * K + k]))
    best = [max(finished[b], key=lambda h: h[0])[1] for b in range(B)]
    width = max(len(h) for h in best)
    out = torch.full((B, width), pad, dtype=torch.long, device=device)  # as greedy's (and transformers')
    for b, hyp in enumerate(best):
        out[b, : len(hyp)] = hyp
    return out
