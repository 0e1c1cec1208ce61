import re

import pytest
import torch

from gpt_ft import GPT, GPTConfig


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


def test_bad_config_errors():
    with pytest.raises(ValueError, match="Unknown GPT preset 'gpt3'.*gpt1, gpt2"):
        GPTConfig.from_name("gpt3")
    with pytest.raises(ValueError, match="n_embd=100 is not divisible by n_head=3"):
        GPTConfig(n_embd=100, n_head=3)
    typo = r"^Unknown GPTConfig field\(s\) \['n_embed'\] in the overrides of preset 'gpt1': did you mean "
    typo += r"'n_embd'\?$"
    with pytest.raises(ValueError, match=typo):
        GPTConfig.from_name("gpt1", n_embed=10)
    with pytest.raises(
        ValueError, match=r"\['zzz'\] in the overrides of preset 'gpt1'; its fields: vocab_size, "
    ):
        GPTConfig.from_name("gpt1", zzz=10)
    with pytest.raises(ValueError, match="activation='swiglu' is not supported"):
        GPTConfig(activation="swiglu")
    # A float or a text where a count or a switch goes: named (they failed deep in the model's build,
    # or a text switch was taken as on).
    wrong = [
        ("n_positions", 64.0, "an integer"),
        ("n_layer", 2.5, "an integer"),
        ("n_head", "2", "an integer"),
        ("qkv_bias", "false", "true or false"),
        ("rope_theta", "1e4", "a number"),
        ("rotary_dim", True, "an integer"),
        ("parallel_residual", "yes", "true or false"),
        ("input_norms", "no", "true or false"),
    ]
    for field, value, kind in [*wrong, ("pre_ln", "yes", "true or false")]:
        with pytest.raises(ValueError, match=rf"^GPTConfig.{field} must be {kind}, got {value!r}\.$"):
            GPTConfig.from_name("gpt-micro", **{field: value})
    # Values no model can use: refused by name (each was a traceback in the forward, or silently
    # non-finite states that SDPA's CPU kernel hid: NaN cos/sin tables, hidden states still finite)
    nonsense = [
        ("layer_norm_epsilon", -1, "a number >= 0, got -1.0"),
        ("initializer_range", -1, "a number >= 0, got -1.0"),
        ("rope_theta", float("nan"), "a positive number, got nan"),
        ("rope_theta", 0, "a positive number, got 0.0"),
        ("rope_local_theta", -1, "a positive number, got -1.0"),
        ("query_pre_attn_scalar", 0, "a positive number, got 0"),  # (taken as None)
        ("query_pre_attn_scalar", -4, "a positive number, got -4"),  # (a complex scale)
        ("rope_scaling", [1], "a mapping or None, got [1]"),
        ("nope_layers", [2], "layer numbers 0 to 1, got [2]"),  # (llama-micro has 2 layers)
        ("nope_layers", [True], "layer numbers 0 to 1, got [True]"),
        ("rotary_dim", 3, "an even number from 2 to the head size 16, or None; got 3"),  # (16-wide heads)
        ("rotary_dim", 18, "an even number from 2 to the head size 16, or None; got 18"),
    ]
    for field, value, said in nonsense:
        with pytest.raises(ValueError, match=rf"^GPTConfig.{field} must be {re.escape(said)}\.$"):
            GPTConfig.from_name("llama-micro", **{field: value})
    for factor in (0, "x", float("inf"), True):
        with pytest.raises(
            ValueError, match=r"^GPTConfig.rope_scaling factor must be a positive number, got "
        ):
            GPTConfig.from_name("llama-micro", rope_scaling={"rope_type": "linear", "factor": factor})
    # a key the scaling's type does not read, or a field of the config's own, was taken and dropped
    linear = {"rope_type": "linear", "factor": 2.0}
    unread = [({"beta_fast": 4}, r"of type 'linear' takes no 'beta_fast' \(it takes factor\)\.$"),
                       ({"factr": 4}, r"of type 'linear' takes no 'factr' "),
                       ({"rope_theta": 5e5}, r"holds rope_theta 500000.0, the config.s is 10000.0: "),
                       ({"partial_rotary_factor": 0.5}, r"holds partial_rotary_factor: ")]  # fmt: skip
    for more, said in unread:
        with pytest.raises(ValueError, match=r"^GPTConfig.rope_scaling " + said):
            GPTConfig.from_name("llama-micro", rope_scaling={**linear, **more})
    assert (
        GPTConfig.from_name("llama-micro", rope_scaling={**linear, "rope_theta": 1e4}).rope_type == "linear"
    )
    for field, value in [
        ("rope_theta", 5e5),
        ("rope_scaling", linear),
        ("rotary_dim", 8),
        ("nope_layers", [1]),
    ]:
        with pytest.raises(
            ValueError, match=rf"^GPTConfig.{field} is for rotary positions; this model's are "
        ):
            GPTConfig.from_name("gpt-micro", **{field: value})  # (learned positions: silently unused)
    with pytest.raises(ValueError, match=r"^GPTConfig.post_norms needs pre_ln: true \("):  # (never applied)
        GPTConfig.from_name("gpt-micro", post_norms=True)
    with pytest.raises(ValueError, match=r"^GPTConfig.parallel_residual needs pre_ln: true \(each branch "):
        GPTConfig.from_name("gpt-micro", parallel_residual=True)
    with pytest.raises(
        ValueError, match=r"^GPTConfig.input_norms: false needs pre_ln: true \(GPT-1's norms "
    ):
        GPTConfig.from_name("gpt-micro", input_norms=False)
    assert GPTConfig.from_name("llama-micro", layer_norm_epsilon=0, initializer_range=0).rope_theta > 0
    import numpy as np  # NumPy's numbers (a sweep over np.arange) are numbers: taken, as Python's

    config = GPTConfig.from_name("gpt-micro", n_embd=np.int64(64), tie_embeddings=np.bool_(False))
    assert (config.n_embd, config.tie_embeddings) == (64, False) and type(config.n_embd) is int
    config = GPTConfig.from_name("llama-micro", nope_layers=np.arange(1, 2))  # (a list field's items too)
    assert config.nope_layers == [1] and type(config.nope_layers[0]) is int


