"""Weights to and from `transformers`: OpenAIGPT* (GPT-1), GPT2*, the Llama family (Llama,
Qwen2, Qwen3, Mistral, Phi-3, Gemma 3, SmolLM3, OLMo 2, OLMo 3; see `hf_llama.py`) and GPT-NeoX (Pythia; see
`hf_neox.py`), as model instances or local directories.

Our module names are GPT-2's, so GPT conversion is a name map (GPT-1 spells two embeddings
differently) plus a transpose list (transformers keeps these layers as `Conv1D`, weight (in, out)).
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor

from gpt_ft.model.config import GPTConfig
from gpt_ft.model.gpt import GPT
from gpt_ft.weights import hf_llama, hf_neox
from gpt_ft.weights.checkpoint import UNSAFE
from gpt_ft.weights.state_checks import check_sizes
from gpt_ft.workarounds.kernels import import_transformers_models

# HF name -> ours, for the GPT-1 family (GPT-2's names are ours already).
_OPENAI_NAMES = {"tokens_embed.": "wte.", "positions_embed.": "wpe."}
# Conv1D weights, stored (in, out) by transformers and (out, in) by nn.Linear.
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

# transformers activation names -> ours. GPT-1's `afn="gelu"` is the tanh form in transformers.
_OPENAI_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
_GPT2_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def _family(hf_config) -> str:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in ("openai-gpt", "gpt2", *hf_llama.MODEL_TYPES, *hf_neox.MODEL_TYPES):
        raise ValueError(
            f"Cannot convert a transformers model of type {model_type!r}; allowed: 'openai-gpt' "
            "(OpenAIGPTModel, OpenAIGPTLMHeadModel), 'gpt2' (GPT2Model, GPT2LMHeadModel), and "
            f"{', '.join(map(repr, hf_llama.MODEL_TYPES + hf_neox.MODEL_TYPES))} (their *Model and "
            "*ForCausalLM)."
        )
    return model_type


def config_from_hf(hf_config) -> GPTConfig:
    """Our GPTConfig for a transformers OpenAIGPTConfig, GPT2Config, a Llama-family config (Llama,
    Qwen2, Qwen3, Mistral, Phi-3, Gemma 3 text, SmolLM3, OLMo 2, OLMo 3) or a GPTNeoXConfig."""
    family = _family(hf_config)
    if family in hf_neox.MODEL_TYPES:
        return hf_neox.config_from_hf(hf_config)
    if family in hf_llama.MODEL_TYPES:
        return hf_llama.config_from_hf(hf_config)
    if family == "openai-gpt":
        activation = _OPENAI_ACTIVATIONS.get(hf_config.afn)
        if activation is None:
            raise ValueError(
                f"OpenAIGPTConfig.afn={hf_config.afn!r} is not supported; "
                f"allowed: {sorted(_OPENAI_ACTIVATIONS)}."
            )
        n_inner, pre_ln = None, False
    else:
        activation = _GPT2_ACTIVATIONS.get(hf_config.activation_function)
        if activation is None:
            raise ValueError(
                f"GPT2Config.activation_function={hf_config.activation_function!r} is not supported; "
                f"allowed: {sorted(_GPT2_ACTIVATIONS)}."
            )
        for flag, wanted in (
            ("scale_attn_weights", True),
            ("scale_attn_by_inverse_layer_idx", False),
            ("add_cross_attention", False),
        ):
            if getattr(hf_config, flag, wanted) != wanted:
                raise ValueError(
                    f"GPT2Config.{flag}={not wanted} is not supported; GPT-2 uses {flag}={wanted}."
                )
        n_inner, pre_ln = hf_config.n_inner, True
    return GPTConfig(
        vocab_size=hf_config.vocab_size,
        n_positions=hf_config.n_positions,
        n_embd=hf_config.n_embd,
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        n_inner=n_inner,
        pre_ln=pre_ln,
        activation=activation,
        embd_pdrop=hf_config.embd_pdrop,
        attn_pdrop=hf_config.attn_pdrop,
        resid_pdrop=hf_config.resid_pdrop,
        layer_norm_epsilon=hf_config.layer_norm_epsilon,
        initializer_range=hf_config.initializer_range,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        hf_token_ids=hf_llama.token_ids_from_hf(hf_config),
    )


def has_double_heads(config: GPTConfig) -> bool:
    """Whether transformers has a `*DoubleHeadsModel` (a choice head beside the LM) for this
    model: GPT-1's and GPT-2's layout, not the Llama family's."""
    return not hf_llama.is_llama_style(config)


