"""What every decoder of `GPT` shares: the arguments checked, the stop ids, CTRL's repetition
penalty (as transformers applies it), prompts padded on the left, and eval mode while it decodes.
Pure torch."""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gpt_ft.model import GPT


def check_decoding(
    model: GPT,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    num_beams: int,
    do_sample: bool,
    repetition_penalty: float = 1.0,
    *,
    cli: bool = False,
) -> None:
    """The decoding options, each refused in one sentence that spells them as Python's arguments,
    or with `cli` as the command line's (`--do_sample false`)."""
    name = (lambda n: f"--{n}") if cli else str
    said = (lambda n, v: f"--{n} {str(v).lower()}") if cli else (lambda n, v: f"{n}={v!r}")
    check_token_ids(input_ids, non_empty=True)
    for n, value in (("max_new_tokens", max_new_tokens), ("num_beams", num_beams), ("top_k", top_k or 1)):
        if isinstance(value, bool) or not hasattr(value, "__index__"):  # (top_k: None is none)
            raise ValueError(f"{name(n)} must be a whole number, got {value!r}.")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}.")
    vocab, low, high = model.config.vocab_size, int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab:  # a padding row of the embedding, or an index error, otherwise
        raise ValueError(
            f"input_ids hold token id {low if low < 0 else high}, outside the model's vocabulary of "
            f"{vocab} (ids 0 to {vocab - 1}): use the tokenizer saved with the weights."
        )
    n_ctx = model.config.n_positions
    if input_ids.shape[1] + max_new_tokens > n_ctx:
        raise ValueError(
            f"A prompt of {input_ids.shape[1]} tokens plus max_new_tokens={max_new_tokens} exceeds the "
            f"model's context of {n_ctx} tokens."
        )
    if (
        do_sample and not temperature > 0
    ):  # (NaN too); greedy decoding reads none of the three, as transformers'
        raise ValueError(
            f"{name('temperature')} must be > 0, got {temperature}; use {said('do_sample', False)} for "
            "greedy decoding."
        )
    if do_sample and top_k is not None and top_k < 1:
        raise ValueError(f"{name('top_k')} must be >= 1, got {top_k}.")
    if do_sample and top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"{name('top_p')} must be in (0, 1], got {top_p}.")
    if num_beams < 1:
        raise ValueError(f"{name('num_beams')} must be >= 1, got {num_beams}.")
    if num_beams > 1 and do_sample:
        raise ValueError(
            f"Beam search is deterministic: use {said('num_beams', 1)} with {said('do_sample', True)}."
        )
    if not repetition_penalty > 0:
        raise ValueError(f"{name('repetition_penalty')} must be > 0 (1: none), got {repetition_penalty}.")


