"""GGUF files whose numbers lie: counts longer than the file, depths and widths its tensors do not
bear out, empty tensors. Each is written here byte by byte (GGUF version 3, little-endian) and refused
in one sentence naming it, at once (before: a loop for hours, memory growing, or a traceback)."""

from __future__ import annotations

import math
import struct
import time

import pytest

from gpt_ft import GPT
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.weights.gguf_bounds import check_metadata

pytest.importorskip("gguf")

UINT8, UINT32, STRING, ARRAY = 0, 4, 8, 9  # GGUF's value types
BIG = 2**40


def text(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<Q", len(data)) + data


def key(name: str, kind: int, payload: bytes) -> bytes:
    return text(name) + struct.pack("<I", kind) + payload


def u32(name: str, value: int) -> bytes:
    return key(name, UINT32, struct.pack("<I", value))


def string(name: str, value: str) -> bytes:
    return key(name, STRING, text(value))


def strings(name: str, values: list[str]) -> bytes:
    return key(name, ARRAY, struct.pack("<IQ", STRING, len(values)) + b"".join(map(text, values)))


LLAMA = string("general.architecture", "llama")


def gguf(path, *keys: bytes, tensors=()):
    """A GGUF file of `keys` (each a whole pair) and F32 `tensors` (name, dimensions innermost first),
    their values zeros."""
    infos, offset = b"", 0
    for name, dims in tensors:
        infos += text(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, 0, offset)
        offset += -(-4 * math.prod(dims) // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)) + b"".join(keys) + infos
    path.write_bytes(head + bytes(-len(head) % 32 + offset if tensors else 0))  # (data: aligned to 32)
    return path


def refused(load, path, message: str) -> None:
    """`load(path)` refuses `path` with `message` (after the path), within two seconds."""
    start = time.perf_counter()
    with pytest.raises(ValueError) as error:
        load(path)
    assert str(error.value) == f"{path}{message}"
    assert time.perf_counter() - start < 2


@pytest.fixture(autouse=True, scope="module")
def imported(tmp_path_factory):
    """What loading imports (transformers, gguf), imported already: the two seconds are the file's."""
    short = tmp_path_factory.mktemp("short") / "short.gguf"
    short.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
    for load in (GPT.from_pretrained, load_tokenizer):
        with pytest.raises(ValueError, match="is cut short or corrupt"):
            load(short)


@pytest.mark.parametrize(
    "payload, held",
    [
        (
            struct.pack("<IQ", UINT8, BIG),
            "holds an array of 1,099,511,627,776 UINT8 values, which take 1,099,511,627,776 bytes",
        ),
        (
            struct.pack("<IQ", STRING, BIG),
            "holds an array of 1,099,511,627,776 STRING values, which take at least 8,796,093,022,208 bytes",
        ),
        (  # an array of arrays
            struct.pack("<IQIQ", ARRAY, 1, UINT32, BIG),
            "holds an array of 1,099,511,627,776 UINT32 values, which take 4,398,046,511,104 bytes",
        ),
        (  # two strings, the second longer than the file
            struct.pack("<IQQ", STRING, 2, 1) + b"a" + struct.pack("<Q", BIG),
            "holds a string that takes 1,099,511,627,776 bytes",
        ),
    ],
    ids=["bytes", "strings", "nested", "a-long-string"],
)
def test_a_metadata_count_longer_than_the_file_is_refused_before_any_reader_believes_it(
    tmp_path, payload, held
):
    """gguf's reader looped over a count of 2**40 items, its memory growing, where the file held none."""
    path = gguf(tmp_path / "bomb.gguf", key("general.bomb", ARRAY, payload))
    message = f" is cut short or corrupt: its metadata key 'general.bomb' {held} where 0 remain."
    for load in (check_metadata, GPT.from_pretrained, load_tokenizer):
        refused(load, path, message)
    unknown = gguf(tmp_path / "unknown.gguf", key("general.bomb", ARRAY, struct.pack("<IQ", 13, 1)))
    refused(
        check_metadata,
        unknown,
        (
            " is cut short or corrupt: its metadata key 'general.bomb' has a value of "
            "type 13, which GGUF does not define."
        ),
    )


def test_a_70_byte_array_of_2_to_the_40_bytes_ends_gpt_ft_generate_at_once(tmp_path, capsys):
    from gpt_ft.cli import main

    path = tmp_path / "bigarray.gguf"
    bomb = key("general.a_bomb_of_2_40", ARRAY, struct.pack("<IQ", UINT8, BIG))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + bomb)  # (70 bytes)
    with pytest.raises(SystemExit) as stopped:
        main(["generate", f"--ckpt_path={path}", "--prompt=hi"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {path} is cut short or corrupt: its metadata key 'general.a_bomb_of_2_40' holds an "
        "array of 1,099,511,627,776 UINT8 values, which take 1,099,511,627,776 bytes where 0 remain."
    )


def test_more_keys_or_tensors_than_the_file_holds_are_refused(tmp_path):
    many = tmp_path / "many.gguf"
    many.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**62) + LLAMA)
    refused(
        GPT.from_pretrained,
        many,
        (
            " is cut short or corrupt: it states 4,611,686,018,427,387,904 metadata "
            "keys, which take at least 59,951,918,239,556,042,752 bytes where 45 "
            "remain."
        ),
    )
    tensors = tmp_path / "tensors.gguf"
    tensors.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 1) + LLAMA)
    refused(
        GPT.from_pretrained,
        tensors,
        (
            " is cut short or corrupt: it states 1,099,511,627,776 tensors, whose "
            "descriptions take at least 26,388,279,066,624 bytes where 0 "
            "remain."
        ),
    )


