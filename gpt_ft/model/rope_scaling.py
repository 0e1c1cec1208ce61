"""The rotary scalings gpt_ft reads, with each one's keys, and the check of a config's `rope_scaling`
(`GPTConfig.rope_scaling`, as transformers writes it; the frequencies themselves are in `rope.py`).
"""

from __future__ import annotations

import math
import numbers

ROPE_TYPES = {  # each scaling's keys
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
ROPE_OPTIONAL = {  # the keys each scaling may take besides (as transformers reads them)
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("attention_factor", "factor"),
}
ROPE_LISTS = ("short_factor", "long_factor")  # LongRoPE's: a divisor for each rotating pair's frequency


def rope_type(scaling: dict | None) -> str:
    """The scaling's type ("rope_type", or the older "type"); "default" where there is none."""
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))


def rope_keys(kind: str) -> tuple[str, ...]:
    """Every key a scaling of type `kind` takes: its type, the keys it needs and those it may take."""
    return ("rope_type", "type", *ROPE_TYPES.get(kind, ()), *ROPE_OPTIONAL.get(kind, ()))


def check_rope_scaling(scaling: dict | None, rotary_pairs: int, theta: float) -> None:
    """Refuse (ValueError naming the key) a scaling gpt_ft does not read as given: another type, a key
    missing, one its type does not take (read by none, or a field of the config's own: a rope_theta
    other than the config's `theta`, as transformers' rope_parameters hold it), a value that is not a
    positive number (LongRoPE's lists: one for each of `rotary_pairs`)."""
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ValueError(f"GPTConfig.rope_scaling must be a mapping or None, got {scaling!r}.")
    kind = rope_type(scaling)
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"GPTConfig.rope_scaling type {kind!r} is not supported; allowed: {', '.join(ROPE_TYPES)}."
        )
    if missing := [key for key in ROPE_TYPES[kind] if key not in scaling]:
        raise ValueError(f"GPTConfig.rope_scaling of type {kind!r} needs {', '.join(missing)}.")
    for key in scaling:
        if key == "rope_theta" and scaling[key] != theta:
            raise ValueError(f"GPTConfig.rope_scaling holds rope_theta {scaling[key]!r}, the config's is "
                             f"{theta!r}: give the base as the config's own rope_theta.")  # fmt: skip
        if key == "partial_rotary_factor":
            raise ValueError("GPTConfig.rope_scaling holds partial_rotary_factor: give the features that "
                             "turn as the config's own rotary_dim.")  # fmt: skip
        if key not in (*rope_keys(kind), "rope_theta"):
            takes = ", ".join(rope_keys(kind)[2:]) or "no other key"
            raise ValueError(f"GPTConfig.rope_scaling of type {kind!r} takes no {key!r} (it takes {takes}).")
    if not isinstance(truncate := scaling.get("truncate", True), bool):  # YaRN's
        raise ValueError(f"GPTConfig.rope_scaling truncate must be true or false, got {truncate!r}.")
    for key in [k for k in scaling if k in rope_keys(kind)[2:] and k != "truncate"]:  # (a bool is no factor)
        value = scaling[key]
        if value is None and key not in ROPE_TYPES[kind]:
            continue
        listed = isinstance(value, (list, tuple)) and len(value) == rotary_pairs  # (LongRoPE's lists)
        values = (value if listed else [None]) if key in ROPE_LISTS else [value]
        if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v < math.inf
                   for v in values):  # fmt: skip
            what = (
                f"{rotary_pairs} positive numbers (rotary pairs)"
                if key in ROPE_LISTS
                else "a positive number"
            )
            raise ValueError(f"GPTConfig.rope_scaling {key} must be {what}, got {value!r}.")
        if key == "original_max_position_embeddings" and (value < 2 or value != int(value)):
            raise ValueError(
                f"GPTConfig.rope_scaling {key} must be a whole number, 2 or more; got {value!r}."
            )
