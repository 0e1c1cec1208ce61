"""What a file's tensors must be before a model takes them, and the entries read beside them.

A config is read before its model is built, and a config that misstates a size would build a model
of a billion layers (built for hours, even with no memory behind it) or of tensors no memory holds
before a single tensor is compared with it: the layer count and the widths it gives are held
against the tensors first (`check_sizes`). Tensors of another shape, missing or left over, are
one sentence naming the first (`load_state`), and so are weights that are not real numbers
(`check_real_weights`) and a calibrated temperature that no score can be divided by
(`checked_temperature`). Each names the file at fault (a copy altered, a download cut short,
a file made to look like a model's).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import Tensor, nn

from gpt_ft.errors import FileProblem

LAYER = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")
"""A block's number in a tensor's name: gpt_ft's and GPT-2's `h.3.` (`transformer.h.3.`), Llama's
and GPT-NeoX's `model.layers.3.`, `gpt_neox.layers.3.`."""
EMBEDDINGS = ("wte.weight", "embed_tokens.weight", "tokens_embed.weight", "embed_in.weight")
"""How each family's token embedding is named (gpt_ft and GPT-2; Llama; GPT-1; GPT-NeoX)."""


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_sizes(
    config: Mapping[str, Any], state: Mapping[str, Tensor], said: Callable[[str], str], held: str
) -> None:
    """The sizes `config` gives (under gpt_ft's field names: `n_layer`, `n_embd`, `vocab_size`,
    `n_positions`, `vocab_multiple`; a field it lacks, or gives as no integer, is not compared) are
    those of the tensors in `state` (held by `held`, "its tensors"), or one sentence naming the
    field as `said(field)` names it ("run.ckpt's gpt_config.n_layer").

    The layers are the block numbers in the tensors' names: a config of more layers than they hold
    is refused (one of fewer builds at once, and loading names the tensors left over). The widths
    are the token embedding's and the position table's. A table may have more rows than the
    vocabulary (its padding, a released table's unused rows), never fewer; and the rows the config
    pads it to are the table's own, or a table saved without padding grown by less than one
    `vocab_multiple`.
    """
    sizes = {name: config[name] for name in config if _integer(config[name])}
    layers = {int(m[1]) for key in state if (m := LAYER.search(key))}
    table_name = next((k for k, v in state.items() if k.endswith(EMBEDDINGS) and v.dim() == 2), None)
    table = state[table_name] if table_name else None
    wpe = state.get("wpe.weight") if config.get("positions", "learned") == "learned" else None

    def refuse(field: str, holds: str) -> None:
        raise FileProblem(
            f"{said(field)} is {config[field]}, but {held} hold {holds}: the config and the weights are "
            "not of one model (the file was altered or is damaged)."
        )

    if "n_layer" in sizes and sizes["n_layer"] > len(layers):
        span = (
            f"blocks {min(layers)} to {max(layers)}" if len(layers) > 1 else f"block {min(layers, default=0)}"
        )
        refuse("n_layer", f"{len(layers)} layer{'s' * (len(layers) > 1)} ({span})" if layers else "no layer")
    if table is not None and "n_embd" in sizes and sizes["n_embd"] != table.shape[1]:
        refuse("n_embd", f"a token embedding {table.shape[1]} wide ({table_name})")
    rows = table.shape[0] if table is not None else None
    if rows is not None and "vocab_size" in sizes and sizes["vocab_size"] > rows:
        refuse("vocab_size", f"a token embedding of {rows} rows ({table_name})")
    if rows is not None and {"vocab_size", "vocab_multiple"} <= sizes.keys():
        vocab, multiple = sizes["vocab_size"], sizes["vocab_multiple"]
        padded = max(-(-vocab // multiple) * multiple, sizes.get("released_rows", 0))
        if padded > rows != vocab:
            field = "released_rows" if sizes.get("released_rows", 0) > rows else "vocab_multiple"
            refuse(field, f"a token embedding of {rows} rows ({table_name}), not {padded}")
    if wpe is not None and "n_positions" in sizes and sizes["n_positions"] != wpe.shape[0]:
        refuse("n_positions", f"a position table of {wpe.shape[0]} rows (wpe.weight)")


def check_real_weights(
    state: Mapping[str, Tensor], parameters: Iterable[str], where: str, *, integers: bool = False
) -> None:
    """The tensors of `state` that load into `parameters` (a model's names; buffers, such as masks,
    may be of any type) are real floating-point numbers, or one sentence naming the first that is
    not (a model computes in floats: an integer, boolean or complex one is no weight gpt_ft wrote);
    `integers`: integer and boolean ones pass, cast on loading (a transformers folder's, as
    transformers casts them)."""
    for name in parameters:
        value = state.get(name)
        if value is None or value.is_floating_point() or (integers and not value.is_complex()):
            continue
        raise FileProblem(
            f"{where}: its tensor {name} holds {str(value.dtype).removeprefix('torch.')} values, not real "
            "floating-point ones as a model's weights are (the file was altered or is damaged)."
        )


def _few(names: list[str]) -> str:
    """How many `names`, and the first three: "5 ['a', 'b', 'c', ...]"."""
    return f"{len(names)} [{', '.join(map(repr, names[:3]))}{', ...' if len(names) > 3 else ''}]"


def load_state(
    module: nn.Module,
    state: Mapping[str, Tensor],
    where: str,
    *,
    described: str,
    shape: str = "",
    strict: bool = True,
    assign: bool = False,
    prefix: str = "",
) -> None:
    """`module.load_state_dict(state)`, a tensor of another shape (`where`'s tensors do not fit
    `described`, "the model its config describes"; named as the file names it, `prefix` first) or,
    `strict`, one missing or left over (`shape` may say the model's size) one sentence naming the
    first, not PyTorch's page of them."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False, assign=assign)
    except RuntimeError as exc:
        wrong = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), None)
        if wrong is None:
            raise
        wrong = wrong.replace("size mismatch for ", f"size mismatch for {prefix}", 1)
        raise FileProblem(f"{where}'s tensors do not fit {described}: {wrong}") from None
    if strict and (missing or unexpected):
        missing, unexpected = ([prefix + name for name in names] for names in (missing, unexpected))
        raise FileProblem(
            f"{where} does not match {described}{shape}: tensors missing: {_few(missing)}, "
            f"unexpected: {_few(unexpected)}."
        )


def check_shapes(
    module: nn.Module, state: Mapping[str, Tensor], where: str, *, described: str, prefix: str = ""
) -> None:
    """The tensors of `state` that `module` has are of its shapes, or one sentence naming the first
    that is not (as `load_state` names it), before another loads them (Lightning's page of them)."""
    own = module.state_dict()
    for name, value in state.items():
        if name in own and value.shape != own[name].shape:
            raise FileProblem(
                f"{where}'s tensors do not fit {described}: {prefix}{name} has shape {list(value.shape)}, "
                f"the model's {list(own[name].shape)}."
            )


def checked_temperature(value: Any, where: str) -> float:
    """`gpt-ft calibrate`'s temperature as `where` records it: a positive finite number, or one
    sentence (scores divide by it: 0 or NaN make every one NaN, a negative one turns them against
    the label chosen)."""
    if not (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    ):
        raise FileProblem(
            f"{where} records a temperature of {value!r}, and gpt-ft calibrate's is a positive number "
            "(every score is divided by it): calibrate the checkpoint again."
        )
    return float(value)
