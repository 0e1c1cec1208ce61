"""The numbers a GGUF file states about itself, checked against what the file holds before anything
acts on them: a file from a stranger may state any count or size.

`gguf.GGUFReader` believes the counts of the metadata section: an array of 2**40 bytes in a 70-byte
file has it loop 2**40 times over empty slices, its memory growing (gguf 0.19's `_get_field_parts`).
`check_metadata` walks that section first, as cheaply as the format allows (an array of fixed-size
items is skipped whole; only strings are walked one by one), and refuses a count the bytes left cannot
hold. Then the model's sizes: transformers builds a model from the metadata alone (even on the meta
device, a `block_count` of 2**31-1 builds blocks for hours), so `check_sizes` compares the depth and
width the metadata states with the tensors the file holds, and `check_depth` (its tokenizer read
alone too: transformers makes its config, Gemma 3's a list as long as its layers) holds the depth to
llama.cpp's limit; `check_tensors` refuses a tensor with no dimension or an empty one, which nothing
can read. Each refusal is one sentence naming the file and the key or tensor.
"""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

from gpt_ft.errors import FileProblem

STRING, ARRAY = 8, 9  # GGUF's value types (gguf.GGUFValueType) of a string and of an array
FIXED = {0: ("UINT8", 1), 1: ("INT8", 1), 2: ("UINT16", 2), 3: ("INT16", 2), 4: ("UINT32", 4),
         5: ("INT32", 4), 6: ("FLOAT32", 4), 7: ("BOOL", 1), 10: ("UINT64", 8), 11: ("INT64", 8),
         12: ("FLOAT64", 8)}  # fmt: skip
"""GGUF's fixed-size value types: their names and sizes in bytes."""
LEAST = {STRING: ("STRING", 8), ARRAY: ("ARRAY", 12), **FIXED}  # (the fewest bytes a value takes)
KEY_LEAST = 8 + 4 + 1  # a key's fewest bytes: its name's length, a value type, a one-byte value
TENSOR_LEAST = 8 + 4 + 4 + 8  # a tensor's description's: its name's length, dimensions' count, type, offset
VERSIONS = (2, 3)  # the versions of 64-bit counts; the reader names any other
MAX_BLOCKS = 512  # llama.cpp's LLAMA_MAX_LAYERS: it reads no deeper model
BLOCK = re.compile(r"blk\.(\d+)\.")


def check_metadata(path: Path) -> None:
    """Refuses, in one sentence naming `path` and the key, a GGUF file (version 2 or 3) whose metadata
    states more keys, items or bytes than the file holds; other faults are left to the reader."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _Walk(path, data).header()


class _Walk:
    """One walk through a file's key/value section: `at` its place, `key` the key being read."""

    def __init__(self, path: Path, data) -> None:
        self.path, self.data, self.size, self.at, self.key = path, data, len(data), 0, ""

    def header(self) -> None:
        if self.size < 24:
            return  # (the reader's: cut short)
        order = ">" if struct.unpack_from("<I", self.data, 4)[0] & 0xFFFF == 0 else "<"  # (the reader's test)
        self.u32, self.u64 = struct.Struct(order + "I").unpack_from, struct.Struct(order + "Q").unpack_from
        if self.u32(self.data, 4)[0] not in VERSIONS:
            return
        tensors, keys = struct.unpack_from(order + "QQ", self.data, 8)
        self.at = 24
        self.need(keys * KEY_LEAST, f"states {keys:,} metadata keys, which take at least")
        for i in range(keys):
            self.key = f"#{i}"
            length = self.take(8, "has a name's length that takes", self.u64)
            name = bytes(self.data[self.at : self.at + min(length, 80)])
            self.take(length, "has a name that takes")
            self.key = repr(name.decode("utf-8", "replace") + ("..." if length > 80 else ""))
            self.value(self.take(4, "has a value type that takes", self.u32))
        self.key = ""
        self.need(tensors * TENSOR_LEAST, f"states {tensors:,} tensors, whose descriptions take at least")

    def need(self, n: int, what: str) -> None:
        if n > (left := self.size - self.at):
            key = f"its metadata key {self.key}" if self.key else "it"
            raise FileProblem(
                f"{self.path} is cut short or corrupt: {key} {what} {n:,} bytes where {left:,} remain."
            )

    def take(self, n: int, what: str, read=None):
        """Steps over `n` bytes (the number they hold, read by `read`), refused where they are not there."""
        self.need(n, what)
        value = read(self.data, self.at)[0] if read else None
        self.at += n
        return value

    def value(self, kind: int) -> None:
        """Steps over one value of type `kind`: nested arrays through a stack of [type, items left]."""
        stack: list[list[int]] = []
        while True:
            if kind == STRING:
                self.strings(1)
            elif kind == ARRAY:
                item = self.take(4, "has an array item type that takes", self.u32)
                count = self.take(8, "has an array length that takes", self.u64)
                if item not in LEAST:
                    self.unknown(item)
                name, least = LEAST[item]
                take = "take" if item in FIXED else "take at least"
                self.need(count * least, f"holds an array of {count:,} {name} values, which {take}")
                if item in FIXED:
                    self.at += count * least  # (skipped whole)
                elif item == STRING:
                    self.strings(count)
                elif count:
                    stack.append([item, count])
            elif kind in FIXED:
                self.take(FIXED[kind][1], f"has a {FIXED[kind][0]} value that takes")
            else:
                self.unknown(kind)
            while stack and not stack[-1][1]:
                stack.pop()
            if not stack:
                return
            stack[-1][1] -= 1
            kind = stack[-1][0]

    def strings(self, count: int) -> None:
        """Steps over `count` strings, each its length then its bytes (a tokenizer's 50,000 in some ms)."""
        data, size, u64, at = self.data, self.size, self.u64, self.at
        for _ in range(count):
            if at + 8 > size or at + 8 + (length := u64(data, at)[0]) > size:
                break
            at += 8 + length
        else:
            self.at = at
            return
        self.at = at
        length = self.take(8, "has a string length that takes", u64)
        self.need(length, "holds a string that takes")

    def unknown(self, kind: int) -> None:
        raise FileProblem(
            f"{self.path} is cut short or corrupt: its metadata key {self.key} has a value of type {kind}, "
            "which GGUF does not define."
        )


