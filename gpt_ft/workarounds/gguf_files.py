"""gguf's reader and transformers' GGUF loading: a file parsed once a load, its tensor-name map built
once; texts split as llama.cpp splits them.

`gguf.GGUFReader` parses every metadata field of a file in Python when it opens it, a tokenizer's
whole vocabulary and merges included (about 4 s for SmolLM2's 49,152 tokens on one core), and
transformers opens a file anew each time it reads one (`load_gguf_checkpoint`: for the config, the
tokenizer, then the weights), with `from gguf import GGUFReader` inside the function; its tensor
names (`get_gguf_hf_weights_map`) build gguf's `TensorNameMap` again for every submodule it walks
(397 times for SmolLM2). No public API hands transformers an open reader or a map, so within
`read_once()` (one thread at a time), `gguf.GGUFReader` and `gguf.get_tensor_name_map`, which
transformers looks up at call time, are `reader` (one reader a file while it is unchanged: its path,
size, times and inode) and a remembered map. The readers go when the load ends: a parsed vocabulary
holds about 150 MB of Python objects (SmolLM2's), and a reader keeps its file mapped.

Upstream: transformers' loader takes a path only (transformers/modeling_gguf_pytorch_utils.py,
`load_gguf_checkpoint`). When it takes a reader, pass one and drop `read_once`;
tests/test_workarounds.py fails when transformers stops looking the two names up at call time.

Within `read_once` too, transformers' GGUF reader (5.25) reads llama.cpp's `smollm3` and `olmo2`
files, which it does not list, by Llama's metadata keys, as llama.cpp does (`READ_AS_LLAMA`): SmolLM3's
tensors as Llama's (q and k in llama.cpp's rotary layout; its config then takes no rotary positions in
every fourth layer, as llama.cpp's architecture does), OLMo 2's as they are stored (its rotary halves
apart, as transformers' own). It reads `gptneox` files (Pythia's) by `NEOX_KEYS` as GPTNeoXConfig's
(transformers' model type is `gpt_neox`), their q/k/v rows put back from llama.cpp's layout (each
projection whole) into the heads' own (q, k and v of each head together) by Bloom's processor, whose
layout is the same. Upstream: transformers' integrations/ggml.py `GGUF_CONFIG_MAPPING` and
modeling_gguf_pytorch_utils.py `TENSOR_PROCESSORS`, `GGUF_SUPPORTED_ARCHITECTURES`; nothing is added
where transformers lists the architecture itself.

`split_as_llama_cpp`: llama.cpp reads a file whose pre-tokenizer (`tokenizer.ggml.pre`) is SmolLM's, and
seven others', by cutting every digit apart before GPT-2's pattern (`\\p{N}` first, its
src/llama-vocab.cpp), as the models' own tokenizer.json does (`Digits(individual_digits=True)`);
transformers' GGUF conversion (5.25) has no split for these names and leaves GPT-2's pattern alone, so
"2024" would be one piece where llama.cpp and the model read four. Llama 3's pre-tokenizer (and
fourteen others') takes a piece the vocabulary holds as one token before merging any (llama.cpp's
`ignore_merges`; Llama 3's tokenizer.json has it, as tiktoken did); transformers' conversion merges
it, so " Việt", one token of Llama 3's, would be three (llama.cpp's pull request 7193). Both are
`split_as_llama_cpp`. Upstream: transformers' integrations/gguf/gguf_tokenizer_mapping.py,
`GGUF_PRE_TOKENIZER_SPLITS`, `set_split_regex`; the tests fail once it splits them itself.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

DIGITS_FIRST = ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2")
"""llama.cpp's pre-tokenizer names whose first split is each digit (`\\p{N}`), then GPT-2's pattern."""
WHOLE_WORDS = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
               "jina-v5-nano", "minicpm5", "youtu", "glm4", "glm5", "tekken",
               "granite-embed-multi-97m")  # fmt: skip
"""llama.cpp's pre-tokenizer names whose pieces the vocabulary holds whole are taken whole, before any
merge (its `ignore_merges`, as Llama 3's tokenizer.json has it)."""
GPT2_PATTERN = ("gpt-2", "phi-2", "mpt", "olmo", "jais", "gigachat", "trillion", "mellum", "a.x-4.0",
                "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code",
                "modern-bert")  # fmt: skip
"""llama.cpp's pre-tokenizer names that split text by GPT-2's pattern alone, as transformers' conversion
does where it knows no other."""
READ_AS_LLAMA = {"smollm3": "llama", "olmo2": None}
"""llama.cpp's architectures transformers' GGUF reader reads by Llama's keys (see above): the tensor
processor of each (None: the tensors as stored)."""
NEOX_KEYS = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
             "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
             "attention.head_count": "num_attention_heads", "attention.layer_norm_epsilon": "layer_norm_eps",
             "use_parallel_residual": "use_parallel_residual", "vocab_size": "vocab_size",
             "rope.dimension_count": None, "rope.freq_base": None}  # fmt: skip
"""llama.cpp's `gptneox` metadata keys as GPTNeoXConfig's fields (the rotary ones: set by the caller,
`gguf_file.hf_config`), which transformers' GGUF reader does not list."""
LOCK = threading.RLock()
OPEN: dict[str, Any] = {}
"""Within the outermost `read_once`: gguf's own reader class and map ("class", "map"), the readers
made ("readers", by file) and the maps ("maps", by architecture and depth)."""


