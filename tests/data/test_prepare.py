import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from gpt_ft.data.folders import Terminated, save_tokenizer
from gpt_ft.data.lm_data import LMDataModule, read_meta
from gpt_ft.data.pieces import cut_point, drops_text, is_validation, pieces, pre_token_ends
from gpt_ft.data.prepare import prepare, token_dtype
from gpt_ft.data.tokenizer import EOS_TOKEN, embedding_size, load_tokenizer, train_tokenizer
from tests.helpers import SENTENCES, write_corpus


def test_token_file_holds_exactly_the_documents_and_separators(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path)
    (corpus / "empty.txt").write_text("\n\n")  # a document with no text gets no separator
    meta = prepare(
        out_dir=tmp_path / "tokens",
        tokenizer=tokenizer_dir,
        inputs=[str(corpus)],
        validation_fraction=0.0,
        progress=False,
    )
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    expected = []
    for path in sorted(p for p in corpus.iterdir() if p.read_text().strip()):
        expected += tok(path.read_text(), add_special_tokens=False)["input_ids"] + [eos]
    tokens = np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"])
    assert tokens.tolist() == expected
    assert meta["dtype"] == "uint16" and meta["documents"] == 4 and meta["eos_token_id"] == eos
    assert meta["tokens"] == {"train": len(expected), "validation": 0}
    assert read_meta(tmp_path / "tokens")["vocab_size"] == len(tok)


def test_a_pretrained_tokenizers_documents_are_framed_as_its_model_read_them(tmp_path):
    """A tokenizer with its own end of text (Gemma's `<eos>`, Llama 2's `</s>`) ends each document
    with it, and one that starts texts with its beginning-of-text token starts each document with
    it: they gained a new, untrained `<|endoftext|>` (the saved tokenizer's eos too) and no bos."""
    from transformers import LlamaTokenizer

    from tests.weights.gguf_files import tiny_pieces

    texts = ["the cat sat on the mat .", "a dog ran .\n\nin the park", "hello world"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(texts):
        (corpus / f"{i}.txt").write_text(text)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    for piece in [*"abcdefghijklmnopqrstuvwxyz .\n", "▁", "▁t", "he", "▁the"]:
        vocab.setdefault(piece, len(vocab))
    llama2 = LlamaTokenizer(vocab=vocab, merges=[("▁", "t"), ("h", "e"), ("▁t", "he")], add_bos_token=True)
    for name, source, end in (("gemma", tiny_pieces(), "<eos>"), ("llama2", llama2, "</s>")):
        source.save_pretrained(tmp_path / name)
        before = load_tokenizer(tmp_path / name, add_specials=True)
        meta = prepare(out_dir=tmp_path / f"{name}-tokens", tokenizer=str(tmp_path / name),
                       inputs=[str(corpus)], validation_fraction=0.0, progress=False)  # fmt: skip
        tok = load_tokenizer(tmp_path / f"{name}-tokens" / "tokenizer")
        assert (len(tok), tok.eos_token, meta["eos_token_id"]) == (
            len(before),
            end,
            tok.convert_tokens_to_ids(end),
        )
        bos, eos = tok.bos_token_id, tok.eos_token_id
        expected = [i for t in texts for i in [bos, *tok(t, add_special_tokens=False)["input_ids"], eos]]
        assert (
            np.fromfile(tmp_path / f"{name}-tokens" / "train.bin", dtype=meta["dtype"]).tolist() == expected
        )
        assert expected.count(bos) == 3 and "<|endoftext|>" not in tok.get_vocab()


def test_each_part_of_a_document_in_a_split_is_framed_as_a_document(tmp_path, tokenizer_dir):
    """A document cut into pieces that go to both splits: each split's part of it starts with the
    bos (a tokenizer that starts texts with one, as Llama 3's) and ends with the end of text, and
    no bos or end of text falls inside a part; the parts hold the documents' own tokens."""
    from tokenizers.processors import TemplateProcessing

    tok = load_tokenizer(tokenizer_dir, add_specials=True)
    tok.bos_token = "<|start|>"
    bos = tok.bos_token_id
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|start|> $A", special_tokens=[("<|start|>", bos)]
    )
    tok.save_pretrained(tmp_path / "tok")
    corpus = write_corpus(tmp_path)
    meta = prepare(out_dir=tmp_path / "tokens", tokenizer=str(tmp_path / "tok"), inputs=[str(corpus)],
                   piece_chars=40, validation_fraction=0.5, progress=False)  # fmt: skip
    eos = meta["eos_token_id"]
    parts = {}
    for split in ("train", "validation"):
        ids = np.fromfile(tmp_path / "tokens" / f"{split}.bin", dtype=meta["dtype"]).tolist()
        assert ids[-1] == eos
        ends = [i for i, t in enumerate(ids) if t == eos]
        parts[split] = [ids[a + 1 : b] for a, b in zip([-1, *ends], ends)]
        for part in parts[split]:
            assert part[0] == bos and bos not in part[1:], part
    assert len(parts["train"]) > meta["documents"] and len(parts["validation"]) > 0  # (documents cut)
    texts = sorted(p.read_text() for p in corpus.iterdir())
    whole = sum((tok(t, add_special_tokens=False)["input_ids"] for t in texts), [])
    train = np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist()
    validation = np.fromfile(tmp_path / "tokens" / "validation.bin", dtype=meta["dtype"]).tolist()
    assert sorted(i for i in train + validation if i not in (bos, eos)) == sorted(whole)


