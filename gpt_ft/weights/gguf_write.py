"""A language model as one GGUF file, as llama.cpp, Ollama and LM Studio load it.

    gpt-ft export --ckpt_path runs/.../last.ckpt --format gguf --out my-model.gguf  # --gguf_type f16

The input is the transformers causal-LM folder `gpt-ft export` writes (GPT-2, Llama, Mistral, Qwen2,
Qwen3, Gemma 3, Phi-3, SmolLM3, OLMo 2 or GPT-NeoX; the same folder llama.cpp's own
`convert_hf_to_gguf.py` takes), and the file is laid out as that converter lays it out: llama.cpp's
architecture, metadata keys and tensor names from the `gguf` library (llama.cpp's own), Llama's q/k
rows reordered for llama.cpp's rotary layout, GPT-NeoX's q/k/v rows each projection whole (each
head's together in transformers), GPT-2's Conv1D weights stored (out, in), Gemma's norm weights as the
scale they apply (plus one), norms, biases and GPT-2's position table in F32, every other matrix in
the chosen type (f32, f16, bf16, or q8_0 where its rows split into 32-value blocks, else f16), a
tied head stored once. Gemma 3's layers that slide a window go in by name where they differ from
llama.cpp's default (five of every six), with the window's rotary base. The tokenizer goes in as
`gguf_vocab.py` writes it. Phi-3's rotary settings go in as the converter writes them (the features
of each head that rotate, LongRoPE's factors as two tensors, its original context), and its
attention factor as transformers computes it (where a config gives one or a factor, the converter
would derive it from the contexts). Another family is refused (GPT-1, which llama.cpp lacks; OLMo 3,
whose window llama.cpp's OLMo 2 lacks), and so is a setting llama.cpp's architecture
lacks or fixes otherwise (a sliding window outside Gemma 3, a rotary scaling other than linear,
Llama 3's or Phi-3's LongRoPE, Gemma's attention scaled other than by the head size's root, SmolLM3
turning other layers than all but every fourth).

A fine-tuned embedding model or reranker goes in as that language model with `Serving`: llama.cpp's
pooling (the last token, the mean, or a reranker's rank), GPT-1's start and extract tokens as the
ids framing each text (bos and eos, added), a reranker's score rows and its prompt.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpt_ft.model.rope import longrope_attention
from gpt_ft.weights.gguf_file import LONGROPE
from gpt_ft.weights.gguf_vocab import check_added_tokens, write_vocabulary

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
ARCHITECTURES = {"gpt2": "GPT2", "llama": "LLAMA", "mistral": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3",
                 "gemma3_text": "GEMMA3", "phi3": "PHI3", "smollm3": "SMOLLM3", "olmo2": "OLMO2",
                 "gpt_neox": "GPTNEOX"}  # fmt: skip
LLAMA_LAYOUT = ("LLAMA", "SMOLLM3")  # q and k in llama.cpp's rotary layout, the vocabulary's size written
NOPE_EVERY = 4  # llama.cpp's SmolLM3: every fourth layer takes no rotary positions, and no other
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
# llama.cpp's: the tanh GELU (GPT-NeoX's exact one too, as llama.cpp runs Pythia); the rest SiLU
ACTIVATIONS = {"gpt2": TANH_GELU, "gemma3_text": TANH_GELU, "gpt_neox": ("gelu", *TANH_GELU)}
UNREAD = {  # settings llama.cpp's architecture has one way only: (that way, what it means)
    "gpt2": {"scale_attn_weights": (True, "divide attention scores by the head size's root"),
             "scale_attn_by_inverse_layer_idx": (False, "scale each layer's attention alike")},
    "qwen3": {"attention_bias": (False, "have no attention biases")},
    "olmo2": {"attention_bias": (False, "have no attention biases")},
    "gpt_neox": {"attention_bias": (True, "have attention biases")},
    "smollm3": {"attention_bias": (False, "have no attention biases"),
                "mlp_bias": (False, "have no MLP biases")},
    "gemma3_text": {"attention_bias": (False, "have no attention biases"),
                    "attn_logit_softcapping": (None, "cap no attention scores"),
                    "use_bidirectional_attention": (False, "attend to earlier tokens only")},
}  # fmt: skip


@dataclass(frozen=True)
class Serving:
    """What llama.cpp reads beyond the language model to serve a fine-tuned one: how a text's states
    are pooled (`last`, `mean`; `rank`, a reranker's score from the last state), the ids around each
    text (`start` before it, `extract` after it where there is one: bos and eos, added as texts are
    tokenized), and a reranker's score rows (`scores`, two: llama.cpp's Qwen3 rerankers answer the
    first's softmax) and the prompt a query and a document fill (`template`); whether the scores have
    a bias, which llama.cpp's have not (`biased`), and the rows' names (`labels`)."""

    pooling: str
    start: int
    extract: int | None = None
    scores: torch.Tensor | None = None
    template: str | None = None
    biased: bool = False
    labels: list[str] | None = None


def write_gguf(
    folder: str | Path,
    path: str | Path,
    *,
    outtype: str = "f16",
    name: str | None = None,
    serving: Serving | None = None,
    place: Callable[[Path, Path], object] | None = None,
) -> Path:
    """Write the transformers causal-LM folder `folder` (config.json, model.safetensors, the
    tokenizer's files) as GGUF file `path`, its matrices in `outtype`; with `serving`, as llama.cpp
    serves an embedding model or a reranker of it. The whole file, written under a name of its own
    beside `path`, takes `path`'s name by `place(file, path)` (default: a rename, which replaces)."""
    import gguf

    folder, path = Path(folder), Path(path)
    check_added_tokens(name or path.stem, folder)
    if outtype not in OUTTYPES:
        raise ValueError(f"--gguf_type {outtype!r}: choose one of {', '.join(OUTTYPES)}.")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    arch = getattr(gguf.MODEL_ARCH, _architecture(config))
    ranks = serving is not None and serving.pooling == "rank"
    if ranks and (config["model_type"] != "qwen3" or serving.biased):
        raise ValueError(
            f"--format gguf: llama.cpp reads a reranker's score layer in Qwen3 models only (without a bias), "
            f"and this is a {config['model_type']} model (export it as a transformers folder: CrossEncoder "
            "loads it)."
        )
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")  # (opened only to write)
    writer = gguf.GGUFWriter(partial, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name or path.stem)
    file_type = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}[outtype]
    _hyperparameters(writer, config, getattr(gguf.LlamaFileType, file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    frame = None if serving is None else (serving.start, serving.extract)
    write_vocabulary(writer, folder, config["vocab_size"], frame)
    names = gguf.get_tensor_name_map(arch, config.get("n_layer") or config["num_hidden_layers"])
    state = _state(folder)
    if serving is not None:
        writer.add_pooling_type(getattr(gguf.PoolingType, serving.pooling.upper()))
        if serving.scores is not None:  # (llama.cpp's name for the rows, which its labels count)
            state["cls.output.weight"] = serving.scores
            writer.add_classifier_output_labels(serving.labels or ["score", "zero"])
        if serving.template is not None:
            writer.add_chat_template([{"name": "rerank", "template": serving.template}])
    for key, tensor in _tensors(state, config):
        named = key.startswith("cls.") or key in LONGROPE  # (GGUF's own names)
        gguf_name = key if named else names.get_name(key, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(
                f"{folder}: tensor {key} has no place in llama.cpp's {config['model_type']} layout."
            )
        data, qtype = _stored(tensor, gguf_name, outtype)
        writer.add_tensor(gguf_name, data, raw_dtype=qtype)
    writer.add_size_label(gguf.size_label(*writer.get_total_parameter_count()))  # ("135M", the converter's)
    path.parent.mkdir(parents=True, exist_ok=True)  # (once every check has passed)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        (place or Path.replace)(partial, path)  # the file takes its name once whole
    finally:
        partial.unlink(missing_ok=True)
    return path


def _state(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors by name, from model.safetensors or the shards its index names."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return load_file(folder / "model.safetensors")
    shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    return {key: tensor for shard in shards for key, tensor in load_file(folder / shard).items()}


def _architecture(config: dict) -> str:
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise ValueError(
            f"gpt_ft writes no GGUF file of a {kind!r} model; it writes them of {', '.join(ARCHITECTURES)} "
            "models (export --format transformers keeps any)."
        )
    keys = ("activation_function", "hidden_act", "hidden_activation")
    activation = next((config[key] for key in keys if config.get(key)), None)
    if activation not in ACTIVATIONS.get(kind, ("silu",)):
        raise ValueError(
            f"llama.cpp's {kind} models use {ACTIVATIONS.get(kind, ('silu',))[0]}; this one {activation}."
        )
    for key, (wanted, meaning) in UNREAD.get(kind, {}).items():
        if config.get(key, wanted) != wanted:
            raise ValueError(f"llama.cpp's {kind} models {meaning}; this one has {key}={config[key]!r}.")
    if kind == "gemma3_text":  # (llama.cpp's Gemma 3 27B's scale is the width's, by its 62 layers)
        wide = config["num_hidden_layers"] == 62
        root = config["hidden_size"] // config["num_attention_heads"] if wide else config["head_dim"]
        if (scalar := config.get("query_pre_attn_scalar", root)) != root:
            raise ValueError(
                f"llama.cpp's {kind} models of {config['num_hidden_layers']} layers divide attention scores "
                f"by the root of {root}; this one by the root of {scalar} (query_pre_attn_scalar)."
            )
    if kind == "smollm3" and (nope := config.get("no_rope_layers")) is not None:  # (1: the layer turns)
        layers = [i for i, turns in enumerate(nope[: config["num_hidden_layers"]]) if not turns]
        if layers != list(range(NOPE_EVERY - 1, config["num_hidden_layers"], NOPE_EVERY)):
            raise ValueError(
                f"llama.cpp's {kind} models take no rotary positions in every {NOPE_EVERY}th layer (3, 7, "
                f"... counting from 0) and in no other; this one in layers {layers} (no_rope_layers)."
            )
    window = config.get("sliding_window") if kind in ("mistral", "phi3") else None
    slides = config.get("use_sliding_window") and kind != "smollm3"  # (SmolLM3's: where its layer_types say)
    if kind == "smollm3" and "sliding_attention" in (config.get("layer_types") or ()):
        window = config.get("sliding_window")
    if slides or (window and window < config["max_position_embeddings"]):
        raise ValueError(
            f"llama.cpp's {kind} models attend to every earlier token; this one slides a window."
        )
    return ARCHITECTURES[kind]


def _rope(config: dict) -> tuple[float, dict]:
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    params = dict(config.get(key) or {})
    key += "['full_attention']" if "full_attention" in params else ""  # (Gemma 3's layers that see all)
    params = dict(params.get("full_attention", params))
    theta = params.pop("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    allowed = {
        "llama": ("default", "linear", "llama3"),
        "phi3": ("default", "longrope"),
        "gpt_neox": ("default",),
    }.get(config["model_type"], ("default", "linear"))
    if kind not in allowed:
        raise ValueError(f"This {config['model_type']} model's rotary scaling {kind!r} ({key}) "
                         f"has no GGUF form here ({', '.join(allowed)}).")  # fmt: skip
    if kind == "longrope":  # one factor a rotating pair, in each list
        pairs = _rotated(config) // 2
        for factors in ("short_factor", "long_factor"):
            if len(params.get(factors) or ()) != pairs:
                raise ValueError(f"{key}['{factors}'] must list {pairs} factors, one per rotating pair; "
                                 f"it has {len(params.get(factors) or ())}.")  # fmt: skip
    return float(theta), params if kind != "default" else {}


def _hyperparameters(writer, config: dict, file_type) -> None:
    if config["model_type"] == "gpt_neox":  # llama.cpp's keys for GPT-NeoX, its converter's and the base
        writer.add_block_count(config["num_hidden_layers"])
        writer.add_context_length(config["max_position_embeddings"])
        writer.add_embedding_length(config["hidden_size"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(config["num_attention_heads"])
        writer.add_rope_dimension_count(_rotated(config))
        writer.add_rope_freq_base(_rope(config)[0])
        writer.add_parallel_residual(config.get("use_parallel_residual", True))
        writer.add_layer_norm_eps(config["layer_norm_eps"])
        writer.add_file_type(file_type)
        return
    if config["model_type"] == "gpt2":  # llama.cpp's keys for GPT-2
        width = config["n_embd"]
        writer.add_block_count(config["n_layer"])
        writer.add_context_length(config["n_positions"])
        writer.add_embedding_length(width)
        writer.add_feed_forward_length(config.get("n_inner") or 4 * width)
        writer.add_head_count(config["n_head"])
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
        writer.add_file_type(file_type)
        return
    import gguf

    heads, head_dim = config["num_attention_heads"], config.get("head_dim")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    theta, scaling = _rope(config)
    writer.add_rope_freq_base(theta)
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config["model_type"] == "gemma3_text":
        _window(writer, config)
    if config["model_type"] == "phi3":
        _phi3(writer, config, scaling)
    if head_dim is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(file_type)
    if ARCHITECTURES[config["model_type"]] in LLAMA_LAYOUT:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim or config["hidden_size"] // heads)


def _phi3(writer, config: dict, scaling: dict) -> None:
    """Phi-3's rotary settings as llama.cpp's converter writes them: the features of each head that
    rotate, the original context, LongRoPE's attention factor (its factors: tensors, `_tensors`) as
    transformers computes it (given, or from the factor by which the context grew), and the window."""
    writer.add_rope_dimension_count(_rotated(config))
    outside = config.get("original_max_position_embeddings")  # (wins, as in transformers; Phi-3.5's own)
    original = outside or scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]
    writer.add_rope_scaling_orig_ctx_len(int(original))
    if scaling:
        factor = scaling.get("factor") or config["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(
            scaling.get("attention_factor") or longrope_attention(factor, original)
        )
    writer.add_sliding_window(config.get("sliding_window") or 0)


def _rotated(config: dict) -> int:
    """The features of each head that rotate, as transformers reads `partial_rotary_factor`: from the
    rotary settings (either key) or the config's top level (Pythia's hub folders: `rotary_pct`)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct")))
    return int(config["hidden_size"] // config["num_attention_heads"] * (partial or 1.0))


def _window(writer, config: dict) -> None:
    """Gemma 3's window: its size, which layers slide it where they differ from llama.cpp's default
    (all but every sixth), and their rotary base; a logit cap where there is one."""
    local = dict((config.get("rope_parameters") or {}).get("sliding_attention") or {})
    if (kind := local.pop("rope_type", "default")) != "default":
        raise ValueError(
            "llama.cpp's gemma3_text models scale no rotary positions of the layers that slide a window; "
            f"this one's rope_parameters['sliding_attention'] is {kind!r}."
        )
    every, layers = config.get("sliding_window_pattern") or 6, range(config["num_hidden_layers"])
    kinds = config.get("layer_types") or [i % every < every - 1 for i in layers]  # (older configs: a period)
    slides = [kind in ("sliding_attention", True) for kind in kinds]
    if any(slides):
        writer.add_sliding_window(config["sliding_window"])
        if slides != [layer % 6 < 5 for layer in range(len(slides))]:
            writer.add_sliding_window_pattern(slides)
        writer.add_rope_freq_base_swa(float(local.get("rope_theta", config.get("rope_local_base_freq", 1e4))))
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])


def _tensors(state: dict[str, torch.Tensor], config: dict):
    """(transformers name, tensor as llama.cpp lays it out) for every tensor of `state`."""
    kind = config["model_type"]
    tied = config.get("tie_word_embeddings", True)
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    theta, scaling = _rope(config) if kind != "gpt2" else (None, {})
    if scaling.get("rope_type", scaling.get("type")) == "llama3":  # llama.cpp reads them as a tensor
        yield "rope_freqs.weight", _llama3_factors(config, theta, scaling)
    if scaling.get("rope_type", scaling.get("type")) == "longrope":  # (Phi-3's)
        for name, factors in zip(LONGROPE, ("long_factor", "short_factor"), strict=True):
            yield name, torch.tensor(scaling[factors], dtype=torch.float32)
    if tied and kind in ("olmo2", "gpt_neox"):  # llama.cpp reads a head of their own: the embedding again
        embedding = "gpt_neox.embed_in.weight" if kind == "gpt_neox" else "model.embed_tokens.weight"
        tied, state = False, {**state, "lm_head.weight": state[embedding]}
    for key, tensor in state.items():
        if tied and key == "lm_head.weight":  # llama.cpp reads the embedding as the head
            continue
        if kind == "gpt2" and key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        tensor = tensor.float()
        if kind == "gpt2" and key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            tensor = tensor.T.contiguous()  # Conv1D's (in, out) as (out, in)
        elif ARCHITECTURES[kind] in LLAMA_LAYOUT and key.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = _reorder(tensor, heads)
        elif ARCHITECTURES[kind] in LLAMA_LAYOUT and key.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = _reorder(tensor, kv_heads)
        elif kind == "gemma3_text" and key.endswith("norm.weight"):  # (Gemma scales by 1 + weight)
            tensor = tensor + 1
        elif kind == "gpt_neox" and key.endswith(("query_key_value.weight", "query_key_value.bias")):
            # each head's q, k and v rows together, as llama.cpp's converter finds them: each whole
            tensor = tensor.reshape(heads, 3, -1, *tensor.shape[1:]).transpose(0, 1).reshape(tensor.shape)
        yield key, tensor


def _reorder(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's rows from transformers' rotary layout (the halves apart) to llama.cpp's (pairs side
    by side), as llama.cpp's converter reorders Llama's q and k."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_factors(config: dict, theta: float, scaling: dict) -> torch.Tensor:
    """Llama 3's rotary scaling as per-frequency divisors (llama.cpp's `rope_freqs`)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim):
        wavelength = 2 * math.pi / float(freq)
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def _stored(tensor: torch.Tensor, gguf_name: str, outtype: str):
    """The tensor's data and GGML type, as llama.cpp's converter chooses them."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    data = tensor.numpy()
    vector = data.ndim <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight")
    if vector or gguf_name.startswith("position_embd"):
        return data.astype(np.float32), kinds.F32
    qtype = getattr(kinds, outtype.upper())
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # rows that do not split into Q8_0's blocks
        return gguf.quants.quantize(data, kinds.F16), kinds.F16
