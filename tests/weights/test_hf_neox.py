"""GPT-NeoX blocks against transformers' GPTNeoXForCausalLM (Pythia): LayerNorm and biases, rotary
positions on the first features of each head (`rotary_dim`), attention and MLP side by side
(`parallel_residual`) or in turn, the fused query_key_value laid out head by head, an untied head."""

import dataclasses
import json
import re

import pytest
import torch

from gpt_ft import GPT, GPTConfig
from tests.helpers import NEOX_MICRO, NEOX_ROPE, TINY_NEOX, tiny_neox

# The Llama family's parity checks, run here on this file's `pair` (fp32 logits with and without
# padding within 1e-5, every tensor back from `to_hf`, token-identical greedy generation).
from tests.weights.test_hf_llama import (  # noqa: F401
    test_greedy_generation_equals_transformers,
    test_logits_equal_transformers,
    test_logits_equal_transformers_with_padding,
    test_to_hf_round_trips_every_tensor,
)

VOCAB = TINY_NEOX["vocab_size"]
VARIANTS = {
    "pythia": {},  # side by side, half of each head turning
    "sequential": dict(use_parallel_residual=False),
    "quarter-rotary": dict(rope_parameters=dict(NEOX_ROPE, partial_rotary_factor=0.25)),  # Pythia's share
    "whole-head-rotary": dict(rope_parameters=dict(NEOX_ROPE, partial_rotary_factor=1.0)),
    "linear-rope-base-500": dict(
        rope_parameters=dict(NEOX_ROPE, rope_type="linear", factor=2.0, rope_theta=500.0)
    ),
    "tied": dict(tie_word_embeddings=True),
    "gelu-fast-20b": dict(hidden_act="gelu_fast"),  # GPT-NeoX-20B's activation
}  # fmt: skip


@pytest.fixture(params=list(VARIANTS))
def pair(request):
    hf = tiny_neox(**VARIANTS[request.param])
    return hf, GPT.from_hf(hf).eval()


def test_the_configs_switches_are_read():
    """Pythia's config becomes `rotary_dim` (half of 8: 4) and `parallel_residual`, and each matters:
    the same weights with either switched give logits 100 times the tolerance away from theirs."""
    hf = tiny_neox()
    gpt = GPT.from_hf(hf).eval()
    c = gpt.config
    assert (c.rotary_dim, c.parallel_residual, c.norm, c.bias, c.tie_embeddings) == (
        4,
        True,
        "layernorm",
        True,
        False,
    )
    assert c.hf_model_type == "gpt_neox" and c.activation == "gelu" and c.hf_token_ids is None
    ids = torch.randint(0, VOCAB, (2, 30))
    with torch.no_grad():
        theirs = hf(ids).logits
        for changed in (dict(rotary_dim=None), dict(parallel_residual=False)):
            other = GPT(dataclasses.replace(c, **changed)).eval()
            other.load_state_dict(gpt.state_dict())
            assert (other.lm_logits(other(ids)) - theirs).abs().max() > 1e-3, changed


def test_base_model_hidden_states_equal_transformers():
    hf = tiny_neox(base=True)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, VOCAB, (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(ids).last_hidden_state, rtol=0, atol=1e-5)