EMBEDDING = [("token_embd.weight", (8, 4))]  # 8 wide, 4 tokens
SIZES = (LLAMA, u32("llama.block_count", 0), u32("llama.attention.head_count", 2))
DEEP = u32("llama.block_count", 2**31 - 1)
BEYOND = "llama.cpp reads models of up to 512 blocks (its LLAMA_MAX_LAYERS)."
TOKENS = (string("tokenizer.ggml.model", "gpt2"), strings("tokenizer.ggml.tokens", ["a", "b"]))
UNTRUE = {  # file: (its keys, its tensors, what refuses it, the sentence after its name)
    "bare": (
        (LLAMA, DEEP),
        [],
        GPT.from_pretrained,
        " holds no token embedding (tensor token_embd.weight): it is no language model.",
    ),
    "deep": (
        (LLAMA, DEEP),
        EMBEDDING,
        GPT.from_pretrained,
        f": its llama.block_count is 2147483647, and {BEYOND}",
    ),
    "three": (
        (LLAMA, u32("llama.block_count", 3)),
        EMBEDDING,
        GPT.from_pretrained,
        ": its llama.block_count is 3, and its tensors hold 0 blocks (blk.N.*).",
    ),
    "vocabulary": (
        (string("general.architecture", "gemma3"), u32("gemma3.block_count", 2**31 - 1), *TOKENS),
        [],
        load_tokenizer,
        f": its gemma3.block_count is 2147483647, and {BEYOND}",
    ),
    "wide": (
        (*SIZES, u32("llama.embedding_length", 2 * (2**31 - 1))),
        EMBEDDING,
        GPT.from_pretrained,
        ": its llama.embedding_length is 4294967294, and its token embedding is 8 wide.",
    ),
    "groups": (
        (*SIZES, u32("llama.attention.head_count_kv", 3)),
        EMBEDDING,
        GPT.from_pretrained,
        ": its llama.attention.head_count_kv is 3, which does not divide its 2 query heads "
        "(attention.head_count).",
    ),
    "odd": (
        (*SIZES, u32("llama.embedding_length", 10)),
        [("token_embd.weight", (10, 4))],
        GPT.from_pretrained,
        ": transformers refuses the llama config its metadata gives: RoPE requires an even rotary dimension, "
        "but got `head_dim`=5 with `partial_rotary_factor`=1.0 for `full_attention`.",
    ),
    "scalar": (
        (LLAMA,),
        [("token_embd.weight", ())],
        GPT.from_pretrained,
        " is corrupt: its tensor token_embd.weight has no dimensions.",
    ),
    "empty": (
        (LLAMA,),
        [("token_embd.weight", (0,))],
        GPT.from_pretrained,
        " is corrupt: its tensor token_embd.weight has a dimension of size 0 (shape [0]).",
    ),
    "flat": (
        (LLAMA,),
        [("token_embd.weight", (8, 0))],
        GPT.from_pretrained,
        " is corrupt: its tensor token_embd.weight has a dimension of size 0 (shape [8, 0]).",
    ),
    "ids": (
        (LLAMA, *TOKENS, u32("tokenizer.ggml.bos_token_id", 7)),
        [],
        load_tokenizer,
        ": its tokenizer.ggml.bos_token_id is 7, and it holds 2 tokens (tokenizer.ggml.tokens).",
    ),
}


@pytest.mark.parametrize("name", UNTRUE)
def test_sizes_the_tensors_do_not_bear_out_are_refused_before_a_model_is_built(tmp_path, name):
    """Before: a `block_count` of 2**31-1 built blocks for hours on the meta device (`vocabulary`: the
    tokenizer alone, transformers' Gemma 3 config listing a type per layer); a width of 2**31-1 per head
    (`wide`) and an odd head (`odd`) ended in transformers' 19-frame validation traceback; a tensor of no
    dimensions (`scalar`) in an IndexError's, one of size 0 (`empty`) in numpy's words naming no file
    (`cannot reshape array of size 0 into shape (0)`); a special token past the vocabulary (`ids`) in an
    IndexError's."""
    keys, tensors, load, message = UNTRUE[name]
    refused(load, gguf(tmp_path / f"{name}.gguf", *keys, tensors=tensors), message)