def config_to_hf(config: GPTConfig):
    """The transformers config of the same family: OpenAIGPTConfig (post-LN), GPT2Config (pre-LN),
    GPTNeoXConfig (LayerNorm with rotary positions), or for Llama-style blocks that of their family
    (see `hf_llama.config_to_hf`)."""
    from transformers import GPT2Config, OpenAIGPTConfig

    if hf_neox.is_neox(config):
        return hf_neox.config_to_hf(config)
    if hf_llama.is_llama_style(config):
        return hf_llama.config_to_hf(config)
    if not (config.bias and config.qkv_bias in (None, True) and config.kv_heads == config.n_head):
        raise ValueError(
            "transformers' GPT-1 and GPT-2 have biases and one key/value head per head; this model has "
            f"bias={config.bias}, qkv_bias={config.qkv_bias}, n_kv_head={config.n_kv_head}."
        )
    llama_only = dict(
        head_size=config.head_dim != config.n_embd // config.n_head,
        qk_norm=config.qk_norm,
        post_norms=config.post_norms,
        input_norms=not config.input_norms,
        scale_embeddings=config.scale_embeddings,
        sliding_window=config.sliding_window,
        query_pre_attn_scalar=config.query_pre_attn_scalar,
        rotary_dim=config.rotary_dim,
        parallel_residual=config.parallel_residual,
    )
    if any(llama_only.values()):
        on = [name for name, value in llama_only.items() if value]
        raise ValueError(f"transformers' GPT-1 and GPT-2 have none of {on}; this model sets them.")

    common = dict(
        vocab_size=config.hf_vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        embd_pdrop=config.embd_pdrop,
        attn_pdrop=config.attn_pdrop,
        resid_pdrop=config.resid_pdrop,
        layer_norm_epsilon=config.layer_norm_epsilon,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_embeddings,
        **hf_llama.token_ids_to_hf(config),
    )
    if config.pre_ln:
        afn = {v: k for k, v in reversed(_GPT2_ACTIVATIONS.items())}[config.activation]
        return GPT2Config(**common, n_inner=config.n_inner, activation_function=afn)
    if config.activation not in ("gelu_tanh", "relu", "silu") or config.ffn_dim != 4 * config.n_embd:
        raise ValueError(
            "transformers' OpenAIGPT has a 4 * n_embd feed-forward layer and GELU (tanh), ReLU or SiLU; "
            f"this model has n_inner={config.n_inner} and activation={config.activation!r}."
        )
    afn = {"gelu_tanh": "gelu", "relu": "relu", "silu": "silu"}[config.activation]
    return OpenAIGPTConfig(**common, afn=afn)


def state_dict_from_hf(hf_state: dict[str, Tensor], family: str, tied: bool = True) -> dict[str, Tensor]:
    """Our state dict from a transformers one (base or LM-head model; a tied `lm_head` is dropped; a
    double-heads model's multiple-choice head is left, as transformers' causal-LM class leaves it)."""
    head = hf_state.get("lm_head.weight")
    embedding = hf_state.get("transformer.wte.weight", hf_state.get("transformer.tokens_embed.weight"))
    if tied and embedding is None and head is not None:  # the tied pair saved under the head's name alone
        name = "transformer.tokens_embed.weight" if family == "openai-gpt" else "transformer.wte.weight"
        hf_state, embedding = {**hf_state, name: head}, head
    if tied and head is not None and embedding is not None:
        hf_llama.refuse_untied(head, embedding)
    out = {}
    for key, value in hf_state.items():
        key = key.removeprefix("transformer.")
        if (
            (key == "lm_head.weight" and tied)
            or key.endswith((".attn.bias", ".attn.masked_bias"))
            or key == "position_ids"
            or key.startswith("multiple_choice_head.")
        ):
            continue  # the tied head and transformers' causal-mask buffers
        if family == "openai-gpt":
            for theirs, ours in _OPENAI_NAMES.items():
                if key.startswith(theirs):
                    key = ours + key.removeprefix(theirs)
        out[key] = value.t() if key.endswith(_TRANSPOSED) else value
    return out


