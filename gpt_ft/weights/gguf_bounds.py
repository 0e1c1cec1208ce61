"""The numbers a GGUF file states about itself, checked against what the file holds before anything
acts on them: a file from a stranger may state any count or size.

`gguf.GGUFReader` believes the counts of the metadata section: an array of 2**40 bytes in a 70-byte
file has it loop 2**40 times over empty slices, its memory growing (gguf 0.19's `_get_field_parts`).
`check_metadata` walks that section first, as cheaply as the format allows (an array of fixed-size
items is skipped whole; only strings are walked one by one), and refuses a count the bytes left cannot
hold, in one sentence naming the file and the key.
"""

from __future__ import annotations

import mmap
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
