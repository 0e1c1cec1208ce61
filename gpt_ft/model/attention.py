"""Causal self-attention: the attention module of every block, its kernels and its masks.

`CausalSelfAttention` (a block's `attn`, module names as in the Hugging Face GPT-2 checkpoint:
`c_attn` holds q, k and v stacked, `c_proj` the output projection, `q_norm`/`k_norm` Qwen3's and
Gemma 3's per-head norms, or OLMo's over all heads) runs PyTorch's `scaled_dot_product_attention`, or
`blocked_causal_attention` where SDPA would be slow (on a CPU: dropout, or bf16/fp16 rows of up to
`BLOCKED_ROWS` positions, where plain matmuls beat SDPA's CPU flash kernel 2-4x forward and
backward; longer rows: the flash kernel, faster, keeps no scores). `causal_mask` builds SDPA's mask
where padding, a cache or a window needs one; `packed_mask` that of rows of packed sequences."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt_ft.model import fused, kernels, rope
from gpt_ft.model.cache import Cache, StaticKVCache
from gpt_ft.model.config import GPTConfig
from gpt_ft.model.linear import Linear
from gpt_ft.model.norms import norm

# torch >= 2.5: scaled_dot_product_attention groups query heads over shared key/value heads itself.
SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
BLOCKED_ROWS = 256
"""bf16/fp16 rows up to this long run blocked on a CPU, longer ones on SDPA's flash kernel (Xeon,
AMX: rows of 512-1,024 positions 1.5-1.75x faster; a step of rows up to 860: 13% faster, 37% less memory)."""
Rotary = tuple[Tensor, Tensor]  # cos, sin (1 or B, 1, T, rotary_dims) of rotary positions


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_dim
        hs, width = config.head_dim, config.n_head * config.head_dim
        qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
        # q for all heads, then k and v for the key/value heads, in one matrix
        self.c_attn = Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * hs, bias=qkv_bias)
        self.c_proj = Linear(width, config.n_embd, bias=config.bias)
        # Qwen3, Gemma 3: each head's queries and keys normalised over the head size; OLMo 2 and 3:
        # all heads' queries, and all keys, each at once before the split into heads
        self.qk_norm_whole = config.qk_norm_span == "all_heads"
        q_width, k_width = (width, self.n_kv_head * hs) if self.qk_norm_whole else (hs, hs)
        self.q_norm = norm(config, q_width) if config.qk_norm else None
        self.k_norm = norm(config, k_width) if config.qk_norm else None
        self.scale = config.query_pre_attn_scalar**-0.5 if config.query_pre_attn_scalar else None
        self.attn_pdrop = config.attn_pdrop
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        cache: Cache | None,
        layer: int,
        rotary: Rotary | None = None,
    ) -> Tensor:
        B, T, _ = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_size
        qkv = self.c_attn(x)
        dropout_p = self.attn_pdrop if self.training else 0.0
        if getattr(mask, "fused_inputs", False) and rotary and self.q_norm is None and fused.wanted(qkv):
            q, k, v = fused.attention_inputs(qkv, (nh, nkv, hs), rotary)
            y = mask.attend(mask.kernel(q, dropout_p), q, k, v, self.scale, dropout_p)
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, nh * hs)))
        q, k, v = qkv.split([nh * hs, nkv * hs, nkv * hs], dim=2)
        if self.qk_norm_whole:  # OLMo 2 and 3: over all heads, before the split
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(B, T, nh, hs), k.view(B, T, nkv, hs), v.view(B, T, nkv, hs)
        if self.q_norm is not None and not self.qk_norm_whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hs)
        if rotary is not None:
            q, k = rope.rotate(q, *rotary), rope.rotate(k, *rotary)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, nkv, T_past + T, hs)
        if isinstance(mask, PackedRows):
            kernel = mask.kernel(q, dropout_p)
            if kernel != "dense":
                y = mask.attend(kernel, q, k, v, self.scale, dropout_p)  # (B, nh, T, hs)
                return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, nh * hs)))
            mask = mask.dense()
        blocked = (
            x.device.type == "cpu"
            and not torch.compiler.is_compiling()  # compiled, its loop would fix T: a graph per length
            and cache is None
            and (mask is not None or is_causal)
            and T > 0  # (no block of queries: SDPA's empty output)
            and (dropout_p > 0 or (low_precision(v) and T <= BLOCKED_ROWS))
        )
        static = isinstance(cache, StaticKVCache)  # its masks made additive once, not in every layer
        if causal_bias(mask) or static:  # in the dtype autocast casts to (SDPA checks before it casts)
            q, k, v = fused.in_autocast_dtype(q, k, v)
        mask = cache.bias(mask, q.dtype) if static else mask
        gqa = {}
        if nkv != nh and (blocked or not SDPA_GQA):  # each key/value head serves nh / nkv query heads
            k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        elif nkv != nh:
            gqa = {"enable_gqa": True}  # SDPA reads each key/value head for its group: no copies
        if blocked:
            y = blocked_causal_attention(q, k, v, mask, dropout_p, scale=self.scale)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=self.scale, **gqa
            )
        y = y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, nh * hs)
        return self.resid_dropout(self.c_proj(y))


def causal_bias(mask) -> bool:
    """Whether `mask` is SDPA's `CausalBias`, whose module is imported only where one is made."""
    bias = sys.modules.get("torch.nn.attention.bias")
    return bias is not None and isinstance(mask, bias.CausalBias)