# Llama 3's and Qwen2's split: punctuation takes the line breaks after it (".\n" is one piece).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def llama3_style_tokenizer(folder, text: str, prefix_space: bool = False, nfc: bool = False) -> str:
    """A byte-level BPE with Llama 3's pre-tokenizer split, trained on `text` (`prefix_space`: GPT-2's
    split instead, and a space put before every text, as RoBERTa's; `nfc`: Qwen2's NFC normalizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=prefix_space)
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC() if nfc else None
    bpe.pre_tokenizer = byte_level if prefix_space else pre_tokenizers.Sequence([split, byte_level])
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS_TOKEN], initial_alphabet=alphabet)
    bpe.train_from_iterator([text], trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS_TOKEN).save_pretrained(folder)
    return str(folder)


def sentencepiece_style_tokenizer(folder, text: str, metaspace: bool = False) -> str:
    """A BPE in Llama 2's layout: no pre-tokenizer, a normalizer that puts "▁" before the text and
    for every space, byte fallback; `metaspace`: the layout transformers writes for Llama 2 and
    Mistral without `legacy` (a pre-tokenizer that does both, and does not split)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    if metaspace:
        bpe.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    else:
        bpe.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    bpe.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Strip(" ", 1, 0)]
    )
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", EOS_TOKEN, *bytes_])
    bpe.train_from_iterator([text], trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS_TOKEN, unk_token="<unk>").save_pretrained(
        folder
    )
    return str(folder)


def test_a_corpus_the_vocabulary_cannot_spell_is_counted_and_warned_about(tmp_path, capsys):
    """GPT-1's vocabulary has no curly quotes: each is its unknown token, which the model would
    learn to write. `prepare` counts them and warns above 0.1% of the tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, EOS_TOKEN: 1, "he": 2, "said": 3, "hi": 4, "“": 5}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token=EOS_TOKEN, unk_token="<unk>").save_pretrained(
        tmp_path / "tok"
    )
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("he said “ hi ”\n")
    meta = prepare(out_dir=tmp_path / "out", tokenizer=str(tmp_path / "tok"), inputs=[str(corpus)],
                   validation_fraction=0.0, progress=False)  # fmt: skip
    assert np.fromfile(tmp_path / "out" / "train.bin", dtype=meta["dtype"]).tolist() == [2, 3, 5, 4, 0, 1]
    assert meta["unknown_tokens"] == 1
    assert capsys.readouterr().err == (
        "warning: 1 of the tokens (16.67%) are the tokenizer's unknown token <unk>: the corpus holds "
        "characters its vocabulary lacks (GPT-1's: curly quotes, dashes, ellipses); write them in ASCII "
        "first (GPT-1 ran ftfy), or use a byte-level tokenizer.\n"
    )
    # A bare tokenizer.json (the `tokenizers` library's): transformers names no unknown token, its model does
    (tmp_path / "bare").mkdir()
    words.save(str(tmp_path / "bare" / "tokenizer.json"))
    (corpus / "a.txt").write_text("he said “ hi ”\n")
    meta = prepare(out_dir=tmp_path / "bare_out", tokenizer=str(tmp_path / "bare"), inputs=[str(corpus)],
                   validation_fraction=0.0, progress=False)  # fmt: skip
    assert meta["unknown_tokens"] == 1 and "unknown token <unk>: the corpus" in capsys.readouterr().err
    # GPT-2's unknown token is its end of text, which ends every document: none of those is counted.
    words = Tokenizer(models.WordLevel(vocab, unk_token=EOS_TOKEN))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token=EOS_TOKEN, unk_token=EOS_TOKEN).save_pretrained(
        tmp_path / "tok2"
    )
    (corpus / "a.txt").write_text("he said hi\n")
    meta = prepare(out_dir=tmp_path / "out2", tokenizer=str(tmp_path / "tok2"), inputs=[str(corpus)],
                   validation_fraction=0.0, progress=False)  # fmt: skip
    assert meta["unknown_tokens"] == 0 and capsys.readouterr().err == ""


def test_characters_a_tokenizer_without_an_unknown_token_leaves_out_are_counted_and_warned_about(
    tmp_path, capsys
):
    """A BPE with neither an unknown token nor byte fallback skips each character its vocabulary
    lacks: nothing in the token files shows it. `prepare` counts those characters and names them."""
    from tokenizers import Tokenizer, models, normalizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(["hello world"] * 4, trainers.BpeTrainer(special_tokens=[EOS_TOKEN]))
    (tmp_path / "bare").mkdir()
    bpe.save(str(tmp_path / "bare" / "tokenizer.json"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello é world\n—é hello\n")
    meta = prepare(out_dir=tmp_path / "out", tokenizer=str(tmp_path / "bare"), inputs=[str(corpus)],
                   validation_fraction=0.0, progress=False)  # fmt: skip
    ids = np.fromfile(tmp_path / "out" / "train.bin", dtype=meta["dtype"]).tolist()
    assert ids == [*(bpe.token_to_id(w) for w in ["hello", "world", "hello"]), bpe.token_to_id(EOS_TOKEN)]
    assert meta["dropped_characters"] == 3
    assert capsys.readouterr().err == (
        "warning: 3 characters of the corpus (2 distinct; most often 'é' ×2, '—' ×1) are left out of the "
        "token files: the tokenizer's vocabulary lacks them and it has no unknown token or byte fallback "
        "to stand for them. Use a byte-level tokenizer (`gpt-ft tokenizer` trains one) or one with an "
        "unknown token.\n"
    )
    (corpus / "a.txt").write_text("hello world\n")  # all of it spelt: no word
    meta = prepare(out_dir=tmp_path / "out2", tokenizer=str(tmp_path / "bare"), inputs=[str(corpus)],
                   validation_fraction=0.0, progress=False)  # fmt: skip
    assert meta["dropped_characters"] == 0 and capsys.readouterr().err == ""
    # Accents its normalizer takes out on purpose are not counted (NFD's combining marks, stripped)
    bpe.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()])
    bpe.save(str(tmp_path / "bare" / "tokenizer.json"))
    (corpus / "a.txt").write_text("hello\u0301 world\u0308\n")
    meta = prepare(out_dir=tmp_path / "out3", tokenizer=str(tmp_path / "bare"), inputs=[str(corpus)],
                   validation_fraction=0.0, progress=False)  # fmt: skip
    assert meta["dropped_characters"] == 0 and capsys.readouterr().err == ""


def test_a_byte_level_bpe_that_spells_every_byte_drops_nothing(tokenizer_dir):
    """Its text is not checked for characters left out (offsets cost prepare half its speed)."""
    from tokenizers import Tokenizer, models, trainers

    assert not drops_text(load_tokenizer(tokenizer_dir).backend_tokenizer)  # gpt-ft tokenizer's: bytes
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(["hello world"] * 4, trainers.BpeTrainer())  # its bytes only: 'é' is lost
    assert drops_text(bpe)


def test_a_special_token_written_in_a_text_is_text_in_a_unigram_tokenizer_too(tmp_path):
    """A Unigram model (SentencePiece's) holds `</s>` among its pieces: "</s>" written in a corpus
    or a task's text was read as that piece, the end of a document. Now it is its characters' pieces;
    the tokenizer's own `</s>` (special tokens not split) is still the end of text."""
    from tokenizers import Tokenizer, models, trainers

    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=40, special_tokens=["<unk>", "</s>"], unk_token="<unk>")
    unigram.train_from_iterator(["hello world </s> foo"] * 10, trainer)
    (tmp_path / "bare").mkdir()
    unigram.save(str(tmp_path / "bare" / "tokenizer.json"))
    pieces = [unigram.token_to_id(p) for p in ["▁", "<", "/", "s", ">"]]
    assert None not in pieces and unigram.token_to_id("</s>") == 1
    (tmp_path / "a.txt").write_text("</s>")
    meta = prepare(out_dir=tmp_path / "out", tokenizer=str(tmp_path / "bare"), inputs=str(tmp_path / "a.txt"),
                   validation_fraction=0.0, progress=False)  # fmt: skip
    assert meta["eos_token_id"] == 1
    assert np.fromfile(tmp_path / "out" / "train.bin", dtype=meta["dtype"]).tolist() == [*pieces, 1]
    tok = load_tokenizer(tmp_path / "bare")
    assert tok("</s>", add_special_tokens=False, split_special_tokens=True)["input_ids"] == pieces
    assert tok("</s>", add_special_tokens=False)["input_ids"] == [1]
    assert tok("hello world", add_special_tokens=False)["input_ids"] == unigram.encode("hello world").ids
    tok.save_pretrained(tmp_path / "again")  # (read again, its pieces' scores are those read once)
    scores = [
        json.loads(t.backend_tokenizer.to_str())["model"]["vocab"]
        for t in (tok, load_tokenizer(tmp_path / "again"))
    ]
    assert scores[0] == scores[1]


