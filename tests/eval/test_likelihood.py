"""Continuations' log-likelihoods in packed rows (shared contexts run once, no padding, the head at
the scored tokens only) against each request run alone through the whole vocabulary."""

from __future__ import annotations

import pytest
import torch

from gpt_ft.eval.likelihood import continuation_logprobs, units
from gpt_ft.model import GPT, GPTConfig


@torch.no_grad()
def alone(gpt: GPT, context: list[int], continuation: list[int]) -> float:
    """The request by itself: every position's logits, the continuation's tokens summed."""
    n_ctx = gpt.config.n_positions
    tokens = (context + continuation)[-(n_ctx + 1) :]
    scored = min(len(continuation), len(tokens) - 1)
    logp = torch.log_softmax(gpt.lm_logits(gpt(torch.tensor([tokens[:-1]]))).double()[0], -1)
    return float(sum(logp[j, tokens[j + 1]] for j in range(len(tokens) - 1 - scored, len(tokens) - 1)))


@pytest.mark.parametrize("preset, window", [("gpt-micro", None), ("llama-micro", None), ("llama-micro", 5)])
def test_packed_continuations_equal_each_request_alone(preset, window):
    torch.manual_seed(0)
    config = GPTConfig.from_name(preset, vocab_size=97, n_positions=32, sliding_window=window)
    gpt = GPT(config).eval()
    story = [5, 6, 7, 8, 9, 10]
    requests = [
        (story, [11, 12, 13]), (story, [14]), (story, [11, 12, 13]), (story, [15, 16]),  # an example
        ([1, 2, 3, 4], [20, 21]), ([1, 2, 3, 5], [20, 21]),  # fill-in: contexts differ, the rest the same
        ([], [30, 31, 32]),  # no context: the first token unscored
        (list(range(40, 80)), [81, 82, 83]),  # longer than the model's 32 positions: cut from the left
        (story, [50] * 30),  # after the last request's context too: one context, a new example
        ([9] * 20, [60] * 10), ([9] * 20, [61] * 14),  # sharing would outgrow the context: each alone
    ]  # fmt: skip
    expected = [alone(gpt, list(c), list(k)) for c, k in requests]
    for batch_size in (1, 3, 16):
        got = continuation_logprobs(gpt, requests, batch_size=batch_size)
        assert got == pytest.approx(expected, abs=2e-5), batch_size
    shared = units(requests, 32)
    assert len(shared[0][0]) == 6 + 2 + 1  # the story once; [11, 12, 13] once for both; [14] adds none
    assert [len(u[3]) for u in shared[:1]] == [3 + 1 + 3 + 2]


def test_a_request_with_nothing_to_score_is_refused():
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=50)).eval()
    with pytest.raises(ValueError, match="no tokens"):
        continuation_logprobs(gpt, [([1, 2], [])])
    with pytest.raises(ValueError, match="nothing to score"):
        continuation_logprobs(gpt, [([], [3])])
