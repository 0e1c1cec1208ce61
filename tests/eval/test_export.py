"""`gpt-ft export`: a fine-tuned classifier as a transformers folder. In a process that never
imports gpt_ft, transformers' pipeline and AutoModelForSequenceClassification give the labels and
probabilities of `Classifier`, for each exportable kind on GPT-1-, GPT-2- and Llama-shaped models,
from the token ids gpt_ft trains on, truncated texts and pairs included."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gpt_ft.adapters import MultiLabel, MultipleChoice, Similarity, SingleText, TextPair
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval.classifier import Classifier
from gpt_ft.eval.export import export_classifier
from gpt_ft.model import GPT, GPTConfig
from tests.cli.test_bad_outputs import error, files
from tests.helpers import GEMMA3_MICRO, QWEN3_MICRO

# Paired with each other in reverse order; the first and last are longer than the models' 48
# positions, alone and together: the tokenizer's truncation must keep what gpt_ft's keeps.
TEXTS = [
    "the quick brown fox jumps over the lazy dog . " * 5,
    "it is not good",
    "two dogs run in a park . " * 3,
    "a",
    "she decides to bake a batch of brownies for the party . " * 4,
]
KINDS = {
    "single": (SingleText(name="s", labels=["negative", "positive"]), lambda a, b: {"sentence": a}),
    "pair": (
        TextPair(name="p", premise="a", hypothesis="b", labels=["yes", "maybe", "no"]),
        lambda a, b: {"a": a, "b": b},
    ),
    "regression": (SingleText(name="r", regression=True), lambda a, b: {"sentence": a}),
    "multi-label": (MultiLabel(name="m", labels=["x", "y", "z"]), lambda a, b: {"text": a}),
    "similarity": (
        Similarity(name="q", labels=["different", "same"]),
        lambda a, b: {"sentence1": a, "sentence2": b},
    ),
}
PAIRED = ("pair", "similarity")

# Run with a python that has transformers but never imports gpt_ft: what a serving stack sees.
READER = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

results = {}
for name, folder, pairs in json.loads(sys.argv[1]):
    # trust_remote_code: a similarity model's class is in its folder (standard ones load the same)
    classify = pipeline("text-classification", model=folder, trust_remote_code=True)
    inputs = [{"text": a, "text_pair": b} if b is not None else a for a, b in pairs]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    logits, ids = [], []
    for a, b in pairs:
        encoded = tokenizer(a, b, truncation=True, return_tensors="pt")
        ids.append(encoded["input_ids"][0].tolist())
        with torch.no_grad():
            logits.append(model(**encoded).logits[0].tolist())
    results[name] = {"pipeline": classify(inputs, top_k=None, truncation=True), "logits": logits,
                     "ids": ids, "class": type(model).__name__, "problem_type": model.config.problem_type}
print(json.dumps({"results": results, "imported_gpt_ft": "gpt_ft" in sys.modules}))
"""


SHAPES = {
    "gpt1": ("gpt-micro", dict(n_embd=32, pre_ln=False), "OpenAIGPT"),  # post-LN
    "gpt2": ("gpt-micro", dict(n_embd=32, pre_ln=True), "GPT2"),  # pre-LN, a final LN
    "llama": ("llama-micro", {}, "Llama"),  # RMSNorm, rotary, SwiGLU, GQA; no biases
    "qwen3": ("llama-micro", QWEN3_MICRO, "Qwen3"),  # its own head size, q/k norms
    "gemma3": ("llama-micro", GEMMA3_MICRO, "Gemma3Text"),  # Gemma's norms, local and global layers
    "phi3": ("llama-micro", dict(hf_model_type="phi3", sliding_window=6), "Phi3"),  # fused q/k/v
}