def test_the_end_of_text_prepare_adds_comes_before_the_framing_tokens(tmp_path):
    """A tokenizer without an end of text (GPT-1's BPE, a WordPiece): the one prepare adds came after
    the framing tokens, so those were no longer the last rows, and took a share of a language
    model's next-token probabilities (`GPT.lm_rows` unset)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gpt_ft.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
    from gpt_ft.training.module import GPTModule

    words = Tokenizer(models.WordLevel({"<unk>": 0, "he": 1, "said": 2, "hi": 3}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>").save_pretrained(tmp_path / "tok")
    (corpus := tmp_path / "corpus").mkdir()
    (corpus / "a.txt").write_text("he said hi\n")
    prepare(out_dir=tmp_path / "out", tokenizer=str(tmp_path / "tok"), inputs=[str(corpus)],
            validation_fraction=0.0, progress=False)  # fmt: skip
    vocab = load_tokenizer(tmp_path / "out" / "tokenizer").get_vocab()
    assert vocab[EOS_TOKEN] == 4 and sorted(vocab[t] for t in SPECIAL_TOKENS.values()) == [5, 6, 7, 8]
    assert GPTModule(preset="gpt-micro", tokenizer=str(tmp_path / "out" / "tokenizer")).gpt.lm_rows == 5


@pytest.mark.parametrize("split", ["gpt2", "llama3", "prefix-space", "sentencepiece", "metaspace"])
def test_pieces_cut_where_the_tokenizer_splits_so_tokens_are_exact(tmp_path, tokenizer_dir, split):
    # Runs of blank lines, indented and trailing spaces, and one long line with no line break:
    # cut into ~40-character pieces, the token file still equals the whole document's tokens.
    text = (
        "The cat sat on the mat.\n\n\nA man is  playing a guitar.  \n    Two dogs run.\n"
        + " ".join(SENTENCES * 6)
        + "\n\nHe is happy now.\n \nShe decides to bake a batch of brownies for the party.\n"
        + "The cat sat.\nThe dog ran.\nA bird, flying.\n" * 4
        + ("这是一个段落，内容很长。" * 8 + "\n\n") * 3  # no space: cut at pre-tokens' ends ("。" | "\n\n")
        + "Words\nin\na\nlist\n" * 6  # line breaks after letters
    ) * 3
    (tmp_path / "doc.txt").write_text(text)
    if split in ("llama3", "prefix-space"):  # (a space before every text: read whole, as below)
        tokenizer_dir = llama3_style_tokenizer(tmp_path / split, text, split == "prefix-space")
    if split in ("sentencepiece", "metaspace"):  # "▁" before every text read: no cut is exact, read whole
        tokenizer_dir = sentencepiece_style_tokenizer(
            tmp_path / split, "\n".join(SENTENCES), split == "metaspace"
        )
    meta = prepare(
        out_dir=tmp_path / "tokens",
        tokenizer=tokenizer_dir,
        inputs=[str(tmp_path / "doc.txt")],
        piece_chars=40,
        validation_fraction=0.0,
        progress=False,
    )
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    expected = tok(text, add_special_tokens=False)["input_ids"] + [meta["eos_token_id"]]
    assert np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist() == expected
    pieces_made = list(pieces(iter([text]), 40))
    assert len(pieces_made) > len(text) // 50 and "".join(p.text for p in pieces_made) == text
    # a document's first piece opens it (its bos, where the tokenizer has one), its last ends it
    made = list(pieces(iter([text, "a short one"]), 40))
    assert [(p.starts_document, p.ends_document) for p in made] == [
        (True, False),
        *[(False, False)] * (len(made) - 3),
        (False, True),
        (True, True),
    ]


@pytest.mark.parametrize("split", ["gpt2", "llama3", "qwen2-nfc"])
def test_a_stretch_with_no_exact_cut_in_the_window_is_not_cut_inside(tmp_path, tokenizer_dir, split):
    """One pre-token longer than half the window (a DNA sequence, a run of digits) is cut at the
    first exact cut after it, not inside it nor at a newline whose whitespace run GPT-2 splits
    otherwise ("  \n\n"); under an NFC normalizer, decomposed kana are never cut from their marks."""
    import unicodedata

    random = np.random.default_rng(0)
    text = (
        "Title  \n\n" + "".join(random.choice(list("ACGT"), 300)) + "\nDigits: "
        + "".join(random.choice(list("0123456789"), 300)) + " end\n"
        + unicodedata.normalize("NFD", "かがみ、ぎんこうでパンをたべる。" * 20) + "\n"
    ) * 2  # fmt: skip
    (tmp_path / "doc.txt").write_text(text)
    if split != "gpt2":  # (trained on the text: its merges span a cut inside a long pre-token)
        tokenizer_dir = llama3_style_tokenizer(tmp_path / split, text, nfc=split == "qwen2-nfc")
    meta = prepare(out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, inputs=[str(tmp_path / "doc.txt")],
                   piece_chars=40, validation_fraction=0.0, progress=False)  # fmt: skip
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    expected = tok(text, add_special_tokens=False)["input_ids"] + [meta["eos_token_id"]]
    assert np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist() == expected


def test_an_exact_cut_at_the_pieces_size_is_found():
    """The only exact cut (before " b") lies at the piece's size itself: taken there, not at the
    newline before it, where a cut splits a run of whitespace the tokenizer reads as one."""
    text = "a" * 10 + "   \n" * 5 + "a" * 10 + " b" * 20
    assert cut_point(text, 40) == 40 and text[40:42] == " b"


def test_a_cut_between_pre_tokens_reads_past_the_window_for_contractions():
    """Unspaced text cut at GPT-2's pre-tokens' ends: "'" ends one where "you'r" stops the window
    and none where "you're" goes on, so every window's cut splits the whole text's pre-tokens."""
    backend = SimpleNamespace(pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False), normalizer=None)
    split = lambda s: [token for token, _ in backend.pre_tokenizer.pre_tokenize_str(s)]  # noqa: E731
    text = "你好you're你好we'll你好" * 6
    for limit in range(12, len(text) - 1):
        cut = cut_point(text, limit, pre_token_ends(backend))
        assert cut <= limit and split(text[:cut]) + split(text[cut:]) == split(text), (limit, cut)


def test_a_long_document_of_whitespace_ends_with_end_of_text_too(tmp_path, tokenizer_dir):
    """A document of whitespace alone, however long, is no document: it holds no exact cut, so it
    is never cut into pieces (whose first would have gone before the rest was seen)."""
    (tmp_path / "c").mkdir()
    texts = ["First document.", "\n" * 100 + " " * 100, "Second document.", " \n"]
    for i, text in enumerate(texts):
        (tmp_path / "c" / f"{i}.txt").write_text(text)
    meta = prepare(inputs=[str(tmp_path / "c")], out_dir=str(tmp_path / "tokens"), tokenizer=tokenizer_dir,
                   piece_chars=64, validation_fraction=0.0, progress=False)  # fmt: skip
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    ids = np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist()
    assert tok.decode(ids).split(EOS_TOKEN) == [texts[0], texts[2], ""] and meta["documents"] == 2


def test_parallel_pieces_and_validation_split(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path, n_files=3, lines=200)
    one, two = (
        prepare(
            out_dir=tmp_path / name,
            tokenizer=tokenizer_dir,
            inputs=[str(corpus)],
            piece_chars=500,
            validation_fraction=0.3,
            workers=workers,
            progress=False,
        )
        for name, workers in (("one", 1), ("two", 2))
    )
    for split in ("train", "validation"):
        name = f"{split}.bin"
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert one["tokens"] == two["tokens"] and one["tokens"]["validation"] > 0 and one["documents"] == 3
    assert sum(is_validation(i, 0.3) for i in range(10_000)) == pytest.approx(3000, abs=150)


def test_a_file_named_twice_is_read_once(tmp_path, tokenizer_dir):
    """A file named and in a folder named, a folder within a folder: each file once, where it first
    comes (read twice, its text would sit in both splits)."""
    corpus = write_corpus(tmp_path, n_files=3, lines=20)
    first = sorted(corpus.rglob("*.txt"))[1]
    once, twice = (
        prepare(out_dir=tmp_path / name, tokenizer=tokenizer_dir, inputs=inputs, progress=False)
        for name, inputs in (
            ("once", [str(first), str(corpus)]),
            ("twice", [str(first), str(corpus), str(corpus)]),
        )
    )
    once.pop("seconds"), twice.pop("seconds")  # (the time taken differs)
    assert once == twice and once["documents"] == 3 and once["sources"][0] == str(first)
    assert (tmp_path / "once" / "train.bin").read_bytes() == (tmp_path / "twice" / "train.bin").read_bytes()


def test_the_sources_are_recorded_where_they_are_found_from_anywhere(tmp_path, tokenizer_dir, monkeypatch):
    """A corpus named relative to the folder `prepare` ran in was recorded so: from the token folder,
    or anywhere else, its files could not be found."""
    corpus = write_corpus(tmp_path, n_files=2, lines=20)
    monkeypatch.chdir(corpus.parent)
    meta = prepare(out_dir=tmp_path / "out", tokenizer=tokenizer_dir, inputs=[corpus.name], progress=False)
    assert meta["sources"] == [str(p) for p in sorted(corpus.resolve().rglob("*.txt"))]


def test_the_bar_in_a_log_is_a_line_now_and_then(tmp_path, tokenizer_dir, capsys):
    """Off a terminal (a log, a pipe), the bar's redraws each make a line: carriage returns ran a
    long run's every redraw into one line."""
    corpus = write_corpus(tmp_path, n_files=2, lines=20)
    prepare(out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, inputs=[str(corpus)])
    err = capsys.readouterr().err
    assert "\r" not in err and re.search(r"^Tokenizing: 100%\|#+\| .* tokens\]$", err, re.M), err


