"""Phi-3.5's and Phi-4-mini's rotary positions against transformers' Phi3ForCausalLM: LongRoPE (a
divisor per rotating pair, the short list within the original context, the long list past it, cos
and sin scaled by its attention factor) and rotary positions on the first features of each head
(Phi-4-mini's `partial_rotary_factor` 0.75)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gpt_ft import GPT, GPTConfig
from tests.helpers import TINY_LLAMA, tiny_llama

# The Llama family's parity checks, run here on this file's `pair`: fp32 logits of 40 tokens (past
# the original context of 16: the long factors) within 1e-5, every tensor back from `to_hf`, and
# greedy generation from 7 tokens to 19 (crossing the original context) token for token.
from tests.weights.test_hf_llama import (  # noqa: F401
    PADDED_LENGTHS,
    padded_rows,
    test_greedy_generation_equals_transformers,
    test_logits_equal_transformers,
    test_to_hf_round_trips_every_tensor,
)

VOCAB = TINY_LLAMA["vocab_size"]
CONTEXT = 16  # the original context of the tiny models (their n_positions: 64, a factor of 4)


def longrope(pairs: int = 4, **more) -> dict:
    """A LongRoPE scaling over `pairs` rotating pairs, each factor its own (a head of 8 turns 4 pairs)."""
    short = [1.0, 1.5, 2.5, 4.0][:pairs]
    long = [1.0, 6.0, 20.0, 64.0][:pairs]
    return dict(rope_type="longrope", rope_theta=1e4, short_factor=short, long_factor=long,
                **{"original_max_position_embeddings": CONTEXT, **more})  # fmt: skip


# Phi3Config's own `original_max_position_embeddings` wins over the one in its rope parameters.
LONG = dict(original_max_position_embeddings=CONTEXT)
UNSCALED_HALF = dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)
VARIANTS = {
    "phi3.5-longrope": dict(LONG, rope_parameters=longrope()),
    # Phi-4-mini: three quarters of each head turn (6 of 8: 3 pairs), a tied head
    "phi4-mini-partial-longrope-tied": dict(
        LONG, rope_parameters=longrope(3, partial_rotary_factor=0.75), tie_word_embeddings=True
    ),
    "half-rotary-unscaled": dict(rope_parameters=UNSCALED_HALF),
    "longrope-factor-and-attention-factor-given": dict(
        LONG, rope_parameters=longrope(factor=8.0, attention_factor=1.1)
    ),
    "longrope-window": dict(LONG, sliding_window=8, rope_parameters=longrope()),
}  # fmt: skip


@pytest.fixture(params=list(VARIANTS))
def pair(request):
    hf = tiny_llama("phi3", **VARIANTS[request.param])
    return hf, GPT.from_hf(hf).eval()


@pytest.mark.parametrize("side", ["left", "right"])
def test_each_padded_row_takes_its_own_factors(pair, side):
    """Rows of 30, 17 and 5 real tokens, the original context 16. Right-padded, each row's logits are
    transformers' for that row alone: the 5-token row keeps the short factors, where transformers'
    padded batch gives every row the longest's. Left-padded, the positions count the padding (as
    transformers' forward counts them), so each row reaches position 29: the padded batch's logits."""
    hf, gpt = pair
    ids, mask = padded_rows(side)
    with torch.no_grad():
        ours = gpt.lm_logits(gpt(ids, mask))
        if side == "left":
            theirs = hf(ids, attention_mask=mask).logits
        else:
            theirs = torch.stack(
                [
                    F.pad(hf(ids[r : r + 1, :n]).logits[0], (0, 0, 0, 30 - n))
                    for r, n in enumerate(PADDED_LENGTHS)
                ]
            )
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-5)


def test_generation_past_the_original_context_equals_transformers():
    """Decoding from 10 tokens to 24: where a text passes the original context, its cached keys are
    computed again with the long factors, as transformers' Phi-3 does. Greedy (cached, static cache,
    no cache) and beam search give transformers' tokens for 4 prompts; before, the cached keys kept
    the short factors' rotation and some prompts' tokens differed (seed 7's at its 13th token)."""
    hf = tiny_llama("phi3", **VARIANTS["phi3.5-longrope"])
    gpt = GPT.from_hf(hf).eval()
    for seed in (0, 3, 7, 11):
        ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(seed))
        for beams in (1, 3):
            theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=14, do_sample=False,
                                 num_beams=beams, pad_token_id=0, eos_token_id=None)  # fmt: skip
            kinds = [dict()] if beams > 1 else [dict(), dict(static_cache=True), dict(use_cache=False)]
            for kind in kinds:
                ours = gpt.generate(ids, max_new_tokens=14, num_beams=beams, **kind)
                assert torch.equal(ours, theirs), (seed, beams, kind)


