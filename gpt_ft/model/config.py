"""GPTConfig: the shape and regularisation of a GPT, and the named presets.

One config describes three families of blocks: GPT-1 (post-LN, learned positions, GELU), GPT-2
(pre-LN with a final LayerNorm) and Llama-style blocks (RMSNorm, rotary positions, SwiGLU,
grouped-query attention, no biases, an untied LM head), which also covers Qwen2, Mistral and
Phi-3. A few more switches make Qwen3 (a head size of its own, RMSNorm on queries and keys) and
Gemma 3 (its (1 + w) RMSNorm, scaled embeddings, norms after attention and MLP, GeGLU, local
sliding-window layers with their own rotary base between global ones), SmolLM3 (layers without
rotary positions between rotary ones), GPT-NeoX (Pythia: GPT-2's LayerNorm and biases with rotary
positions on part of each head, attention and MLP side by side) and OLMo 2 and 3 (norms after attention
and MLP only, RMSNorm over all heads' queries and keys; OLMo 3's sliding-window layers). The presets
are in `presets.py`.
"""

from __future__ import annotations

import copy
import difflib
import math
import numbers
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import torch.nn.functional as F

from gpt_ft.errors import OptionError
from gpt_ft.model.presets import PRESETS
from gpt_ft.model.rope_scaling import check_rope_scaling, rope_keys, rope_type

Activation = Literal["gelu_tanh", "gelu", "relu", "silu"]
Norm = Literal["layernorm", "rmsnorm", "gemma_rmsnorm", "rmsnorm_fp32"]
NORMS = ("layernorm", "rmsnorm", "gemma_rmsnorm", "rmsnorm_fp32")
QKNormSpan = Literal["head", "all_heads"]
QK_NORM_SPANS = ("head", "all_heads")
LAYER_TYPES = ("full_attention", "sliding_attention")
Positions = Literal["learned", "rope"]