def check_tensors(path: Path, reader) -> None:
    """Refuses a tensor of no dimensions, or with one of size 0, naming it: no weight is empty."""
    for tensor in reader.tensors:
        shape = [int(n) for n in tensor.shape]
        if not shape or 0 in shape:
            held = f"a dimension of size 0 (shape {shape})" if shape else "no dimensions"
            raise FileProblem(f"{path} is corrupt: its tensor {tensor.name} has {held}.")


def check_depth(path: Path, reader, arch: str) -> None:
    """Refuses a `block_count` past llama.cpp's `MAX_BLOCKS`, or (in a file holding tensors, not a
    vocabulary alone) other than the blocks its tensors hold (`blk.N.`): transformers' config of a
    file, made for its tokenizer too, holds a list as long (Gemma 3's layer types)."""
    stated = _field(reader, f"{arch}.block_count")
    blocks = {int(m[1]) for t in reader.tensors if (m := BLOCK.match(t.name))}
    if stated is None:
        return
    if not _count(stated) or not 0 <= stated <= MAX_BLOCKS:
        held = f"llama.cpp reads models of up to {MAX_BLOCKS} blocks (its LLAMA_MAX_LAYERS)"
    elif reader.tensors and stated != len(blocks):
        held = f"its tensors hold {len(blocks)} blocks (blk.N.*)"
    else:
        return
    raise FileProblem(f"{path}: its {arch}.block_count is {stated!r}, and {held}.")


def check_sizes(path: Path, reader, arch: str) -> None:
    """Refuses a file without a token embedding, of another depth than its blocks (`check_depth`), whose
    width (`embedding_length`) is not its token embedding's, or whose head counts do not fit that
    width and each other, before any model is built from them."""
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise FileProblem(
            f"{path} holds no token embedding (tensor token_embd.weight): it is no language model."
        )
    check_depth(path, reader, arch)
    width = int(embedding.shape[0])  # (GGUF's dimensions: the innermost first)
    heads = _field(reader, f"{arch}.attention.head_count")
    sizes = (
        ("embedding_length", lambda n: n == width, f"and its token embedding is {width} wide"),
        ("attention.head_count", lambda n: n <= width, f"and its width ({width}) holds 1 to {width} heads"),
        ("attention.head_count_kv", lambda n: not (_count(heads) and heads % n),
         f"which does not divide its {heads} query heads (attention.head_count)"),
    )  # fmt: skip
    for key, fits, what in sizes:
        stated = _field(reader, f"{arch}.{key}")
        if stated is not None and (not _count(stated) or stated < 1 or not fits(stated)):
            raise FileProblem(f"{path}: its {arch}.{key} is {stated!r}, {what}.")


def _field(reader, key: str):
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
