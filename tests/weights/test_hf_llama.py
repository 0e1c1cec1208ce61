"""Llama-family blocks against transformers: LlamaForCausalLM (grouped-query attention, Llama 3
rotary scaling, biases), Qwen2ForCausalLM (q/k/v biases), MistralForCausalLM and Phi3ForCausalLM
(sliding windows), Qwen3ForCausalLM (its own head size, q/k norms), Gemma3ForCausalLM (Gemma's
norms, scaled embeddings, local and global layers), SmolLM3ForCausalLM (layers without rotary
positions), Olmo2ForCausalLM and Olmo3ForCausalLM (norms after attention and MLP only, q/k norms over
all heads; OLMo 3's local and global layers)."""

import dataclasses

import pytest
import torch

from gpt_ft import GPT, GPTConfig
from tests.helpers import LLAMA_FAMILIES, NEW_FAMILIES, TINY_LLAMA, tiny_llama

ALL_FAMILIES = LLAMA_FAMILIES + NEW_FAMILIES

VOCAB = TINY_LLAMA["vocab_size"]
LLAMA3 = dict(
    rope_theta=500000.0,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16),
)  # fmt: skip
LINEAR = dict(rope_type="linear", factor=2.0)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)  # (the tiny models' 64)
WINDOW = dict(sliding_window=8)  # inputs of 30 and 40 tokens: every query past the 8th loses keys
VARIANTS = {
    **{family: (family, {}) for family in ALL_FAMILIES},
    "mistral-window": ("mistral", WINDOW),
    "phi3-window": ("phi3", WINDOW),
    "qwen2-window-last-layer": ("qwen2", dict(WINDOW, use_sliding_window=True, max_window_layers=1)),
    "qwen3-window-tied": ("qwen3", dict(WINDOW, use_sliding_window=True, tie_word_embeddings=True)),
    "gemma3-linear-global": ("gemma3_text", dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})),
    "llama-tied-biases-llama3": (
        "llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True, **LLAMA3)
    ),
    # (a key linear scaling does not read: transformers warns and computes without it; read without it)
    "llama-linear-rope": ("llama", dict(rope_scaling=dict(rope_type="linear", factor=2.0, beta_fast=4.0))),
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1e6)),
    # SmolLM3: its first layer without rotary positions and sliding, the second rotary and full
    "smollm3-nope-first-window": ("smollm3", dict(WINDOW, use_sliding_window=True, no_rope_layers=[0, 1])),
    "smollm3-untied-biases": ("smollm3", dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    "olmo2-tied": ("olmo2", dict(tie_word_embeddings=True)),
    # OLMo 3: its global layer's positions scaled, on a base of their own (its local layer's: 10,000)
    "olmo3-linear-global": ("olmo3", dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})),
    # YaRN: Qwen's long-context setting; with its attention factor's other forms; OLMo 3's global layers
    "qwen3-yarn": ("qwen3", dict(rope_parameters=dict(YARN, rope_theta=1e4))),
    "llama-yarn-mscale-untruncated": ("llama", dict(rope_parameters=dict(
        YARN, rope_theta=10.0, mscale=1.0, mscale_all_dim=0.5, beta_fast=2, beta_slow=1, truncate=False))),
    "olmo3-yarn-global": ("olmo3", dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": dict(YARN, rope_theta=5e5, attention_factor=1.25)})),
    # (a layer type's `truncate` is read by transformers from the outer dict: it truncates, so do we)
    "olmo3-yarn-untruncated-unread": ("olmo3", dict(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": dict(YARN, rope_theta=10.0, beta_fast=2, beta_slow=1, truncate=False)})),
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


@pytest.mark.parametrize(
    "family, unread",
    [("llama", WINDOW), ("phi3", dict(WINDOW, layer_types=["sliding_attention", "full_attention"])),
     ("mistral", dict(WINDOW, layer_types=["full_attention"] * 2)), ("olmo2", WINDOW)],
)  # fmt: skip
def test_window_settings_the_familys_class_leaves_unread_are_left_unread(family, unread):
    """A Llama or OLMo 2 config's `sliding_window` key, and Mistral's or Phi-3's `layer_types`, are read by
    no transformers class of theirs (Mistral and Phi-3 slide in every layer): past the window, the
    logits are still theirs."""
    hf = tiny_llama(family, **unread)
    gpt = GPT.from_hf(hf).eval()
    assert gpt.config.layer_types is None and (gpt.config.sliding_window is None) == (
        family in ("llama", "olmo2")
    )
    ids = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_smollm3s_layers_without_rotary_positions_and_its_layer_types_are_read():
    """SmolLM3's `no_rope_layers` (0: no rotary positions) become `nope_layers`, and its explicit
    `layer_types` slide where `use_sliding_window` is false (as transformers' masks do): the logits
    are transformers', and the same model rotating every layer's are not."""
    hf = tiny_llama("smollm3", **WINDOW, layer_types=["full_attention", "sliding_attention"])
    gpt = GPT.from_hf(hf).eval()
    assert (gpt.config.nope_layers, gpt.config.layer_types[1], gpt.config.sliding_window) == (
        [1],
        "sliding_attention",
        8,
    )
    rotary = GPT(dataclasses.replace(gpt.config, nope_layers=None)).eval()
    rotary.load_state_dict(gpt.state_dict())
    ids = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        theirs = hf(ids).logits
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), theirs, rtol=0, atol=1e-5)
        assert (rotary.lm_logits(rotary(ids)) - theirs).abs().max() > 1e-3  # 100 times the tolerance


def test_phi3s_embedding_dropout_is_left_unread_as_transformers_leaves_it():
    """Phi3Config's `embd_pdrop` is read by no layer of transformers' Phi-3: training drops nothing
    from the embeddings (it dropped half of them here)."""
    hf = tiny_llama("phi3", embd_pdrop=0.5, resid_pdrop=0.0, attention_dropout=0.0).train()
    gpt = GPT.from_hf(hf).train()
    assert gpt.config.embd_pdrop == 0.0
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


PADDED_LENGTHS = [30, 17, 5]


def padded_rows(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (3, 30) and the mask of rows of 30, 17 and 5 real tokens, padded on `side`."""
    rows = [[1] * n + [0] * (30 - n) for n in PADDED_LENGTHS]
    mask = torch.tensor([row[::-1] if side == "left" else row for row in rows])
    return torch.randint(0, VOCAB, (3, 30)), mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_equal_transformers_with_padding(pair, side):
    hf, gpt = pair
    ids, mask = padded_rows(side)
    with torch.no_grad():
        ours, theirs = gpt.lm_logits(gpt(ids, mask)), hf(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_base_model_hidden_states_equal_transformers(family):
    hf = tiny_llama(family, base=True)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, VOCAB, (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(ids).last_hidden_state, rtol=0, atol=1e-5)


def test_to_hf_round_trips_every_tensor(pair):
    """Every tensor, every setting read back (a config class takes a field of another family's name
    without a word, Llama's `rms_norm_eps` given to StableLM's, and fills what is left out with its
    own defaults, a partial rotary factor other than 1), and so the logits. (The config is written
    as its settings are, not as the source spelt them: Qwen2's window as each layer's type.)"""
    hf, gpt = pair
    back = gpt.to_hf().eval()
    assert type(back) is type(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert torch.equal(theirs[key], ours[key]), key
    assert GPT.from_hf(back).config == gpt.config
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, rtol=0, atol=1e-5)
    tied = back.lm_head.weight.data_ptr() == back.get_input_embeddings().weight.data_ptr()
    assert tied == hf.config.tie_word_embeddings


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_from_pretrained_directory_equals_transformers(family, tmp_path):
    hf = tiny_llama(family)
    hf.save_pretrained(tmp_path)
    gpt = GPT.from_pretrained(tmp_path).eval()
    assert gpt.config.hf_model_type == family and gpt.config.n_kv_head == 2
    theirs, ours = hf.config.to_dict(), gpt.to_hf().config.to_dict()
    shape = set(theirs) - {"architectures", "dtype", "transformers_version"}
    assert {k: ours.get(k) for k in shape} == {k: theirs[k] for k in shape}
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_a_tied_folder_holding_the_shared_matrix_under_the_heads_name_loads(tmp_path):
    """safetensors' `save_model` keeps one name of a tied pair (`lm_head.weight`), as transformers
    reads it: so does gpt_ft, and the logits are transformers'."""
    from safetensors.torch import save_model

    hf = tiny_llama("llama", tie_word_embeddings=True)
    hf.config.save_pretrained(tmp_path)
    save_model(hf, str(tmp_path / "model.safetensors"))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" in f.keys() and "model.embed_tokens.weight" not in f.keys()
    gpt = GPT.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_folder_loads_in_float32(dtype, tmp_path):
    """Released folders are mostly bf16: read in float32 (its values exactly), as transformers reads
    it with dtype=float32; kept in bf16, the fp32 task head met bf16 states and fit crashed."""
    tiny_llama("llama").to(dtype).save_pretrained(tmp_path)
    gpt = GPT.from_pretrained(tmp_path).eval()
    assert {p.dtype for p in gpt.parameters()} == {torch.float32}
    hf = type(tiny_llama("llama")).from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_greedy_generation_equals_transformers(pair):
    hf, gpt = pair
    ids = torch.randint(0, VOCAB, (2, 7))
    theirs = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )  # (no mask: its id 0 would read as padding)
    assert torch.equal(gpt.generate(ids, max_new_tokens=12), theirs)


def test_kv_cache_holds_the_key_value_heads_only():
    gpt = GPT.from_hf(tiny_llama("llama"))
    cache = gpt.new_kv_cache(batch_size=3, max_len=10)
    assert cache.k.shape == (2, 3, 2, 10, 8)  # layers, batch, 2 key/value heads (of 4), positions, head size


@pytest.mark.parametrize("family", ["mistral", "phi3", "gemma3_text", "smollm3", "olmo3"])
def test_sliding_windows_apply_over_a_kv_cache(family):
    """Token by token, each new token's window drops the oldest key once the input is longer (SmolLM3's
    in its layer without rotary positions)."""
    windows = {"gemma3_text": {}, "olmo3": {},
               "smollm3": dict(WINDOW, use_sliding_window=True, no_rope_layers=[0, 1])}  # fmt: skip
    hf = tiny_llama(family, **windows.get(family, WINDOW))
    gpt = GPT.from_hf(hf).eval()
    assert gpt.config.sliding_window == 8 and gpt.config.n_positions == 64
    ids = torch.randint(0, VOCAB, (2, 20))
    cache = gpt.new_kv_cache(batch_size=2)
    with torch.no_grad():
        steps = [gpt.lm_logits(gpt(ids[:, :5], kv_cache=cache))]
        steps += [gpt.lm_logits(gpt(ids[:, t : t + 1], kv_cache=cache)) for t in range(5, 20)]
        torch.testing.assert_close(torch.cat(steps, dim=1), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_special_token_ids_come_back_from_a_round_trip(family):
    """Ids unlike the config class's defaults (which are some other model's): `generate` on the
    exported model stops where the source's does."""
    hf = tiny_llama(family, bos_token_id=0, eos_token_id=[0, 7], pad_token_id=None)
    back = GPT.from_hf(hf).to_hf()
    assert (back.config.bos_token_id, back.config.eos_token_id, back.config.pad_token_id) == (0, [0, 7], None)
    ids = torch.randint(8, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))
    for model in (hf, back):
        model.generation_config.eos_token_id = [0, 7]  # a token the random model does produce: 7
    theirs = hf.generate(ids, max_new_tokens=40, do_sample=False)
    torch.testing.assert_close(back.generate(ids, max_new_tokens=40, do_sample=False), theirs)
    none = GPT(GPTConfig.from_name("llama-micro", vocab_size=VOCAB)).to_hf().config  # from scratch: none
    assert (none.bos_token_id, none.eos_token_id, none.pad_token_id) == (None, None, None)


def test_a_folders_generation_config_adds_the_end_of_turn_ids_generation_stops_at(tmp_path):
    """Instruct models list their end-of-turn tokens in generation_config.json, where transformers'
    `generate` finds them: they join config.json's eos. A file that is no JSON object is named."""
    hf = tiny_llama("llama", eos_token_id=2)
    hf.generation_config.eos_token_id = [2, 7]
    hf.save_pretrained(tmp_path)
    assert GPT.from_pretrained(tmp_path).config.hf_token_ids["eos"] == [2, 7]
    (tmp_path / "generation_config.json").write_text("[2, 7")
    with pytest.raises(ValueError, match=r"generation_config.json is not a JSON object \("):
        GPT.from_pretrained(tmp_path)


def test_a_model_from_scratch_exports_to_the_family_its_shape_says():
    from tests.helpers import GEMMA3_MICRO, OLMO2_MICRO, OLMO3_MICRO, QWEN3_MICRO

    cases = [({}, "LlamaForCausalLM"), (dict(qkv_bias=True), "Qwen2ForCausalLM"),
             (dict(hf_model_type="mistral", sliding_window=8), "MistralForCausalLM"),
             (dict(sliding_window=8), "MistralForCausalLM"),
             (dict(hf_model_type="phi3"), "Phi3ForCausalLM"), (dict(rotary_dim=4), "Phi3ForCausalLM"),
             (QWEN3_MICRO, "Qwen3ForCausalLM"),
             (GEMMA3_MICRO, "Gemma3ForCausalLM"), (dict(activation="relu"), "LlamaForCausalLM"),
             ({**GEMMA3_MICRO, "sliding_window": None, "layer_types": None}, "Gemma3ForCausalLM"),
             (dict(nope_layers=[1]), "SmolLM3ForCausalLM"), (OLMO2_MICRO, "Olmo2ForCausalLM"),
             (OLMO3_MICRO, "Olmo3ForCausalLM"), ({**OLMO2_MICRO, "hf_model_type": None}, "Olmo2ForCausalLM"),
             ({**OLMO3_MICRO, "hf_model_type": None}, "Olmo3ForCausalLM"),
             ({**OLMO3_MICRO, "layer_types": None}, "Olmo3ForCausalLM"),
             ({**OLMO3_MICRO, "rope_local_theta": 100.0, "rope_scaling": LINEAR}, "Olmo3ForCausalLM"),
             ]  # fmt: skip
    for overrides, expected in cases:
        layers = dict(n_layer=2) if {"layer_types", "nope_layers"} & set(overrides) else dict(n_layer=1)
        config = GPTConfig.from_name("llama-mini", vocab_size=VOCAB, **layers, **overrides)
        gpt = GPT(config).eval()
        hf = gpt.to_hf()
        assert type(hf).__name__ == expected
        ids = torch.randint(0, VOCAB, (2, 20))
        with torch.no_grad():
            torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


PRESET_PARAMETERS = {"smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768, "llama-3.2-1b": 1_235_814_400,
                     "qwen3-0.6b": 596_049_920, "gemma-3-270m": 268_098_176, "gemma-3-1b": 999_885_952,
                     "phi-3-mini": 3_821_079_552, "smollm3-3b": 3_075_098_624,
                     "olmo-2-1b": 1_484_916_736, "phi-4-mini": 3_836_021_760}  # fmt: skip


def parameter_counts(config: GPTConfig):
    """(ours, transformers', the transformers config) for `config`, counted on the meta device."""
    from transformers import AutoModelForCausalLM

    from gpt_ft.weights.hf import config_to_hf

    with torch.device("meta"):
        hf_config = config_to_hf(config)
        return (
            GPT(config).num_parameters(),
            AutoModelForCausalLM.from_config(hf_config).num_parameters(),
            hf_config,
        )


@pytest.mark.parametrize("preset", list(PRESET_PARAMETERS))
def test_presets_count_the_parameters_transformers_does(preset):
    config = GPTConfig.from_name(preset)
    ours, theirs, _ = parameter_counts(config)
    assert ours == theirs
    assert ours == PRESET_PARAMETERS[preset]  # the model cards' counts
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
            "rope_scaling of type 'yarn' needs original_max_position_embeddings",
        ),
        (
            dict(rope_scaling=dict(YARN, attention_factor=0)),
            "rope_scaling attention_factor must be a positive number, got 0",
        ),
        (dict(rope_scaling=dict(YARN, truncate="no")), "rope_scaling truncate must be true or false, got"),
        (dict(n_embd=20, n_head=4, n_kv_head=None), "Rotary positions need an even head size"),
        (dict(norm="batchnorm"), "GPTConfig.norm='batchnorm' is not supported"),
        (dict(head_size=0), "GPTConfig.head_size must be a positive integer"),
        (dict(layer_types=["full_attention"]), "layer_types must name one of .* for each of the 4 layers"),
        (dict(sliding_window=4, layer_types=["full_attention", "local"] * 2), r"4 entries with \['local'\]"),
        (dict(layer_types=["sliding_attention"] * 4), "sliding_attention layers but sliding_window is None"),
        (
            dict(qk_norm_span="all_heads"),
            r"qk_norm_span must be one of \('head', 'all_heads'\) \('all_heads' with",
        ),
        (dict(qk_norm=True, qk_norm_span="heads"), r"qk_norm_span must be one of .*, got 'heads'\.$"),
        (dict(rope_scaling={"rope_type": "linear"}), "rope_scaling of type 'linear' needs factor"),
        (
            dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
            "needs low_freq_factor, high_freq_factor, original_max_position_embeddings",
        ),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig.from_name("llama-mini", **overrides)


