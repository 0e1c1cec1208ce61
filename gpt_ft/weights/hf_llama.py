"""Llama-family weights to and from `transformers`: LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, MistralForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM, SmolLM3ForCausalLM,
Olmo2ForCausalLM and Olmo3ForCausalLM (SmolLM/SmolLM2, TinyLlama, Qwen2.5, Qwen3, Llama 3.x, Mistral,
Phi-3, Gemma 3 text, SmolLM3, OLMo 2 and OLMo 3 checkpoints).

Their blocks are ours with Llama's switches on (see `GPTConfig`); the names differ, and two groups
of their matrices are one of ours: q/k/v stacked into `attn.c_attn`, gate/up into `mlp.c_fc`
(Phi-3 stores them stacked already). Gemma 3 and OLMo call their norm after attention
`post_attention_layernorm`, the name Llama gives the norm before the MLP.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from gpt_ft.model.config import GPTConfig
from gpt_ft.weights.hf_rope import rope_from_hf, rope_to_hf

MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text", "smollm3", "olmo2", "olmo3")
_CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral", "phi3": "Phi3",
            "gemma3_text": "Gemma3", "smollm3": "SmolLM3", "olmo2": "Olmo2", "olmo3": "Olmo3"}  # fmt: skip
_OLMO = ("olmo2", "olmo3")  # no input norms, post-norms, RMSNorm over all heads' queries and keys
_PER_TYPE_ROPE = ("gemma3_text", "olmo3")  # rope_parameters per layer type
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu"}  # fmt: skip
# theirs (after "model.layers.N.") -> ours (after "h.N.")
_LAYER_NAMES = {
    "input_layernorm": "ln_1",
    "post_attention_layernorm": "ln_2",
    "self_attn.o_proj": "attn.c_proj",
    "mlp.down_proj": "mlp.c_proj",
    "self_attn.q_norm": "attn.q_norm",
    "self_attn.k_norm": "attn.k_norm",
    "self_attn.qkv_proj": "attn.c_attn",  # Phi-3
    "mlp.gate_up_proj": "mlp.c_fc",
}
_GEMMA_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "ln_2",
    "post_feedforward_layernorm": "post_mlp_norm",
}
_STACKED = {"attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj")}  # fmt: skip


_FUSED = ("self_attn.qkv_proj", "mlp.gate_up_proj")


def _layer_names(config: GPTConfig) -> dict[str, str]:
    return _GEMMA_NAMES if config.post_norms else _LAYER_NAMES


_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def token_ids_from_hf(c) -> dict | None:
    """A transformers config's bos/eos/pad ids (`GPTConfig.hf_token_ids`); None when it has none."""
    ids = {kind: getattr(c, f"{kind}_token_id", None) for kind in ("bos", "eos", "pad")}
    return ids if any(i is not None for i in ids.values()) else None


def with_stops(eos, more) -> int | list[int] | None:
    """A config's `eos_token_id` (an id, a list or None) with the ids in `more` after it, each once:
    the end-of-turn tokens a model lists elsewhere (generation_config.json, a GGUF file's eot/eom)."""
    before = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    ids = list(dict.fromkeys([*before, *(int(i) for i in more if i is not None)]))
    return eos if ids == before else ids[0] if len(ids) == 1 else ids


def token_ids_to_hf(config: GPTConfig) -> dict:
    """The `*_token_id` arguments of a transformers config: the source's ids, or None each."""
    ids = config.hf_token_ids or {}
    return {f"{kind}_token_id": ids.get(kind) for kind in ("bos", "eos", "pad")}


def is_llama_style(config: GPTConfig) -> bool:
    return config.norm != "layernorm" or config.positions == "rope" or config.gated_mlp


