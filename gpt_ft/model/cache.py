"""Key/value caches: `KVCache` for generation, `SharedPrefix` for choices that share a context."""

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
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows `index` (beam search follows its surviving beams with this)."""
        self.k = self.k.index_select(1, index)
        self.v = self.v.index_select(1, index)


class SharedPrefix:
    """Keys and values of shared prefixes, attended to by several continuations each; differentiable.

    `gpt(prefix_ids, kv_cache=shared)` records every layer's keys and values of the prefixes
    (B rows); then `shared.repeats = S` and `gpt(continuation_ids, mask, position_ids=...,
    kv_cache=shared)` runs B * S continuations (row b * S + s continues prefix b), each attending
    to its prefix's keys and values and to itself. Gradients from all continuations flow into the
    one prefix computation. The mask covers prefix and continuation keys, (B * S, T_prefix + T).
    """

    def __init__(self) -> None:
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        self.length = 0
        self.repeats: int | None = None

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.repeats is None:  # the prefixes' own pass
            self.k[layer], self.v[layer] = k, v
            return k, v
        return self._with_prefix(self.k[layer], k), self._with_prefix(self.v[layer], v)

    def _with_prefix(self, prefix: Tensor, new: Tensor) -> Tensor:
        B, nh, Tp, hs = prefix.shape
        repeated = prefix[:, None].expand(B, self.repeats, nh, Tp, hs).reshape(B * self.repeats, nh, Tp, hs)
        return torch.cat([repeated, new], dim=2)


Cache = KVCache | SharedPrefix