def test_a_token_folder_whose_tokenizer_was_replaced_after_prepare_is_refused(tmp_path, tokenizer_dir):
    """Another tokenizer saved over the prepared one (a retrained one of another size, say) read
    the ids as its own tokens without a word, and the run's checkpoints carried it."""
    corpus = write_corpus(tmp_path, n_files=1, lines=20)
    meta = prepare(out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, inputs=[str(corpus)], progress=False)
    folder = tmp_path / "tokens" / "tokenizer"
    assert set(meta["tokenizer_files"]) == {"tokenizer.json"} and read_meta(tmp_path / "tokens") == meta
    (folder / "chat_template.jinja").write_text("{{ messages }}")  # no id changes
    assert read_meta(tmp_path / "tokens") == meta
    other = tmp_path / "other"
    train_tokenizer(inputs=[corpus], vocab_size=300, out_dir=other, show_progress=False)
    save_tokenizer(load_tokenizer(other), folder)
    said = r"was changed after `gpt-ft prepare` wrote the token files \(.*meta.json holds the SHA-256"
    with pytest.raises(ValueError, match=f"^{folder / 'tokenizer.json'} {said}.*prepare the folder again"):
        LMDataModule(str(tmp_path / "tokens"), block_size=4)
    shutil.copy(Path(tokenizer_dir) / "tokenizer.json", folder)
    assert read_meta(tmp_path / "tokens") == meta  # the prepared tokenizer put back
    (folder / "vocab.json").write_text("{}")
    with pytest.raises(ValueError, match=r"vocab.json was added after `gpt-ft prepare`"):
        read_meta(tmp_path / "tokens")
    (folder / "vocab.json").unlink()
    (folder / "tokenizer.json").rename(folder / "moved.json")
    with pytest.raises(ValueError, match=r"tokenizer.json was removed after `gpt-ft prepare`"):
        read_meta(tmp_path / "tokens")
    (folder / "moved.json").rename(folder / "tokenizer.json")
    # A folder of an earlier version, which recorded no digests: the tokenizer's size is compared.
    older = {k: v for k, v in meta.items() if k != "tokenizer_files"}
    (tmp_path / "tokens" / "meta.json").write_text(json.dumps(older))
    assert read_meta(tmp_path / "tokens") == older
    save_tokenizer(load_tokenizer(other), folder)
    rows = embedding_size(load_tokenizer(other))
    with pytest.raises(
        ValueError, match=f"{folder} has {rows} tokens and .* written by one of {meta['vocab_size']}"
    ):
        read_meta(tmp_path / "tokens")