def config_from_hf(c) -> GPTConfig:
    """Our GPTConfig for a transformers Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 3 text, SmolLM3,
    OLMo 2 or OLMo 3 config."""
    model_type, name = c.model_type, type(c).__name__
    activation_field = "hidden_activation" if model_type == "gemma3_text" else "hidden_act"
    activation = _ACTIVATIONS.get(getattr(c, activation_field))
    if activation is None:
        raise ValueError(
            f"{name}.{activation_field}={getattr(c, activation_field)!r} is not supported; "
            f"allowed: {sorted(_ACTIVATIONS)}."
        )
    for field, fine in (("final_logit_softcapping", None), ("attn_logit_softcapping", None),
                        ("use_bidirectional_attention", False)):  # fmt: skip
        if getattr(c, field, fine) not in (fine, False):
            raise ValueError(f"{name}.{field}={getattr(c, field)!r} is not supported; it must be {fine}.")
    per_type = model_type in _PER_TYPE_ROPE
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope_theta, rope_scaling, rotary_dim = rope_from_hf(c, head_dim, "full_attention" if per_type else None)
    local_theta = rope_from_hf(c, head_dim, "sliding_attention")[0] if per_type else None
    if rotary_dim is not None and model_type != "phi3":  # (transformers' attention would not run)
        raise ValueError(f"{name}.partial_rotary_factor must be 1.0: transformers' {model_type} models "
                         "rotate the whole head (Phi-3's and GPT-NeoX's rotate part of it).")  # fmt: skip
    if model_type == "olmo3" and local_theta == rope_theta and rope_scaling is None:
        local_theta = None  # (one rotary base, unscaled: the full layers')
    if model_type == "qwen2":  # biases on q, k and v only
        bias, qkv_bias = False, True
    elif model_type in ("llama", "smollm3"):
        bias, qkv_bias = bool(c.attention_bias), None
        if bool(getattr(c, "mlp_bias", False)) != bias:
            raise ValueError(
                f"{name} with attention_bias={c.attention_bias} and mlp_bias={c.mlp_bias} is not "
                "supported; both must be equal."
            )
    else:
        bias, qkv_bias = False, None
        if getattr(c, "attention_bias", False):
            raise ValueError(
                f"{name}.attention_bias=True is not supported: gpt_ft reads {model_type} models without "
                "biases (as they are released)."
            )
    # What transformers' class of the family reads: Llama and OLMo 2 no window (a `sliding_window` key
    # in its config is left unread), Mistral and Phi-3 one for every layer (their `layer_types` unread),
    # SmolLM3 its `layer_types` and `sliding_window` whatever its `use_sliding_window` says.
    window = getattr(c, "sliding_window", None) if model_type not in ("llama", "olmo2") else None
    layered = model_type in ("qwen2", "qwen3", "gemma3_text", "smollm3", "olmo3")
    layer_types = list(getattr(c, "layer_types", None) or []) or None if layered else None
    if model_type == "qwen2" and not getattr(c, "use_sliding_window", False):
        window = None
    if window is None or (layer_types and "sliding_attention" not in layer_types):
        window, layer_types = None, None
    elif layer_types and "full_attention" not in layer_types:
        layer_types = None  # every layer slides
    gemma, olmo, nope = model_type == "gemma3_text", model_type in _OLMO, []
    if model_type == "smollm3":  # its no_rope_layers: 1 where a layer takes rotary positions, 0 where not
        nope = [i for i, r in enumerate(c.no_rope_layers[: c.num_hidden_layers]) if not r]
    return GPTConfig(
        vocab_size=c.vocab_size,
        n_positions=c.max_position_embeddings,
        n_embd=c.hidden_size,
        n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads,
        n_kv_head=c.num_key_value_heads,
        head_size=None if head_dim * c.num_attention_heads == c.hidden_size else head_dim,
        n_inner=c.intermediate_size,
        pre_ln=True,
        norm="gemma_rmsnorm" if gemma else "rmsnorm_fp32" if olmo else "rmsnorm",
        qk_norm=model_type in ("qwen3", "gemma3_text", *_OLMO),
        qk_norm_span="all_heads" if olmo else "head",
        input_norms=not olmo,
        post_norms=gemma or olmo,
        scale_embeddings=gemma,
        query_pre_attn_scalar=int(c.query_pre_attn_scalar) if gemma else None,
        positions="rope",
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rope_local_theta=local_theta,
        nope_layers=nope or None,
        rotary_dim=rotary_dim,
        sliding_window=window,
        layer_types=layer_types,
        activation=activation,
        gated_mlp=True,
        bias=bias,
        qkv_bias=qkv_bias,
        tie_embeddings=bool(c.tie_word_embeddings),
        embd_pdrop=0.0,  # none of these classes drops embeddings (Phi-3's config's embd_pdrop is unread)
        attn_pdrop=float(getattr(c, "attention_dropout", 0.0) or 0.0),
        resid_pdrop=float(getattr(c, "resid_pdrop", 0.0)),
        layer_norm_epsilon=c.rms_norm_eps,
        initializer_range=c.initializer_range,
        hf_model_type=model_type,
        hf_token_ids=token_ids_from_hf(c),
    )


