"""Tiny GGUF files written from tiny transformers models, as llama.cpp's converter lays them out:
GGUF's tensor names, llama's rotary permutation of q and k, Gemma's norm weights stored plus one,
GPT-2's Conv1D weights stored (out, in), each family's metadata keys, and a byte-level BPE
tokenizer with its merges, special tokens and chat template.

Quantized tensors come from gguf's own quantizer (Q8_0, Q4_0, Q4_1, Q5_0, ...) or, for the
K-quants it cannot write, from `k_quant`: blocks packed here by hand from chosen integers and
scales, so that the dequantized values are known without any dequantizer.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import torch

ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3",
        "smollm3": "smollm3", "olmo2": "olmo2", "gpt2": "gpt2"}  # fmt: skip
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPACE = "\u2581"  # SentencePiece's space
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the stage.",
    "Stocks fell sharply; the market closed lower.",
    "She said: it's the best film of 2024!",
]


def tiny_tokenizer(extra: tuple[str, ...] = (), specials: list[str] = SPECIALS, corpus: list[str] = CORPUS):
    """A byte-level BPE (GPT-2's pre-tokenizer) learned from `corpus`, with three special tokens first
    (and `extra` after them), as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials + list(extra),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(corpus * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[1], eos_token=specials[2],
                                   unk_token=None, pad_token=specials[0])  # fmt: skip


def tiny_pieces():
    """A SentencePiece-style BPE as Gemma's tokenizer.json holds it (spaces as "▁", none put first,
    bytes for characters it lacks): five special tokens, a newline as a user-defined one, runs of two
    to four spaces merged first, from any split (as Gemma's ids 138-140), 256 byte tokens, then pieces
    learned from the corpus within words, in the order of their merges (410 ids with the `<mask>`
    GemmaTokenizer adds)."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    learner = Tokenizer(models.BPE(byte_fallback=True))
    learner.normalizer = normalizers.Replace(" ", SPACE)
    learner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # (no piece spans words)
    learner.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(special_tokens=[]))
    learned = json.loads(learner.to_str())["model"]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
    runs = [SPACE * n for n in (2, 3, 4)]
    pieces = specials + ["\n"] + runs + [f"<0x{b:02X}>" for b in range(256)]
    pieces += sorted(learned["vocab"], key=learned["vocab"].get)
    merges = [(SPACE * k, SPACE * (n - k)) for n in (2, 3, 4) for k in range(1, n)]  # every split of a run
    merges += [tuple(m) for m in learned["merges"]]
    tokenizer = GemmaTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=merges, add_bos_token=True)
    tokenizer.add_tokens([AddedToken("\n", normalized=False, special=False)])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>"]})
    return tokenizer


def spaced_pieces():
    """`tiny_pieces` putting a space before each text, and after each special or user-defined token,
    as Llama 2's, Mistral's and Phi-3-mini's tokenizer.json do (its normalizer: "▁" put first, then
    spaces as "▁"), in a class that loads its tokenizer.json as written (a saved GemmaTokenizer is
    rebuilt from its vocabulary, without it)."""
    from tokenizers import decoders, normalizers
    from transformers import PreTrainedTokenizerFast

    pieces = tiny_pieces()
    backend = pieces.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    backend.decoder = decoders.Sequence([backend.decoder, decoders.Strip(" ", 1, 0)])
    specials = {f"{kind}_token": getattr(pieces, f"{kind}_token") for kind in ("bos", "eos", "unk", "pad")}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, add_bos_token=True, **specials)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>"]})
    return tokenizer


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of a q or k projection's rows (its rotary pairs are adjacent)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _metadata(writer, config, model_type: str, sizes: bool) -> None:
    c = config
    if sizes:
        writer.add_vocab_size(config.vocab_size)
    if model_type == "gpt2":
        writer.add_context_length(c.n_positions)
        writer.add_embedding_length(c.n_embd)
        writer.add_block_count(c.n_layer)
        writer.add_feed_forward_length(c.n_inner or 4 * c.n_embd)
        writer.add_head_count(c.n_head)
        writer.add_layer_norm_eps(c.layer_norm_epsilon)
        return
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if model_type == "gemma3_text":
        writer.add_sliding_window(c.sliding_window)
    if model_type == "phi3":  # llama.cpp's converter: the original context, LongRoPE's attention factor
        writer.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        scale = c.max_position_embeddings / c.original_max_position_embeddings
        if rope.get("rope_type") == "longrope":  # (its factors: tensors, `longrope_tensors`)
            writer.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(c.original_max_position_embeddings))
                if scale > 1
                else 1.0
            )


def longrope_tensors(config) -> dict:
    """LongRoPE's factors as llama.cpp's converter stores them: two F32 tensors."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") != "longrope":
        return {}
    return {
        f"rope_factors_{kind}.weight": np.array(rope[f"{kind}_factor"], dtype=np.float32)
        for kind in ("long", "short")
    }