def test_a_batch_decodes_each_prompt_as_alone(monkeypatch):
    """Prompts of 5, 12 and 15 tokens padded on the left, decoded to 20 more: each row's logits at
    every step are those of its prompt decoded alone (each passes the original context at a step of
    its own), cached, static-cached, and its tokens under beam search."""
    gpt = GPT.from_hf(tiny_llama("phi3", **VARIANTS["phi4-mini-partial-longrope-tied"])).eval()
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 12, 15)]
    ids = torch.stack([F.pad(p, (15 - len(p), 0)) for p in prompts])
    mask = torch.stack([F.pad(torch.ones_like(p), (15 - len(p), 0)) for p in prompts])
    steps, head = [], gpt.lm_logits
    monkeypatch.setattr(gpt, "lm_logits", lambda hidden: steps.append(head(hidden)) or steps[-1])
    for kind in (dict(), dict(static_cache=True)):
        steps.clear()
        together = gpt.generate(ids, attention_mask=mask, max_new_tokens=20, **kind)[:, 15:]
        batched = torch.stack(steps)  # (20, 3, V)
        for row, prompt in enumerate(prompts):
            steps.clear()
            assert torch.equal(
                together[row], gpt.generate(prompt[None], max_new_tokens=20, **kind)[0, len(prompt) :]
            )
            torch.testing.assert_close(batched[:, row], torch.stack(steps)[:, 0], rtol=0, atol=1e-5)
    together = gpt.generate(ids, attention_mask=mask, max_new_tokens=20, num_beams=2)[:, 15:]
    for row, prompt in enumerate(prompts):
        assert torch.equal(
            together[row], gpt.generate(prompt[None], max_new_tokens=20, num_beams=2)[0, len(prompt) :]
        )


def test_a_continuations_score_does_not_depend_on_its_batch():
    """Zero-shot scores of a 9-token and a 25-token request (original context 16), run one at a time
    and packed together: the same. Before, the longer one turned the shorter to the long factors."""
    from gpt_ft.eval.likelihood import continuation_logprobs

    gpt = GPT.from_hf(tiny_llama("phi3", **VARIANTS["phi4-mini-partial-longrope-tied"])).eval()
    requests = [([5, 6, 7, 8, 9, 10], [11, 12, 13]), (list(range(40, 62)), [81, 82, 83])]
    alone = continuation_logprobs(gpt, requests, batch_size=1)
    assert continuation_logprobs(gpt, requests, batch_size=16) == pytest.approx(alone, abs=1e-5, rel=0)


