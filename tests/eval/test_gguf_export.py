"""A fine-tuned embedding model or Qwen3 reranker as one GGUF file (gpt_ft/eval/gguf_export.py): its
keys pool, frame and score as the card does, as llama.cpp reads them; what llama.cpp cannot serve is
refused in one sentence with nothing on disk. Where llama-cpp-python is installed, llama.cpp itself
reads the files: its vectors are `Encoder.encode`'s, its reranking scores the sigmoid of gpt_ft's."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from gpt_ft import GPT, GPTConfig
from gpt_ft.adapters import Embedding, Reranker
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval.classifier import Classifier
from gpt_ft.eval.encoder import Encoder
from gpt_ft.eval.export import served_by
from gpt_ft.eval.gguf_export import export_served_gguf
from tests.cli.test_bad_outputs import error
from tests.eval.test_encoder import write_pairs
from tests.helpers import GEMMA3_MICRO

gguf = pytest.importorskip("gguf")
FAMILIES = {  # preset and overrides of a micro model of each family llama.cpp serves
    "gpt2": ("gpt-micro", dict(n_embd=32, pre_ln=True)),
    "llama": ("llama-micro", {}),
    "qwen3": ("llama-micro", dict(qk_norm=True, head_size=16, hf_model_type="qwen3")),
    "gemma3": (
        "llama-micro",
        dict(
            GEMMA3_MICRO,
            head_size=16,
            query_pre_attn_scalar=16,
            sliding_window=4,
            hf_model_type="gemma3_text",
        ),
    ),  # (a window shorter than the texts)
    "phi3": (
        "llama-micro",
        dict(rotary_dim=12, hf_model_type="phi3"),
    ),  # (Phi-4-mini's: part of each head turns)
}
POOLINGS = {"extract": "LAST", "last": "LAST", "mean": "MEAN"}  # the card's, llama.cpp's
TEXTS = ["the cat sat on the mat", "a dog", "", "he is happy in the park today 1999", "Is it <|extract|>?"]
PAIRS = [("the cat", "sat on the mat"), ("a dog", "he is happy"), ("is it true?", "yes, it is.")]


def classifier(task, family: str, tokenizer_dir: str, seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    preset, overrides = FAMILIES.get(family, ("gpt-micro", dict(n_embd=32)))  # (GPT-1's otherwise)
    tokenizer = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name(preset, n_positions=48, vocab_size=len(tokenizer), **overrides)
    head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
    return Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")


def fields(path) -> dict:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()} | {
        "tensors": {t.name: np.array(t.data) for t in reader.tensors}
    }


@pytest.mark.parametrize("pooling", POOLINGS)
def test_an_embedding_models_file_pools_and_frames_each_text_as_its_card(tmp_path, tokenizer_dir, pooling):
    """llama.cpp's pooling, and the start token added before each text and the extract token after
    it (bos, eos): the frame training gave each text."""
    clf = classifier(Embedding(name="e", pooling=pooling), "llama", tokenizer_dir)
    got = fields(export_served_gguf(clf, tmp_path / "e.gguf", "f32"))
    assert got["llama.pooling_type"] == getattr(gguf.PoolingType, POOLINGS[pooling])
    bos, add_bos, add_eos = (
        got[f"tokenizer.ggml.{k}"] for k in ("bos_token_id", "add_bos_token", "add_eos_token")
    )
    eos = [got["tokenizer.ggml.eos_token_id"]] if add_eos else []
    assert (bos, add_bos, add_eos) == (clf.specials.start, True, pooling == "extract")
    ids = clf.tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    assert clf.task.frame(clf.specials, ids)[0] == [bos, *ids, *eos]
    assert not any(key.startswith("tokenizer.chat_template") for key in got)  # texts are no chats
    assert "cls.output.weight" not in got["tensors"]


def test_a_qwen3_rerankers_file_scores_each_pair_by_its_head_against_zero(tmp_path, tokenizer_dir):
    """Rank pooling; the two score rows llama.cpp's Qwen3 reranker softmaxes: the head (divided by a
    calibrated model's temperature) and zeros; the prompt `[start] query [delim] document [extract]`."""
    clf = classifier(Reranker(name="r", num_negatives=1), "qwen3", tokenizer_dir)
    clf.temperature = 2.0
    got = fields(export_served_gguf(clf, tmp_path / "r.gguf", "f32"))
    assert got["qwen3.pooling_type"] == gguf.PoolingType.RANK
    assert got["tokenizer.chat_template.rerank"] == "<|start|>{query}<|delim|>{document}<|extract|>"
    assert len(got["qwen3.classifier.output_labels"]) == 2
    head = clf.head.weight.detach().numpy()
    np.testing.assert_array_equal(got["tensors"]["cls.output.weight"], np.concatenate([head / 2, 0 * head]))
    assert got["tokenizer.ggml.bos_token_id"] == clf.specials.start