def _tokenizer_metadata(writer, tokenizer, pre: str = "gpt-2", add_bos: bool | None = False) -> None:
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # CONTROL or NORMAL
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    if add_bos is not None:  # else left out, as Llama 3.2's files leave it
        writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)


def _pieces_metadata(writer, tokenizer) -> None:
    """A SentencePiece tokenizer (`tiny_pieces`) as Gemma's own files hold it: llama.cpp's "llama"
    model, pieces scored minus their rank, bytes, special tokens control, the newline and the runs
    of spaces user-defined (the runs written as spaces), no space put first, bos added; or
    (`spaced_pieces`) as Llama 2's files hold it: a space put first (llama.cpp's default: no key),
    the runs pieces."""
    vocab = tokenizer.get_vocab()
    tokens, types, scores, rank = sorted(vocab, key=vocab.get), [], [], 0
    special = set(tokenizer.all_special_tokens)
    spaced = "Prepend" in tokenizer.backend_tokenizer.to_str()
    for i, token in enumerate(tokens):
        if token in special or token == "\n" or set(token) == {SPACE} and len(token) > 1 and not spaced:
            types.append(3 if token in special else 4)
            scores.append(-1000.0)
            tokens[i] = token.replace(SPACE, " ")
        elif token.startswith("<0x"):
            types.append(6)
            scores.append(0.0)
        else:
            types.append(1)
            scores.append(-float(rank))
            rank += 1
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    for add, index in ((writer.add_bos_token_id, tokenizer.bos_token_id), (writer.add_eos_token_id,
                       tokenizer.eos_token_id), (writer.add_unk_token_id, tokenizer.unk_token_id),
                       (writer.add_pad_token_id, tokenizer.pad_token_id)):  # fmt: skip
        add(index)
    writer.add_add_bos_token(True)
    if not spaced:
        writer.add_add_space_prefix(False)


