"""Key/value caches: `KVCache` for generation, `StaticKVCache` for generation whose decode step
is captured as a CUDA graph, `SharedPrefix` for choices that share a context."""

from __future__ import annotations

import torch
from torch import Tensor

from gpt_ft.model.config import GPTConfig


class KVCache:
    """Keys and values of the positions seen so far, preallocated for `max_len` positions.

    `gpt(new_ids, kv_cache=cache)` attends to everything in the cache and appends its own keys
    and values; `length` is the number of cached positions.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, *, dtype, device) -> None:
        shape = (config.n_layer, batch_size, config.kv_heads, max_len, config.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this layer's new keys/values (B, nh, T, hs); return all of them so far."""
        end = self.length + k.shape[2]
        if end > self.max_len or k.shape[0] != self.k.shape[1]:
            raise ValueError(misfit(self, k, self.length))
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows `index` (beam search follows its surviving beams with this)."""
        self.k = self.k.index_select(1, index)
        self.v = self.v.index_select(1, index)


class StaticKVCache:
    """A `KVCache` at fixed addresses and shapes: every call attends over all `max_len` slots, those
    not yet written masked out, and the length lives on the device (`position`), so that one decode
    step is the same kernels on the same memory each time and replays as a CUDA graph.

    `gpt(new_ids, kv_cache=cache)` writes the new keys and values at `position` and advances
    it, on the device; `masks` gives the attention masks of those positions. Padded prompts:
    `gpt(ids, attention_mask, position_ids=..., kv_cache=cache)` (`pad`); the keys the mask marks
    as padding stay masked, and the positions of the tokens after it skip them.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, *, dtype, device) -> None:
        shape = (config.n_layer, batch_size, config.kv_heads, max_len, config.head_dim)
        # zeros, not empty: a masked slot's value is still multiplied by its zero weight
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.slots = torch.arange(max_len, device=device)
        self.real = torch.ones(batch_size, max_len, dtype=torch.bool, device=device)  # keys not padding
        self.skipped = torch.zeros(batch_size, 1, dtype=torch.long, device=device)  # padding so far
        self.index: Tensor | None = None  # the slots of the call under way, made once for every layer
        self.biases: list[tuple[Tensor, torch.dtype, Tensor]] = []  # this call's masks made additive

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def length(self) -> int:
        """The cached positions (read back from the device)."""
        return int(self.position)

    def reset(self) -> None:
        """Empty, in place (a captured decode step reads these addresses): no position cached, none
        padding."""
        for t in (self.k, self.v, self.position, self.skipped):
            t.zero_()
        self.real.fill_(True)
        self.index, self.biases = None, []

    def written(self, T: int) -> Tensor:
        """The slots (T,) T new tokens are written at: `position`, ..., `position` + T - 1."""
        return self.position + self.slots[:T]

    def positions(self, T: int) -> Tensor:
        """The positions (B, T) of T new tokens: their slots less the padding before them."""
        return self.written(T) - self.skipped

    def pad(self, attention_mask: Tensor) -> None:
        """Mark the keys that `attention_mask` (B, T_k: the cached and new ones, from the first) marks
        0 as padding: never attended to, and not counted in the positions of the tokens after it."""
        if attention_mask.shape[0] != self.real.shape[0] or attention_mask.shape[1] > self.max_len:
            raise ValueError(
                f"attention_mask of shape {tuple(attention_mask.shape)} does not fit the KV cache "
                f"({self.real.shape[0]} rows of {self.max_len} positions)."
            )
        real = attention_mask.bool()
        self.real[:, : real.shape[1]].copy_(real)  # in place: a captured decode step reads these
        self.skipped.copy_((~real).sum(1, keepdim=True))

    def masks(self, T: int, window: int | None) -> tuple[Tensor, Tensor]:
        """Boolean masks (B, 1, T, max_len), True where allowed, of T new tokens: every layer's
        (causal over the written slots, padding left out), and a sliding window's. A padding query
        sees itself (softmax stays finite)."""
        self.index, self.biases = self.written(T), []
        queries = self.index[:, None]  # (T, 1)
        causal = self.slots[None, :] <= queries
        itself = (self.slots[None, :] == queries)[None, None]
        allowed = (causal[None, None] & self.real[:, None, None, :]) | itself
        if window is None:
            return allowed, allowed
        return allowed, allowed & (queries - self.slots[None, :] < window)[None, None]

    def bias(self, mask: Tensor, dtype: torch.dtype) -> Tensor:
        """One of this call's `masks` as the additive mask SDPA would make of it for queries of
        `dtype` (0 where allowed, -inf where not), made once for every layer: SDPA converts a
        boolean mask again in each (two kernels a layer of a decode step's few hundred)."""
        for made, kind, bias in self.biases:
            if made is mask and kind == dtype:
                return bias
        bias = torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), float("-inf"))
        self.biases.append((mask, dtype, bias))
        return bias

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this layer's new keys/values (B, nh, T, hs) at `position`; return every slot. Under
        autocast they come in its dtype and are kept in the cache's, as `KVCache` keeps them."""
        # The length lives on the device: read on a CPU only (free there), by the first layer; an
        # accelerator's decode loop knows its lengths ahead (`generate` sizes the cache to fit).
        held = self.length if self.k.device.type == "cpu" and layer == 0 else None
        if k.shape[0] != self.k.shape[1] or k.shape[2] + (held or 0) > self.max_len:
            raise ValueError(misfit(self, k, held))
        index = self.index if self.index is not None and len(self.index) == k.shape[2] else None
        index = self.written(k.shape[2]) if index is None else index
        self.k[layer].index_copy_(2, index, k.to(self.k.dtype))
        self.v[layer].index_copy_(2, index, v.to(self.v.dtype))
        return self.k[layer], self.v[layer]

    def advance(self, T: int) -> None:
        self.position += T
        self.index, self.biases = None, []