def test_unsupported_transformers_configs_are_one_sentence():
    from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen3Config, SmolLM3Config

    from gpt_ft.weights.hf import config_from_hf

    half = dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)
    with pytest.raises(
        ValueError, match=r"^LlamaConfig.partial_rotary_factor must be 1.0: transformers' llama"
    ):
        config_from_hf(LlamaConfig(**TINY_LLAMA, rope_parameters=half))  # (its attention would not run)
    with pytest.raises(ValueError, match=r"^Phi3Config.partial_rotary_factor=0.4 turns 3 of each 8-wide hea"):
        config_from_hf(Phi3Config(**TINY_LLAMA, rope_parameters=dict(half, partial_rotary_factor=0.4)))
    with pytest.raises(ValueError, match=r"Gemma3TextConfig.final_logit_softcapping=30.0 is not supported"):
        config_from_hf(Gemma3TextConfig(**TINY_LLAMA, final_logit_softcapping=30.0))
    with pytest.raises(ValueError, match=r"Qwen3Config.attention_bias=True is not supported"):
        config_from_hf(Qwen3Config(**TINY_LLAMA, attention_bias=True))
    for cls in (LlamaConfig, SmolLM3Config):
        with pytest.raises(ValueError, match=f"{cls.__name__} with attention_bias=True and mlp_bias=False"):
            config_from_hf(cls(**TINY_LLAMA, attention_bias=True, pad_token_id=None))
    with pytest.raises(
        ValueError, match="llama models give every layer rotary positions; nope_layers must be"
    ):
        GPT(
            GPTConfig.from_name("llama-micro", vocab_size=VOCAB, hf_model_type="llama", nope_layers=[0])
        ).to_hf()
    with pytest.raises(ValueError, match="fold them in with gpt_ft.model.lora.merge_lora"):
        from gpt_ft.model.lora import LoRA, add_lora

        add_lora(GPT.from_hf(tiny_llama("llama")), LoRA(), new_tokens_from=VOCAB).to_hf()
    for no_bias in (dict(bias=False), dict(qkv_bias=False)):
        with pytest.raises(ValueError, match="GPT-1 and GPT-2 have biases"):
            GPT(GPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, **no_bias)).to_hf()
    linear = dict(rope_type="linear", factor=2.0)
    with pytest.raises(ValueError, match="Phi-3 scales its rotary positions by LongRoPE alone"):
        GPT(
            GPTConfig.from_name("llama-micro", vocab_size=VOCAB, hf_model_type="phi3", rope_scaling=linear)
        ).to_hf()


