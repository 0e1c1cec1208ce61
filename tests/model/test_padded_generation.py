"""Prompts of several lengths in one batch, padded on the left: each continued as it would be alone
(greedy, sampled, beam search, a repetition penalty; dynamic, static and no cache), and as
transformers continues them."""

import pytest
import torch

from gpt_ft import GPT
from tests.helpers import TINY, tiny_gpt, tiny_hf

LENGTHS = [3, 8, 5]
PAD = 7  # a real token's id: where the padding were read as tokens, it would show


def padded(prompts: list[torch.Tensor], pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of `prompts` padded on the left to the longest."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = p, 1
    return ids, mask


def models() -> dict:
    from tests.weights.test_hf_llama import tiny_llama

    return {
        "gpt1": tiny_gpt(),  # learned positions, post-LN
        "gpt2": tiny_gpt(pre_ln=True),
        "llama": GPT.from_hf(tiny_llama("llama")).eval(),  # rotary positions, grouped keys/values
        "gemma3": GPT.from_hf(tiny_llama("gemma3_text")).eval(),  # a layer sliding over 8 tokens
    }


@pytest.mark.parametrize("name", ["gpt1", "gpt2", "llama", "gemma3"])
def test_left_padded_prompts_are_each_continued_as_alone(name):
    gpt = models()[name]
    torch.manual_seed(1)
    prompts = [torch.randint(1, 100, (n,)) for n in LENGTHS]
    ids, mask = padded(prompts)
    width = ids.shape[1]
    kwargs = dict(max_new_tokens=20)
    alone = [gpt.generate(p[None], **kwargs)[0, len(p) :] for p in prompts]
    together = gpt.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(together[:, :width], ids)  # the padding as given
    for row, new in enumerate(alone):
        assert torch.equal(together[row, width:], new), row
    for variant in (dict(use_cache=False), dict(static_cache=True)):
        assert torch.equal(gpt.generate(ids, attention_mask=mask, **kwargs, **variant), together), variant
    streamed = torch.stack(list(gpt.stream(ids, attention_mask=mask, **kwargs)), dim=1)
    assert torch.equal(streamed, together[:, width:])
    # the first step's logits, padded or alone, to float rounding
    hidden = gpt(ids, mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    for row, p in enumerate(prompts):
        torch.testing.assert_close(
            gpt.lm_logits(hidden[row, -1]), gpt.lm_logits(gpt(p[None])[0, -1]), rtol=0, atol=1e-5
        )
    # sampled: a static cache draws what the dynamic one draws
    sampled = [
        gpt.generate(
            ids,
            attention_mask=mask,
            **kwargs,
            do_sample=True,
            top_k=20,
            static_cache=static,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        for static in (False, True)
    ]
    assert torch.equal(*sampled)


@pytest.mark.parametrize("name", ["gpt1", "llama"])
def test_beam_search_and_a_repetition_penalty_count_no_padding(name):
    """Each padded prompt's beams as its own search's; a repetition penalty sees the prompt's tokens,
    not its padding: the padding's id is the token the shortest prompt alone picks first under a
    strong penalty, which would have kept it from picking that token had the padding counted."""
    gpt = models()[name]
    torch.manual_seed(2)
    prompts = [torch.randint(1, 100, (n,)) for n in LENGTHS]
    beams = dict(max_new_tokens=10, num_beams=3, eos_token_id=[5, 9, 11], length_penalty=0.5)
    alone = [gpt.generate(p[None], **beams)[0, len(p) :] for p in prompts]
    ids, mask = padded(prompts)
    together = gpt.generate(ids, attention_mask=mask, **beams)
    assert torch.equal(together[:, : ids.shape[1]], ids)
    for row, new in enumerate(alone):
        got = together[row, ids.shape[1] :]
        assert torch.equal(got[: len(new)], new) and (got[len(new) :] == 5).all(), row  # padded by eos
    shortest = prompts[0][None]
    pad = int(gpt.generate(shortest, max_new_tokens=1, repetition_penalty=100.0)[0, -1])
    ids, mask = padded(prompts, pad=pad)
    for kwargs in (dict(max_new_tokens=8), dict(max_new_tokens=8, num_beams=2)):
        penalised = dict(kwargs, repetition_penalty=100.0)
        together = gpt.generate(ids, attention_mask=mask, **penalised)
        first = gpt.generate(shortest, **penalised)[0, len(prompts[0]) :]
        assert torch.equal(together[0, ids.shape[1] :], first), kwargs
        assert int(first[0]) == pad and pad not in first[1:].tolist()  # once seen, penalised


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_left_padded_generation_equals_transformers(family):
    """Greedy, beam search, and a repetition penalty with the padding's id a real token's."""
    from tests.weights.test_hf_llama import tiny_llama

    hf = tiny_hf(family) if family == "gpt2" else tiny_llama(family)
    gpt = GPT.from_hf(hf).eval()
    torch.manual_seed(3)
    ids, mask = padded([torch.randint(1, TINY["vocab_size"], (n,)) for n in LENGTHS])
    runs = [dict(max_new_tokens=15), dict(max_new_tokens=8, num_beams=3, length_penalty=0.0)]
    runs += [dict(max_new_tokens=10, repetition_penalty=100.0)]
    for kwargs in runs:
        ours = gpt.generate(ids, attention_mask=mask, **kwargs)
        theirs = hf.generate(
            ids, attention_mask=mask, **kwargs, min_new_tokens=kwargs["max_new_tokens"], do_sample=False,
            pad_token_id=PAD, eos_token_id=None,
        )  # fmt: skip
        assert torch.equal(ours, theirs), kwargs


def test_padding_that_cannot_be_continued_is_one_sentence():
    gpt = tiny_gpt()
    ids, mask = padded([torch.tensor([1, 2]), torch.tensor([3, 4, 5])], pad=10_000)  # past the vocabulary
    assert gpt.generate(ids, attention_mask=mask, max_new_tokens=2).shape == (2, 5)  # never embedded
    with pytest.raises(ValueError, match=r"^attention_mask marks the last token of prompt 0 as padding: pad"):
        gpt.generate(ids.flip(1), attention_mask=mask.flip(1), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"^attention_mask has shape \(2, 2\) and input_ids \(2, 3\): give"):
        gpt.generate(ids, attention_mask=mask[:, 1:], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"^input_ids hold token id 10000, outside the model's vocabulary"):
        gpt.generate(ids, max_new_tokens=2)  # unmasked, the padding is a token
    with pytest.raises(
        ValueError, match=r"^Prompt 0 is all padding \(attention_mask 0\): give each prompt a"
    ):
        gpt.generate(ids, attention_mask=mask * torch.tensor([[0], [1]]), max_new_tokens=2)
    out = gpt.generate(ids, attention_mask=mask, max_new_tokens=2)
    for given in (mask.tolist(), mask.numpy(), mask.bool(), mask.float()):  # as a tokenizer may give it
        assert torch.equal(gpt.generate(ids, attention_mask=given, max_new_tokens=2), out)
    with pytest.raises(ValueError, match=r"^An attention_mask on a StaticKVCache takes its position_ids"):
        gpt(ids.clamp(max=99), mask, kv_cache=gpt.new_kv_cache(2, 10, static=True))