def model_type_of(config: GPTConfig) -> str:
    """The transformers model type these weights export to."""
    if config.hf_model_type in MODEL_TYPES:
        return config.hf_model_type
    if config.nope_layers:
        return "smollm3"
    if not config.input_norms or config.qk_norm_span == "all_heads" or config.norm == "rmsnorm_fp32":
        return "olmo2" if config.sliding_window is None else "olmo3"
    if config.post_norms or config.norm == "gemma_rmsnorm":
        return "gemma3_text"
    if config.qk_norm:
        return "qwen3"
    if config.qkv_bias and not config.bias:
        return "qwen2"
    if config.rotary_dim is not None:  # (the one family here that rotates part of each head)
        return "phi3"
    windowed = config.sliding_window is not None and not config.bias  # Llama has no window, Mistral no bias
    return "mistral" if windowed else "llama"


def config_to_hf(config: GPTConfig):
    """The transformers config of a Llama-style GPTConfig (Llama, Qwen2, Qwen3, Mistral, Phi-3,
    Gemma 3, SmolLM3, OLMo 2 or OLMo 3)."""
    import transformers

    model_type = model_type_of(config)
    gemma, olmo, per_type = model_type == "gemma3_text", model_type in _OLMO, model_type in _PER_TYPE_ROPE
    norm = "gemma_rmsnorm" if gemma else "rmsnorm_fp32" if olmo else "rmsnorm"
    wanted = dict(pre_ln=True, positions="rope", gated_mlp=True, norm=norm, input_norms=not olmo,
                  qk_norm=model_type in ("qwen3", "gemma3_text", *_OLMO), post_norms=gemma or olmo,
                  qk_norm_span="all_heads" if olmo else "head", scale_embeddings=gemma,
                  parallel_residual=False)  # fmt: skip
    if model_type != "phi3":  # (Phi-3 rotates part of each head, or all)
        wanted["rotary_dim"] = None
    differ = {k: getattr(config, k) for k, v in wanted.items() if getattr(config, k) != v}
    if differ:
        raise ValueError(f"transformers' {model_type} models need {wanted}; this model has {differ}.")
    expected_qkv = {"qwen2": True}.get(model_type)
    biased = model_type in ("llama", "smollm3")
    if config.qkv_bias not in (expected_qkv, config.bias) or (not biased and config.bias):
        raise ValueError(
            f"A {model_type} model has {'biases on q/k/v only' if model_type == 'qwen2' else 'no biases'}; "
            f"this model has bias={config.bias}, qkv_bias={config.qkv_bias}."
        )
    activation = {v: k for k, v in reversed(_ACTIVATIONS.items())}[config.activation]
    if config.rope_local_theta is not None and not per_type:
        raise ValueError(f"transformers' {model_type} models have one rotary base; rope_local_theta "
                         "must be None.")  # fmt: skip
    if config.nope_layers and model_type != "smollm3":
        raise ValueError(f"transformers' {model_type} models give every layer rotary positions; "
                         "nope_layers must be None.")  # fmt: skip
    if config.query_pre_attn_scalar is not None and not gemma:
        raise ValueError(f"transformers' {model_type} models scale attention by the head size; "
                         "query_pre_attn_scalar must be None.")  # fmt: skip
    rope = rope_to_hf(config)
    common = dict(
        vocab_size=config.hf_vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.n_positions,
        rms_norm_eps=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=config.attn_pdrop,
        rope_parameters=rope,
        **token_ids_to_hf(config),
    )
    if config.head_size is not None or model_type in ("qwen3", "gemma3_text"):  # else: hidden / heads
        common["head_dim"] = config.head_dim
    layers = config.layer_types or [
        "sliding_attention" if config.is_sliding(i) else "full_attention" for i in range(config.n_layer)
    ]
    # transformers' Gemma 3 and OLMo 3 need a window even where no layer slides (none then reads it).
    window = dict(sliding_window=config.sliding_window or (config.n_positions if per_type else None),
                  layer_types=layers)  # fmt: skip
    if model_type in ("llama", "mistral", "phi3") and len(set(layers)) > 1:
        raise ValueError(f"transformers' {model_type} models slide in every layer or none; layer_types must "
                         "be all one type.")  # fmt: skip
    if model_type in ("llama", "olmo2") and config.sliding_window:  # (every other family has one)
        raise ValueError(f"transformers' {model_type} models have no sliding window; sliding_window "
                         "must be None.")  # fmt: skip
    cls = getattr(transformers, _CLASSES[model_type] + ("TextConfig" if gemma else "Config"))
    if model_type == "llama":
        return cls(**common, hidden_act=activation, attention_bias=config.bias, mlp_bias=config.bias)
    if model_type in ("mistral", "phi3"):
        extra = dict(resid_pdrop=config.resid_pdrop, embd_pdrop=config.embd_pdrop)
        if model_type == "phi3" and config.rope_type not in ("default", "longrope"):
            raise ValueError("transformers' Phi-3 scales its rotary positions by LongRoPE alone; "
                             f"rope_scaling type {config.rope_type!r} is not it.")  # fmt: skip
        if model_type == "phi3" and config.rope_type == "longrope":  # (Phi3Config's own field wins over ours)
            extra["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
        return cls(**common, hidden_act=activation, sliding_window=config.sliding_window,
                   **(extra if model_type == "phi3" else {}))  # fmt: skip
    if model_type == "olmo2":
        return cls(**common, hidden_act=activation)
    if per_type:
        local = {"rope_type": "default", "rope_theta": config.rope_local_theta or config.rope_theta}
        if config.rope_local_theta is None and config.rope_scaling:
            raise ValueError(f"transformers' {model_type} models leave the sliding layers' rotary positions "
                             "unscaled; give rope_local_theta.")  # fmt: skip
        if rope.get("truncate") is False:  # (read from the outer dict of the layer types' there: true)
            raise ValueError(f"transformers' {model_type} models truncate YaRN's ramp; rope_scaling truncate "
                             "must be true.")  # fmt: skip
        common["rope_parameters"] = {"full_attention": rope, "sliding_attention": local}
    if olmo:
        return cls(**common, **window, hidden_act=activation)
    if gemma:
        return cls(**common, **window, hidden_activation=activation,
                   query_pre_attn_scalar=config.query_pre_attn_scalar or config.head_dim)  # fmt: skip
    use_window = config.sliding_window is not None
    if model_type == "smollm3":
        common.update(no_rope_layers=[int(config.rotates(i)) for i in range(config.n_layer)],
                      attention_bias=config.bias, mlp_bias=config.bias)  # fmt: skip
    return cls(**common, **window, hidden_act=activation, use_sliding_window=use_window)


def refuse_untied(head: Tensor, embedding: Tensor) -> None:
    """A head the config ties to the token embedding must be that embedding (transformers would keep
    both, and its logits would not be the tied model's)."""
    if not torch.equal(head, embedding):
        raise ValueError(
            "The model's lm_head differs from its token embedding, which its config ties "
            "(tie_word_embeddings)."
        )


def state_dict_from_hf(hf_state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Our state dict from a transformers Llama-family one (base or causal-LM model)."""
    out: dict[str, Tensor] = {}
    stacked: dict[str, dict[str, Tensor]] = {}
    names = _layer_names(config)
    base = not any(key.startswith(("model.", "lm_head.")) for key in hf_state)  # LlamaModel's: no head
    for key, value in hf_state.items():
        if base:
            key = "model." + key
        if key.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from the config
        if key == "lm_head.weight":
            if not config.tie_embeddings:
                out["lm_head.weight"] = value
            elif "model.embed_tokens.weight" not in hf_state:  # the tied pair saved under the head's name
                out["wte.weight"] = value
            else:
                refuse_untied(value, hf_state["model.embed_tokens.weight"])
            continue
        if key == "model.embed_tokens.weight":
            out["wte.weight"] = value
        elif key == "model.norm.weight":
            out["ln_f.weight"] = value
        elif (m := _LAYER_KEY.match(key)) and int(m[1]) >= config.n_layer:
            out[key] = value  # a layer the config does not have: load_state_dict names it unexpected
        elif m:
            layer, name, kind = m.groups()
            ours = names.get(name)
            for group, parts in _STACKED.items():
                if name in parts:
                    stacked.setdefault(f"h.{layer}.{group}.{kind}", {})[name] = value
                    break
            else:
                out[f"h.{layer}.{ours or name}.{kind}"] = value
        else:
            out[key] = value  # unknown: load_state_dict names it
    if not config.tie_embeddings and "lm_head.weight" not in out and not base:
        raise ValueError(
            "lm_head.weight is missing, and the config says the head is untied (tie_word_embeddings)."
        )
    # (a base model, LlamaModel, ...: `pretrained.build` makes its head afresh)
    for key, parts in stacked.items():
        group = key.split(".", 2)[2].rsplit(".", 1)[0]
        names = _STACKED[group]
        if set(parts) != set(names):
            raise ValueError(f"{key.rsplit('.', 1)[0]} needs {names} but the weights have {sorted(parts)}.")
        layer, kind = key.split(".")[1], key.rsplit(".", 1)[1]
        across = (config.n_embd,) if kind == "weight" else ()  # (stacked by rows: each as wide as the model)
        if wrong := next((n for n in names if tuple(parts[n].shape[1:]) != across), None):
            raise ValueError(
                f"model.layers.{layer}.{wrong}.{kind} has shape {list(parts[wrong].shape)}, not "
                f"[*{''.join(f', {w}' for w in across)}] as the config's width (hidden_size) says."
            )
        out[key] = torch.cat([parts[n] for n in names], dim=0)
    return out


def state_dict_to_hf(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """A transformers causal-LM state dict from ours (inverse of `state_dict_from_hf`)."""
    hs = config.head_dim
    sizes = {"attn.c_attn": [config.n_head * hs, config.kv_heads * hs, config.kv_heads * hs],
             "mlp.c_fc": [config.ffn_dim, config.ffn_dim]}  # fmt: skip
    fused = model_type_of(config) == "phi3"  # q/k/v and gate/up stay stacked, as ours
    ours_to_theirs = {v: k for k, v in _layer_names(config).items() if fused or k not in _FUSED}
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
            if name in _STACKED and not fused:
                for part, piece in zip(_STACKED[name], value.split(sizes[name], dim=0), strict=True):
                    out[f"{prefix}{part}.{kind}"] = piece
            else:
                out[f"{prefix}{ours_to_theirs[name]}.{kind}"] = value
    if config.tie_embeddings:
        out["lm_head.weight"] = state["wte.weight"]
    return out


def causal_lm_class(model_type: str):
    import transformers

    return getattr(transformers, _CLASSES[model_type] + "ForCausalLM")
