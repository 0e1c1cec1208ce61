"""Llama-family weights to and from `transformers`: LlamaForCausalLM, Qwen2ForCausalLM and
MistralForCausalLM (SmolLM/SmolLM2, TinyLlama, Qwen2.5, Llama 3.x, Mistral checkpoints).

Their blocks are ours with Llama's switches on (see `GPTConfig`); the names differ, and two groups
of their matrices are one of ours: q/k/v stacked into `attn.c_attn`, gate/up into `mlp.c_fc`.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from gpt_ft.model.config import GPTConfig

MODEL_TYPES = ("llama", "qwen2", "mistral")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
# theirs (after "model.layers.N.") -> ours (after "h.N.")
_LAYER_NAMES = {
    "input_layernorm": "ln_1",
    "post_attention_layernorm": "ln_2",
    "self_attn.o_proj": "attn.c_proj",
    "mlp.down_proj": "mlp.c_proj",
}
_STACKED = {"attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj")}  # fmt: skip
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def is_llama_style(config: GPTConfig) -> bool:
    return config.norm == "rmsnorm" or config.positions == "rope" or config.gated_mlp


def config_from_hf(c) -> GPTConfig:
    """Our GPTConfig for a transformers LlamaConfig, Qwen2Config or MistralConfig."""
    model_type = c.model_type
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise ValueError(
            f"{type(c).__name__} has head_dim={head_dim} with {c.num_attention_heads} heads of a "
            f"{c.hidden_size}-wide model; only head_dim = hidden_size / num_attention_heads is supported."
        )
    activation = _ACTIVATIONS.get(c.hidden_act)
    if activation is None:
        raise ValueError(
            f"{type(c).__name__}.hidden_act={c.hidden_act!r} is not supported; "
            f"allowed: {sorted(_ACTIVATIONS)}."
        )
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    theta = params.pop("rope_theta", getattr(c, "rope_theta", 10000.0))
    scaling = None if params.get("rope_type", params.get("type", "default")) == "default" else params
    if model_type == "qwen2":  # biases on q, k and v only
        bias, qkv_bias = False, True
    elif model_type == "llama":
        bias, qkv_bias = bool(c.attention_bias), None
        if bool(getattr(c, "mlp_bias", False)) != bias:
            raise ValueError(
                f"LlamaConfig with attention_bias={c.attention_bias} and mlp_bias={c.mlp_bias} is not "
                "supported; both must be equal."
            )
    else:
        bias, qkv_bias = False, None
    context = c.max_position_embeddings
    window = getattr(c, "sliding_window", None)
    if window and (model_type == "mistral" or getattr(c, "use_sliding_window", False)):
        # Within one window, sliding-window attention is full causal attention: the window is the context.
        context = min(context, window)
    return GPTConfig(
        vocab_size=c.vocab_size,
        n_positions=context,
        n_embd=c.hidden_size,
        n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads,
        n_kv_head=c.num_key_value_heads,
        n_inner=c.intermediate_size,
        pre_ln=True,
        norm="rmsnorm",
        positions="rope",
        rope_theta=float(theta),
        rope_scaling=scaling,
        activation=activation,
        gated_mlp=True,
        bias=bias,
        qkv_bias=qkv_bias,
        tie_embeddings=bool(c.tie_word_embeddings),
        embd_pdrop=0.0,
        attn_pdrop=float(getattr(c, "attention_dropout", 0.0)),
        resid_pdrop=0.0,
        layer_norm_epsilon=c.rms_norm_eps,
        initializer_range=c.initializer_range,
        hf_model_type=model_type,
    )


def model_type_of(config: GPTConfig) -> str:
    """The transformers model type these weights export to."""
    if config.hf_model_type in MODEL_TYPES:
        return config.hf_model_type
    return "qwen2" if config.qkv_bias and not config.bias else "llama"


def config_to_hf(config: GPTConfig):
    """The transformers config of a Llama-style GPTConfig (Llama, Qwen2 or Mistral)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    wanted = dict(pre_ln=True, norm="rmsnorm", positions="rope", gated_mlp=True)
    differ = {k: getattr(config, k) for k, v in wanted.items() if getattr(config, k) != v}
    if differ:
        raise ValueError(f"transformers' Llama-family models need {wanted}; this model has {differ}.")
    model_type = model_type_of(config)
    expected_qkv = {"llama": None, "mistral": None, "qwen2": True}[model_type]
    if config.qkv_bias not in (expected_qkv, config.bias) or (model_type != "llama" and config.bias):
        raise ValueError(
            f"A {model_type} model has {'biases on q/k/v only' if model_type == 'qwen2' else 'no biases'}; "
            f"this model has bias={config.bias}, qkv_bias={config.qkv_bias}."
        )
    activation = {v: k for k, v in reversed(_ACTIVATIONS.items())}[config.activation]
    common = dict(
        vocab_size=config.hf_vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.kv_heads,
        hidden_act=activation,
        max_position_embeddings=config.n_positions,
        rms_norm_eps=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=config.attn_pdrop,
        rope_theta=config.rope_theta,
        rope_scaling=dict(config.rope_scaling) if config.rope_scaling else None,  # transformers edits it
    )
    if model_type == "llama":
        return LlamaConfig(**common, attention_bias=config.bias, mlp_bias=config.bias)
    if model_type == "mistral":
        return MistralConfig(**common, sliding_window=None)
    return Qwen2Config(**common)


