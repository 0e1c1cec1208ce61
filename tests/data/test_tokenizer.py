"""Tests for gpt_ft.data.tokenizer, offline: every tokenizer is built by hand or trained in tmp_path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer, GPT2TokenizerFast, OpenAIGPTTokenizerFast

from gpt_ft.data.tokenizer import (
    EOS_TOKEN,
    SPECIAL_TOKENS,
    SpecialTokenIds,
    add_special_tokens,
    embedding_size,
    load_tokenizer,
    special_token_ids,
    train_tokenizer,
)

START, DELIM, EXTRACT, PAD = (SPECIAL_TOKENS[k] for k in ("start", "delim", "extract", "pad"))

# A GPT-1 style BPE: lowercased symbols, `</w>` on the last symbol of a word, merges applied by rank.
GPT1_VOCAB = [
    "<unk>", "h", "e", "l", "o", "w", "r", "d", "o</w>", "d</w>", ".</w>", "!</w>",
    "he", "ll", "hell", "hello</w>", "wo", "wor", "worl", "world</w>",
]  # fmt: skip
GPT1_MERGES = ["h e", "l l", "he ll", "hell o</w>", "w o", "wo r", "wor l", "worl d</w>"]

# A GPT-2 style byte-level BPE: `Ġ` is a space, the last id is <|endoftext|>.
GPT2_VOCAB = [
    "H", "e", "l", "o", "Ġ", "w", "r", "d", "ll", "ell", "Hell", "Hello",
    "Ġw", "Ġwo", "Ġwor", "Ġworl", "Ġworld", EOS_TOKEN,
]  # fmt: skip
GPT2_MERGES = ["l l", "e ll", "H ell", "Hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"]

TEXT_WITH_SPECIALS = f"{START}Hello world{DELIM}Hello{EXTRACT}"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Naïve café owners serve crème brûlée to the jury.",
    "Stars 🌟 and smiles 🙂 brighten the day.",
    "To be, or not to be: that is the question.",
]


def _write_bpe(directory: Path, vocab: list[str], merges: list[str]) -> Path:
    directory.mkdir()
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return directory


@pytest.fixture
def gpt1_dir(tmp_path: Path) -> Path:
    return _write_bpe(tmp_path / "gpt1", GPT1_VOCAB, GPT1_MERGES)


@pytest.fixture
def gpt2_dir(tmp_path: Path) -> Path:
    return _write_bpe(tmp_path / "gpt2", GPT2_VOCAB, GPT2_MERGES)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("corpus")
    files = []
    for i in range(2):
        path = root / f"part{i}.txt"
        path.write_text("\n".join(SENTENCES[i::2] * 20) + "\n", encoding="utf-8")
        files.append(path)
    return files


@pytest.fixture(scope="module")
def trained_dir(corpus: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "tok"
    train_tokenizer(inputs=corpus, vocab_size=320, out_dir=out, show_progress=False)
    return out


@pytest.fixture(params=["gpt1", "gpt2", "trained"])
def any_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


# --- format detection and literal ids -------------------------------------------------------------


def test_gpt1_folder_loads_as_openai_gpt_bpe(gpt1_dir: Path) -> None:
    tok = load_tokenizer(gpt1_dir)
    assert isinstance(tok, OpenAIGPTTokenizerFast)
    # hello: h e l l o</w> -> he l l o</w> -> he ll o</w> -> hell o</w> -> hello</w> (by merge rank).
    assert _ids(tok, "Hello world.") == [15, 19, 10]
    # No merge applies to "hold"; "z" is not in the vocabulary and becomes <unk>.
    assert _ids(tok, "HOLD! zoo") == [1, 4, 3, 9, 11, 0, 4, 8]
    assert len(tok) == len(GPT1_VOCAB) + 4
    assert special_token_ids(tok) == SpecialTokenIds(start=20, delim=21, extract=22, pad=23, eos=None)


def test_gpt2_folder_loads_as_byte_level_bpe(gpt2_dir: Path) -> None:
    tok = load_tokenizer(gpt2_dir)
    assert isinstance(tok, GPT2TokenizerFast)
    assert _ids(tok, "Hello world") == [11, 16]
    assert _ids(tok, "Held world") == [0, 1, 2, 7, 16]  # no merge for "Held": one token per byte
    assert len(tok) == len(GPT2_VOCAB) + 4
    assert special_token_ids(tok) == SpecialTokenIds(start=18, delim=19, extract=20, pad=21, eos=17)


@pytest.mark.parametrize("fmt", ["gpt1", "gpt2"])
def test_bpe_files_beside_a_tokenizer_config_naming_no_class(
    fmt: str, request: pytest.FixtureRequest
) -> None:
    # the hub's openai-gpt and gpt2 ship such a file; transformers cannot pick a class from it
    folder = request.getfixturevalue(f"{fmt}_dir")
    bare = load_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 77}')
    tok = load_tokenizer(folder)
    assert type(tok) is type(bare) and tok.model_max_length == 77
    assert _ids(tok, "Hello world.") == _ids(bare, "Hello world.") and len(tok) == len(bare)


def test_a_vocabulary_that_skips_ids_sizes_the_embedding_past_its_largest_id(
    tmp_path: Path, pairs_dir: Path
) -> None:
    from gpt_ft.data.task_data import TaskDataModule
    from tests.data.test_task_data import pair_task

    folder = _write_bpe(tmp_path / "gap", GPT2_VOCAB[:-1], GPT2_MERGES)  # ids 0-16, then a reserved range
    (folder / "vocab.json").write_text(
        json.dumps({**json.loads((folder / "vocab.json").read_text()), EOS_TOKEN: 20})
    )
    tok = load_tokenizer(folder)
    assert special_token_ids(tok) == SpecialTokenIds(start=21, delim=22, extract=23, pad=24, eos=20)
    assert len(tok) == 22 and embedding_size(tok) == 25  # len alone: the framing tokens had no rows
    assert TaskDataModule(pair_task(), str(folder), data_dir=str(pairs_dir)).vocab_size == 25


def test_format_is_read_from_vocab_not_folder_name(tmp_path: Path) -> None:
    misnamed = _write_bpe(tmp_path / "gpt2", GPT1_VOCAB, GPT1_MERGES)
    assert isinstance(load_tokenizer(misnamed), OpenAIGPTTokenizerFast)
    assert _ids(load_tokenizer(misnamed), "hello") == [15]


def test_specials_embedded_in_text_are_single_tokens(gpt1_dir: Path, gpt2_dir: Path) -> None:
    gpt1, gpt2 = load_tokenizer(gpt1_dir), load_tokenizer(gpt2_dir)
    assert _ids(gpt1, TEXT_WITH_SPECIALS) == [20, 15, 19, 21, 15, 22]
    assert _ids(gpt2, TEXT_WITH_SPECIALS) == [18, 11, 16, 19, 11, 20]
    assert gpt2.decode(_ids(gpt2, TEXT_WITH_SPECIALS)) == TEXT_WITH_SPECIALS
    assert gpt2.decode(_ids(gpt2, TEXT_WITH_SPECIALS), skip_special_tokens=True) == "Hello worldHello"
    decoded = gpt1.decode(_ids(gpt1, TEXT_WITH_SPECIALS))
    assert re.findall(r"<\|\w+\|>", decoded) == [START, DELIM, EXTRACT]
    assert "hello world" in decoded  # GPT-1 lowercases


def test_load_without_specials_keeps_base_vocab(gpt1_dir: Path) -> None:
    tok = load_tokenizer(gpt1_dir, add_specials=False)
    assert len(tok) == len(GPT1_VOCAB)
    with pytest.raises(ValueError, match=re.escape("no start token '<|start|>'")):
        special_token_ids(tok)


# --- add_special_tokens ---------------------------------------------------------------------------


def test_add_special_tokens_is_idempotent_and_keeps_ids(any_dir: Path) -> None:
    base = load_tokenizer(any_dir, add_specials=False)
    base_vocab = base.get_vocab()
    tok = add_special_tokens(base)
    ids = special_token_ids(tok)
    size = len(tok)
    assert add_special_tokens(tok) is tok
    assert len(tok) == size
    assert special_token_ids(tok) == ids
    vocab = tok.get_vocab()
    assert {t: vocab[t] for t in base_vocab} == base_vocab
    assert set(SPECIAL_TOKENS.values()) <= set(tok.all_special_tokens)


def test_specials_are_appended_after_base_vocab_in_order(gpt2_dir: Path) -> None:
    base = load_tokenizer(gpt2_dir, add_specials=False)
    n = len(base)
    add_special_tokens(base)
    assert [base.convert_tokens_to_ids(t) for t in (START, DELIM, EXTRACT, PAD)] == [n, n + 1, n + 2, n + 3]


def test_existing_pad_token_is_kept(gpt2_dir: Path) -> None:
    tok = load_tokenizer(gpt2_dir, add_specials=False)
    tok.pad_token = EOS_TOKEN
    add_special_tokens(tok)
    assert len(tok) == len(GPT2_VOCAB) + 3
    assert PAD not in tok.get_vocab()
    assert special_token_ids(tok).pad == 17


def test_existing_extra_special_tokens_stay_special(gpt2_dir: Path) -> None:
    tok = load_tokenizer(gpt2_dir, add_specials=False)
    tok.add_special_tokens({"additional_special_tokens": ["<|mine|>"]})
    add_special_tokens(tok)
    assert {"<|mine|>", START, DELIM, EXTRACT} <= set(tok.all_special_tokens)
    assert tok.convert_tokens_to_ids("<|mine|>") == len(GPT2_VOCAB)
    assert special_token_ids(tok).start == len(GPT2_VOCAB) + 1


def test_specials_survive_save_and_reload(any_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(any_dir)
    tok.save_pretrained(tmp_path / "saved")
    for reloaded in (AutoTokenizer.from_pretrained(tmp_path / "saved"), load_tokenizer(tmp_path / "saved")):
        assert type(reloaded) is type(tok)
        assert len(reloaded) == len(tok)
        assert special_token_ids(reloaded) == special_token_ids(tok)
        assert _ids(reloaded, TEXT_WITH_SPECIALS) == _ids(tok, TEXT_WITH_SPECIALS)


# --- train_tokenizer ------------------------------------------------------------------------------


def test_trained_tokenizer_layout(trained_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(trained_dir)
    assert special_token_ids(tok) == SpecialTokenIds(start=1, delim=2, extract=3, pad=4, eos=0)
    assert tok.convert_tokens_to_ids(EOS_TOKEN) == 0
    assert tok.eos_token == tok.bos_token == EOS_TOKEN
    assert tok.pad_token == PAD
    assert 5 + 256 < len(tok) <= 320  # specials + byte alphabet + some merges
    # load_tokenizer finds every special already there and adds nothing.
    assert len(load_tokenizer(trained_dir)) == len(tok)


def test_trained_tokenizer_reloads_identically(corpus: list[Path], tmp_path: Path) -> None:
    trained = train_tokenizer(inputs=corpus, vocab_size=300, out_dir=tmp_path / "tok", show_progress=False)
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert len(reloaded) == len(trained)
    for text in [*SENTENCES, TEXT_WITH_SPECIALS, f"one{EOS_TOKEN}two"]:
        assert _ids(reloaded, text) == _ids(trained, text)
    assert _ids(trained, TEXT_WITH_SPECIALS)[0] == 1
    assert _ids(trained, f"one{EOS_TOKEN}two").count(0) == 1


@pytest.mark.parametrize(
    "text",
    [
        "Naïve café, crème brûlée!",
        "Unseen scripts: 日本語, Ελληνικά, العربية.",
        "Emoji 🙂🚀👩‍👩‍👧 and tabs\tand\nnewlines  with  double spaces ",
        " leading space",
    ],
)
def test_trained_tokenizer_round_trips_any_text(trained_dir: Path, text: str) -> None:
    tok = AutoTokenizer.from_pretrained(trained_dir)
    ids = _ids(tok, text)
    assert tok.decode(ids) == text


def test_training_reads_the_text_as_prepare_does(corpus: list[Path], tmp_path: Path) -> None:
    """A corpus saved with a byte-order mark and Windows line ends trains the tokenizer its plain
    copy trains, as `gpt-ft prepare` encodes both to the same tokens: no merge of "\\r\\n", no
    token for the mark's bytes."""
    windows = []
    for i, path in enumerate(corpus):
        windows.append(tmp_path / f"windows{i}.txt")
        windows[-1].write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    plain = train_tokenizer(inputs=corpus, vocab_size=300, out_dir=tmp_path / "plain", show_progress=False)
    saved = train_tokenizer(inputs=windows, vocab_size=300, out_dir=tmp_path / "win", show_progress=False)
    assert saved.get_vocab() == plain.get_vocab()
    assert (tmp_path / "win/tokenizer.json").read_text() == (tmp_path / "plain/tokenizer.json").read_text()