def test_unsupported_olmo_configs_and_exports_are_one_sentence():
    """OLMo's biases and scaled local layers are refused as the config field that sets them; so are
    exports of OLMo's switches to families without them, and of settings OLMo's classes cannot hold."""
    from transformers import Olmo2Config, Olmo3Config

    from gpt_ft.weights.hf import config_from_hf
    from tests.helpers import NEOX_MICRO, OLMO2_MICRO, OLMO3_MICRO

    with pytest.raises(ValueError, match=r"^Olmo2Config.attention_bias=True is not supported"):
        config_from_hf(Olmo2Config(**TINY_LLAMA, attention_bias=True))
    yarn = dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=16, rope_theta=1e4)
    local = dict(rope_type="default", rope_theta=1e4)
    with pytest.raises(
        ValueError, match=r"^Olmo3Config.rope_parameters\['sliding_attention'\] with rope_type"
    ):
        config_from_hf(
            Olmo3Config(**TINY_LLAMA, rope_parameters=dict(full_attention=local, sliding_attention=yarn))
        )
    micro = lambda **overrides: GPT(GPTConfig.from_name("llama-micro", vocab_size=VOCAB, **overrides))  # noqa: E731
    untruncated = dict(rope_scaling=dict(YARN, truncate=False), rope_local_theta=1e4)
    refusals = [
        (dict(OLMO3_MICRO, **untruncated), "olmo3 models truncate YaRN's ramp; rope_scaling truncate must"),
        (dict(OLMO2_MICRO, sliding_window=8), "olmo2 models have no sliding window; sliding_window must"),
        (dict(OLMO3_MICRO, rope_scaling=dict(rope_type="linear", factor=2.0)), "give rope_local_theta"),
        (dict(OLMO2_MICRO, hf_model_type="llama"), "transformers' llama models need"),
        (dict(input_norms=False, post_norms=True), "transformers' olmo2 models need"),  # Llama's RMSNorm
        (dict(OLMO2_MICRO, hf_model_type="qwen3", qk_norm_span="head"), "transformers' qwen3 models need"),
        (dict(NEOX_MICRO, input_norms=False), "transformers' gpt_neox models need"),
    ]  # fmt: skip
    for overrides, message in refusals:
        with pytest.raises(ValueError, match=message):
            micro(**overrides).to_hf()
    with pytest.raises(ValueError, match=r"GPT-1 and GPT-2 have none of \['input_norms'\]"):
        GPT(
            GPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, pre_ln=True, input_norms=False)
        ).to_hf()