def test_read_meta_checks_the_token_folder(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path, n_files=1, lines=10)
    assert prepare(
        out_dir=tmp_path / "tokens",
        tokenizer=tokenizer_dir,
        inputs=[str(corpus)],
        validation_fraction=0,
        progress=False,
    )
    meta_path = tmp_path / "tokens" / "meta.json"
    meta = json.loads(meta_path.read_text())
    n = meta["tokens"]["train"]
    meta_path.write_text(json.dumps({**meta, "tokens": {"train": n + 5, "validation": 0}}))
    with pytest.raises(ValueError, match=r"train.bin holds \d+ bytes but meta.json says"):
        read_meta(tmp_path / "tokens")
    meta_path.write_text(json.dumps({**meta, "vocab_size": 70_000}))
    with pytest.raises(ValueError, match="a vocabulary of 70000 does not fit dtype uint16"):
        read_meta(tmp_path / "tokens")
    with pytest.raises(FileNotFoundError, match="holds no meta.json"):
        read_meta(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist: prepare it with `gpt-ft prepare`."):
        read_meta(tmp_path / "nowhere")  # it said the folder holds no meta.json
    damaged = {
        '{"dtype": "uint16", "tokens": {"tr': r"\(JSONDecodeError: Unterminated string",
        '{"dtype": "uint16"}': "it has no field 'tokens'",
        json.dumps({**meta, "dtype": "uint99"}): "TypeError: data type 'uint99' not understood",
        json.dumps({**meta, "dtype": "float16"}): "dtype is 'float16', not an unsigned integer type",
        json.dumps({**meta, "vocab_size": "100"}): "vocab_size is '100', not an integer",
        json.dumps({**meta, "tokenizer": 5}): "tokenizer is 5, not a text",
        json.dumps({**meta, "tokens": {**meta["tokens"], "train": 10.7}}): r"tokens.train is 10.7, not an",
        json.dumps(
            {**meta, "tokenizer_files": ["tokenizer.json"]}
        ): r"tokenizer_files is \['tokenizer.json'\], not",
    }
    for text, why in damaged.items():
        meta_path.write_text(text)
        with pytest.raises(ValueError, match=f"^{meta_path} is damaged .*{why}.*; prepare the folder again"):
            read_meta(tmp_path / "tokens")
    meta_path.write_text(json.dumps(meta))
    shutil.rmtree(
        tmp_path / "tokens" / "tokenizer"
    )  # it was then looked up on the hub, after the model was built
    with pytest.raises(ValueError, match=r"tokens/tokenizer is missing; the folder is incomplete"):
        read_meta(tmp_path / "tokens")
    (tmp_path / "tokens" / "validation.bin").unlink()
    with pytest.raises(ValueError, match=r"validation.bin is missing; the folder is incomplete"):
        read_meta(tmp_path / "tokens")
    with pytest.raises(FileNotFoundError, match=r"meta.json is a file, not a folder: prepare it with"):
        read_meta(meta_path)  # it said the file does not exist


def test_bad_prepare_arguments(tmp_path, tokenizer_dir):
    corpus = [str(write_corpus(tmp_path, n_files=1, lines=2))]
    with pytest.raises(
        ValueError, match="Give either text files/folders or --dataset, not both and not neither"
    ):
        prepare(out_dir=tmp_path / "t", tokenizer=tokenizer_dir, progress=False)
    table = tmp_path / "ok.csv"  # not looked for on the hub (retried for half a minute offline)
    table.write_text("text\na cat\n")
    with pytest.raises(
        ValueError, match=r"^--dataset \S+ok.csv is a file: give a dataset's folder or hub id, or"
    ):
        prepare(out_dir=tmp_path / "t", tokenizer=tokenizer_dir, dataset=str(table), progress=False)
    with pytest.raises(ValueError, match=r"validation_fraction must be in \[0, 1\), got 1"):
        prepare(
            out_dir=tmp_path / "t",
            tokenizer=tokenizer_dir,
            inputs=corpus,
            validation_fraction=1,
            progress=False,
        )
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        prepare(out_dir=tmp_path / "t", tokenizer=tokenizer_dir, inputs=corpus, workers=0, progress=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and holds no token files"):
        prepare(out_dir=tmp_path / "full", tokenizer=tokenizer_dir, inputs=corpus, progress=False)
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]
    assert (token_dtype(2**16), token_dtype(2**16 + 1)) == ("uint16", "uint32")


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_an_interrupted_prepare_leaves_nothing_behind_and_runs_again(
    tmp_path, tokenizer_dir, monkeypatch, stop
):
    """Ctrl-C, or SIGTERM (`kill`, a job scheduler), while the fifth file is read, after batches
    were written: no partial token files, so the same command runs again."""
    import os
    import signal

    import gpt_ft.data.prepare as preparing

    corpus, out, real = (
        write_corpus(tmp_path, n_files=6, lines=200),
        tmp_path / "tokens",
        preparing.file_documents,
    )

    def interrupted(paths, split_on):
        for i, document in enumerate(real(paths, split_on)):
            if i == 4:
                if stop == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                raise KeyboardInterrupt
            yield document

    monkeypatch.setattr(preparing, "file_documents", interrupted)
    with pytest.raises(Terminated if stop == "sigterm" else KeyboardInterrupt):
        prepare(
            inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, piece_chars=200, progress=False
        )
    assert not out.exists()  # the folder it made, removed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.setattr(preparing, "file_documents", real)
    prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, piece_chars=200, progress=False)
    assert read_meta(out)["documents"] > 0