def test_a_qwen3_pair_task_of_one_score_or_two_classes_is_served_as_a_reranker(tmp_path, tokenizer_dir):
    """A TextPair card scored pointwise: one score as the rows (w, 0), two classes as the second's row
    then the first's (llama.cpp's score: the second class's probability), the rows named so."""
    from gpt_ft.adapters import TextPair

    regression = classifier(TextPair(name="p", regression=True, label="score"), "qwen3", tokenizer_dir)
    two = classifier(TextPair(name="p", labels=["unrelated", "relevant"]), "qwen3", tokenizer_dir)
    for clf, labels in ((regression, ["score", "zero"]), (two, ["relevant", "unrelated"])):
        got = fields(export_served_gguf(clf, tmp_path / f"{len(labels[0])}.gguf", "f32"))
        assert got["qwen3.pooling_type"] == gguf.PoolingType.RANK
        assert got["qwen3.classifier.output_labels"] == labels
        assert got["tokenizer.chat_template.rerank"] == "<|start|>{query}<|delim|>{document}<|extract|>"
        head = clf.head.weight.detach().numpy()
        rows = np.concatenate([head, 0 * head]) if len(head) == 1 else head[::-1]
        np.testing.assert_array_equal(got["tensors"]["cls.output.weight"], rows)
    assert served_by(two) == (
        "llama-server --reranking serves it, its score the probability of 'relevant' (its texts as trained: "
        "cut to 48 tokens, framed)"
    )
    assert served_by(regression).startswith("llama-server --reranking serves it, its score the sigmoid of")


def test_what_llama_cpp_cannot_serve_is_refused_with_nothing_on_disk(tmp_path, tokenizer_dir):
    from tokenizers import pre_tokenizers

    from gpt_ft.adapters import Similarity, SingleText, TextPair

    cases = [
        (Embedding(name="e", dimensions=16), "llama", "with no projection after it; task 'e' projects to 16"),
        (Reranker(name="r", num_negatives=1), "llama", "only (without a bias), and this is a llama model"),
        (Embedding(name="e"), "gpt1", "gpt_ft writes no GGUF file of a 'openai-gpt' model"),
        (SingleText(name="c", labels=["no", "yes"]), "qwen3", "task 'c' (classification) exports as a"),
        (TextPair(name="t", labels=["a", "b", "c"]), "qwen3", "task 't' (classification) exports as a"),
        (Similarity(name="s", regression=True, label="x"), "qwen3", "task 's' (regression) exports as a"),
    ]
    split_otherwise = classifier(Embedding(name="e"), "llama", tokenizer_dir)
    split_otherwise.tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    for task, family, words in cases:
        with pytest.raises(ValueError, match=re.escape(words)):
            export_served_gguf(classifier(task, family, tokenizer_dir), tmp_path / "new" / "x.gguf", "f16")
    projects = classifier(Embedding(name="e"), "llama", tokenizer_dir)  # a head of a user's own kind
    projects.head = Embedding(name="e", dimensions=8).head(64, dropout=0.0, init_std=0.3, bias=False)
    with pytest.raises(ValueError, match=re.escape("task 'e' projects to 8 dimensions")):
        export_served_gguf(projects, tmp_path / "new" / "x.gguf", "f16")
    with pytest.raises(ValueError) as refused:  # (the message names no scratch folder)
        export_served_gguf(split_otherwise, tmp_path / "new" / "x.gguf", "f16")
    assert str(refused.value).startswith("llama.cpp has no pre-tokenizer this toolkit can name")
    assert list(tmp_path.iterdir()) == []  # (nor the folder --out would have made)


def test_export_writes_a_fine_tuned_embedding_model_as_gguf_and_says_what_texts_need(
    tmp_path, tokenizer_dir, capsys, monkeypatch
):
    """`gpt-ft export --format gguf` of a Llama-family embedding checkpoint: llama-server serves it,
    and llama.cpp adds no prompt: the message names the card's. ONNX, which has no embedding model,
    is refused from the card, before the weights load."""
    root = write_pairs(tmp_path)
    args = [
        f"--data.task={root / 'card.yaml'}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={root}",
    ]
    main(["fit", *args, "--data.batch_size=4", "--data.max_length=32", "--model.preset=llama-micro",
          "--trainer.max_steps=1", f"--trainer.default_root_dir={root}", "--trainer.logger=false",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])  # fmt: skip
    ckpt, out = next(root.rglob("last.ckpt")), tmp_path / "e.gguf"
    capsys.readouterr()
    main(["export", f"--ckpt_path={ckpt}", f"--out={out}", "--format=gguf", "--gguf_type=q8_0"])
    said = capsys.readouterr()
    assert "Writing model shards" not in said.err  # (transformers' bar over its one file)
    assert said.out.strip() == (
        f"wrote {out}: llama-server --embeddings serves it (its texts as trained: before each query "
        "'query: ', before each document 'passage: ', cut to 32 tokens, framed)"
    )
    assert fields(out)["llama.pooling_type"] == gguf.PoolingType.LAST
    assert fields(out)["general.name"] == "e"  # (the file's, as llama.cpp and Ollama show it)
    assert error(capsys, "export", f"--ckpt_path={ckpt}", f"--out={out}", "--format=gguf").startswith(
        f"--out {out} already exists"
    )
    monkeypatch.setattr(Classifier, "from_checkpoint", None)  # (loading the weights would fail)
    assert error(capsys, "export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'o'}", "--format=onnx") == (
        "--format onnx: an embedding model exports as a sentence-transformers folder."
    )