def test_padded_vocab_size_rounds_up_to_the_multiple():
    assert GPTConfig(vocab_size=100).padded_vocab_size == 128
    assert GPTConfig(vocab_size=128).padded_vocab_size == 128
    assert GPTConfig(vocab_size=100, vocab_multiple=1).padded_vocab_size == 100
    assert GPTConfig(n_embd=256, n_head=4, n_inner=100).ffn_dim == 100
    assert GPTConfig(n_embd=256, n_head=4).head_dim == 64


def test_the_shape_fields_are_those_that_make_the_weights():
    from dataclasses import fields, replace

    base = GPTConfig.from_name(
        "gpt-micro", vocab_size=100, pre_ln=True, positions="rope"
    )  # (parallel_residual
    # needs pre_ln; the rotary fields, rotary positions)
    names = {f.name for f in fields(GPTConfig)}
    assert set(GPTConfig.SHAPE_FIELDS) <= names
    # Every other field may differ between a checkpoint and the model it loads into: none changes a
    # tensor's name or shape (vocab_multiple and released_rows change only padding rows, which loading fits).
    others = dict(activation="relu", embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0, layer_norm_epsilon=1e-6,
                  initializer_range=0.01, rope_theta=500.0, hf_model_type="llama",
                  rope_scaling={"rope_type": "linear", "factor": 2.0}, query_pre_attn_scalar=16,
                  sliding_window=8, layer_types=["full_attention"] * 2, rope_local_theta=100.0,
                  nope_layers=[1], hf_token_ids={"bos": 1, "eos": [2, 3], "pad": None}, rotary_dim=8,
                  parallel_residual=True)  # fmt: skip
    assert set(others) == names - set(GPTConfig.SHAPE_FIELDS) - {"vocab_multiple", "released_rows"}

    def shapes(config):
        return {k: v.shape for k, v in GPT(config).state_dict().items()}

    for name, value in others.items():
        assert shapes(replace(base, **{name: value})) == shapes(base), name


def test_a_checkpoints_shape_is_compared_with_its_fields_defaults_and_meanings():
    """A field a checkpoint lacks (written before the field was) has its default, as it had then; a
    None and the value it means (n_kv_head: n_head, head_size: n_embd / n_head) are one shape."""
    olmo = GPTConfig.from_name("olmo-2-1b", n_layer=1, vocab_size=64)
    older = {k: v for k, v in vars(olmo).items() if k not in ("input_norms", "qk_norm_span")}
    assert olmo.differing_shapes(older) == {"input_norms": True, "qk_norm_span": "head"}
    assert olmo.differing_shapes(vars(olmo)) == {}
    spelled = GPTConfig.from_name("olmo-2-1b", n_layer=1, vocab_size=64, n_kv_head=16, head_size=128)
    assert olmo.differing_shapes(vars(spelled)) == spelled.differing_shapes(vars(olmo)) == {}
    assert olmo.differing_shapes({**vars(spelled), "n_kv_head": 8}) == {"n_kv_head": 8}
    gpt2 = GPTConfig.from_name("gpt2", n_layer=1)  # n_inner None: 4 n_embd; qkv_bias None: bias
    assert gpt2.differing_shapes({**vars(gpt2), "n_inner": 3072, "qkv_bias": True}) == {}
    assert gpt2.differing_shapes({**vars(gpt2), "qkv_bias": False}) == {"qkv_bias": False}
