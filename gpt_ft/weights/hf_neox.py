"""GPT-NeoX weights to and from `transformers`: GPTNeoXForCausalLM and GPTNeoXModel (the Pythia
suite, 14M to 12B, and GPT-NeoX-20B).

Their blocks are ours with GPT-2's LayerNorm and biases, rotary positions on the first `rotary_dim`
features of each head (`rotary_pct`, `partial_rotary_factor`) and, where `use_parallel_residual`,
attention and MLP side by side (`parallel_residual`). The names differ, and their fused
`query_key_value` is laid out head by head (each head's q, k and v rows in turn) where ours stacks
all queries, then all keys, then all values: its rows are reordered both ways. The untied head is
`embed_out` in the released folders and `lm_head` in transformers' model.
"""

from __future__ import annotations

import re

from torch import Tensor

from gpt_ft.model.config import GPTConfig
from gpt_ft.weights.hf_llama import refuse_untied, token_ids_from_hf, token_ids_to_hf
from gpt_ft.weights.hf_rope import rope_from_hf, rope_to_hf

MODEL_TYPES = ("gpt_neox",)
# transformers' hidden_act -> ours; GPT-NeoX-20B's gelu_fast is GELU's tanh form written out
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu"}  # fmt: skip
_WRITTEN = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}
# theirs (after "gpt_neox.layers.N.") -> ours (after "h.N.")
_LAYER_NAMES = {
    "input_layernorm": "ln_1",
    "post_attention_layernorm": "ln_2",
    "attention.query_key_value": "attn.c_attn",
    "attention.dense": "attn.c_proj",
    "mlp.dense_h_to_4h": "mlp.c_fc",
    "mlp.dense_4h_to_h": "mlp.c_proj",
}
_OURS = {v: k for k, v in _LAYER_NAMES.items()}
_LAYER_KEY = re.compile(r"^gpt_neox\.layers\.(\d+)\.(.+)\.(weight|bias)$")
# buffers of older folders (the causal mask, the rotary frequencies): recomputed, never read
_BUFFERS = re.compile(r"^gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)$")
_HEADS = ("lm_head.weight", "embed_out.weight")


def is_neox(config: GPTConfig) -> bool:
    """Whether a model exports to GPT-NeoX: it says so, or (none named) LayerNorm with rotary positions."""
    if config.hf_model_type is not None:
        return config.hf_model_type in MODEL_TYPES
    return config.norm == "layernorm" and config.positions == "rope"