def test_from_pretrained_directory_equals_transformers(tmp_path):
    """A saved folder names the head `embed_out` (as Pythia's do); its config comes back whole."""
    from safetensors import safe_open

    hf = tiny_neox()
    hf.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "embed_out.weight" in f.keys() and "lm_head.weight" not in f.keys()
    gpt = GPT.from_pretrained(tmp_path).eval()
    assert gpt.config.hf_model_type == "gpt_neox" and gpt.config.rotary_dim == 4
    theirs, ours = hf.config.to_dict(), gpt.to_hf().config.to_dict()
    shape = set(theirs) - {"architectures", "dtype", "transformers_version"}
    assert {k: ours.get(k) for k in shape} == {k: theirs[k] for k in shape}
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_an_older_folders_attention_buffers_are_left_unread(tmp_path):
    """Pythia's first folders hold each layer's causal mask (`attention.bias`, `attention.masked_bias`)
    and rotary frequencies, which transformers ignores: so does gpt_ft."""
    from safetensors.torch import load_file, save_file

    hf = tiny_neox()
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    for i in range(2):
        state[f"gpt_neox.layers.{i}.attention.bias"] = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
        state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
        state[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(2)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    gpt = GPT.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_the_kv_cache_gives_transformers_logits_token_by_token():
    hf = tiny_neox()
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, VOCAB, (2, 20))
    cache = gpt.new_kv_cache(batch_size=2)
    assert cache.k.shape == (2, 2, 4, 64, 8)  # layers, batch, heads, positions, head size
    with torch.no_grad():
        steps = [gpt.lm_logits(gpt(ids[:, :5], kv_cache=cache))]
        steps += [gpt.lm_logits(gpt(ids[:, t : t + 1], kv_cache=cache)) for t in range(5, 20)]
        torch.testing.assert_close(torch.cat(steps, dim=1), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [NEOX_MICRO, dict(NEOX_MICRO, hf_model_type=None, parallel_residual=False, tie_embeddings=True),
     dict(NEOX_MICRO, hf_model_type=None, rotary_dim=None, activation="gelu_tanh")],
    ids=["named", "by-shape-sequential-tied", "by-shape-whole-head"],
)  # fmt: skip
def test_a_model_from_scratch_exports_to_gpt_neox(overrides):
    """Named by `hf_model_type`, or (none named) LayerNorm with rotary positions: GPTNeoXForCausalLM."""
    config = GPTConfig.from_name("llama-micro", vocab_size=VOCAB, **overrides)
    torch.manual_seed(0)
    gpt = GPT(config).eval()
    hf = gpt.to_hf()
    assert type(hf).__name__ == "GPTNeoXForCausalLM"
    assert GPT.from_hf(hf).config == dataclasses.replace(config, hf_model_type="gpt_neox")
    ids = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


PRESET_PARAMETERS = {"pythia-70m": 70_426_624, "pythia-160m": 162_322_944}  # the Pythia paper's table


@pytest.mark.parametrize("preset", list(PRESET_PARAMETERS))
def test_presets_count_the_parameters_transformers_does(preset):
    from tests.weights.test_hf_llama import parameter_counts

    ours, theirs, hf_config = parameter_counts(GPTConfig.from_name(preset))
    assert hf_config.rope_parameters["partial_rotary_factor"] == 0.25 and hf_config.use_parallel_residual
    assert ours == theirs == PRESET_PARAMETERS[preset]