def state_dict_from_hf(hf_state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Our state dict from a transformers Llama-family one (base or causal-LM model)."""
    out: dict[str, Tensor] = {}
    stacked: dict[str, dict[str, Tensor]] = {}
    for key, value in hf_state.items():
        if not key.startswith(("model.", "lm_head.")):
            key = "model." + key  # a base model's keys
        if key.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from the config
        if key == "lm_head.weight":
            if not config.tie_embeddings:
                out["lm_head.weight"] = value
            continue
        if key == "model.embed_tokens.weight":
            out["wte.weight"] = value
        elif key == "model.norm.weight":
            out["ln_f.weight"] = value
        elif m := _LAYER_KEY.match(key):
            layer, name, kind = m.groups()
            ours = _LAYER_NAMES.get(name)
            for group, parts in _STACKED.items():
                if name in parts:
                    stacked.setdefault(f"h.{layer}.{group}.{kind}", {})[name] = value
                    break
            else:
                out[f"h.{layer}.{ours or name}.{kind}"] = value
        else:
            out[key] = value  # unknown: load_state_dict names it
    if not config.tie_embeddings and "lm_head.weight" not in out and "wte.weight" in out:
        # a base model (LlamaModel, ...): a fresh head, as transformers gives its *ForCausalLM
        seeded = torch.Generator().manual_seed(0)
        head = torch.randn(out["wte.weight"].shape, generator=seeded, dtype=out["wte.weight"].dtype)
        out["lm_head.weight"] = head * config.initializer_range
    for key, parts in stacked.items():
        group = key.split(".", 2)[2].rsplit(".", 1)[0]
        names = _STACKED[group]
        if set(parts) != set(names):
            raise ValueError(f"{key.rsplit('.', 1)[0]} needs {names} but the weights have {sorted(parts)}.")
        out[key] = torch.cat([parts[n] for n in names], dim=0)
    return out


def state_dict_to_hf(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """A transformers causal-LM state dict from ours (inverse of `state_dict_from_hf`)."""
    hs = config.head_dim
    sizes = {"attn.c_attn": [config.n_head * hs, config.kv_heads * hs, config.kv_heads * hs],
             "mlp.c_fc": [config.ffn_dim, config.ffn_dim]}  # fmt: skip
    ours_to_theirs = {v: k for k, v in _LAYER_NAMES.items()}
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key == "wte.weight":
            out["model.embed_tokens.weight"] = value
        elif key == "ln_f.weight":
            out["model.norm.weight"] = value
        elif key == "lm_head.weight":
            out[key] = value
        else:
            _, layer, rest = key.split(".", 2)
            name, kind = rest.rsplit(".", 1)
            prefix = f"model.layers.{layer}."
            if name in _STACKED:
                for part, piece in zip(_STACKED[name], value.split(sizes[name], dim=0), strict=True):
                    out[f"{prefix}{part}.{kind}"] = piece
            else:
                out[f"{prefix}{ours_to_theirs[name]}.{kind}"] = value
    if config.tie_embeddings:
        out["lm_head.weight"] = state["wte.weight"]
    return out


def causal_lm_class(model_type: str):
    from transformers import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM

    return {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "mistral": MistralForCausalLM}[model_type]
