"""Rotary positions to and from a transformers config's `rope_parameters` (Llama-family and GPT-NeoX
configs): the base, the scaling, and the features of each head that rotate (`partial_rotary_factor`,
GPTConfig's `rotary_dim`).
"""

from __future__ import annotations

import math

from gpt_ft.model.config import GPTConfig
from gpt_ft.model.rope_scaling import ROPE_LISTS, rope_keys


def rope_from_hf(c, head: int, layer_type: str | None = None) -> tuple[float, dict | None, int | None]:
    """(rope_theta, rope_scaling or None, rotary_dim or None for the whole head) of transformers config
    `c` whose heads are `head` wide; `layer_type`: that layer type's, where rotary parameters are
    given per layer type (Gemma 3, OLMo 3)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    if layer_type is not None:  # (transformers reads YaRN's `truncate` from the outer dict: always true)
        params = {k: v for k, v in (params.get(layer_type) or {}).items() if k != "truncate"}
    theta = params.pop("rope_theta", getattr(c, "rope_theta", 10000.0))
    partial = params.pop("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
    rotary = int(head * partial)  # as transformers' attention counts them
    if rotary % 2 or rotary < 2:
        raise ValueError(
            f"{type(c).__name__}.partial_rotary_factor={partial} turns {rotary} of each {head}-wide head's "
            "features; gpt_ft turns an even number of them, 2 or more."
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default" and layer_type == "sliding_attention":
        raise ValueError(
            f"{type(c).__name__}.rope_parameters['sliding_attention'] with rope_type {kind!r} is not "
            "supported; local layers' rotary positions must be unscaled."
        )
    params = {key: value for key, value in params.items() if key in rope_keys(kind)}  # (others unread)
    return float(theta), None if kind == "default" else params, None if rotary == head else rotary


def rope_to_hf(config: GPTConfig, partial: bool = False) -> dict:
    """The `rope_parameters` of a transformers config for `config`: its base and scaling, and, where
    it rotates part of each head or `partial` asks, its `partial_rotary_factor`."""
    rope = dict(config.rope_scaling or {"rope_type": "default"}, rope_theta=config.rope_theta)
    for key, value in rope.items():  # as transformers' configs hold them (NumPy's numbers, tuples: theirs)
        if key in ROPE_LISTS:
            rope[key] = [float(v) for v in value]
        elif key == "original_max_position_embeddings":
            rope[key] = int(value)
    if partial or config.rotary_dim is not None:
        rope["partial_rotary_factor"] = partial_factor(config.rotary_dims, config.head_dim)
    return rope


def partial_factor(rotated: int, head: int) -> float:
    """The `partial_rotary_factor` that turns exactly `rotated` of a `head`-wide head's features in
    transformers, which truncates head x factor."""
    factor = rotated / head
    return factor if int(head * factor) == rotated else math.nextafter(factor, 1.0)