def gelu_tanh(x):
    """GELU's tanh form, which GPT-1 and GPT-2 both use (a named function: a model pickles)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {
    "gelu_tanh": gelu_tanh,
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


@dataclass
class GPTConfig:
    """Shape and regularisation of a GPT. The defaults are GPT-1 (Radford et al. 2018)."""

    vocab_size: int = 40478
    """Number of token embeddings: the BPE vocabulary plus any special tokens."""
    n_positions: int = 512
    """Context length: the number of learned position embeddings."""
    n_embd: int = 768
    """Width of the residual stream."""
    n_layer: int = 12
    """Number of transformer blocks."""
    n_head: int = 12
    """Number of attention heads; must divide n_embd unless head_size is given."""
    head_size: int | None = None
    """Width of each attention head; None: n_embd / n_head. Qwen3 and Gemma 3 choose their own
    (queries then span n_head * head_size, which the output projection maps back to n_embd)."""
    n_inner: int | None = None
    """Width of the feed-forward layer; None means 4 * n_embd."""
    pre_ln: bool = False
    """False: GPT-1's post-LN blocks, no final LayerNorm. True: GPT-2's pre-LN blocks plus a final LN."""
    activation: Activation = "gelu_tanh"
    """Feed-forward nonlinearity; GPT-1 and GPT-2 use GELU in its tanh form."""
    embd_pdrop: float = 0.1
    """Dropout on the sum of token and position embeddings."""
    attn_pdrop: float = 0.1
    """Dropout on the attention probabilities."""
    resid_pdrop: float = 0.1
    """Dropout on the output of each attention and feed-forward sublayer."""
    layer_norm_epsilon: float = 1e-5
    """Epsilon of every LayerNorm."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weights and embeddings."""
    vocab_multiple: int = 64
    """The token embedding gets a multiple of this many rows, for faster kernels; the extra rows
    are never looked up, predicted, sampled or counted in the loss (1: no padding)."""
    released_rows: int | None = None
    """Rows of a released embedding table with more rows than its tokenizer has tokens (Qwen2.5:
    151,936 for 151,665): the table keeps them (the unused ones as padding) and `to_hf` writes
    them back; None: none."""
    norm: Norm = "layernorm"
    """LayerNorm (GPT-1, GPT-2), RMSNorm (Llama, Qwen, Mistral, Phi-3), Gemma's RMSNorm, which
    scales by (1 + weight) in fp32, or RMSNorm multiplied by its weight in fp32 too and cast to the
    input's dtype last (OLMo 2 and 3: "rmsnorm_fp32"); epsilon layer_norm_epsilon."""
    qk_norm: bool = False
    """Normalise the queries and keys (the norm above, over qk_norm_span) before the rotary
    positions (Qwen3, Gemma 3, OLMo 2 and 3)."""
    qk_norm_span: QKNormSpan = "head"
    """What qk_norm normalises over: "head", each head's queries and keys over the head size (Qwen3,
    Gemma 3); "all_heads", all heads' queries (n_head * head size) and all keys (n_kv_head * head
    size) at once, before they split into heads (OLMo 2 and 3)."""
    input_norms: bool = True
    """Normalise the input of attention and MLP (a pre-LN block's ln_1, ln_2); False: the block has
    no such norms, only post_norms' after them (OLMo 2 and 3)."""
    post_norms: bool = False
    """Normalise the outputs of attention and MLP too, before they join the residual stream
    (Gemma 2 and 3: `post_attn_norm`, `post_mlp_norm`)."""
    scale_embeddings: bool = False
    """Multiply the token embeddings by sqrt(n_embd) (Gemma) before the first block."""
    query_pre_attn_scalar: int | None = None
    """Attention scores are scaled by 1 / sqrt(this) (Gemma 3: 256); None: by 1 / sqrt(head size)."""
    sliding_window: int | None = None
    """Sliding-window layers let each token see only the `sliding_window` tokens up to and including
    itself (Mistral, Phi-3, Gemma 3's local layers); None: every layer sees the whole context."""
    layer_types: list[str] | None = None
    """Each layer's attention, "full_attention" or "sliding_attention" (Gemma 3: five local layers
    per global one); None: all sliding when sliding_window is set, else all full."""
    rope_local_theta: float | None = None
    """Rotary base of the sliding-window layers (Gemma 3: 10,000), unscaled; None: rope_theta and
    rope_scaling, as the full layers."""
    nope_layers: list[int] | None = None
    """The layers (numbered from 0) whose queries and keys take no rotary positions (SmolLM3: every
    fourth, the zeros of its `no_rope_layers`); None: every layer takes them."""
    rotary_dim: int | None = None
    """The features of each query and key head that take rotary positions, the first ones (GPT-NeoX's
    `rotary_pct` of the head, Pythia's 16 of 64; Phi-2's 32 of 80), the rest passed as they are;
    None: the whole head."""
    parallel_residual: bool = False
    """Attention and MLP side by side on the block's input, each through its own norm, x +
    attn(ln_1(x)) + mlp(ln_2(x)) (GPT-NeoX's `use_parallel_residual`); False: one after the other."""
    positions: Positions = "learned"
    """Learned position embeddings added to the tokens' (GPT) or rotary positions in attention (Llama)."""
    rope_theta: float = 10000.0
    """Base wavelength of the rotary position frequencies."""
    rope_scaling: dict | None = None
    """Rotary frequency scaling as transformers writes it: {"rope_type": "linear", "factor": F},
    Llama 3's {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}, "yarn" or Phi-3.5's "longrope" (see `rope.py`); None: unscaled."""
    gated_mlp: bool = False
    """False: `proj(act(fc(x)))`. True: `proj(act(gate(x)) * up(x))`, SwiGLU with activation silu;
    `c_fc` then holds gate and up stacked."""
    n_kv_head: int | None = None
    """Key/value heads (grouped-query attention), a divisor of n_head; None: n_head."""
    bias: bool = True
    """Biases on every linear layer (GPT) or on none (Llama)."""
    qkv_bias: bool | None = None
    """Biases on the query/key/value projection alone (Qwen2: True with bias=False); None: as bias."""
    tie_embeddings: bool = True
    """The LM head is the token embedding (GPT, small Llamas) or a matrix of its own (`lm_head`)."""
    hf_model_type: str | None = None
    """The transformers model type `to_hf` writes (llama, qwen2, qwen3, mistral, phi3, gemma3_text,
    smollm3, gpt_neox); None: read from the shape."""
    hf_token_ids: dict[str, Any] | None = None
    """The bos/eos/pad token ids of the transformers config (or GGUF file) the weights came from,
    {"bos": 1, "eos": [2, 7], "pad": None}, which `to_hf` writes back; None: it writes none (a
    config class's defaults are some other model's ids)."""

    SHAPE_FIELDS: ClassVar[tuple[str, ...]] = (
        "n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "pre_ln", "norm", "positions",
        "gated_mlp", "n_kv_head", "tie_embeddings", "bias", "qkv_bias", "n_inner", "head_size", "qk_norm",
        "post_norms", "scale_embeddings", "qk_norm_span", "input_norms",
    )  # fmt: skip
    """The fields that make the weights what they are (their tensors, their shapes, how the heads
    split them): weights load only into a model whose values are equal. A new field that changes
    the weights belongs here; the others (dropouts, epsilon, rotary frequencies, ...) may differ."""

    def __post_init__(self) -> None:
        for f in fields(self):  # a text where a number or a switch goes failed deep in the model's build
            value, kind = getattr(self, f.name), f.type.removesuffix(" | None")
            if (value is None and f.type.endswith(" | None")) or kind not in ("int", "float", "bool"):
                continue
            number = isinstance(value, numbers.Integral if kind == "int" else numbers.Real)
            if kind == "bool" and (isinstance(value, str) or value not in (True, False)):
                raise ValueError(f"GPTConfig.{f.name} must be true or false, got {value!r}.")
            if kind != "bool" and (not number or isinstance(value, bool)):
                what = "an integer" if kind == "int" else "a number"
                raise ValueError(f"GPTConfig.{f.name} must be {what}, got {value!r}.")
            setattr(self, f.name, {"int": int, "float": float, "bool": bool}[kind](value))  # (NumPy's: plain)
        for name in ("vocab_size", "n_positions", "n_embd", "n_head", "vocab_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {getattr(self, name)}.")
        if self.n_layer < 0:
            raise ValueError(f"GPTConfig.n_layer must be >= 0, got {self.n_layer}.")
        if self.head_size is not None and self.head_size < 1:
            raise ValueError(f"GPTConfig.head_size must be a positive integer or None, got {self.head_size}.")
        if self.head_size is None and self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"choose n_head among the divisors of {self.n_embd}, or give head_size."
            )
        if self.n_inner is not None and self.n_inner < 1:
            raise ValueError(f"GPTConfig.n_inner must be a positive integer or None, got {self.n_inner}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"GPTConfig.activation={self.activation!r} is not supported; allowed: {sorted(ACTIVATIONS)}."
            )
        if self.norm not in NORMS:
            raise ValueError(
                f"GPTConfig.norm={self.norm!r} is not supported; allowed: {', '.join(map(repr, NORMS))}."
            )
        if self.positions not in ("learned", "rope"):
            raise ValueError(
                f"GPTConfig.positions={self.positions!r} is not supported; allowed: 'learned', 'rope'."
            )
        if self.positions == "rope" and self.rotary_dim is None and self.head_dim % 2:
            raise ValueError(f"Rotary positions need an even head size; this model's is {self.head_dim}.")
        if self.rotary_dim is not None and (self.rotary_dim % 2 or not 2 <= self.rotary_dim <= self.head_dim):
            raise ValueError(f"GPTConfig.rotary_dim must be an even number from 2 to the head size "
                             f"{self.head_dim}, or None; got {self.rotary_dim}.")  # fmt: skip
        for name, least in [("layer_norm_epsilon", 0), ("initializer_range", 0), ("rope_theta", None),
                            ("rope_local_theta", None), ("query_pre_attn_scalar", None)]:  # fmt: skip
            value = getattr(self, name)  # NaN, inf or a negative: a traceback or silently non-finite states
            if value is not None and not (
                math.isfinite(value) and (value >= least if least == 0 else value > 0)
            ):
                what = "a number >= 0" if least == 0 else "a positive number"
                raise ValueError(f"GPTConfig.{name} must be {what}, got {value}.")
        needs_pre_ln = {
            "post_norms": (self.post_norms, "Gemma's blocks normalise both ways"),
            "input_norms: false": (not self.input_norms, "GPT-1's norms follow each sum"),
            "parallel_residual": (self.parallel_residual, "each branch reads its own norm"),
        }
        for name, (wanted, why) in needs_pre_ln.items():  # (GPT-1's post-LN blocks have no place for them)
            if wanted and not self.pre_ln:
                raise ValueError(f"GPTConfig.{name} needs pre_ln: true ({why}).")
        if self.qk_norm_span not in QK_NORM_SPANS or (self.qk_norm_span != "head" and not self.qk_norm):
            raise ValueError(f"GPTConfig.qk_norm_span must be one of {QK_NORM_SPANS} ('all_heads' with "
                             f"qk_norm: true), got {self.qk_norm_span!r}.")  # fmt: skip
        check_rope_scaling(self.rope_scaling, self.rotary_dims // 2, self.rope_theta)
        rotary = {name: getattr(self, name) != value for name, value in ROTARY_UNSET.items()}
        if self.positions == "learned" and (given := [name for name, wanted in rotary.items() if wanted]):
            raise ValueError(f"GPTConfig.{given[0]} is for rotary positions; this model's are learned "
                             "(positions: 'rope' for rotary ones).")  # fmt: skip
        if self.n_kv_head is not None and (self.n_kv_head < 1 or self.n_head % self.n_kv_head):
            raise ValueError(
                f"GPTConfig.n_kv_head={self.n_kv_head} must divide n_head={self.n_head} "
                "(grouped-query attention)."
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(
                f"GPTConfig.sliding_window must be a positive integer or None, got {self.sliding_window}."
            )
        if self.layer_types is not None:
            self.layer_types = list(self.layer_types)
            wrong = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if wrong or len(self.layer_types) != self.n_layer:
                raise ValueError(
                    f"GPTConfig.layer_types must name one of {LAYER_TYPES} for each of the {self.n_layer} "
                    f"layers; got {len(self.layer_types)} entries{f' with {wrong}' if wrong else ''}."
                )
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError(
                    "GPTConfig.layer_types has sliding_attention layers but sliding_window is None."
                )
        if self.nope_layers is not None:
            self.nope_layers = list(self.nope_layers)
            if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < self.n_layer
                   for i in self.nope_layers):  # fmt: skip
                last, got = self.n_layer - 1, self.nope_layers
                raise ValueError(f"GPTConfig.nope_layers must be layer numbers 0 to {last}, got {got}.")
            self.nope_layers = [int(i) for i in self.nope_layers]  # (NumPy's: plain)
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"GPTConfig.{name} must be in [0, 1), got {getattr(self, name)}.")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding: vocab_size rounded up to a multiple of vocab_multiple (at
        least a released table's rows)."""
        return max(-(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple, self.released_rows or 0)

    @property
    def hf_vocab_size(self) -> int:
        """The rows a transformers config names: the released table's, or the vocabulary."""
        return max(self.vocab_size, self.released_rows or 0)

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.n_embd // self.n_head

    def is_sliding(self, layer: int) -> bool:
        """Whether block `layer` attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.layer_types is None or self.layer_types[layer] == "sliding_attention"

    def rotates(self, layer: int) -> bool:
        """Whether block `layer` takes rotary positions (where the model has them)."""
        return self.nope_layers is None or layer not in self.nope_layers

    @property
    def rotary_dims(self) -> int:
        """The features of each head that rotate: rotary_dim, or the whole head."""
        return self.rotary_dim or self.head_dim

    @property
    def rope_type(self) -> str:
        return rope_type(self.rope_scaling)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    def differing_shapes(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The `SHAPE_FIELDS` whose values in `stored` (a checkpoint's config; a field it lacks has
        its default, as when it was written) make other weights than this config's, with those
        values. None and the value it means are one (`n_kv_head`: n_head; `head_size`: n_embd /
        n_head; `n_inner`: 4 n_embd; `qkv_bias`: bias; None on both sides follows the fields it is
        read from, named where they differ)."""
        defaults = {f.name: f.default for f in fields(self)}
        theirs = {k: stored.get(k, defaults[k]) for k in self.SHAPE_FIELDS}
        qkv = theirs["qkv_bias"]
        meant = dict(n_kv_head=theirs["n_kv_head"] or theirs["n_head"],
                     head_size=theirs["head_size"] or theirs["n_embd"] // theirs["n_head"],
                     n_inner=theirs["n_inner"] or 4 * theirs["n_embd"],
                     qkv_bias=theirs["bias"] if qkv is None else qkv)  # fmt: skip
        ours = dict(n_kv_head=self.kv_heads, head_size=self.head_dim, n_inner=self.ffn_dim,
                    qkv_bias=self.bias if self.qkv_bias is None else self.qkv_bias)  # fmt: skip
        differ = {k: v for k, v in theirs.items() if meant.get(k, v) != ours.get(k, getattr(self, k))}
        return {k: v for k, v in differ.items() if k not in ours or (v, getattr(self, k)) != (None, None)}

    @property
    def ffn_dim(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def from_name(cls, name: str, **overrides) -> GPTConfig:
        """A preset by name (see `PRESETS`), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"Unknown GPT preset {name!r}; available presets: {', '.join(PRESETS)}.")
        cls.check_fields(overrides, f"in the overrides of preset {name!r}")
        return cls(**{**copy.deepcopy(PRESETS[name]), **overrides})

    @classmethod
    def check_fields(cls, names, where: str) -> None:
        """`names` (`--model.overrides` from the command line) are the config's fields, or one
        sentence naming those that are not (`where` they were given) and the nearest field."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(names) - set(known)):
            close = difflib.get_close_matches(unknown[0], known, n=1)
            raise ValueError(
                f"Unknown GPTConfig field(s) {unknown} {where}"
                + (f": did you mean {close[0]!r}?" if close else f"; its fields: {', '.join(known)}.")
            )


ROTARY_UNSET = dict(
    rope_theta=10000.0, rope_scaling=None, rope_local_theta=None, rotary_dim=None, nope_layers=None
)
"""The rotary fields as a model with learned positions has them."""


def as_read_now(config: dict) -> dict:
    """A checkpoint's config fields as this version reads them: what an earlier one kept unread left
    out (a scaling's keys its type does not read, a learned-position model's rotary fields), which
    the config now refuses where a user gives them. The same model either way."""
    config, scaling = dict(config), config.get("rope_scaling")
    if isinstance(scaling, dict):
        theta = config.get("rope_theta", ROTARY_UNSET["rope_theta"])
        kept = rope_keys(rope_type(scaling))
        config["rope_scaling"] = {
            k: v for k, v in scaling.items() if k in kept or k == "rope_theta" and v == theta
        }
    if config.get("positions", "learned") == "learned":
        config.update({name: value for name, value in ROTARY_UNSET.items() if name in config})
    return config


def check_known_fields(
    config: dict, where: str, version: str | None, known=None, what="model settings"
) -> dict:
    """`config` (a checkpoint's model fields, or its `what`) if each is `known` (this version's
    `GPTConfig` fields); one that is not (a newer version's, `version` the writer's) named."""
    if unknown := sorted(set(config) - set(known or [f.name for f in fields(GPTConfig)])):
        raise ValueError(
            f"{where} records {what} this version of gpt_ft does not know "
            f"({', '.join(unknown)}): it was written by gpt_ft {version or 'of an unrecorded version'}; "
            "read it with that version."
        )
    return config if known else as_read_now(config)


def preset_config(preset: str, overrides: dict | None, **fixed) -> GPTConfig:
    """`GPTConfig.from_name(preset, **overrides, **fixed)`, a bad override (an unknown field, a value
    the config refuses) named as the option that gave it, `--model.overrides`."""
    if preset not in PRESETS or not overrides:
        return GPTConfig.from_name(preset, **{**(overrides or {}), **fixed})
    try:
        return GPTConfig.from_name(preset, **{**overrides, **fixed})
    except (ValueError, TypeError) as exc:  # (an argument's error: a suite names its file and task)
        raise OptionError(f"{str(exc).rstrip('.')} (--model.overrides).") from None