def test_training_into_a_tokenizer_dir_replaces_it_if_asked(corpus: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "tok"
    train_tokenizer(inputs=corpus, vocab_size=280, out_dir=out, show_progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(
        ValueError, match=re.escape(f"--out_dir {out} holds a tokenizer: give another folder, or --overwrite")
    ):
        train_tokenizer(inputs=corpus, vocab_size=300, out_dir=out, show_progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    again = train_tokenizer(inputs=corpus, vocab_size=300, out_dir=out, show_progress=False, overwrite=True)
    assert len(AutoTokenizer.from_pretrained(out)) == len(again) > 280


def test_two_runs_given_one_new_folder_do_not_both_write_it(
    corpus: list[Path], trained_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """A run that finds the folder held by another is refused; one that finds, as it saves, a
    tokenizer another run saved while it trained is refused too; neither touches the other's files,
    and a refused run leaves no folder of its own."""
    import shutil

    import gpt_ft.data.tokenizer as tokenizing
    from gpt_ft.data.folders import one_writer

    out = tmp_path / "new" / "tok"
    out.mkdir(parents=True)
    with one_writer(out, "`gpt-ft tokenizer`"):
        with pytest.raises(
            ValueError, match=re.escape(f"Another `gpt-ft tokenizer` is writing to {out}; wait")
        ):
            train_tokenizer(inputs=corpus, vocab_size=280, out_dir=out, show_progress=False)
    shutil.rmtree(tmp_path / "new")
    lines = tokenizing.file_lines

    def another_run_saves_meanwhile(paths):
        yield from lines(paths)
        shutil.copytree(trained_dir, out)

    monkeypatch.setattr(tokenizing, "file_lines", another_run_saves_meanwhile)
    with pytest.raises(
        ValueError, match=re.escape(f"--out_dir {out} holds a tokenizer: give another folder")
    ):
        train_tokenizer(inputs=corpus, vocab_size=280, out_dir=out, show_progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        p.name: p.read_bytes() for p in trained_dir.iterdir()
    }
    shutil.rmtree(tmp_path / "new")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("gpt_ft.data.folders.save_tokenizer", interrupted)
    monkeypatch.setattr(tokenizing, "file_lines", lines)
    with pytest.raises(KeyboardInterrupt):
        train_tokenizer(inputs=corpus, vocab_size=280, out_dir=out, show_progress=False)
    assert not (tmp_path / "new").exists()


# --- bad input ------------------------------------------------------------------------------------


def test_a_tokenizer_folder_with_a_broken_json_file_names_it(trained_dir: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "tok"
    shutil.copytree(trained_dir, broken)
    (broken / "tokenizer.json").write_text('{"model": \n')
    named = re.escape(str(broken / "tokenizer.json"))
    with pytest.raises(ValueError, match=rf"^{named}, line 2 is not valid JSON"):
        load_tokenizer(broken)
    (broken / "tokenizer.json").write_text((trained_dir / "tokenizer.json").read_text())
    (broken / "config.json").write_text("{bad")  # a weights folder's, read by transformers first (OSError)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(broken / 'config.json'))}, line 1 is not valid JSON"
    ):
        load_tokenizer(broken)
    # a value its validators refuse (huggingface_hub's error): tokenizer.json was named
    (broken / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 32, "num_attention_heads": 5}'
    )
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(broken / 'config.json'))}: transformers refuses it: "
    ):
        load_tokenizer(broken)
    (broken / "config.json").unlink()
    for (
        text,
        error,
    ) in (  # JSON, but no tokenizer these libraries read: a newer tokenizers' model, a part missing
        (
            '{"version": "1.0", "added_tokens": [], "model": {"type": "FancyNew"}}',
            "Exception: data did not match",
        ),
        ('{"version": "1.0", "model": {"type": "BPE"}}', "KeyError: 'added_tokens'"),
    ):
        (broken / "tokenizer.json").write_text(text)
        with pytest.raises(ValueError) as caught:
            load_tokenizer(broken)
        assert str(caught.value).startswith(f"{broken / 'tokenizer.json'} is no tokenizer transformers ")
        assert error in str(caught.value) and str(caught.value).endswith(
            "a newer tokenizers' file, or a damaged one."
        )
    (broken / "tokenizer.json").unlink()  # its settings copied alone: transformers asked for packages
    with pytest.raises(ValueError, match=rf"^{re.escape(str(broken))} holds no vocabulary to load \("):
        load_tokenizer(broken)
    for other in ("vocab.json", "merges.txt"):  # a SentencePiece model, say, that transformers cannot read
        (broken / other).unlink(missing_ok=True)
    (broken / "spm.model").write_bytes(b"\x00")
    with pytest.raises(ValueError) as raised:
        load_tokenizer(broken)
    assert "holds no vocabulary" not in str(raised.value)  # transformers' own words: it has one


