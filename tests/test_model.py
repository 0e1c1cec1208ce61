import math

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    OpenAIGPTConfig,
    OpenAIGPTLMHeadModel,
    OpenAIGPTModel,
)

from gpt_ft import GPT, GPTConfig
from gpt_ft.model.generation import _filter_logits, beam_search

TINY = dict(vocab_size=101, n_positions=64, n_embd=32, n_layer=2, n_head=4)
FAMILIES = {
    "openai-gpt": (OpenAIGPTConfig, OpenAIGPTLMHeadModel, OpenAIGPTModel),
    "gpt2": (GPT2Config, GPT2LMHeadModel, GPT2Model),
}


def tiny_hf(family: str, base: bool = False, **overrides):
    config_cls, lm_cls, base_cls = FAMILIES[family]
    torch.manual_seed(0)
    config = config_cls(**{**TINY, **overrides}, bos_token_id=0, eos_token_id=0)
    return (base_cls if base else lm_cls)(config).eval()


def tiny_gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_logits_equal_transformers(family, activation):
    key = "afn" if family == "openai-gpt" else "activation_function"
    hf = tiny_hf(family, **{key: activation})
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, TINY["vocab_size"], (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_with_right_padding(family):
    hf = tiny_hf(family)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, TINY["vocab_size"], (3, 30))
    lengths = [30, 17, 5]
    mask = torch.tensor([[1] * n + [0] * (30 - n) for n in lengths])
    with torch.no_grad():
        ours, theirs = gpt.lm_logits(gpt(ids, mask)), hf(ids, attention_mask=mask).logits
    for b, n in enumerate(lengths):
        torch.testing.assert_close(ours[b, :n], theirs[b, :n], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_base_model_hidden_states_equal_transformers(family):
    hf = tiny_hf(family, base=True)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(ids).last_hidden_state, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_to_hf_round_trips_every_tensor(family):
    hf = tiny_hf(family)
    back = GPT.from_hf(hf).to_hf()
    assert type(back) is type(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert torch.equal(theirs[key], ours[key]), key
    assert back.lm_head.weight.data_ptr() == back.transformer.get_input_embeddings().weight.data_ptr()


def test_to_hf_from_scratch_model_matches_logits():
    for pre_ln in (False, True):
        gpt = tiny_gpt(pre_ln=pre_ln)
        hf = gpt.to_hf().eval()
        ids = torch.randint(0, TINY["vocab_size"], (2, 33))
        with torch.no_grad():
            torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("safe", [True, False])
def test_from_pretrained_local_directory(tmp_path, family, safe):
    hf = tiny_hf(family)
    hf.save_pretrained(tmp_path, safe_serialization=safe)
    gpt = GPT.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        GPT.from_pretrained(tmp_path)
    tiny_hf("gpt2").config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        GPT.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("preset", "hf_config"),
    [("gpt1", OpenAIGPTConfig()), ("gpt2", GPT2Config())],
)
def test_presets_have_the_parameter_count_of_transformers(preset, hf_config):
    config = GPTConfig.from_name(preset)
    with torch.device("meta"):
        ours = GPT(config)
        theirs = (OpenAIGPTLMHeadModel if preset == "gpt1" else GPT2LMHeadModel)(hf_config)
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    assert ours.num_parameters() == {"gpt1": 116_534_784, "gpt2": 124_439_808}[preset]


def test_gpt1_preset_is_the_paper_model():
    c = GPTConfig.from_name("gpt1")
    assert (c.n_layer, c.n_embd, c.n_head, c.ffn_dim, c.n_positions, c.vocab_size) == (
        12,
        768,
        12,
        3072,
        512,
        40478,
    )
    assert (
        not c.pre_ln and c.activation == "gelu_tanh" and c.embd_pdrop == c.attn_pdrop == c.resid_pdrop == 0.1
    )
    gpt2 = GPTConfig.from_name("gpt2")
    assert gpt2.pre_ln and (gpt2.n_positions, gpt2.vocab_size) == (1024, 50257)
    assert GPT(GPTConfig.from_name("gpt-micro", vocab_size=50)).ln_f is None
    assert isinstance(
        GPT(GPTConfig.from_name("gpt-micro", vocab_size=50, pre_ln=True)).ln_f, torch.nn.LayerNorm
    )


def test_init_is_normal_0_02():
    gpt = GPT(GPTConfig(vocab_size=4000, n_positions=256, n_embd=128, n_layer=1, n_head=4))
    for p in (gpt.wte.weight, gpt.wpe.weight, gpt.h[0].attn.c_attn.weight, gpt.h[0].mlp.c_proj.weight):
        assert abs(p.mean().item()) < 2e-3
        assert p.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.all(gpt.h[0].attn.c_attn.bias == 0)
    assert torch.all(gpt.h[0].ln_1.weight == 1) and torch.all(gpt.h[0].ln_1.bias == 0)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_causality(pre_ln):
    gpt = tiny_gpt(pre_ln=pre_ln)
    ids = torch.randint(0, TINY["vocab_size"], (2, 40))
    changed = ids.clone()
    t = 17
    changed[:, t + 1 :] = torch.randint(0, TINY["vocab_size"], (2, 40 - t - 1))
    with torch.no_grad():
        a, b = gpt(ids), gpt(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_left_padding_gives_finite_states():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 10))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
    with torch.no_grad():
        assert torch.isfinite(gpt(ids, mask)).all()