def test_pretraining_blocks_take_the_factors_of_their_length():
    """Pretraining's blocks (no padding, no mask) of 32 tokens, past the original context: their summed
    LM loss is the one of the model's own logits (the long factors)."""
    from gpt_ft.data.batches import collate_blocks
    from gpt_ft.training.terms import batch_terms

    gpt = GPT.from_hf(tiny_llama("phi3", **VARIANTS["phi3.5-longrope"])).eval()
    blocks = [torch.randint(0, VOCAB, (33,), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    batch = collate_blocks(list(enumerate(blocks)))
    with torch.no_grad():
        terms = batch_terms(gpt, None, batch, lm=True)
        ids, targets = batch.input_ids.flatten(0, 1), batch.lm_targets.flatten(0, 1)  # (2, 32): a block a row
        logits = gpt.lm_logits(gpt(ids))
    expected = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(1)
    torch.testing.assert_close(terms["lm_sum"], expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("tail", ["zeros", "counting"])
def test_a_packed_rows_tail_counts_for_no_sequence(tail):
    """A row of a 5-token and a 4-token sequence and a tail of 21 (documents -1): the first sequence's
    states are its own alone, whatever positions the tail holds (counting 0 to 20, they made it long)."""
    gpt = GPT.from_hf(tiny_llama("phi3", **VARIANTS["phi3.5-longrope"])).eval()
    a, b = torch.randint(0, VOCAB, (5,)), torch.randint(0, VOCAB, (4,))
    ids = torch.zeros(1, 30, dtype=torch.long)
    ids[0, :5], ids[0, 5:9] = a, b
    documents = torch.full((1, 30), -1)
    documents[0, :5], documents[0, 5:9] = 0, 1
    positions = torch.zeros(1, 30, dtype=torch.long)
    positions[0, :5], positions[0, 5:9] = torch.arange(5), torch.arange(4)
    positions[0, 9:] = torch.arange(21) if tail == "counting" else 0
    with torch.no_grad():
        packed = gpt(ids, position_ids=positions, documents=documents)[0, :5]
        torch.testing.assert_close(packed, gpt(a[None])[0], rtol=0, atol=1e-5)


def test_the_configs_rotary_settings_are_read():
    hf = tiny_llama("phi3", **VARIANTS["phi4-mini-partial-longrope-tied"])
    c = GPT.from_hf(hf).config
    assert (c.rotary_dim, c.rotary_dims, c.rope_type, c.hf_model_type) == (6, 6, "longrope", "phi3")
    assert c.rope_scaling["short_factor"] == [1.0, 1.5, 2.5] and c.rope_scaling["long_factor"] == [
        1.0,
        6.0,
        20.0,
    ]
    assert c.rope_scaling["original_max_position_embeddings"] == CONTEXT


@pytest.mark.parametrize("length", [CONTEXT, CONTEXT + 1])
def test_the_short_factors_hold_within_the_original_context_and_the_long_ones_past_it(length):
    """At 16 tokens (the original context) the logits are transformers' and do not depend on the long
    factors; at 17 they are transformers' and do; the frequencies unscaled give others at both."""
    hf = tiny_llama("phi3", **VARIANTS["phi3.5-longrope"])
    gpt = GPT.from_hf(hf).eval()
    scaling = gpt.config.rope_scaling
    models = {
        "long as short": dict(rope_scaling=dict(scaling, long_factor=scaling["short_factor"])),
        "unscaled": dict(rope_scaling=None),
    }
    ids = torch.randint(0, VOCAB, (2, length))
    with torch.no_grad():
        ours, theirs = gpt.lm_logits(gpt(ids)), hf(ids).logits
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
        gaps = {}
        for name, changed in models.items():
            other = GPT(dataclasses.replace(gpt.config, **changed)).eval()
            other.load_state_dict(gpt.state_dict())
            gaps[name] = (other.lm_logits(other(ids)) - theirs).abs().max().item()
    assert gaps["unscaled"] > 1e-3  # 100 times the tolerance
    if length == CONTEXT:
        assert gaps["long as short"] == 0.0
    else:
        assert gaps["long as short"] > 1e-3


def test_a_kv_cache_switches_to_the_long_factors_where_transformers_does():
    """Token by token past the original context: each step's logits are transformers' for the same
    steps over its own cache (whose earlier keys keep the short factors' rotation, as ours do)."""
    hf = tiny_llama("phi3", **VARIANTS["phi4-mini-partial-longrope-tied"])
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, VOCAB, (1, 24))
    from transformers import DynamicCache

    cache, theirs_cache = gpt.new_kv_cache(batch_size=1), DynamicCache(config=hf.config)
    with torch.no_grad():
        ours = [gpt.lm_logits(gpt(ids[:, :12], kv_cache=cache))]
        theirs = [hf(ids[:, :12], None, None, theirs_cache, use_cache=True).logits]  # (its 4th: the cache)
        for t in range(12, 24):
            ours.append(gpt.lm_logits(gpt(ids[:, t : t + 1], kv_cache=cache)))
            theirs.append(hf(ids[:, t : t + 1], None, None, theirs_cache, use_cache=True).logits)
        torch.testing.assert_close(torch.cat(ours, dim=1), torch.cat(theirs, dim=1), rtol=0, atol=1e-5)


def test_a_folder_round_trips_its_config(tmp_path):
    """Phi-4-mini's config.json, read and written back: the same transformers config (LongRoPE's
    lists and its original context, the rotating share of each head)."""
    hf = tiny_llama("phi3", **VARIANTS["phi4-mini-partial-longrope-tied"])
    hf.save_pretrained(tmp_path)
    gpt = GPT.from_pretrained(tmp_path).eval()
    theirs, ours = hf.config.to_dict(), gpt.to_hf().config.to_dict()
    shape = set(theirs) - {"architectures", "dtype", "transformers_version"}
    assert {k: ours.get(k) for k in shape} == {k: theirs[k] for k in shape}
    assert ours["rope_parameters"]["partial_rotary_factor"] == 0.75


PAIRS = r"must be 4 positive numbers \(rotary pairs\), got"


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        (dict(longrope(), short_factor=[1.0, 2.0]), rf"short_factor {PAIRS} \[1.0, 2.0\]\.$"),
        (dict(longrope(), long_factor=[1.0, 2.0, 0.0, 4.0]), rf"long_factor {PAIRS} \[1.0, 2.0, 0.0, 4\.0\]"),
        (dict(longrope(), long_factor=2.0), rf"long_factor {PAIRS} 2.0\.$"),
        (dict(longrope(), factor=-1.0), r"factor must be a positive number, got -1.0\.$"),
        ({k: v for k, v in longrope().items() if k != "long_factor"}, "of type 'longrope' needs long_fact"),
        (longrope(original_max_position_embeddings=1), r"original_max_position_embeddings must be a whole"),
        (longrope(original_max_position_embeddings=16.5), r"original_max_position_embeddings must.*got 16.5"),
    ],
)  # fmt: skip
def test_longrope_errors_name_the_field(scaling, message):
    with pytest.raises(ValueError, match=r"^GPTConfig.rope_scaling " + message):
        GPTConfig.from_name("llama-micro", vocab_size=VOCAB, rotary_dim=8, rope_scaling=scaling)  # 4 pairs