def low_precision(x: Tensor) -> bool:
    """Whether attention runs in bf16 or fp16 here: x is, or autocast will cast it."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return True
    kind = x.device.type
    return torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) != torch.float32


def causal_mask(
    attention_mask: Tensor | None,
    T: int,
    past: int,
    device: torch.device,
    window: int | None = None,
    positions: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor | None, bool]:
    """(mask, is_causal) for scaled_dot_product_attention; a boolean mask is True where allowed.

    Without padding or a window no mask is built, so that SDPA may pick its flash or
    memory-efficient kernels: plain causal, one new token over the cache, or T new tokens over
    T_past cached ones (causal aligned to the lower right: query i sees keys up to T_past + i).
    `window`: each query sees only the keys fewer than `window` positions before it (a sliding
    window), counted in `positions` (queries (B, T), keys (B, T_k)) where those are not the
    indices: a shared prefix's continuations.
    """
    if window is not None and past + T <= window:
        window = None  # nothing is that far back
    if attention_mask is None and window is None:
        if past == 0:
            return None, True
        if T == 1:
            return None, False
        from torch.nn.attention.bias import causal_lower_right  # (loads TorchDynamo: when needed)

        return causal_lower_right(T, past + T), False
    if attention_mask is not None and attention_mask.shape[-1] != past + T:
        raise ValueError(
            f"attention_mask covers {attention_mask.shape[-1]} positions but the keys are {past + T}."
        )
    q_index = torch.arange(past, past + T, device=device)[:, None]  # (T, 1)
    k_index = torch.arange(past + T, device=device)[None, :]  # (1, T_k)
    allowed = k_index <= q_index  # (T, T_k)
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, None, :]  # (B, 1, T, T_k)
    if window is not None:
        q_pos, k_pos = (
            (q_index, k_index)
            if positions is None
            else (positions[0][:, None, :, None], positions[1][:, None, None, :])
        )
        allowed = allowed & (q_pos - k_pos < window)
    # A padding query may see no real key at all; letting it see itself keeps softmax finite.
    mask = allowed | (k_index == q_index)
    return mask if mask.ndim == 4 else mask[None, None], False


def packed_mask(
    documents: Tensor, branches: Tensor | None, positions: Tensor, window: int | None = None
) -> Tensor:
    """The boolean mask (R, 1, L, L), True where allowed, of rows of packed sequences: a token
    attends to the tokens before it in its own sequence only (`documents` (R, L), the sequence of
    each token), and with `branches` (R, L) a choice's continuation (k > 0) to its shared context
    (0) and itself, never to another choice. `window`: only keys fewer than `window` positions
    (`positions` (R, L)) back. Every token sees itself, a row's padded tail included.
    """
    L = documents.shape[1]
    index = torch.arange(L, device=documents.device)
    allowed = (documents[:, :, None] == documents[:, None, :]) & (index[None, :] <= index[:, None])
    if branches is not None:
        key = branches[:, None, :]
        allowed &= (key == 0) | (key == branches[:, :, None])
    if window is not None:
        allowed &= positions[:, :, None] - positions[:, None, :] < window
    return allowed[:, None]


def segment_offsets(documents: Tensor) -> tuple[Tensor, int]:
    """(cu_seqlens, max_seqlen) of rows of packed sequences (`documents` (R, L), -1 at a row's
    tail): where each sequence, and each row's padded tail, starts in the flattened rows, and the
    longest. The collator computes the same on the host; this serves callers that have only
    `documents` (reading the longest back from the device)."""
    R, L = documents.shape
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    begins = starts.flatten().nonzero().flatten()
    ends = torch.cat([begins[1:], begins.new_tensor([R * L])])
    return torch.cat([begins, ends[-1:]]).int(), int((ends - begins).max())


FORCE_KERNEL: str | None = None
"""Run packed rows on this kernel ("varlen", "flex" or "dense"; "sequences": laid flat where they can
be, on the dense mask where not) wherever it runs; tests set it."""


class PackedRows:
    """Attention's view of rows of packed sequences (R, L): a token attends to the earlier tokens
    of its own sequence (`documents`), a choice's continuation to its shared context and itself
    (`branches`), within `window` positions when set. `cu_seqlens` / `max_seqlen` (see
    `segment_offsets`) come from the collator, so no step reads them back from the device.

    On CUDA, rows without shared contexts run FlashAttention's variable-length kernel in bf16/fp16
    (`varlen_attn`; under attention dropout, which it does not draw, `FlashVarlenDropout`), and the
    rest FlexAttention with a block mask of the same rule, or, under attention dropout (which
    FlexAttention cannot draw), the dense mask. Elsewhere the dense mask (`packed_mask`) goes to
    SDPA or the blocked matmuls, or, on a CPU, long sequences are laid flat (`sequences.FlatRows`).
    Either mask is built once per forward pass, for every layer.
    """

    fused_inputs = False  # whether `attend` takes `fused.attention_inputs`' queries, keys, values

    def __init__(
        self,
        documents: Tensor,
        branches: Tensor | None,
        positions: Tensor,
        window: int | None = None,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> None:
        self.documents, self.branches, self.positions, self.window = documents, branches, positions, window
        self.cu_seqlens, self.max_seqlen = cu_seqlens, max_seqlen
        self._dense: Tensor | None = None
        self._block = None

    def dense(self) -> Tensor:
        """The boolean mask (R, 1, L, L), True where allowed (`packed_mask`)."""
        if self._dense is None:
            self._dense = packed_mask(self.documents, self.branches, self.positions, self.window)
        return self._dense

    def kernel(self, q: Tensor, dropout_p: float) -> str:
        """ "varlen", "flex" or "dense": the kernel for these rows and queries (B, nh, T, hs)."""
        if FORCE_KERNEL is not None:
            if FORCE_KERNEL == "varlen" and self.branches is not None:  # it would let choices see each other
                raise ValueError("FORCE_KERNEL 'varlen' cannot run shared contexts (rows with branches).")
            return "dense" if FORCE_KERNEL == "sequences" else FORCE_KERNEL  # (rows not laid flat)
        if q.device.type != "cuda":
            return "dense"
        kernels.load()
        varlen = (
            kernels.varlen_attn is not None
            and self.branches is None
            and low_precision(q)
            and q.shape[-1] % 8 == 0
            and q.shape[-1] <= 256
            and (self.window is None or "window_size" in kernels.VARLEN)
        )
        if dropout_p > 0:  # FlashAttention draws it; FlexAttention cannot
            return "varlen" if varlen else "dense"
        return "varlen" if varlen else "flex" if kernels.flex_attention is not None else "dense"

    def attend(
        self, kernel: str, q: Tensor, k: Tensor, v: Tensor, scale: float | None, dropout_p: float = 0.0
    ) -> Tensor:
        """Attention of queries (B, nh, T, hs) over keys and values (B, nkv, T, hs) on `kernel`."""
        q, k, v = fused.in_autocast_dtype(q, k, v)
        kernels.load()
        if kernel == "varlen":
            return self._varlen(q, k, v, scale, dropout_p)
        return self._flex(q, k, v, scale)

    def _varlen(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None, dropout_p: float) -> Tensor:
        B, nh, T, hs = q.shape
        if self.cu_seqlens is None:
            self.cu_seqlens, self.max_seqlen = segment_offsets(self.documents)
        flat = lambda t: t.transpose(1, 2).reshape(B * T, t.shape[1], hs)  # noqa: E731
        cu, longest, groups = self.cu_seqlens.to(q.device, torch.int32), self.max_seqlen, nh // k.shape[1]
        if dropout_p > 0:
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            left = -1 if self.window is None else self.window - 1
            drop = kernels.FlashVarlenDropout
            y = drop.apply(flat(q), flat(k), flat(v), cu, longest, dropout_p, scale, left)
            return y.view(B, T, nh, hs).transpose(1, 2)
        options, keywords = {}, kernels.VARLEN
        if "window_size" in keywords:  # causal: (-1, 0); a sliding window sees `window` - 1 keys back
            options["window_size"] = (-1 if self.window is None else self.window - 1, 0)
        else:
            options["is_causal"] = True
        if scale is not None and "scale" not in keywords:
            q, scale = q * (scale * hs**0.5), None
        if scale is not None:
            options["scale"] = scale
        if groups > 1 and "enable_gqa" in keywords:
            options["enable_gqa"] = True
        elif groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        varlen = kernels.varlen_attn
        y = varlen(flat(q), flat(k), flat(v), cu, cu, longest, longest, **options)  # (B * T, nh, hs)
        return y.view(B, T, nh, hs).transpose(1, 2)

    def block_mask(self):
        """FlexAttention's `BlockMask` of these rows: `packed_mask`'s rule as a mask_mod."""
        if self._block is None:
            kernels.load()
            documents, branches = self.documents, self.branches
            positions, window = self.positions, self.window

            def allowed(b, h, query, key):
                same = (documents[b, query] == documents[b, key]) & (key <= query)
                if branches is not None:
                    same = same & ((branches[b, key] == 0) | (branches[b, key] == branches[b, query]))
                if window is not None:
                    same = same & (positions[b, query] - positions[b, key] < window)
                return same

            R, L = documents.shape
            self._block = kernels.create_block_mask(allowed, R, None, L, L, device=documents.device)
        return self._block

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, scale: float | None) -> Tensor:
        gqa = k.shape[1] != q.shape[1]
        return kernels.flex(q.device)(q, k, v, block_mask=self.block_mask(), scale=scale, enable_gqa=gqa)


def blocked_causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    block: int = 128,
    scale: float | None = None,
) -> Tensor:
    """Causal self-attention, one block of queries at a time; (B, nh, T, hs) in and out.

    PyTorch's CPU flash kernel has no dropout, so SDPA with dropout on a CPU materialises the whole
    (T, T) score matrix, masked half included. A block of queries only needs the keys up to its
    last position, which skips most of that half (at T = 512: 62.5% of the work, about half the
    time). In bf16 the CPU flash kernel is slower still, 2-4x these matmuls forward and backward
    (most at short rows: packed sentences); the scores are the matmuls' (bf16, as transformers'
    eager attention), their softmax fp32. `mask` is None (plain causal) or a boolean (B or 1, 1,
    T, T) mask, True where allowed; `scale` multiplies the scores (default 1 / sqrt(hs)).
    """
    B, nh, T, hs = q.shape
    q = q * (hs**-0.5 if scale is None else scale)
    if mask is None:
        bias = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device).triu(1)  # (T, T)
    out = []
    for start in range(0, T, block):
        end = min(start + block, T)
        if mask is None:  # baddbmm adds the causal bias inside the matmul
            att = torch.baddbmm(
                bias[start:end, :end],
                q[:, :, start:end].reshape(B * nh, end - start, hs),
                k[:, :, :end].reshape(B * nh, end, hs).transpose(1, 2),
            ).view(B, nh, end - start, end)  # (B, nh, block, end)
        else:
            att = q[:, :, start:end] @ k[:, :, :end].transpose(-1, -2)  # (B, nh, block, end)
            att = att.masked_fill(~mask[:, :, start:end, :end], float("-inf"))
        att = att.softmax(dim=-1, dtype=torch.promote_types(att.dtype, torch.float32)).to(
            v.dtype
        )  # fp64 kept
        att = F.dropout(att, dropout_p, training=True)
        out.append(att @ v[:, :, :end])  # (B, nh, block, hs)
    return torch.cat(out, dim=2)