def test_dropout_is_active_in_training_only():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 10))
    with torch.no_grad():
        assert torch.equal(gpt(ids), gpt(ids))
        gpt.train()
        assert not torch.equal(gpt(ids), gpt(ids))


def test_kv_cache_prefill_in_chunks_equals_full_forward():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 30))
    cache = gpt.new_kv_cache(2)
    with torch.no_grad():
        full = gpt(ids)
        chunks = [
            gpt(ids[:, :12], kv_cache=cache),
            gpt(ids[:, 12:13], kv_cache=cache),
            gpt(ids[:, 13:], kv_cache=cache),
        ]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_greedy_50_tokens_identical_with_and_without_cache(pre_ln):
    gpt = tiny_gpt(pre_ln=pre_ln)
    prompt = torch.randint(0, TINY["vocab_size"], (3, 7))
    cached = gpt.generate(prompt, max_new_tokens=50)
    uncached = gpt.generate(prompt, max_new_tokens=50, use_cache=False)
    assert cached.shape == (3, 57)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :7], prompt)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_and_beam_search_equal_transformers_generate(family):
    hf = tiny_hf(family)
    gpt = GPT.from_hf(hf).eval()
    prompt = torch.randint(1, TINY["vocab_size"], (1, 6))
    ours = gpt.generate(prompt, max_new_tokens=30)
    theirs = hf.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)
    ours = gpt.generate(prompt, max_new_tokens=12, num_beams=4, length_penalty=0.0)
    theirs = hf.generate(
        prompt,
        max_new_tokens=12,
        min_new_tokens=12,
        num_beams=4,
        length_penalty=0.0,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(ours, theirs)


def test_stop_token_ends_generation_and_pads():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5))
    free = gpt.generate(prompt, max_new_tokens=20)
    eos = int(free[0, 8])  # the 4th generated token of row 0 becomes the stop token
    out = gpt.generate(prompt, max_new_tokens=20, eos_token_id=eos)
    first = (free[0, 5:] == eos).nonzero()[0].item()
    assert torch.equal(out[0, : 5 + first + 1], free[0, : 5 + first + 1])
    assert torch.all(out[0, 5 + first :] == eos)
    for row in range(2):  # stopped rows are padded with eos; generation ends once all rows stopped
        hit = (out[row, 5:] == eos).nonzero()
        if len(hit):
            assert torch.all(out[row, 5 + hit[0].item() :] == eos)
    assert out.shape[1] <= 25


def test_beam_search_with_one_beam_equals_greedy():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 4))
    greedy = gpt.generate(prompt, max_new_tokens=25)
    assert torch.equal(beam_search(gpt, prompt, num_beams=1, max_new_tokens=25), greedy)
    eos = int(greedy[0, 10])
    assert torch.equal(
        beam_search(gpt, prompt[:1], num_beams=1, max_new_tokens=25, eos_token_id=eos, length_penalty=0.0),
        gpt.generate(prompt[:1], max_new_tokens=25, eos_token_id=eos),
    )