def test_unsupported_configs_are_one_sentence():
    from transformers import GPTNeoXConfig

    from gpt_ft.weights.hf import config_from_hf

    tiny = dict(TINY_NEOX, rope_parameters=dict(NEOX_ROPE))
    with pytest.raises(ValueError, match=r"^GPTNeoXConfig.attention_bias=False is not supported: gpt_ft's"):
        config_from_hf(GPTNeoXConfig(**tiny, attention_bias=False))
    with pytest.raises(ValueError, match=r"^GPTNeoXConfig.hidden_act='gelu_10' is not supported; allowed: "):
        config_from_hf(GPTNeoXConfig(**tiny, hidden_act="gelu_10"))
    odd = dict(tiny, rope_parameters=dict(NEOX_ROPE, partial_rotary_factor=0.375))  # (transformers runs it)
    with pytest.raises(ValueError, match=r"^GPTNeoXConfig.partial_rotary_factor=0.375 turns 3 of each 8"):
        config_from_hf(GPTNeoXConfig(**odd))
    dynamic = dict(tiny, rope_parameters=dict(NEOX_ROPE, rope_type="dynamic", factor=2.0))
    with pytest.raises(ValueError, match="rope_scaling type 'dynamic' is not supported"):
        config_from_hf(GPTNeoXConfig(**dynamic))
    wrong = [(dict(n_kv_head=2), "n_kv_head"), (dict(gated_mlp=True), "gated_mlp"),
             (dict(head_size=8), "head_size"), (dict(qkv_bias=False), "qkv_bias")]  # fmt: skip
    for overrides, field in wrong:
        config = GPTConfig.from_name("llama-micro", vocab_size=VOCAB, **{**NEOX_MICRO, **overrides})
        with pytest.raises(
            ValueError, match=rf"^transformers' gpt_neox models need .*; this model has \{{'{field}'"
        ):
            GPT(config).to_hf()
    # the other families' exports would drop the switches: refused
    with pytest.raises(
        ValueError, match=r"^transformers' llama models need .*; this model has \{'rotary_dim': 4\}"
    ):
        GPT(GPTConfig.from_name("llama-micro", vocab_size=VOCAB, rotary_dim=4, hf_model_type="llama")).to_hf()
    parallel = GPTConfig.from_name("gpt-micro", vocab_size=VOCAB, pre_ln=True, parallel_residual=True)
    with pytest.raises(
        ValueError, match=r"^transformers' GPT-1 and GPT-2 have none of \['parallel_residual'\]"
    ):
        GPT(parallel).to_hf()


def test_gguf_files_of_gpt_neox_read_and_write_what_llama_cpp_has(tmp_path, monkeypatch):
    """llama.cpp's `gptneox` (tests/weights/test_gguf_write.py reads files back and through llama.cpp):
    its rotary positions unscaled, its attention biased; a file's q/k/v put back into each head's."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf
    from tests.weights.gguf_files import tiny_tokenizer

    for overrides, refused in (
        ({"rope_parameters": dict(NEOX_ROPE, rope_type="linear", factor=2.0)}, "rotary scaling 'linear'"),
        ({"attention_bias": False}, "llama.cpp's gpt_neox models have attention biases; this one has "
         "attention_bias=False."),
    ):  # fmt: skip
        folder = tmp_path / refused[:6]
        tiny_neox(**overrides).save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        with pytest.raises(ValueError, match=re.escape(refused)):
            write_gguf(folder, tmp_path / "out.gguf")
    hf = tiny_neox(vocab_size=320)
    hf.save_pretrained(tmp_path / "folder")
    tiny_tokenizer().save_pretrained(tmp_path / "folder")
    path = write_gguf(tmp_path / "folder", tmp_path / "neox.gguf", outtype="f32")
    stored = {t.name: t.data for t in gguf.GGUFReader(path).tensors}
    qkv = hf.gpt_neox.layers[0].attention.query_key_value.weight.detach()  # (heads, q/k/v, width, in)
    q = qkv.reshape(4, 3, 8, 32)[:, 0].reshape(32, 32)
    assert torch.equal(torch.from_numpy(stored["blk.0.attn_qkv.weight"][:32].copy()), q)  # q rows first
    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    gpt = GPT.from_pretrained(path).eval()
    assert (gpt.config.rotary_dim, gpt.config.parallel_residual) == (4, True)
    ids = torch.randint(0, 320, (2, 17))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=2e-5)
    # A folder as Pythia's hub repositories hold it (`rotary_pct`, `rotary_emb_base`, no rope_parameters),
    # as llama.cpp's converter reads it: the whole head was written as rotating, at base 10,000.
    config = json.loads((tmp_path / "folder" / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rotary_pct=0.25, rotary_emb_base=500)
    (tmp_path / "folder" / "config.json").write_text(json.dumps(config))
    fields = gguf.GGUFReader(write_gguf(tmp_path / "folder", tmp_path / "hub.gguf", outtype="f32")).fields
    assert (
        fields["gptneox.rope.dimension_count"].contents(),
        fields["gptneox.rope.freq_base"].contents(),
    ) == (2, 500)