def misfit(cache: KVCache | StaticKVCache, k: Tensor, length: int | None) -> str:
    """The sentence for new keys (B, nh, T, hs) that do not fit `cache` (`length` positions in it)."""
    rows, room = cache.k.shape[1], cache.max_len
    if k.shape[0] != rows:
        b = k.shape[0]
        return f"The KV cache was made for a batch of {rows}, not {b}: make one with new_kv_cache({b})."
    held = "" if length is None else f"{length} are cached and "
    return (
        f"The KV cache holds {room} positions; {held}{k.shape[2]} more do not fit: make it with "
        "new_kv_cache(batch_size, max_len=...)."
    )


class SharedPrefix:
    """Keys and values of shared prefixes, attended to by several continuations each; differentiable.

    `gpt(prefix_ids, kv_cache=shared)` records every layer's keys and values of the prefixes
    (B rows); then `gpt(continuation_ids, mask, position_ids=..., kv_cache=shared.continued(S))`
    runs B * S continuations (row b * S + s continues prefix b), each attending to its prefix's keys
    and values and to itself. Gradients from all continuations flow into the one prefix
    computation. The mask covers prefix and continuation keys, (B * S, T_prefix + T). Each pass
    keeps its own object, so a block recomputed in the backward pass (activation checkpointing)
    does what it did forward.
    """

    def __init__(self) -> None:
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        self.length = 0
        self.repeats: int | None = None
        self.lengths: Tensor | None = None
        """LongRoPE's: the length each row's factors are chosen by (its continuations'), (rows, 1)."""

    def continued(self, repeats: int) -> SharedPrefix:
        """The continuations' view of these prefixes' keys and values, `repeats` to a prefix."""
        view = SharedPrefix()
        view.k, view.v, view.length, view.repeats = self.k, self.v, self.length, repeats
        return view

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.repeats is None:  # the prefixes' own pass
            self.k[layer], self.v[layer] = k, v
            return k, v
        return self._with_prefix(self.k[layer], k), self._with_prefix(self.v[layer], v)

    def _with_prefix(self, prefix: Tensor, new: Tensor) -> Tensor:
        B, nh, Tp, hs = prefix.shape
        repeated = prefix[:, None].expand(B, self.repeats, nh, Tp, hs).reshape(B * self.repeats, nh, Tp, hs)
        return torch.cat([repeated, new], dim=2)


Cache = KVCache | StaticKVCache | SharedPrefix