def lookahead_model() -> GPT:
    """A 0-layer GPT whose next-token distribution is set by hand.

    With no blocks, logits = (wte[x] + wpe[pos]) @ wte.T. From the prompt [0]: p(A=1) = 0.6,
    p(B=2) = 0.4. After A (a tiny embedding) the next token is ~uniform; after B it is B again
    with p ~ 1. Greedy takes A (joint probability 0.6 * 0.25); beam search finds B, B (~0.4).
    """
    gpt = GPT(
        GPTConfig(
            vocab_size=4, n_positions=4, n_embd=4, n_layer=0, n_head=1, embd_pdrop=0.0, vocab_multiple=1
        )
    ).eval()
    scale = torch.tensor([1.0, 0.1, 3.0, 1.0])
    wanted = torch.tensor([-20.0, math.log(0.6), math.log(0.4), -20.0])  # logits at position 0 from token 0
    with torch.no_grad():
        gpt.wte.weight.copy_(torch.diag(scale))
        gpt.wpe.weight.zero_()
        # (wte[0] + wpe[0]) @ diag(scale) = wanted  =>  wpe[0] = wanted / scale - wte[0]
        gpt.wpe.weight[0] = wanted / scale - gpt.wte.weight[0]
    return gpt


def test_beam_search_finds_a_sequence_greedy_misses():
    gpt = lookahead_model()
    prompt = torch.tensor([[0]])
    probs = gpt.lm_logits(gpt(prompt))[0, -1].softmax(-1)
    torch.testing.assert_close(probs[1:3], torch.tensor([0.6, 0.4]), rtol=0, atol=1e-6)
    greedy = gpt.generate(prompt, max_new_tokens=2)
    beam = gpt.generate(prompt, max_new_tokens=2, num_beams=2)
    assert greedy[0, 1].item() == 1
    assert beam[0, 1:].tolist() == [2, 2]

    def joint(seq):
        logp = gpt.lm_logits(gpt(seq[:, :-1]))[0].log_softmax(-1)
        return logp[torch.arange(seq.shape[1] - 1), seq[0, 1:]].sum().item()

    assert joint(beam) > joint(greedy) + 0.5


def test_sampling_filters():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    kept = lambda out: torch.isfinite(out[0]).tolist()  # noqa: E731
    assert kept(_filter_logits(logits, 1.0, 2, None)) == [True, True, False, False]
    assert kept(_filter_logits(logits, 1.0, None, 0.5)) == [True, False, False, False]
    assert kept(_filter_logits(logits, 1.0, None, 0.7)) == [True, True, False, False]
    assert kept(_filter_logits(logits, 1.0, None, 0.81)) == [True, True, True, False]
    # temperature: q ∝ p^(1/T)
    q = _filter_logits(logits, 0.5, None, None).softmax(-1)
    p2 = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 2
    torch.testing.assert_close(q[0], p2 / p2.sum())


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 4))
    greedy = gpt.generate(prompt, max_new_tokens=15)
    assert torch.equal(gpt.generate(prompt, max_new_tokens=15, do_sample=True, top_k=1), greedy)
    a = gpt.generate(prompt, max_new_tokens=15, do_sample=True, generator=torch.Generator().manual_seed(1))
    b = gpt.generate(prompt, max_new_tokens=15, do_sample=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert not torch.equal(a, greedy)


def test_stream_yields_the_generated_tokens():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (1, 4))
    streamed = torch.stack(list(gpt.stream(prompt, max_new_tokens=10)), dim=1)
    assert torch.equal(streamed, gpt.generate(prompt, max_new_tokens=10)[:, 4:])