def test_olmos_rmsnorm_is_transformers_in_bf16_too():
    """OLMo's RMSNorm multiplies by its weight in fp32 before the cast (Llama's casts first): in bf16
    exactly transformers' Olmo2RMSNorm, which Llama's form is not."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from gpt_ft.model.norms import norm
    from tests.helpers import OLMO2_MICRO

    torch.manual_seed(0)
    x, weight = torch.randn(4, 9, 64).bfloat16(), torch.randn(64).bfloat16()
    theirs = Olmo2RMSNorm(64, eps=1e-6).bfloat16()
    outputs = {}
    for kind in ("rmsnorm_fp32", "rmsnorm"):
        ours = norm(
            GPTConfig.from_name("llama-micro", **{**OLMO2_MICRO, "norm": kind}, layer_norm_epsilon=1e-6)
        )
        with torch.no_grad():
            ours.bfloat16().weight.copy_(weight), theirs.weight.copy_(weight)
            outputs[kind] = ours(x)
    expected = theirs(x)
    assert outputs["rmsnorm_fp32"].dtype == torch.bfloat16 and torch.equal(outputs["rmsnorm_fp32"], expected)
    assert not torch.equal(outputs["rmsnorm"], expected)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_lora_merges_back_into_the_family_checkpoint(family):
    """LoRA on Qwen3, Gemma 3 and Phi-3 (their q/k norms and post-norms frozen with the rest):
    merged, the model exports with the adapted logits."""
    from gpt_ft.model.lora import LoRA, add_lora, merge_lora

    gpt = GPT.from_hf(tiny_llama(family)).eval()
    add_lora(gpt, LoRA(rank=4, dropout=0.0), new_tokens_from=VOCAB)
    trainable = {n.split(".", 2)[-1] for n, p in gpt.named_parameters() if p.requires_grad and n[:2] == "h."}
    assert trainable == {f"{t}.lora_{m}" for t in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
                         for m in "AB"}  # fmt: skip
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0.0, 0.1)
        ids = torch.randint(0, VOCAB, (2, 20))
        adapted = gpt.lm_logits(gpt(ids))
        hf = merge_lora(gpt).to_hf()
        torch.testing.assert_close(hf(ids).logits, adapted, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_activation_checkpointing_gives_the_family_the_same_gradients(family):
    gpt = GPT.from_hf(tiny_llama(family, **({} if family == "gemma3_text" else WINDOW))).train()
    ids = torch.randint(0, VOCAB, (2, 24))

    def grads(recompute: bool):
        gpt.activation_checkpointing = recompute
        gpt.zero_grad(set_to_none=True)
        gpt.lm_logits(gpt(ids)).logsumexp(-1).mean().backward()
        return {n: p.grad.clone() for n, p in gpt.named_parameters()}

    plain, recomputed = grads(False), grads(True)
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "scaling",
    [dict(YARN), dict(YARN, factor=32.0, original_max_position_embeddings=4096),
     dict(YARN, attention_factor=0.9), dict(YARN, beta_fast=8, beta_slow=0.5, truncate=False),
     dict(YARN, mscale=0.707, mscale_all_dim=1.0)],
)  # fmt: skip
def test_yarn_frequencies_and_attention_factor_are_transformers(scaling):
    """YaRN's ramp between kept and divided frequencies, and its attention factor in each of its three
    forms, as transformers computes them (`_compute_yarn_parameters`) for 64- and 128-wide heads."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from gpt_ft.model import rope

    for heads in (8, 4):
        theirs = LlamaConfig(hidden_size=512, num_attention_heads=heads, max_position_embeddings=131072,
                             rope_parameters=dict(scaling, rope_theta=1e6))  # fmt: skip
        inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](theirs, torch.device("cpu"))
        ours = GPTConfig.from_name("llama-mini", n_embd=512, n_head=heads, n_kv_head=heads, rope_theta=1e6,
                                   rope_scaling=scaling)  # fmt: skip
        torch.testing.assert_close(rope.inverse_frequencies(ours), inv_freq, rtol=0, atol=0)
        assert rope.attention_factor(ours) == pytest.approx(factor, rel=1e-12)
        plain = dataclasses.replace(ours, rope_scaling=None)
        assert not torch.equal(inv_freq, rope.inverse_frequencies(plain))  # (the ramp divides some)
    # the tiny models' heads (8 wide), base 10, betas 2 and 1: truncating the ramp's bounds changes them
    fit = dict(YARN, beta_fast=2, beta_slow=1)
    tiny = GPTConfig.from_name("llama-micro", n_embd=32, rope_theta=10.0, rope_scaling=fit)
    untruncated = dataclasses.replace(tiny, rope_scaling=dict(fit, truncate=False))
    assert not torch.equal(rope.inverse_frequencies(tiny), rope.inverse_frequencies(untruncated))


def test_gemma3s_embedding_scale_is_rounded_through_fp32_as_transformers_rounds_it():
    """transformers keeps sqrt(hidden) as an fp32 tensor, then casts it: in float64, a width whose
    root fp32 cannot hold (48; the real 640) made every logit differ by ~1e-6 of its scale."""
    hf = tiny_llama("gemma3_text", hidden_size=48, head_dim=12).double()
    gpt = GPT.from_hf(hf).double().eval()
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-11)