def state_dict_to_hf(state: dict[str, Tensor], family: str) -> dict[str, Tensor]:
    """A transformers LM-head state dict from ours (inverse of `state_dict_from_hf`)."""
    out = {}
    for key, value in state.items():
        hf_key = key
        if family == "openai-gpt":
            for theirs, ours in _OPENAI_NAMES.items():
                if key.startswith(ours):
                    hf_key = theirs + key.removeprefix(ours)
        if key != "lm_head.weight":
            out["transformer." + hf_key] = value.t() if key.endswith(_TRANSPOSED) else value
    out["lm_head.weight"] = state.get("lm_head.weight", state["wte.weight"])
    return out


def from_hf(hf_model) -> tuple[GPTConfig, dict[str, Tensor], str]:
    """(config, state dict in gpt_ft's names, source) of a transformers model instance of a family
    gpt_ft has (base or LM-head)."""
    config = getattr(hf_model, "config", None)
    if config is None:
        raise ValueError(f"Expected a transformers model instance, got {type(hf_model).__name__}.")
    state = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    return (*convert(config, state), type(hf_model).__name__)


def convert(hf_config, state: dict[str, Tensor]) -> tuple[GPTConfig, dict[str, Tensor]]:
    """A transformers config and its model's state dict in gpt_ft's terms."""
    family = _family(hf_config)
    config = config_from_hf(hf_config)
    if family in hf_neox.MODEL_TYPES:
        ours = hf_neox.state_dict_from_hf(state, config)
    elif family in hf_llama.MODEL_TYPES:
        ours = hf_llama.state_dict_from_hf(state, config)
    else:
        ours = state_dict_from_hf(state, family, config.tie_embeddings)
    for key in ("wte.weight", "lm_head.weight"):  # transformers refuses a table of another size too
        if key in ours and ours[key].shape[0] != hf_config.vocab_size:
            raise ValueError(
                f"config.json's vocab_size {hf_config.vocab_size} does not match the {ours[key].shape[0]} "
                f"rows of the weights' {'token embedding' if key == 'wte.weight' else 'LM head'}."
            )
    return config, ours


def to_hf(gpt: GPT):
    """The matching transformers LM-head model (OpenAIGPTLMHeadModel, GPT2LMHeadModel or the
    family's *ForCausalLM: Llama, Qwen2, Qwen3, Mistral, Phi3, Gemma3, SmolLM3, Olmo2, Olmo3, GPTNeoX),
    same weights."""
    import_transformers_models()
    from transformers import GPT2LMHeadModel, OpenAIGPTLMHeadModel

    if any(name.endswith("lora_A") for name, _ in gpt.named_parameters()):
        raise ValueError(
            "This model has LoRA adapters: fold them in with gpt_ft.model.lora.merge_lora(gpt) first."
        )
    hf_config = config_to_hf(gpt.config)
    family = hf_config.model_type
    state = {k: v.detach().clone() for k, v in gpt.state_dict().items()}
    for key in ("wte.weight", "lm_head.weight"):
        if key in state:
            state[key] = state[key][: gpt.config.hf_vocab_size]  # no padding rows but a released table's
    if family in hf_neox.MODEL_TYPES:
        cls, hf_state = hf_neox.causal_lm_class(family), hf_neox.state_dict_to_hf(state, gpt.config)
    elif family in hf_llama.MODEL_TYPES:
        cls, hf_state = hf_llama.causal_lm_class(family), hf_llama.state_dict_to_hf(state, gpt.config)
    else:
        cls = GPT2LMHeadModel if gpt.config.pre_ln else OpenAIGPTLMHeadModel
        hf_state = state_dict_to_hf(state, family)
    hf_model = cls(hf_config).to(dtype=gpt.wte.weight.dtype, device=gpt.wte.weight.device)
    hf_model.load_state_dict(hf_state, strict=True)
    hf_model.tie_weights()
    return hf_model.eval() if not gpt.training else hf_model


def generation_stops(path: Path) -> list[int]:
    """The end-of-text ids a folder's generation_config.json lists (transformers' `generate` stops at
    each; instruct models list their end-of-turn tokens there); none without one."""
    file = path / "generation_config.json"
    if not file.is_file():
        return []
    try:
        eos = json.loads(file.read_text(encoding="utf-8")).get("eos_token_id")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"{file} is not a JSON object ({exc}).") from None
    ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    return [i for i in ids if isinstance(i, int)]