def read_without_gpt_ft(reader: str, jobs: list) -> dict:
    """`reader`'s JSON over the exported folders `jobs`, from a process that never imports gpt_ft."""
    run = subprocess.run(
        [sys.executable, "-c", reader, json.dumps(jobs)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["imported_gpt_ft"] is False
    return got


def classifier(kind: str, shape: str, tokenizer_dir: str) -> Classifier:
    """A micro model of `shape` with a random head (whose bias, where it has one, is not zero)."""
    torch.manual_seed(len(kind) + len(shape))
    tokenizer = load_tokenizer(tokenizer_dir)
    preset, overrides, _ = SHAPES[shape]
    config = GPTConfig.from_name(preset, n_positions=48, vocab_size=len(tokenizer), **overrides)
    task = KINDS[kind][0]
    head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
    if head.bias is not None:
        torch.nn.init.normal_(head.bias, std=1.0)
    return Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")


def test_exported_classifiers_give_the_classifiers_labels_and_probabilities(tmp_path, tokenizer_dir):
    jobs, expected = [], {}
    for kind, (task, example) in KINDS.items():
        # every kind on GPT-1's and Llama's layouts, GPT-2's and the newer families' blocks on one kind
        for shape in SHAPES if kind == "single" else ("gpt1", "llama"):
            name = f"{kind}-{shape}"
            clf = classifier(kind, shape, tokenizer_dir)
            if shape == "gpt1" and kind != "regression":
                clf.temperature = 2.5  # as `gpt-ft calibrate` leaves it: the exported scores are divided too
            pairs = [(a, TEXTS[-1 - i] if kind in PAIRED else None) for i, a in enumerate(TEXTS)]
            examples = [example(a, b) for a, b in pairs]
            ids = [encoded["input_ids"][0] for encoded in clf.encode(examples)]  # the first order
            expected[name] = (clf.predict(examples), ids)
            jobs.append((name, str(export_classifier(clf, tmp_path / name)), pairs))
    got = read_without_gpt_ft(READER, jobs)
    for name, (outcomes, ids) in expected.items():
        result = got["results"][name]
        kind, shape = name.rsplit("-", 1)
        family = SHAPES[shape][2] + ("Similarity" if kind == "similarity" else "")
        assert result["class"] == f"{family}ForSequenceClassification"
        assert result["ids"] == ids  # the served model reads the tokens the trained one read
        assert max(map(len, ids)) == 48  # truncated, alone and in pairs
        for outcome, ranked, logits in zip(outcomes, result["pipeline"], result["logits"]):
            scores = {r["label"]: r["score"] for r in ranked}
            if kind == "regression":  # the score itself, as the label's score
                assert result["problem_type"] == "regression"
                assert scores["label"] == pytest.approx(outcome["scores"], abs=1e-5)
                assert logits[0] == pytest.approx(outcome["scores"], abs=1e-5)
                continue
            assert scores.keys() == outcome["scores"].keys()
            for label, probability in outcome["scores"].items():
                assert scores[label] == pytest.approx(probability, abs=1e-5)
            if kind != "multi-label":  # the pipeline's first label is the Classifier's
                assert ranked[0]["label"] == outcome["label"]
            else:
                assert [n for n in outcome["scores"] if scores[n] > 0.5] == outcome["label"]


def test_a_llama_multiple_choice_task_is_not_exported(tmp_path, tokenizer_dir):
    clf = classifier("single", "llama", tokenizer_dir)
    clf.task = MultipleChoice(name="mc", context=["story"], choices=["end1", "end2"])
    with pytest.raises(
        ValueError, match="'mc' \\(MultipleChoice, multiple-choice\\) has no transformers class"
    ):
        export_classifier(clf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_command(tmp_path, finetuned, capsys):
    from gpt_ft.cli import main

    out = tmp_path / "exported"
    main(["export", f"--ckpt_path={finetuned.ckpt}", f"--out={out}"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["problem_type"] == "single_label_classification"
    before = files(tmp_path)
    assert error(capsys, "export", f"--ckpt_path={finetuned.ckpt}", f"--out={out}") == (
        f"--out {out} is not empty: give a new or empty folder (nothing was written)."
    )
    assert "--format: " in error(
        capsys, "export", f"--ckpt_path={finetuned.ckpt}", "--out=x", "--format=tflite"
    )
    assert files(tmp_path) == before


CHOICE_READER = """
import json, sys
import torch
from transformers import AutoTokenizer, GPT2DoubleHeadsModel, OpenAIGPTDoubleHeadsModel

results = {}
for name, folder, rows in json.loads(sys.argv[1]):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cls = GPT2DoubleHeadsModel if "gpt2" in name else OpenAIGPTDoubleHeadsModel
    model = cls.from_pretrained(folder).eval()
    scores = []
    for context, choices in rows:
        encoded = tokenizer([context] * len(choices), choices, padding=True, return_tensors="pt")
        extract = encoded["attention_mask"].sum(dim=1) - 1  # the last token of each choice
        with torch.no_grad():
            # Padding on the right comes after each extract token: causal attention never reads it.
            out = model(input_ids=encoded["input_ids"][None], mc_token_ids=extract[None])
        scores.append(out.mc_logits[0].softmax(-1).tolist())
    results[name] = {"scores": scores, "class": type(model).__name__}
print(json.dumps({"results": results, "imported_gpt_ft": "gpt_ft" in sys.modules}))
"""


def test_gpt_multiple_choice_exports_to_double_heads_models(tmp_path, tokenizer_dir):
    task = MultipleChoice(name="mc", context=["story"], choices=["end1", "end2", "end3"])
    short = [t for t in TEXTS if len(t) < 30]  # each choice fits: no truncation to match
    rows = [(a, [short[1], short[-1], b]) for a, b in zip(short, reversed(short))]
    jobs, expected = [], {}
    for shape in ("gpt1", "gpt2"):
        clf = classifier("single", shape, tokenizer_dir)
        clf.task = task
        clf.head = task.head(clf.gpt.config.n_embd, dropout=0.0, init_std=0.3)
        torch.nn.init.normal_(clf.head.bias, std=1.0)
        examples = [{"story": a, "end1": c[0], "end2": c[1], "end3": c[2]} for a, c in rows]
        expected[shape] = clf.predict(examples)
        jobs.append((shape, str(export_classifier(clf, tmp_path / shape)), rows))
    got = read_without_gpt_ft(CHOICE_READER, jobs)
    for shape, outcomes in expected.items():
        assert got["results"][shape]["class"] == f"{SHAPES[shape][2]}DoubleHeadsModel"
        for outcome, probabilities in zip(outcomes, got["results"][shape]["scores"]):
            assert probabilities == pytest.approx(list(outcome["scores"].values()), abs=1e-4)


ONNX_READER = """
import json, sys
import numpy as np
import onnxruntime
from transformers import AutoTokenizer

results = {}
for name, folder, pairs in json.loads(sys.argv[1]):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    session = onnxruntime.InferenceSession(folder + "/model.onnx")
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    second = b if b[0] is not None else None
    encoded = tokenizer(a, second, padding=True, truncation=True, return_tensors="np")
    feed = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    results[name] = session.run(None, feed)[0].tolist()  # one padded batch: dynamic batch and length
print(json.dumps({"results": results, "imported_gpt_ft": "gpt_ft" in sys.modules}))
"""


def test_onnx_export_gives_the_classifiers_outputs_in_onnxruntime(tmp_path, tokenizer_dir):
    pytest.importorskip("onnxscript")
    jobs, expected = [], {}
    # rotary positions, GQA, a text pair; GPT-1 and a similarity pair: both orders inside the graph
    for kind, shape in (("pair", "llama"), ("similarity", "gpt1")):
        clf = classifier(kind, shape, tokenizer_dir)
        pairs = [(a, TEXTS[-1 - i]) for i, a in enumerate(TEXTS[:3])]
        example = KINDS[kind][1]
        expected[kind] = clf.predict([example(a, b) for a, b in pairs])
        jobs.append((kind, str(export_classifier(clf, tmp_path / kind, format="onnx")), pairs))
        assert (tmp_path / kind / "model.onnx").is_file() and not (
            tmp_path / kind / "model.safetensors"
        ).exists()
    got = read_without_gpt_ft(ONNX_READER, jobs)
    for kind, outcomes in expected.items():
        for outcome, logits in zip(outcomes, got["results"][kind]):
            logits = torch.tensor(logits)
            assert logits.softmax(-1).tolist() == pytest.approx(list(outcome["scores"].values()), abs=1e-4)


def test_a_trained_similarity_model_exports_and_serves_its_scores(tmp_path, tokenizer_dir):
    """`gpt-ft export` of an STS-B-shaped run (both orders, a score clipped to [0, 5]): the folder's
    own model class gives `Classifier`'s scores, in a process that never imports gpt_ft."""
    from gpt_ft.cli import main
    from tests.helpers import common_args, make_task

    card = make_task("similarity", tmp_path)
    main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=1"])
    ckpt = next(tmp_path.glob("runs/lightning_logs/version_0/checkpoints/last.ckpt"))
    main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'sts'}"])
    pairs = [(TEXTS[0], TEXTS[-1]), ("it is not good", "a"), ("a", "it is not good")]
    outcomes = Classifier.from_checkpoint(ckpt, device="cpu").predict(
        [{"sentence1": a, "sentence2": b} for a, b in pairs]
    )
    result = read_without_gpt_ft(READER, [("sts", str(tmp_path / "sts"), pairs)])["results"]["sts"]
    assert result["class"] == "OpenAIGPTSimilarityForSequenceClassification"
    assert result["problem_type"] == "regression"
    assert [r[0]["score"] for r in result["pipeline"]] == pytest.approx(
        [o["scores"] for o in outcomes], abs=1e-5
    )