def write_gguf(path: Path, hf_model, tokenizer=None, qtype: str = "F32", name: str = "tiny",
               quantize: dict | None = None, sizes: bool = True, ids: dict | None = None, pre: str = "gpt-2",
               add_bos: bool | None = False, extra: dict | None = None) -> Path:  # fmt: skip
    """`hf_model` (a transformers *ForCausalLM) as a GGUF file: its matrices stored as `qtype`, the
    rest (norms, biases, 1-D tensors) as F32, llama.cpp's habit; `quantize` may give a type per
    tensor name suffix instead. With `tokenizer`, the file carries it. `sizes=False` leaves out the
    vocabulary's size and the padding id, which some files lack; `ids` adds token ids by key
    (`tokenizer.ggml.eot_token_id`: 7); `pre` names the pre-tokenizer, `add_bos` the file's
    `add_bos_token` (None: no such key); `extra` adds tensors by GGUF name (F32 arrays)."""
    import gguf

    config = hf_model.config
    model_type = config.model_type
    arch = ARCH[model_type]
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    n_layer = config.n_layer if model_type == "gpt2" else config.num_hidden_layers
    names = gguf.get_tensor_name_map(arch_id, n_layer)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    _metadata(writer, config, model_type, sizes)
    if tokenizer is not None:
        if json.loads(tokenizer.backend_tokenizer.to_str())["model"].get("byte_fallback"):  # SentencePiece's
            _pieces_metadata(writer, tokenizer)
        else:
            _tokenizer_metadata(writer, tokenizer, pre, add_bos)
    elif sizes:
        writer.add_pad_token_id(0)  # as real files say (else a config class's default may lie outside)
    for key, value in (ids or {}).items():
        writer.add_uint32(key, value)
    state = hf_model.state_dict()
    for hf_name, tensor in state.items():
        if hf_name.endswith((".attn.bias", ".attn.masked_bias")) or "rotary_emb" in hf_name:
            continue
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is None:
            raise KeyError(f"no GGUF name for {hf_name}")
        w = tensor.detach().to(torch.float32).numpy().copy()
        if (
            model_type == "gpt2"
            and suffix == "weight"
            and w.ndim == 2
            and "wte" not in hf_name
            and "wpe" not in hf_name
            and hf_name != "lm_head.weight"  # a Linear's (out, in) already
        ):
            w = w.T.copy()  # Conv1D's (in, out) as (out, in)
        if model_type in ("llama", "smollm3") and hf_name.endswith(
            ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")
        ):
            heads = config.num_attention_heads if "q_proj" in hf_name else config.num_key_value_heads
            w = _permute(w, heads)
        if model_type == "gemma3_text" and hf_name.endswith("norm.weight"):
            w = w + 1
        kind = next((t for end, t in (quantize or {}).items() if hf_name.endswith(end)), None)
        kind = kind or (qtype if w.ndim == 2 else "F32")
        _add(writer, f"{gguf_name}.{suffix}", w, kind, seed_of(hf_name))
    for gguf_name, w in {**longrope_tensors(config), **(extra or {})}.items():
        _add(writer, gguf_name, w, "F32", seed_of(gguf_name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def seed_of(name: str) -> int:
    """The seed of a hand-packed K-quant tensor: its transformers name's, so that each differs."""
    return zlib.crc32(name.encode())


def _add(writer, name: str, w: np.ndarray, kind: str, seed: int) -> None:
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
        writer.add_tensor(name, w.astype(np.float32))
    elif kind == "F16":
        writer.add_tensor(name, w.astype(np.float16))
    elif kind in K_QUANTS:
        blocks, _ = k_quant(kind, w, seed)
        writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_shape=None, raw_dtype=qtype)


# --- K-quants packed by hand: super-blocks of 256 values ----------------------------------------

QK = 256
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


def _f16(x: float) -> np.ndarray:
    return np.array([x], dtype=np.float16).view(np.uint8)


def _pack_6bit(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes holding 8 six-bit scales and 8 six-bit mins (ggml's `get_scale_min_k4`)."""
    out = np.zeros(12, np.uint8)
    for j in range(8):
        if j < 4:
            out[j] = sc[j] & 63
            out[j + 4] = mn[j] & 63
        else:
            out[j + 4] = (sc[j] & 15) | ((mn[j] & 15) << 4)
            out[j - 4] |= (sc[j] >> 4) << 6
            out[j] |= (mn[j] >> 4) << 6
    return out


def k_quant(kind: str, w: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw blocks, the values they stand for) of a K-quantized tensor shaped like `w`: its
    integers and scales drawn from `seed`, d and dmin powers of two, so every value is exact in
    float32. The values' scale follows `w`'s, so a model built from them still computes sanely."""
    rows, cols = w.shape
    assert cols % QK == 0, "K-quants need rows of a multiple of 256 values"
    rng = np.random.default_rng(seed)
    # Scales and mins over all 6 bits: the largest value is about 63 * 31 steps (Q6_K: 32 * 32).
    step = 2.0 ** np.floor(np.log2(max(np.abs(w).max(), 1e-3) / (1024 if kind == "Q6_K" else 2048)))
    blocks, values = [], []
    for _ in range(rows * cols // QK):
        if kind in ("Q4_K", "Q5_K"):
            bits = 4 if kind == "Q4_K" else 5
            q = rng.integers(0, 2**bits, QK).astype(np.uint8)
            sc, mn = (
                rng.integers(1, 4, 8).astype(np.uint8),
                rng.integers(0, 2**bits // 2 * 3, 8).astype(np.uint8),
            )
            d, dmin = step, step
            values.append((d * np.repeat(sc, 32) * q - dmin * np.repeat(mn, 32)).astype(np.float32))
            low = q & 15
            qs = np.concatenate(
                [low[64 * c : 64 * c + 32] | (low[64 * c + 32 : 64 * c + 64] << 4) for c in range(4)]
            )
            head = [_f16(d), _f16(dmin), _pack_6bit(sc, mn)]
            if kind == "Q5_K":
                qh = np.zeros(32, np.uint8)
                for k in range(8):
                    qh |= ((q[32 * k : 32 * k + 32] >> 4) & 1) << k
                head.append(qh)
            blocks.append(np.concatenate([*head, qs.astype(np.uint8)]))
        else:  # Q6_K: 6-bit q - 32, a signed 8-bit scale per 16 values, d last
            q = rng.integers(0, 64, QK).astype(np.uint8)
            sc = rng.integers(-32, 32, 16).astype(np.int8)
            d = step
            values.append(
                (d * np.repeat(sc.astype(np.float32), 16) * (q.astype(np.float32) - 32)).astype(np.float32)
            )
            ql = np.zeros(128, np.uint8)
            qh = np.zeros(64, np.uint8)
            for h in range(2):
                part = q[128 * h : 128 * h + 128]
                ql[64 * h : 64 * h + 64] = (part[:64] & 15) | ((part[64:] & 15) << 4)
                for k in range(4):
                    qh[32 * h : 32 * h + 32] |= (part[32 * k : 32 * k + 32] >> 4) << (2 * k)
            blocks.append(np.concatenate([ql, qh, sc.view(np.uint8), _f16(d)]))
    raw = np.stack(blocks).reshape(rows, -1)
    return raw, np.concatenate(values).reshape(rows, cols)
