"""GPT-1, GPT-2 and Llama-style decoders in pure PyTorch.

One config switch picks the block layout: GPT-1 is post-LN with no final LayerNorm, GPT-2 is
pre-LN with a final LayerNorm. A few more make Llama-family blocks of the same modules: RMSNorm
for LayerNorm, rotary positions for learned ones, SwiGLU, fewer key/value heads, no biases, an
untied head; and Qwen3's and Gemma 3's (per-head query/key norms, norms after attention and MLP,
scaled embeddings, sliding-window layers), SmolLM3's (layers without rotary positions), GPT-NeoX's
(rotary positions on part of each head, attention and MLP side by side), OLMo 2's and 3's (norms after
attention and MLP only, queries and keys normalised over all heads). Attention
lives in `attention.py`, the norms in `norms.py`. Module names follow the Hugging Face GPT-2
checkpoint keys (`wte`, `wpe`, `h.N.attn.c_attn`, ...), so converting GPT weights in either
direction is a name map plus a transpose list; Llama's separate q/k/v and gate/up matrices are
stacked (see `gpt_ft/weights/hf.py`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from gpt_ft.model import attention, fused, generation, rope
from gpt_ft.model.attention import CausalSelfAttention, PackedRows, Rotary, causal_mask
from gpt_ft.model.cache import Cache, KVCache, SharedPrefix, StaticKVCache
from gpt_ft.model.config import ACTIVATIONS, GPTConfig
from gpt_ft.model.decoding import check_token_ids
from gpt_ft.model.linear import Linear, linear
from gpt_ft.model.norms import RMSNorm, norm
from gpt_ft.model.sequences import FlatRows, flat_rows

__all__ = ["GPT", "GPTConfig", "Block", "KVCache", "StaticKVCache", "SharedPrefix"]


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gated = config.gated_mlp  # c_fc then computes gate and up, stacked
        self.c_fc = Linear(config.n_embd, (2 if self.gated else 1) * config.ffn_dim, bias=config.bias)
        self.c_proj = Linear(config.ffn_dim, config.n_embd, bias=config.bias)
        self.act, self.activation = ACTIVATIONS[config.activation], config.activation
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)
        if self.gated and fused.wanted(h):
            swiglu = fused.compiled(f"swiglu-{self.activation}", fused.gated(self.act))
            return self.dropout(self.c_proj(swiglu(h)))
        if self.gated:  # SwiGLU (Shazeer 2020): act(gate) * up
            gate, up = h.chunk(2, dim=-1)
            return self.dropout(self.c_proj(self.act(gate) * up))
        return self.dropout(self.c_proj(self.act(h)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.pre_ln, self.parallel_residual = config.pre_ln, config.parallel_residual
        # OLMo 2 and 3 normalise no input of attention or MLP (input_norms false), only their outputs
        self.ln_1 = norm(config) if config.input_norms else None
        self.attn = CausalSelfAttention(config)
        self.ln_2 = norm(config) if config.input_norms else None
        for ln in (self.ln_1, self.ln_2) if config.pre_ln and config.input_norms else ():
            ln.feeds_matmul = True  # into attn.c_attn, mlp.c_fc only (see RMSNorm)
        self.mlp = MLP(config)
        # Gemma 2 and 3: attention's and the MLP's outputs normalised before the residual sum
        self.post_attn_norm = norm(config) if config.post_norms else None
        self.post_mlp_norm = norm(config) if config.post_norms else None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        cache: Cache | None,
        layer: int,
        rotary: Rotary | None = None,
    ) -> Tensor:
        if not self.pre_ln:  # GPT-1
            x = self.ln_1(x + self.attn(x, mask, is_causal, cache, layer, rotary))
            return self.ln_2(x + self.mlp(x))
        ln_1, ln_2 = (self.ln_1, self.ln_2) if self.ln_1 is not None else (_unnormed, _unnormed)
        h = self.attn(ln_1(x), mask, is_causal, cache, layer, rotary)  # GPT-2, Llama, ...
        h = h if self.post_attn_norm is None else self.post_attn_norm(h)
        if self.parallel_residual:  # GPT-NeoX: the MLP reads the block's input too (summed as it sums)
            m = self.mlp(ln_2(x))
            return (m if self.post_mlp_norm is None else self.post_mlp_norm(m)) + h + x
        x = x + h
        h = self.mlp(ln_2(x))
        return x + (h if self.post_mlp_norm is None else self.post_mlp_norm(h))


def _unnormed(x: Tensor) -> Tensor:
    """The input of attention or MLP in a block without input norms (OLMo 2 and 3), as it is."""
    return x


def table(rows: int, width: int, drawn: bool = True) -> nn.Embedding:
    """An embedding table, its weights drawn as torch draws them, or left undrawn (on the meta
    device, for weights loaded next: a meta `normal_` imports TorchDynamo, over a second)."""
    return nn.Embedding(rows, width, _weight=None if drawn else torch.empty(rows, width))


class GPT(nn.Module):
    """A decoder-only transformer: GPT-1, GPT-2 or Llama-style, as `config` says.

    `gpt(input_ids)` returns the final hidden states; `gpt.lm_logits(hidden)` the next-token
    logits through the token embedding (tied) or `lm_head` (untied).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        drawn = torch.get_default_device().type != "meta"  # meta: its weights are loaded next
        self.wte = table(config.padded_vocab_size, config.n_embd, drawn)
        learned = config.positions == "learned"
        self.wpe = table(config.n_positions, config.n_embd, drawn) if learned else None
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = norm(config) if config.pre_ln else None
        untied = not config.tie_embeddings
        self.lm_head = Linear(config.n_embd, config.padded_vocab_size, bias=False) if untied else None
        if drawn:
            self._initialize(self)
        self.register_load_state_dict_pre_hook(GPT._fit_embedding_rows)
        self.activation_checkpointing = False
        """In training, keep only each block's input and recompute its activations in the backward
        pass: memory for about one more forward pass (the dropout masks are replayed)."""
        self.lm_rows: int | None = None  # a training loss's next tokens: the first rows only (a run's)

    def _initialize(self, root: nn.Module) -> None:
        """Fresh weights for `root` (this model or some of its blocks)."""
        root.apply(self._init_weights)
        if self.config.pre_ln and self.config.n_layer:
            # GPT-2 §2.3: scale the init of residual projections by 1/sqrt(N), N residual layers.
            std = self.config.initializer_range / math.sqrt(2 * self.config.n_layer)
            for name, p in root.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=std)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-1 §4.1: "a simple weight initialization of N(0, 0.02) was sufficient".
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm | RMSNorm):
            module.reset_parameters()

    def reset_blocks(self, start: int) -> None:
        """Freshly initialise the transformer blocks from `start` on, keeping the embeddings and the
        first `start` blocks: GPT-1's transfer-depth study (§5, Fig. 2 left)."""
        if not 0 <= start <= self.config.n_layer:
            n = self.config.n_layer
            raise ValueError(f"Cannot keep {start} of the model's {n} blocks: give a number in [0, {n}].")
        for block in self.h[start:]:
            self._initialize(block)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        kv_cache: Cache | None = None,
        documents: Tensor | None = None,
        branches: Tensor | None = None,
        cu_seqlens: Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> Tensor:
        """Final hidden states (B, T, C) of `input_ids` (B, T).

        Args:
            input_ids: token ids (B, T).
            attention_mask: 1 for real tokens, 0 for padding, over every key the tokens attend to:
                (B, T), or (B, T_cached + T) with a KV cache. Padded keys are never attended to.
            position_ids: positions (B, T) or (T,); by default T_cached, ..., T_cached + T - 1.
            kv_cache: past keys/values to attend to (see `new_kv_cache`); this call appends to it.
            documents: rows of packed sequences (B, T): the sequence each token belongs to, which
                alone it attends to (with `position_ids` restarting at each; see `packed_mask`).
            branches: with `documents`, (B, T): 0 for a shared context, k > 0 for the k-th
                continuation of it, which attends to the context and itself only.
            cu_seqlens, max_seqlen: with `documents`, where each sequence (and each row's padded
                tail) starts in the flattened rows, and the longest (see `segment_offsets`): the
                variable-length kernel's offsets, from the host; computed here when not given.
        """
        check_token_ids(input_ids, vocab_size=self.config.vocab_size)
        B, T = input_ids.shape
        static = isinstance(kv_cache, StaticKVCache)  # its length stays on the device
        if static and attention_mask is not None and position_ids is None:  # they would count the padding
            raise ValueError(
                "An attention_mask on a StaticKVCache takes its position_ids (each prompt's own tokens "
                "counted, as `generate` gives them)."
            )
        past = kv_cache.length if kv_cache is not None and not static else 0
        if static and position_ids is None:
            position_ids = kv_cache.positions(T)
        if position_ids is None and past + T > self.config.n_positions:
            raise ValueError(
                f"Input of {past + T} tokens is longer than the model's context of "
                f"{self.config.n_positions} (n_positions); truncate it to at most {self.config.n_positions}."
            )
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=input_ids.device)  # (T,)
        x = self.wte(input_ids)  # (B, T, C)
        if self.config.scale_embeddings:  # Gemma: sqrt(C), in fp32 then the weights' dtype as it does
            # made on the device: read back as a Python number, it broke a compiled graph in two
            x = x * torch.full((), self.config.n_embd**0.5, dtype=torch.float32, device=x.device).to(x.dtype)
        if self.wpe is not None:
            x = x + self.wpe(position_ids)
        x = self.drop(x)
        flat = None
        if documents is not None:
            if kv_cache is not None or position_ids.shape != documents.shape:
                raise ValueError("Packed rows (documents) take their position_ids, and no KV cache.")
            flat = self._flat_rows(documents, branches, cu_seqlens, position_ids)
            lengths = (
                rope.sequence_lengths(documents, position_ids)
                if self.config.rope_type == "longrope"
                else None
            )
            if flat is not None:  # on a CPU: the real tokens in one row, each sequence on its own
                x, position_ids = flat.flatten(x), flat.positions
                lengths = None if lengths is None else flat.flatten(lengths)
            window, offsets = self.config.sliding_window, (cu_seqlens, max_seqlen)
            rows = flat if flat is not None else PackedRows(documents, branches, position_ids, None, *offsets)
            full = (rows, False)
            local = (
                full
                if window is None
                else (PackedRows(documents, branches, position_ids, window, *offsets), False)
            )
            masks, rotaries = {False: full, True: local}, self._rotaries(position_ids, x.dtype, lengths)
        elif static:
            if attention_mask is not None:
                kv_cache.pad(attention_mask)
            full, local = kv_cache.masks(T, self.config.sliding_window)
            masks, rotaries = (
                {False: (full, False), True: (local, False)},
                self._rotaries(
                    position_ids, x.dtype, rope.real_lengths(self.config, position_ids, attention_mask)
                ),
            )
        else:
            masks, rotaries = self._attention_inputs(attention_mask, position_ids, kv_cache, T, x.dtype)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.h):
            local = self.config.is_sliding(i)
            rotary = rotaries[local and self.config.rope_local_theta is not None]
            rotary = rotary if self.config.rotates(i) else None  # SmolLM3's layers without positions
            args = (x, *masks[local], kv_cache, i, rotary)
            x = checkpoint(block, *args, use_reentrant=False) if recompute else block(*args)
        if static:
            kv_cache.advance(T)
        elif kv_cache is not None:
            kv_cache.length += T
        x = self.ln_f(x) if self.ln_f is not None else x
        return x if flat is None else flat.unflatten(x)

    def _flat_rows(
        self, documents: Tensor, branches: Tensor | None, cu_seqlens: Tensor | None, positions: Tensor
    ) -> FlatRows | None:
        """Packed rows laid flat (`sequences.flat_rows`) where they can be and that costs less: on a
        CPU, without shared contexts, attention dropout or a sliding window, and not under
        torch.compile (laying them flat reads the offsets back: a graph break every step)."""
        force = attention.FORCE_KERNEL
        dropout = self.training and any(block.attn.attn_pdrop > 0 for block in self.h)
        window = self.config.sliding_window is not None
        compiling = torch.compiler.is_compiling()
        if documents.device.type != "cpu" or branches is not None or dropout or window or compiling:
            return None
        if force not in (None, "sequences"):
            return None
        return flat_rows(documents, cu_seqlens, positions, force=force == "sequences")

    def _attention_inputs(
        self, attention_mask: Tensor | None, position_ids: Tensor, cache: Cache | None, T: int, dtype
    ) -> tuple[dict, dict]:
        """The masks ({sliding: (mask, is_causal)}) and rotary angles ({local: (cos, sin)}) the
        blocks take: the full layers' and the sliding-window (local) layers'."""
        c, past, device = self.config, (cache.length if cache is not None else 0), position_ids.device
        full = causal_mask(attention_mask, T, past, device)
        masks = {False: full, True: full}
        if c.sliding_window is not None:
            positions = None
            if isinstance(cache, SharedPrefix) and cache.repeats is not None:  # prefix keys at 0, 1, ...
                queries = position_ids.expand(-1 if position_ids.ndim == 2 else 1, T)
                keys = torch.arange(past, device=device).expand(queries.shape[0], past)
                positions = (queries, torch.cat([keys, queries], dim=1))
            masks[True] = causal_mask(attention_mask, T, past, device, c.sliding_window, positions)
        lengths = getattr(cache, "lengths", None)  # (a shared prefix's: those of its continuations)
        lengths = rope.real_lengths(c, position_ids, attention_mask) if lengths is None else lengths
        return masks, self._rotaries(position_ids, dtype, lengths)

    def _rotaries(self, position_ids: Tensor, dtype, lengths: Tensor | None = None) -> dict:
        """The rotary angles ({local: (cos, sin)}) at `position_ids`; None for learned positions
        (`lengths`: LongRoPE's, see `rope.cos_sin`)."""
        c, rotaries = self.config, {False: None, True: None}
        if self.wpe is None:
            rotaries[False] = rope.cos_sin(c, position_ids, dtype, lengths=lengths)
            if c.rope_local_theta is not None:
                rotaries[True] = rope.cos_sin(c, position_ids, dtype, local=True)
        return rotaries

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """Next-token logits (..., vocab) from hidden states (..., C): `hidden @ wte.T` (tied head)
        or `lm_head(hidden)`.

        Only the vocabulary's rows: padding rows never get a logit.
        """
        head = self.wte if self.lm_head is None else self.lm_head
        if hasattr(head, "logits"):  # LoRA's TokenRows: frozen rows and trained ones (lora.py)
            return head.logits(hidden)
        weight, vocab = head.weight, self.config.vocab_size
        # no slice where there is no padding: its backward would zero and copy a table-sized gradient
        return linear(hidden, weight if weight.shape[0] == vocab else weight[:vocab])

    def _fit_embedding_rows(self, state: dict, prefix: str, *args) -> None:
        """Loads weights saved with another padding (or none, as transformers saves them)."""
        vocab, rows = self.config.vocab_size, self.config.padded_vocab_size
        for key in (prefix + "wte.weight", prefix + "lm_head.weight"):
            weight = state.get(key)
            if weight is None or weight.shape[0] == rows or weight.shape[0] < vocab:
                continue  # nothing to do, or a real mismatch that load_state_dict reports
            fitted = weight.new_zeros(rows, weight.shape[1])
            fitted[:vocab] = weight[:vocab]
            state[key] = fitted

    def new_kv_cache(
        self, batch_size: int, max_len: int | None = None, *, static: bool = False
    ) -> KVCache | StaticKVCache:
        """An empty KV cache for `batch_size` sequences of up to `max_len` (default n_positions)
        tokens; `static`: a `StaticKVCache`, whose decode step can be captured as a CUDA graph."""
        p = next(self.parameters())
        max_len = self.config.n_positions if max_len is None else max_len
        kind = StaticKVCache if static else KVCache
        return kind(self.config, batch_size, max_len, dtype=p.dtype, device=p.device)

    def resize_token_embeddings(self, vocab_size: int, *, generator: torch.Generator | None = None) -> None:
        """Grow the vocabulary to `vocab_size`: new rows ~ N(0, initializer_range), existing rows untouched.

        GPT-1 §3.3: only the special tokens' embeddings (and the task head) are new at fine-tuning.
        New tokens take padding rows first; the table grows only when those run out.
        """
        old_vocab = self.config.vocab_size
        if vocab_size < old_vocab:
            raise ValueError(
                f"resize_token_embeddings can only grow the vocabulary: {vocab_size} < {old_vocab}."
            )
        self.config = dataclasses.replace(self.config, vocab_size=vocab_size)  # (not the caller's object)
        for name in ("wte", "lm_head"):
            module = getattr(self, name)
            if module is None:
                continue
            old = module.weight
            new_rows = torch.empty(vocab_size - old_vocab, old.shape[1], dtype=old.dtype, device=old.device)
            new_rows.normal_(0.0, self.config.initializer_range, generator=generator)
            rows = self.config.padded_vocab_size
            if rows != old.shape[0]:
                kwargs = dict(device=old.device, dtype=old.dtype)
                if name == "wte":
                    setattr(self, name, nn.Embedding(rows, old.shape[1], **kwargs))
                else:
                    setattr(self, name, Linear(old.shape[1], rows, bias=False, **kwargs))
                getattr(self, name).weight.requires_grad_(old.requires_grad)
            with torch.no_grad():
                weight = getattr(self, name).weight
                weight[:old_vocab] = old[:old_vocab]
                weight[old_vocab:vocab_size] = new_rows
                if not self.config.released_rows:  # a released table's unused rows stay as released
                    weight[vocab_size:] = 0.0

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Numbers in the model (frozen ones too); the embedding's padding rows are not counted."""
        n = sum(p.numel() for p in self.parameters())
        padding = (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        n -= padding * sum(table is not None for table in (self.wte, self.lm_head))
        if exclude_embeddings:
            n -= self.config.vocab_size * self.config.n_embd
            n -= self.wpe.weight.numel() if self.wpe is not None else 0
        return n

    # Generation: gpt.generate(input_ids, max_new_tokens=..., ...) and gpt.stream(...);
    # see gpt_ft/model/generation.py.
    generate = generation.generate
    stream = generation.stream


def with_dropout(gpt: GPT) -> GPT:
    """Apply the config's dropout rates to an existing model's modules."""
    c = gpt.config
    gpt.drop.p = c.embd_pdrop
    for block in gpt.h:
        block.attn.attn_pdrop = c.attn_pdrop
        block.attn.resid_dropout.p = c.resid_pdrop
        block.mlp.dropout.p = c.resid_pdrop
    return gpt
