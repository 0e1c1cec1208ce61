"""Corpus files that are not text (binary, Latin-1, UTF-16) are refused by `gpt-ft prepare` and
`gpt-ft tokenizer` in one sentence that names the file, with exit code 2 and nothing written;
never a traceback, never tokenized as garbage."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from gpt_ft.cli import main
from gpt_ft.data.tokenizer import load_tokenizer
from tests.helpers import write_corpus

NOT_TEXT = {  # file name, bytes, what the sentence says
    "binary": (
        "weights.txt",
        bytes(range(256)) * 4,
        "is not text (a NUL byte at byte offset 0, as in binary",
    ),
    "latin-1": (
        "café.txt",
        "Un café au lait, s'il vous plaît.\n".encode("latin-1"),
        "is not UTF-8 text (byte offset 6: invalid continuation byte)",
    ),
    "utf-16": (
        "notes.md",
        "Two dogs run in a park.\n".encode("utf-16"),
        "is not UTF-8 text (byte offset 0: invalid start byte)",
    ),
    "NUL bytes": ("dump.raw", b"header\x00\x00\x01\x02 data\n", "is not text (a NUL byte at byte offset 6"),
}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err[-2000:]
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()  # one sentence
    return line


@pytest.mark.parametrize("kind", NOT_TEXT)
@pytest.mark.parametrize("command", ["prepare", "tokenizer"])
def test_a_corpus_file_that_is_not_text_is_named_and_nothing_is_written(
    tmp_path, tokenizer_dir, capsys, command, kind
):
    corpus = write_corpus(tmp_path, n_files=3, lines=10)  # UTF-8 text files around the bad one
    name, data, says = NOT_TEXT[kind]
    (corpus / name).write_bytes(data)
    out = tmp_path / "new" / "out"
    args = ["--tokenizer", tokenizer_dir] if command == "prepare" else ["--vocab_size", "300"]
    before = snapshot(tmp_path)
    line = refused(capsys, [command, "--inputs", str(corpus), *args, "--out_dir", str(out)])
    role = "Corpus file" if command == "prepare" else "Training file"
    assert line.startswith(f"gpt-ft: error: {role} {corpus / name} {says}"), line
    assert line.endswith("; save it as UTF-8 or leave it out.")
    assert snapshot(tmp_path) == before and not (tmp_path / "new").exists()


def test_an_earlier_output_is_left_as_it_was(tmp_path, tokenizer_dir, capsys):
    corpus = write_corpus(tmp_path, n_files=2, lines=10)
    out = tmp_path / "tokens"
    main(["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir, "--out_dir", str(out)])
    before = snapshot(out)
    (corpus / "z.txt").write_bytes("naïve\n".encode("latin-1"))
    line = refused(
        capsys, ["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir, "--out_dir", str(out)]
    )
    assert f"Corpus file {corpus / 'z.txt'} is not UTF-8 text" in line
    assert snapshot(out) == before


def test_a_byte_order_mark_is_not_tokenized(tmp_path, tokenizer_dir):
    (tmp_path / "c").mkdir()
    text = "The cat sat on the mat. Two dogs run in a park.\n"
    (tmp_path / "c" / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    out = tmp_path / "tokens"
    main(["prepare", "--inputs", str(tmp_path / "c"), "--tokenizer", tokenizer_dir, "--out_dir", str(out)])
    main(["prepare", "--inputs", str(tmp_path / "c"), "--tokenizer", tokenizer_dir, "--out_dir", str(out)])
    tok = load_tokenizer(out / "tokenizer")
    tokens = [np.fromfile(out / f, dtype="uint16").tolist() for f in ("train.bin", "validation.bin")]
    assert sum(tokens, [])[:-1] == tok(text, add_special_tokens=False)["input_ids"]


def test_the_offset_named_is_the_first_bad_byte_whatever_the_chunk_size(tmp_path):
    """Random bytes (no NUL) read in chunks that split characters: the offset in the sentence is
    where decoding the whole file at once fails, and a file that decodes is accepted."""
    from gpt_ft.data.file_faults import check_text_file

    rng = random.Random(0)
    pieces = ["a", " ", "é", "€", "😀", "\n"]
    path = tmp_path / "f.txt"
    for trial in range(300):
        data = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40))).encode()
        if trial % 2:  # one stray byte somewhere
            at = rng.randrange(len(data) + 1)
            data = data[:at] + bytes([rng.choice([0x80, 0xC3, 0xE9, 0xF0, 0xFF])]) + data[at:]
        path.write_bytes(data)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            with pytest.raises(ValueError) as refused:
                check_text_file(path, "Corpus file", chunk_bytes=rng.randrange(1, 8))
            message = str(refused.value)
            assert f"byte offset {exc.start}:" in message or "ends mid-character" in message, (data, message)
        else:
            assert check_text_file(path, chunk_bytes=rng.randrange(1, 8)) == (not data.decode().isspace())