def test_an_interrupt_while_the_files_are_committed_leaves_nothing_behind(
    tmp_path, tokenizer_dir, monkeypatch
):
    """Ctrl-C after the tokenizer is saved, before meta.json: the token files and the tokenizer go
    too (they were left, and the rerun was refused: "not empty and holds no token files"); in a
    folder prepared before, its old meta.json too."""
    import gpt_ft.data.prepare as preparing

    corpus, out, real = (
        write_corpus(tmp_path, n_files=1, lines=20),
        tmp_path / "tokens",
        preparing.put_tokenizer,
    )

    def interrupted(staging, folder):
        real(staging, folder)
        raise KeyboardInterrupt

    monkeypatch.setattr(preparing, "put_tokenizer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    assert not out.exists()
    monkeypatch.setattr(preparing, "put_tokenizer", real)
    prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    assert read_meta(out)["documents"] == 1
    # Into a folder prepared before: its meta.json goes first, so the old token files are never
    # read with the new tokenizer; the folder reads as unprepared, and prepares again.
    monkeypatch.setattr(preparing, "put_tokenizer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    with pytest.raises(FileNotFoundError, match="holds no meta.json: prepare it"):
        read_meta(out)
    monkeypatch.setattr(preparing, "put_tokenizer", real)
    prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    assert read_meta(out)["documents"] == 1
    # A disk that fills as meta.json is written, the token files in place already: they go too.
    write_text = Path.write_text

    def full(path, *args, **kwargs):
        if path.name == "meta.json":
            raise OSError(28, "No space left on device")
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space left"):
        prepare(inputs=[str(corpus)], out_dir=str(tmp_path / "new"), tokenizer=tokenizer_dir, progress=False)
    assert not (tmp_path / "new").exists()


def test_special_tokens_written_in_the_corpus_are_text(tmp_path, tokenizer_dir):
    """A page about GPT-2 that writes "<|endoftext|>" and "<|extract|>": one document, one end-of-text
    token (the one after it), no fine-tuning token; the strings' own characters are encoded."""
    (tmp_path / "c").mkdir()
    text = "GPT-2 separates documents with <|endoftext|> and GPT-1 reads <|extract|> last.\n"
    (tmp_path / "c" / "a.txt").write_text(text)
    meta = prepare(inputs=[str(tmp_path / "c")], out_dir=str(tmp_path / "tokens"), tokenizer=tokenizer_dir,
                   validation_fraction=0.0, progress=False)  # fmt: skip
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    tokens = np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist()
    assert meta["documents"] == 1 and tokens[-1] == meta["eos_token_id"]
    assert tokens.count(meta["eos_token_id"]) == 1 and tok.convert_tokens_to_ids("<|extract|>") not in tokens
    assert tok.decode(tokens[:-1]) == text


def test_a_document_cut_into_pieces_across_both_splits_never_runs_into_another(tmp_path, tokenizer_dir):
    """Pieces go to a split each; where a document goes on in the other split, its part here ends
    with end-of-text, so each stretch between end-of-text tokens is one document's text."""
    (tmp_path / "c").mkdir()
    words = ["cat", "dog", "man", "mat", "park", "gang"]
    for i, word in enumerate(words):  # one word per document, many pieces each
        (tmp_path / "c" / f"doc{i}.txt").write_text(" ".join([word] * 400) + "\n")
    meta = prepare(inputs=[str(tmp_path / "c")], out_dir=str(tmp_path / "tokens"), tokenizer=tokenizer_dir,
                   piece_chars=300, validation_fraction=0.3, progress=False)  # fmt: skip
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    for split in ("train", "validation"):
        ids = np.fromfile(tmp_path / "tokens" / f"{split}.bin", dtype=meta["dtype"]).tolist()
        stretches = [s.split() for s in tok.decode(ids).split(EOS_TOKEN) if s.strip()]
        assert len(stretches) > len(words) / 2 and all(len(set(s)) == 1 for s in stretches), split


def test_one_prepare_at_a_time_and_a_killed_ones_leftovers(tmp_path, tokenizer_dir):
    """A second run into a folder being written is refused in one sentence; the files a killed run
    leaves (SIGKILL: no clean-up) do not stop the next."""
    from gpt_ft.data.folders import LOCK, one_writer

    corpus, out = write_corpus(tmp_path, n_files=2, lines=20), tmp_path / "tokens"
    args = dict(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    out.mkdir()
    with one_writer(out, "`gpt-ft prepare`"):
        (out / "train.bin.tmp").write_bytes(b"being written")  # the other writer's files, left alone
        with pytest.raises(ValueError, match=f"Another `gpt-ft prepare` is writing to {out}; wait for it"):
            prepare(**args)
        assert (out / LOCK).exists() and (out / "train.bin.tmp").read_bytes() == b"being written"
    assert not (out / LOCK).exists()
    (out / LOCK).touch()
    (out / "train.bin.tmp").write_bytes(b"\0" * 10)
    (out / ".tokenizer.x1.partial").mkdir()  # killed while saving its tokenizer: staged beside it
    (out / ".tokenizer.x1.partial" / "vocab.json").write_text("{}")
    prepare(**args)
    assert read_meta(out)["documents"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer", "train.bin", "validation.bin"]
    # A tokenizer folder alone is someone's own, not a killed run's: kept, the folder refused.
    mine = tmp_path / "mine"
    shutil.copytree(tokenizer_dir, mine / "tokenizer")
    before = (mine / "tokenizer" / "tokenizer.json").read_bytes()
    with pytest.raises(
        ValueError,
        match=r"holds no token files of gpt-ft prepare \(no meta.json\); choose an empty folder",
    ):
        prepare(**{**args, "out_dir": str(mine)})
    assert (mine / "tokenizer" / "tokenizer.json").read_bytes() == before
    # Token files of one's own, alone or beside a tokenizer, no run's commit (marked while it runs):
    # they were replaced, and the tokenizer's files deleted, without a word
    own = {"train.bin": tmp_path / "bin", "validation.bin": mine}
    for name, folder in own.items():
        folder.mkdir(exist_ok=True)
        (folder / name).write_bytes(b"mine")
        with pytest.raises(
            ValueError,
            match=r"holds no token files of gpt-ft prepare \(no meta.json\); choose an empty folder",
        ):
            prepare(**{**args, "out_dir": str(folder)})
        assert (folder / name).read_bytes() == b"mine"
    assert (mine / "tokenizer" / "tokenizer.json").read_bytes() == before


def test_a_full_disk_names_the_file_being_written(tmp_path, tokenizer_dir, monkeypatch):
    """A token file that no longer fits: one sentence naming it (a bare OSError named none, and the
    command line printed its traceback); a new folder is said to hold nothing, and goes (its
    tokenizer was said to be "the previous folder", kept)."""
    import builtins

    import gpt_ft.data.prepare as preparing
    from gpt_ft.data.folders import save_tokenizer

    corpus, out = write_corpus(tmp_path, n_files=1, lines=20), tmp_path / "tokens"

    class Full:
        def __init__(self, path, mode):
            self.file = builtins.open(path, mode)

        def write(self, data):
            raise OSError(28, "No space left on device")

        def close(self):
            self.file.close()

    monkeypatch.setattr(preparing, "open", Full, raising=False)
    with pytest.raises(OSError) as raised:
        prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    assert raised.value.filename == str(out / "train.bin") and not out.exists()
    assert (
        raised.value.strerror == "could not be written (No space left on device); nothing was written there"
    )
    monkeypatch.undo()
    tok = load_tokenizer(tokenizer_dir)
    monkeypatch.setattr(
        type(tok),
        "save_pretrained",
        lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device")),
    )
    with pytest.raises(
        OSError, match=r"could not be written \(No space left on device\); nothing was written there"
    ):
        save_tokenizer(tok, tmp_path / "new" / "tokenizer")
    assert not (tmp_path / "new" / "tokenizer").exists()


def test_a_full_disk_as_the_tokenizer_is_saved_keeps_the_folder_prepared_before(
    tmp_path, tokenizer_dir, monkeypatch
):
    """The tokenizer is saved before the folder's commit begins: a disk full then leaves the earlier
    corpus as it was, as the sentence says (its meta.json went first, and the folder read as
    unprepared)."""
    from transformers import PreTrainedTokenizerBase

    corpus, out = write_corpus(tmp_path, n_files=1, lines=20), tmp_path / "tokens"
    prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    full = lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device"))  # noqa: E731
    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
    with pytest.raises(
        OSError, match=r"could not be written \(No space left on device\); the previous folder"
    ):
        prepare(inputs=[str(corpus)], out_dir=str(out), tokenizer=tokenizer_dir, progress=False)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert read_meta(out)["documents"] == 1 and not [p for p in out.iterdir() if p.name.endswith(".partial")]


def test_a_tokenizer_saved_over_another_leaves_none_of_its_files(tmp_path, tokenizer_dir):
    """A chat template of the tokenizer saved there before would render the new one's chats."""
    from gpt_ft.data.folders import save_tokenizer

    folder = tmp_path / "tok"
    with_template = load_tokenizer(tokenizer_dir)
    with_template.chat_template = "{{ messages[0]['content'] }}"
    save_tokenizer(with_template, folder)
    (folder / "notes.txt").write_text("mine")
    assert load_tokenizer(folder).chat_template
    save_tokenizer(load_tokenizer(tokenizer_dir), folder)
    assert not load_tokenizer(folder).chat_template and (folder / "notes.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".tok.*"))  # no staging folder left


def test_a_file_system_without_locks_is_written_unguarded_with_a_warning(tmp_path, monkeypatch):
    """Some network file systems refuse flock: the writer warns and goes on (it stopped with a bare
    OSError); a handler of SIGTERM set outside Python comes back as the default."""
    import errno
    import fcntl
    import signal

    from gpt_ft.data import folders

    def refused(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refused)
    with pytest.warns(UserWarning, match=f"{tmp_path} cannot be locked \\(No locks available\\)"):
        with folders.one_writer(tmp_path, "`gpt-ft prepare`"):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
    assert not (tmp_path / folders.LOCK).exists()
    real = signal.signal

    def says_none(signum, handler):
        real(signum, handler)
        return None

    monkeypatch.setattr(signal, "signal", says_none)
    with folders.sigterm_stops():
        pass  # `signal.signal` said None (a handler set outside Python): the default goes back
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_dataset_row_without_text_is_an_empty_document_and_an_unreachable_one_is_named(
    tmp_path, tokenizer_dir, monkeypatch
):
    import datasets

    folder = tmp_path / "ds"
    folder.mkdir()
    rows = [{"text": "hello world"}, {"text": None}, {"text": "more text"}]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = prepare(
        out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, dataset=str(folder), validation_fraction=0.0,
        progress=False,
    )  # fmt: skip
    tok = load_tokenizer(tmp_path / "tokens" / "tokenizer")
    eos = meta["eos_token_id"]
    expected = [*tok("hello world")["input_ids"], eos, *tok("more text")["input_ids"], eos]
    assert np.fromfile(tmp_path / "tokens" / "train.bin", dtype=meta["dtype"]).tolist() == expected

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wiki' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        ValueError, match=r"^--dataset wiki cannot be loaded \(Couldn't reach 'wiki' on the Hub"
    ):
        prepare(out_dir=tmp_path / "out", tokenizer=tokenizer_dir, dataset="wiki", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_dataset_saved_to_disk_is_read_one_split(tmp_path, tokenizer_dir):
    """`save_to_disk`'s folders: `load_dataset` refused them, asking for a `load_from_disk` the
    command line cannot call."""
    import datasets

    texts = {"train": ["hello world", "more text"], "validation": ["the cat"]}
    whole = datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in texts.items()})
    whole.save_to_disk(tmp_path / "dict")
    whole["validation"].save_to_disk(tmp_path / "one")
    for folder, split in (("dict", "validation"), ("one", "train")):  # a Dataset: its one split, named or not
        out = tmp_path / f"tokens-{folder}"
        meta = prepare(out_dir=out, tokenizer=tokenizer_dir, dataset=str(tmp_path / folder),
                       dataset_split=split, validation_fraction=0.0, progress=False)  # fmt: skip
        tok = load_tokenizer(out / "tokenizer")
        assert np.fromfile(out / "train.bin", dtype=meta["dtype"]).tolist() == [
            *tok("the cat")["input_ids"], meta["eos_token_id"]
        ]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"^--dataset \S+dict has no split 'test'; it has \['train', 'validation'\]"
    ):
        prepare(out_dir=tmp_path / "out", tokenizer=tokenizer_dir, dataset=str(tmp_path / "dict"),
                dataset_split="test", progress=False)  # fmt: skip
    assert not (tmp_path / "out").exists()
    # A folder of data files: the same sentence, not datasets' "Bad split: test. Available splits: ..."
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "train.jsonl").write_text('{"text": "hi there"}\n')
    with pytest.raises(
        ValueError, match=r"^--dataset \S+files has no split 'test'; it has \['train'\] \(--dat"
    ):
        prepare(out_dir=tmp_path / "out", tokenizer=tokenizer_dir, dataset=str(tmp_path / "files"),
                dataset_split="test", progress=False)  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_hub_task_that_cannot_be_reached_asks_for_its_files(monkeypatch):
    import datasets

    from gpt_ft.adapters import TaskDataError
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.files import load_split
    from tests.helpers import ROOT

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TaskDataError) as raised:
        load_split(load_card(ROOT / "tasks/glue/rte.yaml"), "validation", None)
    assert str(raised.value) == (
        "Hub dataset nyu-mll/glue (rte) cannot be loaded (Couldn't reach 'nyu-mll/glue' on the Hub "
        "(LocalEntryNotFoundError)); give the task's files with --data.data_dir DIR."
    )