WEIGHT_FILES = [
    ("model.safetensors", "model.safetensors.index.json"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
]
"""A folder's weights, in the order transformers looks for them: one file, or the shards an index lists."""


def weight_files(path: Path) -> list[Path]:
    """The weights files of a transformers folder that transformers reads: the one file, or exactly the
    shards its index lists (shards of an older save left beside them are not read)."""
    for single, index in WEIGHT_FILES:
        if (path / single).is_file():
            return [path / single]
        if (path / index).is_file():
            try:
                names = sorted(
                    set(json.loads((path / index).read_text(encoding="utf-8"))["weight_map"].values())
                )
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(
                    f"{path / index} is not a weights index with a weight_map ({exc!r})."
                ) from None
            if missing := [name for name in names if not (path / name).is_file()]:
                raise FileNotFoundError(f"{path / index} lists {missing[0]}, which {path} does not hold.")
            return [path / name for name in names]
    shards = sorted(path.glob("model-*.safetensors")) + sorted(path.glob("pytorch_model-*.bin"))
    lacks = f"; its shards ({shards[0].name}, ...) need their index" if shards else ""
    raise FileNotFoundError(f"{path} has no model.safetensors or pytorch_model.bin weights file{lacks}.")


def transformers_config(path: Path):
    """transformers' config of a model folder, or one sentence naming its config.json and what
    transformers refuses in it (huggingface_hub's validators say it over lines, naming no file:
    `num_attention_heads` not dividing the width, a string for a number)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except OSError:
        raise
    except Exception as exc:
        reason = re.sub(r"^\w+: ", "", str(exc).strip().splitlines()[-1].strip()) if str(exc).strip() else ""
        said = f": {reason.rstrip('.')}" if reason else f" ({type(exc).__name__})"
        raise ValueError(f"{Path(path) / 'config.json'}: transformers refuses it{said}.") from None


RAW_SIZES = {"n_layer": ("num_hidden_layers", "n_layer"), "n_embd": ("hidden_size", "n_embd")}
"""gpt_ft's sizes as a transformers config.json names them (Llama's and GPT-NeoX's, GPT-2's)."""


def read_folder(path: Path) -> tuple[GPTConfig, dict[str, Tensor], str]:
    """(config, state dict in gpt_ft's names, source) of a transformers directory (config.json plus
    model.safetensors or pytorch_model.bin), such as a hub id's snapshot.

    Weights are read with safetensors or `torch.load(weights_only=True)`; no code is executed.
    """
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a transformers model directory: it has no config.json.")
    try:  # transformers' own words name neither the line nor, for a type it lacks, what is read here
        fields = json.loads(config_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_file} is not valid JSON ({exc}).") from None
    try:
        _family(SimpleNamespace(model_type=fields.get("model_type") if isinstance(fields, dict) else None))
    except ValueError as exc:
        raise ValueError(f"{config_file}: {exc}") from None
    state: dict[str, Tensor] = {}
    for shard in weight_files(path):  # one file, or the shards its index lists
        try:
            if shard.suffix == ".safetensors":
                from safetensors.torch import load_file

                state.update(load_file(shard))
            else:
                state.update(torch.load(shard, map_location="cpu", weights_only=True))
        except Exception as exc:  # safetensors' and torch's errors for a file cut short or not theirs
            if isinstance(exc, OSError) and exc.filename is not None:
                raise  # unreadable (permissions): the system's words name it
            if isinstance(exc, pickle.UnpicklingError) and "GLOBAL" in str(
                exc
            ):  # whole, but not only tensors
                raise ValueError(UNSAFE.format(path=shard)) from None
            reason = (
                re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()[0] if str(exc).strip() else ""
            )
            reason = reason or type(exc).__name__
            raise ValueError(
                f"{shard} is not a readable weights file: it is truncated or corrupt ({reason})."
            ) from None
    # Sizes held against the weights before transformers reads them (Qwen2's and Gemma 3's configs
    # list every layer's kind: a billion layers take hours), named as config.json names them
    named = {ours: next((k for k in theirs if k in fields), theirs[0]) for ours, theirs in RAW_SIZES.items()}
    sizes, said = {ours: fields.get(k) for ours, k in named.items()}, f"the weights of {path}"
    check_sizes(sizes, state, lambda field: f"{config_file}'s {named[field]}", said)
    hf_config = transformers_config(path)
    hf_config.eos_token_id = hf_llama.with_stops(hf_config.eos_token_id, generation_stops(path))
    if "score.weight" in state:  # *ForSequenceClassification: gpt-ft export's, a hub reward model
        raise ValueError(
            f"{path} is a sequence classifier ({', '.join(hf_config.architectures or ['a score head'])}), "
            "not a language model: start from the model it was fine-tuned from, or its gpt-ft checkpoint."
        )
    try:
        return (*convert(hf_config, state), str(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
