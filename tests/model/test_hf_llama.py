"""Llama-family blocks against transformers: LlamaForCausalLM (grouped-query attention, Llama 3
rotary scaling, biases), Qwen2ForCausalLM (q/k/v biases) and MistralForCausalLM."""

import pytest
import torch

from gpt_ft import GPT, GPTConfig
from tests.helpers import LLAMA_FAMILIES, TINY_LLAMA, tiny_llama

VOCAB = TINY_LLAMA["vocab_size"]
LLAMA3 = dict(
    rope_theta=500000.0,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16),
)  # fmt: skip
VARIANTS = {
    **{family: (family, {}) for family in LLAMA_FAMILIES},
    "llama-tied-biases-llama3": (
        "llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True, **LLAMA3)
    ),
    "llama-linear-rope": ("llama", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1e6)),
}  # fmt: skip


@pytest.fixture(params=list(VARIANTS))
def pair(request):
    family, overrides = VARIANTS[request.param]
    hf = tiny_llama(family, **overrides)
    return hf, GPT.from_hf(hf).eval()


def test_logits_equal_transformers(pair):
    hf, gpt = pair
    ids = torch.randint(0, VOCAB, (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_equal_transformers_with_padding(pair, side):
    hf, gpt = pair
    ids = torch.randint(0, VOCAB, (3, 30))
    lengths = [30, 17, 5]
    rows = [[1] * n + [0] * (30 - n) for n in lengths]
    mask = torch.tensor([row[::-1] if side == "left" else row for row in rows])
    with torch.no_grad():
        ours, theirs = gpt.lm_logits(gpt(ids, mask)), hf(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_base_model_hidden_states_equal_transformers(family):
    hf = tiny_llama(family, base=True)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, VOCAB, (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(ids).last_hidden_state, rtol=0, atol=1e-5)


def test_to_hf_round_trips_every_tensor(pair):
    hf, gpt = pair
    back = gpt.to_hf()
    assert type(back) is type(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert torch.equal(theirs[key], ours[key]), key
    tied = back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    assert tied == hf.config.tie_word_embeddings


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_from_pretrained_directory_equals_transformers(family, tmp_path):
    hf = tiny_llama(family)
    hf.save_pretrained(tmp_path)
    gpt = GPT.from_pretrained(tmp_path).eval()
    assert gpt.config.hf_model_type == family and gpt.config.n_kv_head == 2
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_greedy_generation_equals_transformers(pair):
    hf, gpt = pair
    ids = torch.randint(0, VOCAB, (2, 7))
    theirs = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(gpt.generate(ids, max_new_tokens=12), theirs)


def test_kv_cache_holds_the_key_value_heads_only():
    gpt = GPT.from_hf(tiny_llama("llama"))
    cache = gpt.new_kv_cache(batch_size=3, max_len=10)
    assert cache.k.shape == (2, 3, 2, 10, 8)  # layers, batch, 2 key/value heads (of 4), positions, head size


def test_mistral_sliding_window_becomes_the_context():
    gpt = GPT.from_hf(tiny_llama("mistral", sliding_window=16))
    assert gpt.config.n_positions == 16
    with pytest.raises(ValueError, match="longer than the model's context of 16"):
        gpt(torch.zeros(1, 17, dtype=torch.long))


def test_a_model_from_scratch_exports_to_the_family_its_shape_says():
    cases = [(None, None, "LlamaForCausalLM"), (None, True, "Qwen2ForCausalLM"),
             ("mistral", None, "MistralForCausalLM")]  # fmt: skip
    for hf_model_type, qkv_bias, expected in cases:
        config = GPTConfig.from_name("llama-mini", vocab_size=VOCAB, n_layer=1, qkv_bias=qkv_bias,
                                     hf_model_type=hf_model_type)  # fmt: skip
        gpt = GPT(config).eval()
        hf = gpt.to_hf()
        assert type(hf).__name__ == expected
        ids = torch.randint(0, VOCAB, (2, 20))
        with torch.no_grad():
            torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b"])
def test_presets_count_the_parameters_transformers_does(preset):
    from gpt_ft.model.hf import config_to_hf
    from gpt_ft.model.hf_llama import causal_lm_class

    config = GPTConfig.from_name(preset)
    with torch.device("meta"):
        ours = GPT(config).num_parameters()
        hf_config = config_to_hf(config)
        theirs = causal_lm_class(hf_config.model_type)(hf_config).num_parameters()
    assert ours == theirs
    expected = {"smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768, "llama-3.2-1b": 1_235_814_400}
    assert ours == expected[preset]
    assert GPTConfig.from_name(preset).rope_scaling == config.rope_scaling  # exporting changed no preset
    if preset == "llama-3.2-1b":
        assert "rope_theta" not in config.rope_scaling


@pytest.mark.parametrize("vocab", [VOCAB, 128], ids=["into-padding", "past-the-padding"])
def test_untied_head_grows_with_the_vocabulary(vocab):
    gpt = GPT.from_hf(tiny_llama("llama", vocab_size=vocab)).eval()
    ids = torch.randint(0, vocab, (1, 9))
    with torch.no_grad():
        before = gpt.lm_logits(gpt(ids))
        gpt.resize_token_embeddings(vocab + 3)  # 128 + 3: the padded table grows to 192 rows
        after = gpt.lm_logits(gpt(ids))
    assert after.shape[-1] == vocab + 3 and gpt.lm_head.weight.shape == (gpt.config.padded_vocab_size, 32)
    assert gpt.wte.weight.shape == gpt.lm_head.weight.shape
    torch.testing.assert_close(after[..., :vocab], before, rtol=0, atol=0)
    assert gpt.lm_head.weight[vocab : vocab + 3].abs().sum() > 0  # new rows drawn, not zeros


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(n_kv_head=3), "n_kv_head=3 must divide n_head=4"),
        (
            dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}),
            "rope_scaling type 'yarn' is not supported",
        ),
        (dict(n_embd=20, n_head=4, n_kv_head=None), "Rotary positions need an even head size"),
        (dict(norm="batchnorm"), "GPTConfig.norm='batchnorm' is not supported"),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig.from_name("llama-mini", **overrides)


def test_unsupported_transformers_configs_are_one_sentence():
    from transformers import LlamaConfig

    from gpt_ft.model.hf import config_from_hf

    with pytest.raises(ValueError, match="only head_dim = hidden_size / num_attention_heads"):
        config_from_hf(LlamaConfig(**{**TINY_LLAMA, "head_dim": 16}))
    with pytest.raises(ValueError, match="attention_bias=True and mlp_bias=False"):
        config_from_hf(LlamaConfig(**TINY_LLAMA, attention_bias=True))
    with pytest.raises(ValueError, match="fold them in with gpt_ft.model.lora.merge_lora"):
        from gpt_ft.model.lora import LoRA, add_lora

        add_lora(GPT.from_hf(tiny_llama("llama")), LoRA(), new_tokens_from=VOCAB).to_hf()
    with pytest.raises(ValueError, match="GPT-1 and GPT-2 have biases"):
        GPT(GPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, bias=False)).to_hf()