@pytest.mark.parametrize(
    "name", ["missing", "./missing-tokenizer", "~/missing-tokenizer-9f3a1c", "runs/last.ckpt"]
)
def test_missing_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / name if name == "missing" else name
    what = "Checkpoint " if name.endswith(".ckpt") else ""  # a file: never looked up on the hub
    with pytest.raises(FileNotFoundError, match=re.escape(f"{what}{Path(path).expanduser()} does not exist")):
        load_tokenizer(path)


def test_directory_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "vocab.json").write_text("{}")  # vocab.json alone, no merges.txt
    with pytest.raises(
        ValueError, match=rf"Directory {re.escape(str(tmp_path))} holds no tokenizer; expected"
    ):
        load_tokenizer(tmp_path)


def test_file_instead_of_directory(gpt2_dir: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{gpt2_dir / 'vocab.json'} is a file")):
        load_tokenizer(gpt2_dir / "vocab.json")


def test_a_checkpoint_gives_the_tokenizer_saved_beside_it(finetuned, tmp_path: Path) -> None:
    """What `--data.tokenizer`, `prepare --tokenizer` and the other tokenizer options read of a .ckpt."""
    beside = load_tokenizer(finetuned.ckpt.parent / "tokenizer")
    assert load_tokenizer(finetuned.ckpt).get_vocab() == beside.get_vocab() and len(beside) > 0
    moved = tmp_path / "last.ckpt"
    moved.write_bytes(finetuned.ckpt.read_bytes())
    with pytest.raises(ValueError, match=re.escape(f"{moved} has no tokenizer folder beside it")):
        load_tokenizer(moved)


def test_unreadable_vocab(gpt2_dir: Path) -> None:
    vocab = json.loads((gpt2_dir / "vocab.json").read_text())
    (gpt2_dir / "vocab.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(f"{gpt2_dir / 'vocab.json'} is not valid JSON")):
        load_tokenizer(gpt2_dir)
    for bad in (1.5, -3, "7"):  # it was blamed on merges.txt
        first = next(iter(vocab))
        (gpt2_dir / "vocab.json").write_text(json.dumps({**vocab, first: bad}))
        said = f"Vocabulary file {gpt2_dir / 'vocab.json'} gives {first!r} the id {bad!r}; expected a token"
        with pytest.raises(ValueError, match=f"^{re.escape(said)}"):
            load_tokenizer(gpt2_dir)


@pytest.mark.parametrize("merges", [b"garbage line with three parts\n", b"#version: 0.2\n\xc4\n"])
def test_a_broken_merges_file_is_named(gpt2_dir: Path, merges: bytes) -> None:
    """The BPE builder raised a bare Exception naming no file (a traceback at the command line)."""
    (gpt2_dir / "merges.txt").write_bytes(merges)
    with pytest.raises(
        ValueError, match=re.escape(f"{gpt2_dir / 'merges.txt'} is not a valid BPE merges file (")
    ):
        load_tokenizer(gpt2_dir)


def test_a_gpt1_vocab_without_unk_is_refused_at_load(tmp_path: Path) -> None:
    # The GPT-1 BPE maps a character outside its vocabulary to <unk>: without one, encoding that
    # character would fail mid-run with the tokenizer library's bare exception.
    directory = _write_bpe(tmp_path / "gpt1", GPT1_VOCAB[1:], GPT1_MERGES)
    with pytest.raises(ValueError, match=re.escape(f"{directory / 'vocab.json'} has no '<unk>' entry")):
        load_tokenizer(directory)


def test_vocab_of_unknown_format(tmp_path: Path) -> None:
    directory = _write_bpe(tmp_path / "plain", ["a", "b", "ab"], ["a b"])
    with pytest.raises(ValueError, match="Cannot tell the BPE format"):
        load_tokenizer(directory)


def test_special_token_ids_without_pad(gpt2_dir: Path) -> None:
    tok = load_tokenizer(gpt2_dir, add_specials=False)
    tok.add_special_tokens({"additional_special_tokens": [START, DELIM, EXTRACT]})
    with pytest.raises(ValueError, match="no pad token"):
        special_token_ids(tok)


def test_train_rejects_small_vocab(corpus: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"vocab_size=260 is too small; expected at least 261"):
        train_tokenizer(inputs=corpus, vocab_size=260, out_dir=tmp_path / "tok")


def test_train_rejects_no_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="No training files given"):
        train_tokenizer(inputs=[], vocab_size=300, out_dir=tmp_path / "tok")


def test_train_rejects_missing_file(corpus: list[Path], tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(f"Training file {missing} does not exist")):
        train_tokenizer(inputs=[*corpus, missing], vocab_size=300, out_dir=tmp_path / "tok")


def test_train_rejects_files_without_text(tmp_path: Path) -> None:
    empty, blank = tmp_path / "empty.txt", tmp_path / "blank.txt"
    empty.write_text("")
    blank.write_text(" \n\t\n")
    with pytest.raises(ValueError, match=re.escape(f"Training file {blank} contains no text")):
        train_tokenizer(inputs=[blank], vocab_size=300, out_dir=tmp_path / "tok")
    with pytest.raises(ValueError, match="None of the 2 training files contains any text"):
        train_tokenizer(inputs=[empty, blank], vocab_size=300, out_dir=tmp_path / "tok")
    marked = tmp_path / "bom.txt"  # an empty file a Windows editor saved as "UTF-8 with BOM"
    marked.write_bytes(b"\xef\xbb\xbf\r\n  \r\n")
    with pytest.raises(ValueError, match=re.escape(f"Training file {marked} contains no text")):
        train_tokenizer(inputs=[marked], vocab_size=300, out_dir=tmp_path / "tok")


def test_train_rejects_binary_file(tmp_path: Path) -> None:
    binary = tmp_path / "data.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 10)
    with pytest.raises(ValueError, match=re.escape(f"Training file {binary} is not UTF-8")):
        train_tokenizer(inputs=[binary], vocab_size=300, out_dir=tmp_path / "tok")


def test_train_refuses_to_overwrite_other_directory(corpus: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "checkpoints"
    out.mkdir()
    (out / "model.ckpt").write_text("weights")
    with pytest.raises(
        ValueError, match=re.escape(f"--out_dir {out} is not empty and holds no tokenizer; give an empty")
    ):
        train_tokenizer(inputs=corpus, vocab_size=300, out_dir=out)
    assert [p.name for p in out.iterdir()] == ["model.ckpt"]
    with pytest.raises(
        ValueError, match=re.escape(f"--out_dir {out / 'model.ckpt'} is a file, not a folder")
    ):
        train_tokenizer(inputs=corpus, vocab_size=300, out_dir=out / "model.ckpt")


def test_a_corpus_too_small_for_the_vocabulary_asked_says_so(
    corpus: list[Path], tmp_path: Path, capsys
) -> None:
    tok = train_tokenizer(inputs=corpus, vocab_size=5000, out_dir=tmp_path / "tok", show_progress=False)
    assert len(tok) < 5000
    said = capsys.readouterr().err
    assert (
        f"note: the corpus gave {len(tok)} tokens, fewer than --vocab_size 5000 (every pair seen at least"
        in said
    )


def test_a_tokenizer_may_read_every_text_in_one_unicode_form(tmp_path):
    """`--normalizer nfc`: a letter and its accent typed apart (NFD, as macOS names files) read as
    the accented letter; nfkc reads full-width forms as the plain ones too; none keeps GPT-2's bytes."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("crème brûlée très bien ！ ok\n" * 50)
    encoded = {}
    for form in ("none", "nfc", "nfkc"):
        tok = train_tokenizer(inputs=[str(corpus)], vocab_size=300, out_dir=str(tmp_path / form),
                              normalizer=form, show_progress=False)  # fmt: skip
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in ("crème", "cre\u0300me", "!", "！")]
        encoded[form] = (ids[0] == ids[1], ids[2] == ids[3])
    assert encoded == {"none": (False, False), "nfc": (True, False), "nfkc": (True, True)}
    saved = load_tokenizer(
        str(tmp_path / "nfc")
    )  # (the form is the saved tokenizer's: prepare, label, export)
    assert saved("cre\u0300me")["input_ids"] == saved("crème")["input_ids"]