def test_a_file_written_meanwhile_under_the_outs_name_is_kept(tmp_path, tokenizer_dir, monkeypatch):
    """Two exports to one --out: the second to finish finds the first's file and keeps it."""
    from gpt_ft.weights import gguf_write

    out, read = tmp_path / "e.gguf", gguf_write._state

    def beaten(folder):  # (another export takes the name while this one reads the weights)
        out.write_text("another process's file")
        return read(folder)

    monkeypatch.setattr(gguf_write, "_state", beaten)
    clf = classifier(Embedding(name="e"), "llama", tokenizer_dir)
    with pytest.raises(
        ValueError, match="was written by another process while this one ran: give another name"
    ):
        export_served_gguf(clf, out, "f16")
    assert out.read_text() == "another process's file" and [p.name for p in tmp_path.iterdir()] == ["e.gguf"]


def llama(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp, llama_cpp.Llama(
        model_path=str(path), embedding=True, n_ctx=64, verbose=False, type_k=0, type_v=0
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_embeds_each_text_as_the_encoder_does(tmp_path, tokenizer_dir, family):
    """llama.cpp's vectors (f32 weights and cache, normalised as llama-server does) for each pooling:
    the encoder's, from the same tokens (a text spelling a special token is text)."""
    pytest.importorskip("llama_cpp")
    for pooling in POOLINGS:
        clf = classifier(Embedding(name="e", pooling=pooling), family, tokenizer_dir)
        path = export_served_gguf(clf, tmp_path / f"{pooling}.gguf", "f32")
        _, llm = llama(path)
        encoder = Encoder(clf)
        for text, ids in zip(TEXTS, encoder.tokens(TEXTS, None)):
            assert llm.tokenize(text.encode()) == clf.task.frame(clf.specials, ids)[0], (pooling, text)
        got = np.array([llm.embed(text, normalize=True) for text in TEXTS])
        atol = 1e-3 if family == "gpt2" else 1e-4  # llama.cpp's GELU reads a table of fp16 values
        np.testing.assert_allclose(got, encoder.encode(TEXTS), rtol=0, atol=atol, err_msg=pooling)


@pytest.mark.parametrize("kind", ["reranker", "regression", "two-classes"])
def test_llama_cpp_reranks_each_pair_by_the_sigmoid_of_gpt_fts_score(tmp_path, tokenizer_dir, kind):
    """llama-server's rerank prompt, tokenized as it tokenizes it (the special tokens in it read as
    such), is the pair as training framed it; llama.cpp's score is sigmoid(gpt_ft's score), or the
    second class's probability."""
    from gpt_ft.adapters import TextPair

    card = {"regression": True} if kind == "regression" else {"labels": ["no", "yes"]}
    task = Reranker(name="r", num_negatives=1) if kind == "reranker" else TextPair(name="p", **card)
    clf = classifier(task, "qwen3", tokenizer_dir)
    llama_cpp, llm = llama(export_served_gguf(clf, tmp_path / "r.gguf", "f32"))
    fields = ("query", "positive") if kind == "reranker" else ("premise", "hypothesis")
    rows = [{fields[0]: q, fields[1]: d, "negatives": []} for q, d in PAIRS]
    template, scores = llm.metadata["tokenizer.chat_template.rerank"], []
    for (query, document), encoded in zip(PAIRS, clf.encode(rows)):
        ids = llm.tokenize(
            template.format(query=query, document=document).encode(), add_bos=False, special=True
        )
        assert ids == encoded["input_ids"][0]
        llm._batch.reset()
        llm._batch.add_sequence(ids, 0, False)
        llm._ctx.decode(llm._batch)
        scores.append(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[0])
        llm._ctx.kv_cache_clear()
    raw = clf.raw_outputs(rows)
    expected = raw.softmax(-1)[:, 1] if kind == "two-classes" else torch.sigmoid(raw[:, 0])
    np.testing.assert_allclose(scores, expected.numpy(), rtol=0, atol=1e-5)