def reader(path) -> Any:
    """The `gguf.GGUFReader` of file `path`: within `read_once`, the one of this load; else a new one."""
    import gguf

    with LOCK:
        if not OPEN:
            return gguf.GGUFReader(path)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
        if key not in OPEN["readers"]:
            OPEN["readers"][key] = OPEN["class"](path)
        return OPEN["readers"][key]


def tensor_name_map(arch, n_blocks) -> Any:
    """gguf's `get_tensor_name_map`, each (architecture, depth) built once within `read_once`."""
    if (arch, n_blocks) not in OPEN["maps"]:
        OPEN["maps"][arch, n_blocks] = OPEN["map"](arch, n_blocks)
    return OPEN["maps"][arch, n_blocks]


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """transformers' GGUF loading, within it, through `reader` and `tensor_name_map`; nested, the
    outer one's; another thread's waits until it ends."""
    import gguf

    with LOCK:
        if OPEN:
            yield
            return
        OPEN.update({"class": gguf.GGUFReader, "map": gguf.get_tensor_name_map, "readers": {}, "maps": {}})
        gguf.GGUFReader = lambda path, mode="r": reader(path) if mode == "r" else OPEN["class"](path, mode)
        gguf.get_tensor_name_map = tensor_name_map
        added = _read_unlisted()
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = OPEN["class"], OPEN["map"]
            OPEN.clear()
            for table, key in added:
                table.pop(key) if isinstance(table, dict) else table.remove(key)


def _read_unlisted() -> list:
    """List `READ_AS_LLAMA` and `gptneox` in transformers' GGUF tables (where it lists them not itself);
    the (table, key) pairs added."""
    from transformers.modeling_gguf_pytorch_utils import (
        GGUF_SUPPORTED_ARCHITECTURES,
        GGUF_TO_TRANSFORMERS_MAPPING,
        TENSOR_PROCESSORS,
    )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    added, config = [], GGUF_TO_TRANSFORMERS_MAPPING["config"]
    for arch, processor in [*READ_AS_LLAMA.items(), ("gptneox", "gptneox")]:
        if arch in GGUF_SUPPORTED_ARCHITECTURES:  # (transformers' own reading)
            continue
        GGUF_SUPPORTED_ARCHITECTURES.append(arch)
        config[arch] = NEOX_KEYS if arch == "gptneox" else config["llama"]
        added += [(GGUF_SUPPORTED_ARCHITECTURES, arch), (config, arch)]
        if processor is not None:
            TENSOR_PROCESSORS[arch] = _neox_processor() if arch == "gptneox" else TENSOR_PROCESSORS[processor]
            added.append((TENSOR_PROCESSORS, arch))
    if (config, "gptneox") in added and "gptneox" not in CONFIG_MAPPING:  # (the file's config's model type)
        from transformers import GPTNeoXConfig

        CONFIG_MAPPING.register("gptneox", GPTNeoXConfig)
        added.append((CONFIG_MAPPING._extra_content, "gptneox"))
    return added


def _neox_processor() -> type:
    """Bloom's tensor processor, which puts q/k/v rows back into each head's (the layout llama.cpp's
    converter takes GPT-NeoX's and Bloom's from), reading the heads from GPTNeoXConfig's field."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    class NeoXTensorProcessor(TENSOR_PROCESSORS["bloom"]):
        def __init__(self, config=None):
            super().__init__(config={**(config or {}), "n_head": (config or {}).get("num_attention_heads")})

    return NeoXTensorProcessor


def splits_as_llama_cpp(pre: str | None) -> bool:
    """Whether a byte-level GGUF file's pre-tokenizer `pre` (`tokenizer.ggml.pre`) splits text, as read
    here, as llama.cpp splits it: GPT-2's pattern (or no name: llama.cpp's older files, read by GPT-2's
    pattern, the likelier of the model's own), `DIGITS_FIRST`, or a pattern transformers' conversion
    gives the name (Llama 3's, Qwen2's, GPT-4o's, Tekken's, ...)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS as known
    except ImportError:  # (a transformers without the table: the patterns this toolkit tests)
        known = ("llama3", "llama-v3", "llama-bpe", "qwen2")
    return pre in (None, "default", *GPT2_PATTERN, *DIGITS_FIRST, *known)


def split_as_llama_cpp(tokenizer, pre: str | None) -> None:
    """Give a tokenizer transformers converted from a GGUF file of pre-tokenizer `pre` llama.cpp's
    digit split where it has GPT-2's pattern alone, and llama.cpp's whole pieces before merges where
    llama.cpp takes them (see above); any other is left as it is."""
    from tokenizers import models, pre_tokenizers

    backend = tokenizer.backend_tokenizer
    if pre in DIGITS_FIRST and isinstance(backend.pre_tokenizer, pre_tokenizers.ByteLevel):
        digits = pre_tokenizers.Digits(individual_digits=True)
        backend.pre_tokenizer = pre_tokenizers.Sequence([digits, backend.pre_tokenizer])
    if pre in WHOLE_WORDS and isinstance(backend.model, models.BPE):
        backend.model.ignore_merges = True
