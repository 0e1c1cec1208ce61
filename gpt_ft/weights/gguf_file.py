"""GGUF files (llama.cpp's format, the one Ollama and LM Studio keep models in): their config and their
weights dequantized to float32 (their tokenizer: `gguf_tokenizer.py`).

They are read through transformers' own GGUF loader, which already knows each architecture's
metadata keys and renames GGUF's tensors to its own (undoing llama.cpp's rotary permutation of q
and k, and Gemma's +1 on its norm weights); its tensors then take the same path into a GPT as a
transformers folder's (`hf.py`). What this module adds is finding the file, the settings
transformers' reading leaves out (Gemma 3's layers that slide a window, their rotary base; Phi-3's
rotary settings; SmolLM3's files, read as Llama's, and GPT-NeoX's, which transformers does not list:
`gpt_ft/workarounds/gguf_files.py`; GPT-NeoX's rotating share of each head and base), and the
checks that turn a file gpt_ft cannot read into one sentence: not GGUF, cut short, counts or sizes
its bytes and tensors do not bear out (`gguf_bounds.py`, before anything believes them), an
architecture gpt_ft lacks, or a type it cannot dequantize.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from gpt_ft.errors import FileProblem
from gpt_ft.weights.gguf_bounds import check_metadata, check_sizes, check_tensors
from gpt_ft.workarounds.gguf_files import read_once, reader
from gpt_ft.workarounds.kernels import import_transformers_models

MAGIC = b"GGUF"
TOKENS = "tokenizer.ggml.tokens"
SUFFIX = ".gguf"
# GGUF's `general.architecture` for the families gpt_ft has (a llama file named "mistral" is one).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3", "olmo2", "gpt2", "gptneox")
ENDS = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                  "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                  "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                  "<｜end▁of▁sentence｜>", "[e~["))  # fmt: skip
"""Tokens llama.cpp ends generation at by their text, whatever ids the file names (its
src/llama-vocab.cpp): Gemma 3's `<end_of_turn>`, ChatML's `<|im_end|>`, ..."""
CONTROL = 3  # GGUF's token type of a control token (gguf.TokenType.CONTROL), never read from a text
SPLIT_COUNT = "split.count"  # llama.cpp's split files: each part names how many there are


def find(path: str | os.PathLike) -> Path | None:
    """The GGUF file `path` names: the file itself (named `*.gguf`, or starting with GGUF's magic),
    or the one `*.gguf` in a folder without a `config.json` (which makes it a transformers folder);
    None for anything else.

    Raises:
        ValueError: in one sentence, for a folder holding several GGUF files.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return path if path.suffix.lower() == SUFFIX or _starts_with_magic(path) else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(f for f in path.iterdir() if f.suffix.lower() == SUFFIX and f.is_file())
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ValueError(f"{path} holds several GGUF files ({names}); name the one to read.")
    return files[0] if files else None


def _starts_with_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError("Reading a GGUF file needs the gguf package: pip install gguf.") from None
    return gguf


def open_checked(path: Path, *, weights: bool = True):
    """A `gguf.GGUFReader` over `path` (`read_once`'s), once the file is known to be one gpt_ft can
    read (with `weights=False`, only its metadata: for its tokenizer). Raises a ValueError in one
    sentence naming the file when it is not GGUF, cannot be read (cut short, corrupt, a version the
    gguf library does not read, counts its bytes cannot hold), is one part of a split model, or (for
    its weights) holds an architecture gpt_ft lacks, an empty tensor or a type it cannot dequantize."""
    gguf = _gguf()
    if not _starts_with_magic(path):
        raise ValueError(f"{path} is not a GGUF file: it does not start with GGUF's magic bytes {MAGIC!r}.")
    try:
        check_metadata(path)  # (before gguf's reader, which believes any count)
        opened = reader(path)
        architecture = field(opened, "general.architecture")
        parts = field(opened, SPLIT_COUNT)
    except FileProblem:
        raise
    except ValueError as exc:
        if "GGMLQuantizationType" in str(exc):
            raise ValueError(
                f"{path} uses a tensor type unknown to gguf {_version(gguf)} ({exc}); "
                "a newer gguf may read it."
            ) from None
        if "version" in str(exc):
            raise ValueError(f"{path} is a GGUF version gguf {_version(gguf)} cannot read ({exc}).") from None
        raise ValueError(
            f"{path} is cut short or corrupt: its contents do not fit in the file ({exc})."
        ) from None
    except (IndexError, KeyError, OSError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is cut short or corrupt: its header cannot be read ({exc}).") from None
    if parts and parts > 1:
        raise ValueError(
            f"{path} is one of {parts} parts of a split model; merge them into one file first "
            "(llama.cpp's llama-gguf-split --merge)."
        )
    if weights and architecture not in ARCHITECTURES:
        held = f"a {architecture!r} model" if architecture else "no architecture (general.architecture)"
        raise ValueError(f"{path} holds {held}; gpt_ft reads GGUF files of {', '.join(ARCHITECTURES)}.")
    if weights:
        check_tensors(path, opened)
        _check_types(path, opened, gguf)
    return opened


def field(reader, key: str):
    """The value of metadata `key` in GGUF reader `reader`, or None where the file lacks it."""
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def _version(gguf) -> str:
    return getattr(gguf, "__version__", None) or __import__("importlib.metadata").metadata.version("gguf")


def _check_types(path: Path, reader, gguf) -> None:
    """Dequantize the first row of one tensor of each type the file uses, so that a type the gguf
    library cannot dequantize is named before anything is loaded."""
    import numpy as np

    seen = set()
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind in seen:
            continue
        seen.add(kind)
        data = np.asarray(tensor.data)
        try:
            gguf.quants.dequantize(data.reshape(-1, data.shape[-1])[:1], kind)
        except NotImplementedError:
            raise ValueError(
                f"{path}: tensor {tensor.name} is stored as {kind.name}, which gguf {_version(gguf)} cannot "
                "dequantize; readable types include F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the "
                "K-quants Q2_K to Q6_K."
            ) from None


def hf_config(path: Path, reader=None):
    """The transformers config of the model in GGUF file `path` (checked first, unless `reader`, its
    `open_checked`, is given)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    reader = reader or open_checked(path)
    arch = field(reader, "general.architecture")
    check_sizes(path, reader, arch)  # (transformers builds what the metadata says)
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except StrictDataclassError as exc:  # its config class's checks of the metadata's values
        reason = " ".join(str(exc.__cause__ or exc).split()).rstrip(".")
        raise ValueError(
            f"{path}: transformers refuses the {arch} config its metadata gives: {reason}."
        ) from None
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")  # (check_sizes: one)
    config.vocab_size = int(embedding.data.shape[0])  # (a file may say its vocabulary's size nowhere else)
    if (getattr(config, "pad_token_id", None) or 0) >= config.vocab_size:  # a config class's default
        config.pad_token_id = None
    if config.model_type == "gpt2":  # GGUF's context_length is the position table's size
        config.n_positions = config.n_ctx
        width = field(reader, "gpt2.feed_forward_length")  # transformers' reading leaves it at 4 x n_embd
        config.n_inner = int(width) if width and int(width) != 4 * config.n_embd else None
    window = field(reader, f"{arch}.attention.sliding_window")
    if window and hasattr(config, "sliding_window") and config.sliding_window is None:  # Phi-3's
        config.sliding_window = int(window)
    if config.model_type == "mistral":  # a `llama` file named "mistral": its window is the file's, if any
        config.sliding_window = int(window) if window else None
    head_dim = field(reader, f"{arch}.attention.key_length")  # transformers' qwen3 reading skips it
    if getattr(config, "head_dim", None) is not None:  # none given: llama.cpp's width over the heads
        config.head_dim = int(head_dim) if head_dim else config.hidden_size // config.num_attention_heads
    tensors = {t.name for t in reader.tensors}
    for flag, tensor in (("attention_bias", "blk.0.attn_q.bias"), ("mlp_bias", "blk.0.ffn_up.bias")):
        if hasattr(config, flag):  # left unset by transformers' reading; llama.cpp reads them if present
            setattr(config, flag, bool({tensor, tensor.replace("_q.", "_qkv.")} & tensors))  # (GPT-NeoX's)
    if config.model_type in ("llama", "smollm3") and config.attention_bias != config.mlp_bias:
        has, lacks = ("attention", "MLP") if config.attention_bias else ("MLP", "attention")
        raise ValueError(
            f"{path}: its blocks carry {has} biases and no {lacks} biases, and gpt_ft's Llama blocks hold "
            "both or neither."
        )
    if config.model_type == "gemma3_text":  # unread by transformers; llama.cpp's (27B's, 62 layers, aside)
        width, n = config.hidden_size // config.num_attention_heads, config.num_hidden_layers
        config.query_pre_attn_scalar = width if n == 62 else config.head_dim
        every = field(reader, "gemma3.attention.sliding_window_pattern")
        every = 6 if every is None else every  # (llama.cpp's default: five layers of six slide; 0: all)
        slides = every if isinstance(every, list) else [not every or i % every < every - 1 for i in range(n)]
        config.layer_types = ["sliding_attention" if s and window else "full_attention" for s in slides]
        base = field(reader, "gemma3.rope.freq_base_swa")
        config.rope_parameters["sliding_attention"]["rope_theta"] = float(base or 10000.0)
        config.final_logit_softcapping = field(reader, "gemma3.final_logit_softcapping")  # (llama.cpp caps)
    if arch == "phi3":
        _phi3_rope(path, reader, config)
    if arch == "gptneox":  # (llama.cpp's base where the file names none)
        from gpt_ft.weights.hf_rope import partial_factor

        head, rotated = (
            config.hidden_size // config.num_attention_heads,
            field(reader, "gptneox.rope.dimension_count"),
        )
        config.rope_parameters["partial_rotary_factor"] = partial_factor(int(rotated or head), head)
        config.rope_parameters["rope_theta"] = float(field(reader, "gptneox.rope.freq_base") or 10000.0)
    _check_rope(path, reader, arch, config)
    from gpt_ft.weights.hf_llama import with_stops

    # the end-of-turn tokens a file names beside its eos, or holds by a name llama.cpp stops at (Phi-3's
    # `<|end|>`, whatever its type); but `</s>` where it is no control token is text, HTML's strikethrough
    # (Gemma 3's, user-defined), as transformers reads it (llama.cpp does in Gemma 4's files)
    more = [field(reader, f"tokenizer.ggml.{kind}_token_id") for kind in ("eot", "eom")]
    kinds = field(reader, "tokenizer.ggml.token_type") or []
    for i, text in enumerate(field(reader, TOKENS) or []):
        if text in ENDS and (text != "</s>" or i >= len(kinds) or kinds[i] == CONTROL):
            more.append(i)
    config.eos_token_id = with_stops(config.eos_token_id, more)
    return config


LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")  # Phi-3-128k's, Phi-3.5's, Phi-4-mini's


def _phi3_rope(path: Path, reader, config) -> None:
    """Phi-3's rotary settings that llama.cpp writes where transformers' reading does not look, set as
    the model's config.json holds them: the features of each head that rotate (`rope.dimension_count`,
    Phi-4-mini's 96 of 128) and LongRoPE's factors (tensors), original context and attention factor
    (Phi-3-128k, Phi-3.5, Phi-4-mini)."""
    from gpt_ft.weights.hf_rope import partial_factor

    params, head = config.rope_parameters, config.hidden_size // config.num_attention_heads
    if rotated := field(reader, "phi3.rope.dimension_count"):
        params["partial_rotary_factor"] = partial_factor(int(rotated), head)
    factors = {t.name: [float(x) for x in t.data] for t in reader.tensors if t.name in LONGROPE}
    pairs = int(rotated or head) // 2
    for name, values in factors.items():  # (llama.cpp refuses such a file too)
        if len(values) != pairs:
            raise ValueError(f"{path}: its {name} holds {len(values)} factors where {pairs} pairs of each "
                             "head's features rotate (rope.dimension_count): one factor a pair.")  # fmt: skip
    original = field(reader, "phi3.rope.scaling.original_context_length")
    if len(factors) == 2 and original:  # (else refused by _check_rope, a scaling left unread)
        config.original_max_position_embeddings = int(original)  # (Phi3Config's own field wins)
        long, short = (factors[name] for name in LONGROPE)
        params.update(rope_type="longrope", long_factor=long, short_factor=short,
                      original_max_position_embeddings=int(original))  # fmt: skip
        attention = field(reader, "phi3.rope.scaling.attn_factor")  # (none: llama.cpp's 1)
        params["attention_factor"] = 1.0 if attention is None else float(attention)


def _check_rope(path: Path, reader, arch: str, config) -> None:
    """Refuses a file whose rotary frequencies are scaled where neither transformers' reading of it nor
    `_phi3_rope` read the scaling: llama.cpp keeps Llama 3.x's scaling as a `rope_freqs` tensor,
    LongRoPE's as `rope_factors_*` tensors and an attention factor, and linear scaling (Gemma 3 4B and
    larger) as metadata; a model read without them computes other logits."""
    scaling = field(reader, f"{arch}.rope.scaling.type")
    tensors = {t.name for t in reader.tensors} & {"rope_freqs.weight", *LONGROPE}
    attention_factor = field(reader, f"{arch}.rope.scaling.attn_factor")
    stored = f"a {sorted(tensors)[0].removesuffix('.weight')} tensor" if tensors else None
    factors = (field(reader, f"{arch}.rope.scaling.factor"), field(reader, f"{arch}.rope.scale_linear"))
    factor = next((f for f in factors if f not in (None, 0.0, 1.0)), None)  # no type: llama.cpp's linear
    plain = scaling in (None, "none") or (scaling == "linear" and factor is None)  # (linear by 1: none)
    stored = stored or (f"rope scaling {scaling!r}" if not plain else None)
    if attention_factor not in (None, 1.0):
        stored = stored or f"attention factor {attention_factor:g}"
    stored = stored or (f"rope scaling factor {factor:g}" if factor else None)
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = {p.get("rope_type") for p in ([params] if "rope_type" in params else params.values())
             if isinstance(p, dict)}  # fmt: skip
    if stored and not kinds - {None, "default"}:
        raise ValueError(
            f"{path}: its rotary frequencies are scaled ({stored}), which transformers' GGUF reader "
            "leaves out, so the model read from it would compute other logits: load its transformers "
            "weights (a hub id or folder) instead."
        )
    rotated = field(reader, f"{arch}.rope.dimension_count")
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rotated and int(rotated) < head and arch not in ("phi3", "gptneox"):  # (theirs: read)
        raise ValueError(
            f"{path}: it rotates {int(rotated)} of each head's {head} dimensions (rope.dimension_count), "
            f"and transformers' {config.model_type} models rotate them all: the model read from it would "
            "compute other logits."
        )


@read_once()  # one parse of the file (gguf's reader), one tensor-name map
def read(path: Path):
    """(transformers config, transformers-named state dict in float32) of GGUF file `path`."""
    import torch

    import_transformers_models()
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging

    reader = open_checked(path)
    config = hf_config(path, reader)
    try:  # (on the meta device: only its parameters' names, for transformers' GGUF name map)
        with torch.device("meta"):  # (gguf maps no "mistral", a `llama` file by its name: Llama's names)
            names = AutoModelForCausalLM.from_config(
                _as_llama(config) if config.model_type == "mistral" else config
            )
    except ValueError as exc:  # sizes its modules refuse (GPT-2's heads that do not split the width)
        raise ValueError(
            f"{path}: transformers builds no {config.model_type} model from its metadata: {exc}"
        ) from None
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # its notes on unused metadata
    try:  # its "Converting and de-quantizing GGUF tensors" bar (tqdm's own, no switch) at every load
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = load_gguf_checkpoint(
                str(path), return_tensors=True, model_to_load=names, torch_dtype=torch.float32
            )
    except ValueError as exc:  # a tensor its config does not shape (transformers' q/k rows put back)
        reason = str(exc).rstrip(".")
        raise ValueError(f"{path}'s tensors do not fit the model its config describes: {reason}.") from None
    finally:
        logging.set_verbosity(verbosity)
    # transformers drops a tensor its model has no place for: the logits would not be llama.cpp's
    read = sum(t.name in LONGROPE for t in reader.tensors) if config.model_type == "phi3" else 0  # (config)
    if (left := len(reader.tensors) - read - len(parsed["tensors"])) > 0:
        raise ValueError(
            f"{path}: {left} of its tensors have no place in the {config.model_type} model transformers "
            "reads it as, and the model would compute other logits without them."
        )
    if config.model_type == "gptneox":  # (gguf's name for it, which transformers' loading looks up)
        config.model_type = "gpt_neox"
    return config, parsed["tensors"]


def _as_llama(config):
    from transformers import LlamaConfig

    return LlamaConfig(
        **{k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
    )


def read_weights(path: Path):
    """(config, state dict in gpt_ft's names, float32) of GGUF file `path`."""
    import torch

    from gpt_ft.weights import hf

    hf_config, state = read(path)
    head, embedding = state.get("lm_head.weight"), state.get("transformer.wte.weight")
    if hf_config.model_type == "gpt2" and head is not None and embedding is not None:
        # llama.cpp's GPT-2 files may keep a copy of the embedding as the head (`output.weight`),
        # quantized apart from it; llama.cpp reads the head from that copy, and so does this.
        hf_config.tie_word_embeddings = bool(torch.equal(head, embedding))
    try:
        return hf.convert(hf_config, state)
    except ValueError as exc:  # a setting not converted, a layer's tensor missing
        raise ValueError(f"{path}: {exc}") from None
