"""An embedding model exported as a sentence-transformers folder, and a reranker as a one-output
sequence classifier: in a process that never imports gpt_ft, `SentenceTransformer(folder).encode`
gives `Encoder.encode`'s vectors (≤ 1e-5, the card's query prompt the default; a text longer
than the context cut alike) for GPT-1's, GPT-2's and the Llama family's layouts, with and without
a projection, for each pooling, and `CrossEncoder(folder).predict` the reranker's scores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.background import Command

TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "she bakes brownies now",
    "",
    "he is happy in the park today",
    "  it cost 1999 in 2024 ",  # (stripped by qwen2's card: a tokenizer class of qwen2's own would not)
    "the cat sat on the mat and the dog sat on the log " * 6,
]  # the last is cut to the context
LAYOUTS = {  # preset, overrides, projection, pooling
    "gpt1": ("gpt-micro", dict(n_embd=32, pre_ln=False), None, "extract"),
    "gpt2": ("gpt-micro", dict(n_embd=32, pre_ln=True), 16, "extract"),
    "llama": ("llama-micro", {}, 16, "extract"),
    "gpt1-last": ("gpt-micro", dict(n_embd=32, pre_ln=False), None, "last"),
    "llama-last": ("llama-micro", {}, None, "last"),
    "gpt2-mean": ("gpt-micro", dict(n_embd=32, pre_ln=True), 16, "mean"),
    "llama-mean": ("llama-micro", {}, None, "mean"),
    "qwen2": ("llama-micro", dict(qkv_bias=True), 16, "extract"),  # its tokenizer loaded as written
}

READER = """
import json, sys
from sentence_transformers import CrossEncoder, SentenceTransformer

jobs = json.load(open(sys.argv[1]))
results = {}
for name, folder, texts in jobs:
    if name.startswith("rerank"):
        results[name] = CrossEncoder(folder, device="cpu").predict(texts).tolist()
        continue
    model = SentenceTransformer(folder, device="cpu")
    document = model.encode(texts, prompt_name="document")
    results[name] = {"query": model.encode(texts).tolist(), "document": document.tolist()}
print(json.dumps({"results": results, "imported_gpt_ft": "gpt_ft" in sys.modules}))
"""


CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"


def write_encoders(out: str, tokenizer_dir: str) -> None:
    """Each layout's random encoder exported under `out`, with what `Encoder` says of the texts."""
    import torch

    from gpt_ft import GPT, GPTConfig
    from gpt_ft.adapters import Embedding, Reranker
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.classifier import Classifier
    from gpt_ft.eval.encoder import Encoder
    from gpt_ft.eval.export import export_classifier, export_encoder

    out, tokenizer = Path(out), load_tokenizer(tokenizer_dir)
    tokenizer.chat_template = CHAT_TEMPLATE  # as a released chat model's tokenizer has one
    jobs, expected = [], {}
    for name, (preset, overrides, dimensions, pooling) in LAYOUTS.items():
        torch.manual_seed(len(name))
        config = GPTConfig.from_name(preset, n_positions=48, vocab_size=len(tokenizer), **overrides)
        prompts = dict(query_prompt="query: ", document_prompt="passage: ")
        task = Embedding(
            name="e", dimensions=dimensions, pooling=pooling, strip_texts=name == "qwen2", **prompts
        )
        head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
        clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")
        encoder = Encoder(clf)
        expected[name] = {p: encoder.encode(TEXTS, prompt=p).tolist() for p in ("query", "document")}
        jobs.append((name, str(export_encoder(clf, out / name)), TEXTS))
    pairs = [
        (TEXTS[i], TEXTS[-1 - i]) for i in range(len(TEXTS)) if TEXTS[i] and TEXTS[-1 - i]
    ]  # (none empty)
    for name in ("gpt1", "llama"):
        preset, overrides, _, _ = LAYOUTS[name]
        torch.manual_seed(7)
        config = GPTConfig.from_name(preset, n_positions=48, vocab_size=len(tokenizer), **overrides)
        task = Reranker(name="r", num_negatives=1)
        head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
        clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")
        rows = [{"query": q, "positive": d, "negatives": []} for q, d in pairs]
        expected[f"rerank-{name}"] = clf.raw_outputs(rows)[:, 0].tolist()
        jobs.append((f"rerank-{name}", str(export_classifier(clf, out / f"rerank-{name}")), pairs))
    (out / "expected.json").write_text(json.dumps(expected))
    (out / "jobs.json").write_text(json.dumps(jobs))


def start_encoders(root, tokenizer_dir):
    """The folders written by a process that imports gpt_ft, then read by one that never does."""
    write = "from tests.eval.test_export_encoder import write_encoders; "
    write += f"write_encoders({str(root)!r}, {tokenizer_dir!r})"
    return [
        Command([sys.executable, "-c", write], preloaded=True),
        Command([sys.executable, "-c", READER, str(root / "jobs.json")]),
    ]


@pytest.mark.background(start=start_encoders)
def test_sentence_transformers_loads_the_exported_encoder_and_reranker_without_gpt_ft(background):
    for run in background.runs:
        assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(background.runs[1].stdout.strip().splitlines()[-1])
    assert got["imported_gpt_ft"] is False
    expected = json.loads((background.root / "expected.json").read_text())
    assert set(got["results"]) == {*LAYOUTS, "rerank-gpt1", "rerank-llama"}
    for name in ("rerank-gpt1", "rerank-llama"):  # the reranker's scores, one pair at a time
        np.testing.assert_allclose(got["results"][name], expected.pop(name), atol=1e-5, rtol=0)
    for name, vectors in expected.items():
        for prompt in ("query", "document"):
            np.testing.assert_allclose(got["results"][name][prompt], vectors[prompt], atol=1e-5, rtol=0)
    modules = json.loads((background.root / "llama" / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Dense", "3_Normalize"]
    for name, mode in (("llama", "lasttoken"), ("llama-last", "lasttoken"), ("llama-mean", "mean")):
        pooling = json.loads((background.root / name / "1_Pooling" / "config.json").read_text())
        assert pooling["pooling_mode"] == mode, name  # extract, last: the last token the template gives
    # the chat template the tokenizer had is not exported: the post-processor frames each text
    assert not list(background.root.rglob("chat_template.jinja"))
    config = json.loads((background.root / "llama" / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
