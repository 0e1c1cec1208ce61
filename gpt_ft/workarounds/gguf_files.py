"""gguf's reader and transformers' GGUF loading: a file parsed once, its tensor-name map built once.

`gguf.GGUFReader` parses every metadata field of a file in Python when it opens it, a tokenizer's
whole vocabulary and merges included (about 4 s for SmolLM2's 49,152 tokens on one core), and
transformers opens a file anew each time it reads one (`load_gguf_checkpoint`: for the config, the
tokenizer, then the weights), with `from gguf import GGUFReader` inside the function; its tensor
names (`get_gguf_hf_weights_map`) build gguf's `TensorNameMap` again for every submodule it walks
(397 times for SmolLM2). No public API hands transformers an open reader or a map, so:

- `reader(path)` opens a file once per process while it is unchanged (its path, size, times and
  inode), for gpt_ft's own checks and for transformers';
- within `read_once()`, `gguf.GGUFReader` and `gguf.get_tensor_name_map`, which transformers looks
  up at call time, are that reader and a remembered map.

Upstream: transformers' loader takes a path only (transformers/modeling_gguf_pytorch_utils.py,
`load_gguf_checkpoint`). When it takes a reader, pass `reader(path)` and drop `read_once`;
tests/test_workarounds.py fails when transformers stops looking the two names up at call time.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any


def reader(path) -> Any:
    """The `gguf.GGUFReader` of file `path`, read once while the file is unchanged."""
    stat = os.stat(path)
    return _reader(os.path.realpath(path), (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino))


@functools.lru_cache(maxsize=2)
def _reader(path: str, stamp: tuple) -> Any:
    import gguf

    return READERS.get(gguf, gguf.GGUFReader)(path)


READERS: dict = {}
"""gguf's own reader class while `read_once` stands in for it."""


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """transformers' GGUF loading, within it, through `reader` and one tensor-name map per shape."""
    import gguf

    if gguf in READERS:  # (nested: the outer one's stand-ins hold)
        yield
        return
    maps: dict[tuple, Any] = {}
    own_map = gguf.get_tensor_name_map

    def tensor_name_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = own_map(arch, n_blocks)
        return maps[arch, n_blocks]

    READERS[gguf] = gguf.GGUFReader
    gguf.GGUFReader = lambda path, mode="r": reader(path) if mode == "r" else READERS[gguf](path, mode)
    gguf.get_tensor_name_map = tensor_name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = READERS.pop(gguf), own_map