def penalized(scores: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019), as transformers applies it: the score of each
    token the sequence holds already (`seen`, (B, V) bool) divided by `penalty` where positive,
    multiplied by it where negative (beam search penalises log-probabilities so)."""
    return torch.where(seen, torch.where(scores < 0, scores * penalty, scores / penalty), scores)


def seen_tokens(ids: Tensor, vocab: int, real: Tensor | None = None) -> Tensor:
    """(B, V) bool: which tokens each row of `ids` holds (where `real`, (B, T) bool, if given: a
    padded prompt's padding is no token of it)."""
    held = torch.zeros(ids.shape[0], vocab, dtype=torch.long, device=ids.device)
    ones = torch.ones_like(ids, dtype=torch.long) if real is None else real.long()  # (any integer ids)
    return held.scatter_add_(1, ids.long(), ones) > 0


def left_padding(
    input_ids: Tensor, attention_mask: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Prompts padded on the left as the model takes them: (the ids, each padding one 0; `real`,
    (B, T) bool; the positions, counting each prompt's own tokens only, as if it were alone), or
    (`input_ids`, None, None) where no token is padding."""
    if attention_mask is None:
        return input_ids, None, None
    attention_mask = torch.as_tensor(attention_mask)  # (a list or NumPy array, as a tokenizer may give)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} and input_ids "
            f"{tuple(input_ids.shape)}: give a mask value (1 real, 0 padding) for each token."
        )
    real = attention_mask.to(input_ids.device).bool()
    if bool(real.all()):  # no mask to build: SDPA keeps its fastest kernels
        return input_ids, None, None
    empty = (~real.any(1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"Prompt {empty[0]} is all padding (attention_mask 0): give each prompt a token.")
    ends_padded = (~real[:, -1]).nonzero().flatten().tolist()
    if ends_padded:
        raise ValueError(
            f"attention_mask marks the last token of prompt {ends_padded[0]} as padding: pad prompts "
            "on the left (a transformers tokenizer's padding_side='left'), as the new tokens follow "
            "each prompt's last."
        )
    return input_ids.masked_fill(~real, 0), real, (real.long().cumsum(1) - 1).clamp(min=0)


def longrope_crossings(model, input_ids: Tensor, real: Tensor | None, max_new_tokens: int) -> set[int]:
    """The decoding steps (1 to max_new_tokens - 1; the prompt's is 0) whose new token takes a text past
    LongRoPE's original context: there its keys, cached with the short factors, are computed again
    with the long ones (the whole text run anew, as transformers' Phi-3 decodes), so that the text
    decodes as it runs whole. None for other models (a prompt's length read once)."""
    c = model.config
    if c.rope_type != "longrope":
        return set()
    lengths = [input_ids.shape[1]] if real is None else real.sum(1).tolist()
    steps = {c.rope_scaling["original_max_position_embeddings"] + 1 - n for n in lengths}
    return {i for i in steps if 1 <= i < max_new_tokens}


def restarted(cache):
    """`cache` emptied, in place (a static one keeps its addresses)."""
    if hasattr(cache, "reset"):
        cache.reset()
    else:
        cache.length = 0
    return cache


def grown(real: Tensor | None, positions: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """A padded batch's mask and positions with one more (real) token a row."""
    if real is None or positions is None:
        return real, positions
    return torch.nn.functional.pad(real, (0, 1), value=True), torch.cat([positions, positions[:, -1:] + 1], 1)


def stop_ids(eos_token_id: int | list[int] | None, vocab_size: int | None = None) -> list[int]:
    """The end-of-text ids decoding stops at: none, one, or several; with `vocab_size`, those the
    vocabulary holds (no step gives another; a finished row is filled with the first, and reads it)."""
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, (str, bytes)):  # (its characters would be read as ids)
        raise ValueError(f"eos_token_id is a token's id or a list of them, got the text {eos_token_id!r}.")
    try:  # an int, or one as NumPy or torch holds it
        ids = [operator.index(eos_token_id)]
    except TypeError:
        try:
            ids = [operator.index(i) for i in eos_token_id]
        except TypeError:  # 5.0, or [5.0]
            raise ValueError(
                f"eos_token_id is a token's id or a list of them, got {eos_token_id!r}."
            ) from None
    return [i for i in ids if vocab_size is None or 0 <= i < vocab_size]


VALUES_CHECKED_ON = frozenset({"cpu"})  # devices where reading token ids back costs nothing


def check_token_ids(input_ids: Tensor, non_empty: bool = False, vocab_size: int | None = None) -> None:
    """Token ids as the model takes them, (batch, length) integers, or one sentence saying how they
    are not: their shape and type; and on the CPU, outside a compiled graph, their values within
    `vocab_size` (an id past it read an untrained row of the padded table, or failed deep in torch;
    on a GPU they would be read back from the device, a wait at every step)."""
    if not isinstance(input_ids, Tensor):
        raise ValueError(
            f"input_ids must be a (batch, length) tensor of token ids, got a {type(input_ids).__name__}."
        )
    if input_ids.ndim != 2 or (non_empty and 0 in input_ids.shape):
        what = "a non-empty (batch, length)" if non_empty else "a (batch, length)"
        raise ValueError(f"input_ids must be {what} tensor, got shape {tuple(input_ids.shape)}.")
    if input_ids.dtype not in (torch.int64, torch.int32):  # (the embedding takes no other)
        raise ValueError(f"input_ids must hold integer token ids (int64 or int32), got {input_ids.dtype}.")
    if vocab_size is not None and input_ids.device.type in VALUES_CHECKED_ON and input_ids.numel():
        if not torch.compiler.is_compiling():
            low, high = (int(v) for v in torch.aminmax(input_ids))
            if low < 0 or high >= vocab_size:
                raise ValueError(
                    f"input_ids holds the token id {low if low < 0 else high}, outside the model's "
                    f"vocabulary of {vocab_size} (ids 0 to {vocab_size - 1})."
                )


_IN_EVAL: dict[int, list] = {}  # a model in `eval_mode`: [the entries not yet left, its modules' modes]
_IN_EVAL_LOCK = threading.Lock()


@contextmanager
def eval_mode(*models: torch.nn.Module) -> Iterator[None]:
    """The models in eval mode (no dropout) while they decode or score, then each of their modules
    back in the mode it was in: a model fresh from `from_pretrained` is in training mode, and one
    mid-training goes on training after it is read. Threads reading one model at once share one
    entry: the modes are put back when the last leaves (the first to leave switched dropout back on
    under the others)."""
    with _IN_EVAL_LOCK:
        for model in models:
            if id(model) not in _IN_EVAL:
                _IN_EVAL[id(model)] = [0, [(module, module.training) for module in model.modules()]]
            _IN_EVAL[id(model)][0] += 1
            model.eval()  # (each entry: a model trained again while another is open reads in eval mode)
    try:
        yield
    finally:
        with _IN_EVAL_LOCK:
            for model in models:
                entry = _IN_EVAL[id(model)]
                entry[0] -= 1
                if not entry[0]:
                    for module, training in entry[1]:
                        module.training = training
                    del _IN_EVAL[id(model)]