def test_resize_token_embeddings_keeps_rows_and_inits_new_ones():
    gpt = GPT(GPTConfig(vocab_size=10, n_positions=8, n_embd=512, n_layer=1, n_head=8))
    old = gpt.wte.weight.detach().clone()
    gpt.resize_token_embeddings(13)  # the new rows come out of the padding: the table keeps its 64 rows
    assert gpt.wte.weight.shape == (64, 512) and gpt.config.vocab_size == 13
    assert torch.equal(gpt.wte.weight[:10], old[:10])
    assert gpt.wte.weight[10:13].std().item() == pytest.approx(0.02, rel=0.1)
    assert not gpt.wte.weight[13:].any()
    assert gpt.lm_logits(gpt(torch.tensor([[12]]))).shape == (1, 1, 13)
    assert gpt.wte.weight.requires_grad
    kept = gpt.wte.weight.detach().clone()
    gpt.resize_token_embeddings(70)  # past the padding: the table grows to the next multiple of 64
    assert gpt.wte.weight.shape == (128, 512) and torch.equal(gpt.wte.weight[:13], kept[:13])
    with pytest.raises(ValueError, match="can only grow"):
        gpt.resize_token_embeddings(5)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="Unknown GPT preset 'gpt3'.*gpt1, gpt2"):
        GPTConfig.from_name("gpt3")
    with pytest.raises(ValueError, match="n_embd=100 is not divisible by n_head=3"):
        GPTConfig(n_embd=100, n_head=3)
    with pytest.raises(ValueError, match=r"Unknown GPTConfig field\(s\) \['n_embed'\]"):
        GPTConfig.from_name("gpt1", n_embed=10)
    with pytest.raises(ValueError, match="activation='swiglu' is not supported"):
        GPTConfig(activation="swiglu")
    gpt = tiny_gpt()
    with pytest.raises(ValueError, match="Input of 65 tokens is longer than the model's context of 64"):
        gpt(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        gpt.generate(torch.zeros(1, 60, dtype=torch.long), max_new_tokens=5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        gpt.generate(torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, do_sample=True, temperature=0)
    bert = BertModel(
        BertConfig(
            vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
        )
    )
    with pytest.raises(ValueError, match="type 'bert'.*allowed: 'openai-gpt'.*'gpt2'"):
        GPT.from_hf(bert)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        GPT.from_hf(tiny_hf("gpt2", scale_attn_by_inverse_layer_idx=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_with_stop_token_and_length_penalty_equals_transformers(family):
    hf = tiny_hf(family, vocab_size=8)  # a small vocabulary, so hypotheses do end in eos (id 0)
    gpt = GPT.from_hf(hf).eval()
    ended = 0
    for seed in range(6):
        torch.manual_seed(seed)
        prompt = torch.randint(1, 8, (1, 4))
        for length_penalty in (1.0, 0.5, 0.0):
            ours = gpt.generate(
                prompt, max_new_tokens=15, num_beams=3, length_penalty=length_penalty, eos_token_id=0
            )
            theirs = hf.generate(
                prompt,
                max_new_tokens=15,
                num_beams=3,
                length_penalty=length_penalty,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=0,
            )
            assert torch.equal(ours, theirs), (seed, length_penalty)
            ended += int((ours[0, 4:] == 0).any())
    assert ended >= 3


@pytest.mark.parametrize("padded", [False, True])
def test_blocked_attention_equals_sdpa(padded):
    from gpt_ft.model.gpt import blocked_causal_attention

    q, k, v = (torch.randn(2, 3, 300, 8) for _ in range(3))  # 300: the last block is partial
    mask = None
    if padded:
        keys = torch.ones(2, 300, dtype=torch.bool)
        keys[1, 200:] = False
        pos = torch.arange(300)
        mask = ((pos[None, :] <= pos[:, None]) & keys[:, None, None, :]) | (pos[None, :] == pos[:, None])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    expected = sdpa(q, k, v, attn_mask=mask, is_causal=mask is None)
    got = blocked_causal_attention(q, k, v, mask, dropout_p=0.0, block=128)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_blocked_attention_dropout_is_unbiased():
    from gpt_ft.model.gpt import blocked_causal_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 20, 4) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    samples = torch.stack([blocked_causal_attention(q, k, v, None, 0.3, block=8) for _ in range(4000)])
    assert not torch.allclose(samples[0], expected, atol=1e-3)  # dropout does change each sample
    torch.testing.assert_close(samples.mean(0), expected, rtol=0, atol=0.06)


def test_padded_embedding_rows_are_never_predicted_counted_or_exported():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=100, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    gpt = GPT(config).eval()
    assert config.padded_vocab_size == 128 and gpt.wte.weight.shape == (128, 32)
    unpadded = GPT(GPTConfig(**{**vars(config), "vocab_multiple": 1})).eval()
    assert unpadded.wte.weight.shape == (100, 32)
    assert gpt.num_parameters() == unpadded.num_parameters()  # padding rows are not parameters of the model
    ids = torch.randint(0, 100, (2, 8))
    logits = gpt.lm_logits(gpt(ids))
    assert logits.shape == (2, 8, 100)  # no logit for a padding id, so none is sampled or in the loss
    # Weights without padding (transformers', older checkpoints) load into the padded table, and back.
    unpadded.load_state_dict(gpt.state_dict())
    torch.testing.assert_close(unpadded.lm_logits(unpadded(ids)), logits)
    gpt.load_state_dict(unpadded.state_dict())
    torch.testing.assert_close(gpt.lm_logits(gpt(ids)), logits)
    hf = gpt.to_hf()
    assert hf.transformer.tokens_embed.weight.shape == (100, 32)
    torch.testing.assert_close(hf(ids).logits, logits)