def config_from_hf(c) -> GPTConfig:
    """Our GPTConfig for a transformers GPTNeoXConfig."""
    name = type(c).__name__
    activation = _ACTIVATIONS.get(c.hidden_act)
    if activation is None:
        raise ValueError(
            f"{name}.hidden_act={c.hidden_act!r} is not supported; allowed: {sorted(_ACTIVATIONS)}."
        )
    if not c.attention_bias:  # the MLP's layers have biases whatever it says: ours are all or none
        raise ValueError(
            f"{name}.attention_bias=False is not supported: gpt_ft's GPT-NeoX blocks have biases on every "
            "linear layer, as its MLP has."
        )
    theta, scaling, rotary = rope_from_hf(c, c.hidden_size // c.num_attention_heads)
    return GPTConfig(
        vocab_size=c.vocab_size,
        n_positions=c.max_position_embeddings,
        n_embd=c.hidden_size,
        n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads,
        n_inner=c.intermediate_size,
        pre_ln=True,
        norm="layernorm",
        positions="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        rotary_dim=rotary,
        parallel_residual=bool(c.use_parallel_residual),
        activation=activation,
        bias=True,
        tie_embeddings=bool(c.tie_word_embeddings),
        embd_pdrop=float(c.hidden_dropout),  # its one hidden_dropout: the embeddings' and each branch's
        attn_pdrop=float(c.attention_dropout),
        resid_pdrop=float(c.hidden_dropout),
        layer_norm_epsilon=c.layer_norm_eps,
        initializer_range=c.initializer_range,
        hf_model_type="gpt_neox",
        hf_token_ids=token_ids_from_hf(c),
    )


def config_to_hf(config: GPTConfig):
    """The transformers GPTNeoXConfig of a GPT-NeoX-shaped GPTConfig (hidden_dropout: resid_pdrop)."""
    from transformers import GPTNeoXConfig

    wanted = dict(pre_ln=True, norm="layernorm", positions="rope", gated_mlp=False, bias=True, qk_norm=False,
                  post_norms=False, scale_embeddings=False, query_pre_attn_scalar=None, sliding_window=None,
                  rope_local_theta=None, nope_layers=None, input_norms=True)  # fmt: skip
    differ = {k: getattr(config, k) for k, v in wanted.items() if getattr(config, k) != v}
    shapes = dict(qkv_bias=config.qkv_bias is False, n_kv_head=config.kv_heads != config.n_head,
                  head_size=config.head_dim * config.n_head != config.n_embd)  # fmt: skip
    differ.update({k: getattr(config, k) for k, wrong in shapes.items() if wrong})
    if differ:
        raise ValueError(
            f"transformers' gpt_neox models need {wanted}, biases on q/k/v, one key/value head per head and "
            f"heads n_embd / n_head wide; this model has {differ}."
        )
    return GPTNeoXConfig(
        vocab_size=config.hf_vocab_size,
        hidden_size=config.n_embd,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        intermediate_size=config.ffn_dim,
        hidden_act=_WRITTEN[config.activation],
        attention_dropout=config.attn_pdrop,
        hidden_dropout=config.resid_pdrop,
        max_position_embeddings=config.n_positions,
        initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_epsilon,
        use_parallel_residual=config.parallel_residual,
        tie_word_embeddings=config.tie_embeddings,
        attention_bias=True,
        rope_parameters=rope_to_hf(config, partial=True),
        **token_ids_to_hf(config),
    )


def _by_kind(t: Tensor, n_head: int, theirs: bool) -> Tensor:
    """query_key_value's rows (or bias) head by head [q0 k0 v0 q1 ...] (`theirs`) as ours [q k v], or back."""
    rest = t.shape[1:]
    first = (n_head, 3) if theirs else (3, n_head)
    return t.reshape(*first, -1, *rest).transpose(0, 1).reshape(t.shape)


def state_dict_from_hf(hf_state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Our state dict from a transformers GPT-NeoX one (GPTNeoXForCausalLM's, a released folder's with
    `embed_out`, or GPTNeoXModel's without the `gpt_neox.` prefix)."""
    base = not any(key.startswith(("gpt_neox.", *_HEADS)) for key in hf_state)  # GPTNeoXModel's: no head
    out: dict[str, Tensor] = {}
    for key, value in hf_state.items():
        key = "gpt_neox." + key if base else key
        if _BUFFERS.match(key):
            continue
        if key in _HEADS:
            if not config.tie_embeddings:
                out["lm_head.weight"] = value
            elif "gpt_neox.embed_in.weight" not in hf_state:  # the tied pair saved under the head's name
                out["wte.weight"] = value
            else:
                refuse_untied(value, hf_state["gpt_neox.embed_in.weight"])
        elif key == "gpt_neox.embed_in.weight":
            out["wte.weight"] = value
        elif key.startswith("gpt_neox.final_layer_norm."):
            out["ln_f." + key.rsplit(".", 1)[1]] = value
        elif (m := _LAYER_KEY.match(key)) and int(m[1]) < config.n_layer and m[2] in _LAYER_NAMES:
            layer, name, kind = m.groups()
            ours = _LAYER_NAMES[name]
            out[f"h.{layer}.{ours}.{kind}"] = (
                _by_kind(value, config.n_head, True) if ours == "attn.c_attn" else value
            )
        else:
            out[key] = value  # unknown, or a layer the config does not have: load_state_dict names it
    if not config.tie_embeddings and "lm_head.weight" not in out and not base:
        raise ValueError(
            "embed_out.weight is missing, and the config says the head is untied (tie_word_embeddings)."
        )
    return out


def state_dict_to_hf(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """GPTNeoXForCausalLM's state dict from ours (inverse of `state_dict_from_hf`)."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key == "wte.weight":
            out["gpt_neox.embed_in.weight"] = value
        elif key.startswith("ln_f."):
            out["gpt_neox.final_layer_norm." + key.removeprefix("ln_f.")] = value
        elif key == "lm_head.weight":
            out[key] = value
        else:
            _, layer, rest = key.split(".", 2)
            name, kind = rest.rsplit(".", 1)
            value = _by_kind(value, config.n_head, False) if name == "attn.c_attn" else value
            out[f"gpt_neox.layers.{layer}.{_OURS[name]}.{kind}"] = value
    if config.tie_embeddings:
        out["lm_head.weight"] = state["wte.weight"]
    return out


def causal_lm_class(model_type: str):
    from transformers import GPTNeoXForCausalLM

    return GPTNeoXForCausalLM