def test_a_tokenizer_that_reads_documents_whole_is_advised_smaller_documents(tmp_path):
    """SentencePiece's layout cuts no piece: `--piece_chars` changes nothing, smaller documents do."""
    text = "\n".join(SENTENCES) + "\n"
    (tmp_path / "doc.txt").write_text(text)
    tokenizer = sentencepiece_style_tokenizer(tmp_path / "sp", text)
    with pytest.raises(
        ValueError, match=r"none to train: give smaller documents \(--split_on blank_line or line"
    ):
        prepare(out_dir=tmp_path / "t", tokenizer=tokenizer, inputs=[str(tmp_path / "doc.txt")],
                piece_chars=40, validation_fraction=0.9999, progress=False)  # fmt: skip


def test_paths_are_read_as_typed_and_a_tilde_of_no_user_is_one_sentence(
    tmp_path, tokenizer_dir, capsys, monkeypatch
):
    """jsonargparse read `--inputs '#notes.txt'` (a YAML comment) or `null` as no inputs; pathlib's
    `~name` of no user was a traceback (RuntimeError)."""
    from gpt_ft.cli import main

    monkeypatch.chdir(tmp_path)
    for name in ("#notes.txt", "null"):
        (tmp_path / name).write_text("the cat sat on the mat .\n")
        main(["prepare", "--inputs", name, f"--tokenizer={tokenizer_dir}", f"--out_dir=out{len(name)}"])
        assert read_meta(tmp_path / f"out{len(name)}")["documents"] == 1
    for option in ("--out_dir", "--inputs"):
        args = {"--inputs": "null", "--out_dir": "o", option: "~no-such-user-here/x"}
        with pytest.raises(SystemExit) as stop:
            main(["prepare", f"--tokenizer={tokenizer_dir}", *(f"{k}={v}" for k, v in args.items())])
        assert stop.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"gpt-ft: error: {option} ~no-such-user-here/x: this machine has no user 'no-such-user-here' "
            "(~no-such-user-here: their home); write the path in full."
        )