def test_numpy_numbers_and_tuples_export_as_transformers_configs_hold_them():
    """Factors as a tuple of NumPy floats and the original context as a NumPy integer: read, and
    written as transformers' strict config fields take them (lists of floats, an int)."""
    import numpy as np

    scaling = dict(longrope(), short_factor=tuple(np.float32(f) for f in longrope()["short_factor"]),
                   original_max_position_embeddings=np.int64(CONTEXT))  # fmt: skip
    gpt = GPT(GPTConfig.from_name("llama-micro", vocab_size=VOCAB, rotary_dim=8, rope_scaling=scaling)).eval()
    hf = gpt.to_hf()
    rope = hf.config.rope_parameters
    assert (
        rope["short_factor"] == [1.0, 1.5, 2.5, 4.0] and type(rope["original_max_position_embeddings"]) is int
    )
    ids = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_other_families_refuse_what_phi3_alone_holds():
    """transformers' Llama rotates the whole head and Phi-3 scales by LongRoPE alone: exporting either
    elsewhere is one sentence, not a model computing otherwise."""
    partial = GPTConfig.from_name(
        "llama-micro", vocab_size=VOCAB, rotary_dim=4, hf_model_type="qwen2", qkv_bias=True
    )
    with pytest.raises(
        ValueError, match=r"^transformers' qwen2 models need .*; this model has \{'rotary_dim': 4\}"
    ):
        GPT(partial).to_hf()
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=CONTEXT)
    config = GPTConfig.from_name("llama-micro", vocab_size=VOCAB, rotary_dim=4, rope_scaling=yarn)
    with pytest.raises(
        ValueError, match=r"^transformers' Phi-3 scales its rotary positions by LongRoPE alone; "
    ):
        GPT(config).to_hf()
