"""`gpt-ft export`: a fine-tuned classifier as a transformers folder. In a process that never
imports gpt_ft, transformers' pipeline and AutoModelForSequenceClassification give the labels and
probabilities of `Classifier`, for each exportable kind on GPT-1-, GPT-2- and Llama-shaped models,
from the token ids gpt_ft trains on, truncated texts and pairs included. The folders are written,
and read, by processes of their own in the background (tests/background.py)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from gpt_ft.adapters import (
    MultiLabel,
    MultipleChoice,
    Preference,
    Ranking,
    Similarity,
    SingleText,
    Steps,
    TextPair,
)
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.eval.classifier import Classifier
from gpt_ft.eval.export import export_classifier, what_loads
from gpt_ft.model import GPT, GPTConfig
from tests.background import Command
from tests.cli.test_bad_outputs import error, files
from tests.helpers import GEMMA3_MICRO, NEOX_MICRO, OLMO2_MICRO, OLMO3_MICRO, QWEN3_MICRO, SMOLLM3_MICRO

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
# A reward model: one reply to a prompt, [start] prompt [delim] reply [extract], its reward
KINDS["reward"] = (Preference(name="rm", prompt="prompt"), lambda a, b: {"prompt": a, "reply": b})
# A ranking's reward model: one reply scored as a pair's is
KINDS["ranking"] = (Ranking(name="rk", max_replies=3), lambda a, b: {"prompt": a, "replies": [b]})
# STS-B's shape: a similarity score, served clipped to the card's range as gpt_ft predicts it (the
# micro models give scores on both sides of 5)
KINDS["sts"] = (Similarity(name="sts", regression=True, score_range=(0, 5)), KINDS["similarity"][1])
PAIRED = ("pair", "similarity", "sts", "reward", "ranking")
SCORES = ("regression", "sts", "reward", "ranking")

# Run with a python that has transformers but never imports gpt_ft: what a serving stack sees. One
# process reads every folder the tests export (importing transformers once), listed in the JSON file
# it is given.
READER = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
from transformers import GPT2DoubleHeadsModel, OpenAIGPTDoubleHeadsModel

def sequence(folder, pairs):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # trust_remote_code: a similarity model's class is in its folder (standard ones load the same)
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer)
    inputs = [{"text": a, "text_pair": b} if b is not None else a for a, b in pairs]
    logits, ids = [], []
    for a, b in pairs:
        encoded = tokenizer(a, b, truncation=True, return_tensors="pt")
        ids.append(encoded["input_ids"][0].tolist())
        with torch.no_grad():
            logits.append(model(**encoded).logits[0].tolist())
    return {"pipeline": classify(inputs, top_k=None, truncation=True), "logits": logits,
            "ids": ids, "class": type(model).__name__, "problem_type": model.config.problem_type}

def choice(folder, rows):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cls = GPT2DoubleHeadsModel if folder.endswith("gpt2") else OpenAIGPTDoubleHeadsModel
    model = cls.from_pretrained(folder).eval()
    scores = []
    for context, choices in rows:
        encoded = tokenizer([context] * len(choices), choices, padding=True, return_tensors="pt")
        extract = encoded["attention_mask"].sum(dim=1) - 1  # the last token of each choice
        with torch.no_grad():
            # Padding on the right comes after each extract token: causal attention never reads it.
            out = model(input_ids=encoded["input_ids"][None], mc_token_ids=extract[None])
        scores.append(out.mc_logits[0].softmax(-1).tolist())
    return {"scores": scores, "class": type(model).__name__, "labels": model.config.choice_labels}

def onnx(folder, pairs):
    import onnxruntime

    tokenizer = AutoTokenizer.from_pretrained(folder)
    session = onnxruntime.InferenceSession(folder + "/model.onnx")
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    encoded = tokenizer(a, b, padding=True, truncation=True, return_tensors="np")
    feed = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    return session.run(None, feed)[0].tolist()  # one padded batch: dynamic batch and length

def steps(folder, rows):
    from transformers import AutoModelForTokenClassification

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    config, out = model.config, []
    sep = config.step_separator_token_id
    for problem, steps in rows:
        # [start] problem [delim] step_1 [extract] ... step_n [extract]: fine-tuning.md's recipe
        ids = tokenizer([problem], [steps[0]])["input_ids"][0]
        for step in steps[1:]:
            ids += tokenizer(step, add_special_tokens=False)["input_ids"] + [sep]
        ids = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        out.append(logits[ids[0] == sep].softmax(-1)[:, 1].tolist())
    return {"scores": out, "class": type(model).__name__, "threshold": config.threshold,
            "labels": config.id2label}

readers = {"sequence": sequence, "choice": choice, "onnx": onnx, "steps": steps}
with open(sys.argv[1]) as f:
    jobs = json.load(f)
results = {name: readers[kind](folder, inputs) for kind, name, folder, inputs in jobs}
print(json.dumps({"results": results, "imported_gpt_ft": "gpt_ft" in sys.modules}))
"""


SHAPES = {
    "gpt1": ("gpt-micro", dict(n_embd=32, pre_ln=False), "OpenAIGPT"),  # post-LN
    "gpt2": ("gpt-micro", dict(n_embd=32, pre_ln=True), "GPT2"),  # pre-LN, a final LN
    "llama": ("llama-micro", {}, "Llama"),  # RMSNorm, rotary, SwiGLU, GQA; no biases
    "qwen3": ("llama-micro", QWEN3_MICRO, "Qwen3"),  # its own head size, q/k norms
    "gemma3": ("llama-micro", GEMMA3_MICRO, "Gemma3Text"),  # Gemma's norms, local and global layers
    "phi3": ("llama-micro", dict(hf_model_type="phi3", sliding_window=6), "Phi3"),  # fused q/k/v
    "qwen2": ("llama-micro", dict(qkv_bias=True), "Qwen2"),  # q/k/v biases; its tokenizer kept as written
    "smollm3": ("llama-micro", SMOLLM3_MICRO, "SmolLM3"),  # a layer without rotary positions
    "neox": ("llama-micro", NEOX_MICRO, "GPTNeoX"),  # LayerNorm, biases, partial rotary, parallel branches
    "olmo2": ("llama-micro", OLMO2_MICRO, "Olmo2"),  # norms after attention and MLP only
    "olmo3": ("llama-micro", OLMO3_MICRO, "Olmo3"),  # and local and global layers too
}


def classifier(kind: str, shape: str, tokenizer_dir: str, **layers) -> Classifier:
    """A micro model of `shape` with a random head (whose bias, where it has one, is not zero);
    `layers`: n_layer, where it is not the preset's."""
    torch.manual_seed(len(kind) + len(shape))
    tokenizer = load_tokenizer(tokenizer_dir)
    preset, overrides, _ = SHAPES[shape]
    config = GPTConfig.from_name(preset, n_positions=48, vocab_size=len(tokenizer), **overrides, **layers)
    task = KINDS[kind][0]
    head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
    if head.bias is not None:
        torch.nn.init.normal_(head.bias, std=1.0)
    return Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")


def write_exports(out: str, tokenizer_dir: str) -> None:
    """Every exported kind, written under `out` in a process of its own (`start_exports`): the
    folders, what `Classifier` says of their inputs (expected.json) and the reader's jobs (jobs.json)."""
    out = Path(out)
    jobs, expected = [], {}
    for kind, (task, example) in KINDS.items():
        # every kind on GPT-1's and Llama's layouts, GPT-2's and the newer families' blocks on one kind
        for shape in SHAPES if kind == "single" else ("gpt1", "llama"):
            name = f"{kind}-{shape}"
            clf = classifier(kind, shape, tokenizer_dir)
            if shape == "gpt1" and kind not in SCORES:
                clf.temperature = 2.5  # as `gpt-ft calibrate` leaves it: the exported scores are divided too
            pairs = [(a, TEXTS[-1 - i] if kind in PAIRED else None) for i, a in enumerate(TEXTS)]
            examples = [example(a, b) for a, b in pairs]
            ids = [encoded["input_ids"][0] for encoded in clf.encode(examples)]  # the first order
            expected[name] = {"outcomes": clf.predict(examples), "ids": ids}
            jobs.append(("sequence", name, str(export_classifier(clf, out / name)), pairs))
    # Multiple choice on GPT-1 and GPT-2: their double-heads models.
    task = MultipleChoice(name="mc", context=["story"], choices=["end1", "end2", "end3"])
    short = [t for t in TEXTS if len(t) < 30]  # each choice fits: no truncation to match
    rows = [(a, [short[1], short[-1], b]) for a, b in zip(short, reversed(short))]
    for shape in ("gpt1", "gpt2"):
        clf = classifier("single", shape, tokenizer_dir)
        clf.task = task
        clf.head = task.head(clf.gpt.config.n_embd, dropout=0.0, init_std=0.3)
        torch.nn.init.normal_(clf.head.bias, std=1.0)
        examples = [{"story": a, "end1": c[0], "end2": c[1], "end3": c[2]} for a, c in rows]
        expected[f"choice-{shape}"] = {"outcomes": clf.predict(examples)}
        jobs.append(("choice", f"choice-{shape}", str(export_classifier(clf, out / f"choice-{shape}")), rows))
    # Process rewards: GPT-2's and Llama's token classifiers, read at each step's separator.
    task = Steps(name="prm", max_steps=4)
    rows = [
        (a, [b, "so it is 4 .", "done"][: 1 + i % 3]) for i, (a, b) in enumerate(zip(short, reversed(short)))
    ]
    for shape in ("gpt2", "llama"):
        clf = classifier("single", shape, tokenizer_dir)
        clf.task = task
        clf.head = task.head(clf.gpt.config.n_embd, dropout=0.0, init_std=0.3, bias=clf.gpt.config.bias)
        clf.head.threshold = 0.4
        expected[f"steps-{shape}"] = {"outcomes": clf.predict([{"problem": a, "steps": s} for a, s in rows])}
        jobs.append(("steps", f"steps-{shape}", str(export_classifier(clf, out / f"steps-{shape}")), rows))
    # ONNX: GPT-1's layout, and Llama's (rotary positions, GQA); similarity pairs, both orders
    # inside the graph, each order the plain pair classifier's.
    onnx = (("similarity", "gpt1"), ("similarity", "llama")) if find_spec("onnxscript") else ()
    for kind, shape in onnx:
        clf = classifier(kind, shape, tokenizer_dir, n_layer=1)  # one block: exporting time grows with it
        pairs = [(a, TEXTS[-1 - i]) for i, a in enumerate(TEXTS[:3])]
        name = f"onnx-{kind}-{shape}"
        expected[name] = {"outcomes": clf.predict([KINDS[kind][1](a, b) for a, b in pairs])}
        jobs.append(("onnx", name, str(export_classifier(clf, out / name, format="onnx")), pairs))
    (out / "expected.json").write_text(json.dumps(expected))
    (out / "jobs.json").write_text(json.dumps(jobs))


def start_exports(root, tokenizer_dir):
    """The folders written by a process that imports gpt_ft, then read by one that never does."""
    write = (
        f"from tests.eval.test_export import write_exports; write_exports({str(root)!r}, {tokenizer_dir!r})"
    )
    return [
        Command([sys.executable, "-c", write], preloaded=True),
        Command([sys.executable, "-c", READER, str(root / "jobs.json")]),
    ]


def served(background) -> tuple[dict, dict]:
    """What `Classifier` says of each job's inputs, and what its folder gives without gpt_ft."""
    for run in background.runs:
        assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(background.runs[1].stdout.strip().splitlines()[-1])
    assert got["imported_gpt_ft"] is False
    return json.loads((background.root / "expected.json").read_text()), got["results"]


@pytest.mark.background(start=start_exports)
def test_exported_classifiers_give_the_classifiers_labels_and_probabilities(background):
    expected, got = served(background)
    sequences = {n: r for n, r in got.items() if not n.startswith(("choice-", "onnx-", "steps-"))}
    assert len(sequences) == len(SHAPES) + 2 * (len(KINDS) - 1)
    for name, result in sequences.items():
        kind, shape = name.rsplit("-", 1)
        outcomes, ids = expected[name]["outcomes"], expected[name]["ids"]
        family = SHAPES[shape][2] + ("Similarity" if kind in ("similarity", "sts") else "")
        assert result["class"] == f"{family}ForSequenceClassification"
        assert max(map(len, ids)) == 48  # truncated, alone and in pairs
        differ = [i for i, (served, trained) in enumerate(zip(result["ids"], ids)) if served != trained]
        if kind in ("reward", "ranking"):  # the prompt keeps its end, as served (the tokenizer cuts on the
            # left); where the reply is cut too (both texts longer than half the room: the first, middle
            # and last rows), training keeps its start, the tokenizer its end
            assert differ == [0, 2, 4]
            for i in differ:  # the prompts, up to the delimiter (id 2), agree
                assert result["ids"][i][: ids[i].index(2)] == ids[i][: ids[i].index(2)]
        else:
            assert differ == []  # the served model reads the tokens the trained one read
        for i, (outcome, ranked, logits) in enumerate(zip(outcomes, result["pipeline"], result["logits"])):
            if i in differ:
                continue
            scores = {r["label"]: r["score"] for r in ranked}
            if kind in SCORES:  # the score itself, as the label's score
                assert result["problem_type"] == "regression"
                assert scores == {
                    "reward" if kind in ("reward", "ranking") else "label": pytest.approx(
                        outcome["scores"], abs=1e-5
                    )
                }
                assert logits[0] == pytest.approx(outcome["scores"], abs=1e-5)
                continue
            assert scores.keys() == outcome["scores"].keys()
            for label, probability in outcome["scores"].items():
                assert scores[label] == pytest.approx(probability, abs=1e-5)
            if kind != "multi-label":  # the pipeline's first label is the Classifier's
                assert ranked[0]["label"] == outcome["label"]
            else:
                assert [n for n in outcome["scores"] if scores[n] > 0.5] == outcome["label"]


def test_a_multi_label_export_carries_the_threshold_its_labels_are_decided_by(tmp_path, tokenizer_dir):
    """The card's threshold on the raw outputs' sigmoids, as the calibrated (divided by T) outputs
    of the exported folder read it: their labels are the Classifier's."""
    import math

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gpt_ft.eval.export import export_classifier

    clf = classifier("multi-label", "gpt1", tokenizer_dir)
    clf.task.output.threshold = clf.head.threshold = 0.3
    clf.temperature = 2.0
    texts = ["the cat sat on the mat .", "two dogs run in a park .", "he is happy now .", "a <|extract|> cat"]
    rows = [{"text": t} for t in texts]  # the last spells a special token: text, as in training
    folder = export_classifier(clf, tmp_path / "m")
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert model.config.threshold == pytest.approx(1 / (1 + math.exp(-math.log(0.3 / 0.7) / 2.0)))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer(texts[-1])["input_ids"].count(clf.specials.extract) == 1  # the framing's own only
    for row, outcome in zip(rows, clf.predict(rows)):
        with torch.no_grad():
            probabilities = model(**tokenizer(row["text"], return_tensors="pt")).logits[0].sigmoid()
        names = [model.config.id2label[i] for i, p in enumerate(probabilities) if p > model.config.threshold]
        assert names == outcome["label"]
    clf.temperature = 1.0  # uncalibrated: the card's threshold as written (it was 0.30000000000000004)
    config = AutoModelForSequenceClassification.from_pretrained(
        export_classifier(clf, tmp_path / "t1")
    ).config
    assert config.threshold == 0.3


def test_every_family_has_a_similarity_class():
    """`gpt-ft export` of a similarity task (MRPC, QQP, STS-B) ships the family's class, by model type."""
    from gpt_ft.eval.modeling_similarity import CLASSES
    from gpt_ft.weights import hf_llama, hf_neox

    assert set(CLASSES) == {"openai-gpt", "gpt2", *hf_llama.MODEL_TYPES, *hf_neox.MODEL_TYPES}


def test_the_similarity_model_builds_the_other_order_and_refuses_what_is_not_a_pair():
    """`[start] a [delim] b [extract]` padded on the right becomes `[start] b [delim] a [extract]`,
    padding kept; a row without one delimiter (a single text, an empty second text) or padded on the
    left is one sentence, not a silently wrong score."""
    from gpt_ft.eval.modeling_similarity import check_pairs, swap_pair

    S, D, E, P = 1, 2, 3, 0
    ids = torch.tensor([[S, 5, 6, D, 7, E, P], [S, 5, D, 7, 8, E, P], [S, D, 7, 8, 9, 10, E]])
    mask = (ids != P).long()
    check_pairs(ids, mask, D)
    assert swap_pair(ids, mask, D).tolist() == [
        [S, 7, D, 5, 6, E, P],
        [S, 7, 8, D, 5, E, P],
        [S, 7, 8, 9, 10, D, E],
    ]
    with pytest.raises(ValueError, match="Row 1 holds 0 delimiter tokens; a similarity model reads one pair"):
        check_pairs(torch.tensor([[S, 5, D, 6, E], [S, 5, 6, 7, E]]), torch.ones(2, 5), D)
    with pytest.raises(ValueError, match="padded on the right"):
        check_pairs(torch.tensor([[P, S, 5, D, 6, E]]), torch.tensor([[0, 1, 1, 1, 1, 1]]), D)


def test_a_classifier_of_several_sequences_summed_is_not_exported_as_multiple_choice(tmp_path, tokenizer_dir):
    """Its refusal said transformers has multiple-choice models of GPT-1 and GPT-2 only, of a GPT-1."""
    clf = classifier("single", "gpt1", tokenizer_dir)
    clf.task = copy.copy(clf.task)  # (the table's task is shared)
    clf.task.num_sequences = 2  # (an adapter of the user's: a claim and its two evidences, one class)
    with pytest.raises(ValueError, match=r"export to: it adds the states of an example's 2 sequences, as"):
        export_classifier(clf, tmp_path / "out")


def test_a_llama_multiple_choice_task_is_not_exported(tmp_path, tokenizer_dir):
    clf = classifier("single", "llama", tokenizer_dir)
    clf.task = MultipleChoice(name="mc", context=["story"], choices=["end1", "end2"])
    with pytest.raises(
        ValueError, match="'mc' \\(MultipleChoice, multiple-choice\\) has no transformers class"
    ):
        export_classifier(clf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_biased_head_wider_than_the_model_is_not_exported(tmp_path, tokenizer_dir):
    """transformers' score layer has no bias: the final LayerNorm carries it only where W δ = b has
    a solution. A head of more labels than the model is wide exported with other probabilities."""
    clf = classifier("single", "gpt1", tokenizer_dir)
    width = clf.gpt.config.n_embd
    clf.task = SingleText(name="many", labels=[f"c{i}" for i in range(width + 8)])
    clf.head = clf.task.head(width, dropout=0.0, init_std=0.3)
    torch.nn.init.normal_(clf.head.bias, std=1.0)
    with pytest.raises(
        ValueError, match=rf"head has {width + 8} outputs, more than the model's width \({width}\)"
    ):
        export_classifier(clf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_llama_model_of_biases_says_why_its_head_is_not_exported(tmp_path, tokenizer_dir):
    """Its head is trained with a bias, as the model's layers are: fine-tuning again cannot help."""
    clf = classifier("single", "llama", tokenizer_dir, bias=True)
    assert clf.head.bias is not None
    with pytest.raises(
        ValueError, match=r"RMSNorm cannot carry: its model has biases, so its head has one; "
    ):
        export_classifier(clf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_reward_model_of_chat_messages_exports_the_chat_template_its_prompts_are_rendered_with(
    tmp_path, tokenizer_dir
):
    """The folder renders a dialogue as training did (fine-tuning.md's recipe): its reward equals
    `Classifier`'s for the same messages, a card's rendered texts stripped as training strips them
    (the newlines between a chat's special tokens kept)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    clf = classifier("reward", "llama", tokenizer_dir)
    dialogues = [
        [{"role": "user", "content": "name a prime ."}, {"role": "assistant", "content": "seven "}],
        [
            {"role": "user", "content": " hi"},
            {"role": "assistant", "content": "hello , how can i help ?"},
            {"role": "user", "content": "a dog ?"},
            {"role": "assistant", "content": "two dogs run in a park ."},
        ],
    ]
    ends = CHAT.replace("<|im_end|>", "<|endoftext|>")  # a special token this tokenizer has: markup
    for template, strip in ((CHAT, False), (ends, True)):
        clf.tokenizer.chat_template, clf.task.strip_texts = template, strip
        expected = [outcome["scores"] for outcome in clf.predict([{"reply": d} for d in dialogues])]
        folder = export_classifier(clf, tmp_path / f"rm{strip}")
        tok = AutoTokenizer.from_pretrained(folder)
        rm = AutoModelForSequenceClassification.from_pretrained(folder)
        assert tok.chat_template == template and not tok.split_special_tokens  # (its tokens are meant)
        rewards = []
        for messages in dialogues:
            prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
            reply = tok.apply_chat_template(messages, tokenize=False)[len(prompt) :]
            with torch.no_grad():
                batch = tok([prompt], [reply], truncation=True, return_tensors="pt")
                rewards.append(rm(**batch).logits[0, 0].item())
        assert rewards == pytest.approx(expected, abs=1e-5)
        assert len(set(rewards)) == 2


def test_an_empty_text_keeps_its_place_through_the_exported_tokenizer_given_lists(tmp_path, tokenizer_dir):
    """transformers reads an empty second text given alone (`tok(prompt, "")`) as no text at all: a
    ranking's empty reply then lost its delimiter, the prompt scored as the reply, and a process
    reward model's empty first step too. Given as one-item lists (fine-tuning.md's recipes), the
    tokenizer keeps it: the reward equals `Classifier`'s, each step's probability too."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    clf = classifier("ranking", "llama", tokenizer_dir)
    rows = [("rate it", ""), ("", "good"), ("rate it", "good")]
    expected = [o["scores"] for o in clf.predict([{"prompt": p, "replies": [r]} for p, r in rows])]
    folder = export_classifier(clf, tmp_path / "rm")
    tok, rm = (
        AutoTokenizer.from_pretrained(folder),
        AutoModelForSequenceClassification.from_pretrained(folder),
    )
    assert tok("rate it", "")["input_ids"] != tok(["rate it"], [""])["input_ids"][0]  # (transformers' way)
    with torch.no_grad():
        rewards = [rm(**tok([p], [r], return_tensors="pt")).logits[0, 0].item() for p, r in rows]
    assert rewards == pytest.approx(expected, abs=1e-5)
    clf.task = Steps(name="prm", max_steps=4)
    clf.head = clf.task.head(clf.gpt.config.n_embd, dropout=0.0, init_std=0.3, bias=clf.gpt.config.bias)
    problem, steps = "2 + 2 ?", ["", "so it is 4 ."]
    (outcome,) = clf.predict([{"problem": problem, "steps": steps}])
    folder = export_classifier(clf, tmp_path / "prm")
    tok, prm = AutoTokenizer.from_pretrained(folder), AutoModelForTokenClassification.from_pretrained(folder)
    sep = prm.config.step_separator_token_id
    ids = tok([problem], [steps[0]])["input_ids"][0]
    for step in steps[1:]:
        ids += tok(step, add_special_tokens=False)["input_ids"] + [sep]
    with torch.no_grad():
        logits = prm(input_ids=torch.tensor([ids])).logits[0, torch.tensor(ids) == sep]
    assert logits.softmax(-1)[:, 1].tolist() == pytest.approx(outcome["scores"], abs=1e-5)


def test_export_command(tmp_path, finetuned, capsys, monkeypatch):
    from gpt_ft.cli import main

    out = tmp_path / "exported"
    main(["export", f"--ckpt_path={finetuned.ckpt}", f"--out={out}"])
    assert (
        capsys.readouterr().out.splitlines()[-1] == f"wrote {out}: pipeline('text-classification') loads it"
    )
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    umask = os.umask(0o022)
    os.umask(umask)  # every file readable as a new file is (transformers saves the weights 0600)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == dict.fromkeys(
        [p.name for p in out.iterdir()], 0o666 & ~umask
    )
    config = json.loads((out / "config.json").read_text())
    similarity = {**config, "architectures": ["X"], "auto_map": {"AutoModelForSequenceClassification": "m.X"}}
    assert what_loads(similarity, "transformers") == (  # without trust_remote_code: random weights
        "pipeline('text-classification', trust_remote_code=True) loads it (its X)"
    )
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["problem_type"] == "single_label_classification"
    before = files(tmp_path)
    assert error(capsys, "export", f"--ckpt_path={finetuned.ckpt}", f"--out={out}") == (
        f"--out {out} is not empty: give a new or empty folder (nothing was written)."
    )
    assert "--format: " in error(
        capsys, "export", f"--ckpt_path={finetuned.ckpt}", "--out=x", "--format=tflite"
    )
    monkeypatch.setattr(Classifier, "from_checkpoint", None)  # refused from the card, no weights loaded
    assert error(
        capsys, "export", f"--ckpt_path={finetuned.ckpt}", f"--out={tmp_path}/m.gguf", "--format=gguf"
    ) == (
        "--format gguf: llama.cpp serves language models, embedding models and scores of a pair of texts "
        "(rerankers, and pair tasks of one score or two classes); task 'sent' (classification) exports as a "
        "transformers or ONNX folder."
    )
    assert files(tmp_path) == before
    # Another export into the same new folder meanwhile: its files are kept, this one's go (both said
    # "wrote", their files mixed).
    from transformers import PreTrainedModel

    monkeypatch.undo()  # (the checkpoint's classifier loads again)
    raced, save = tmp_path / "raced", PreTrainedModel.save_pretrained

    def meanwhile(model, folder, **kwargs):
        save(model, folder, **kwargs)
        raced.mkdir(exist_ok=True)
        (raced / "config.json").write_text("another run's")

    with monkeypatch.context() as patch:
        patch.setattr(PreTrainedModel, "save_pretrained", meanwhile)
        for made in (False, True):  # a new folder, and an empty one given
            shutil.rmtree(raced, ignore_errors=True)
            if made:
                raced.mkdir()
            assert error(capsys, "export", f"--ckpt_path={finetuned.ckpt}", f"--out={raced}") == (
                f"{raced}: could not be written (another process wrote there meanwhile); the previous "
                "folder is kept."
            )
            assert files(raced) == {"config.json": b"another run's"} and not list(tmp_path.glob(".raced*"))
    # An empty folder given (a mount point, a group's folder) takes the files, its own mode kept.
    (shared := tmp_path / "shared").mkdir()
    shared.chmod(0o2750)
    main(["export", f"--ckpt_path={finetuned.ckpt}", f"--out={shared}"])
    assert (shared / "config.json").is_file() and shared.stat().st_mode & 0o7777 == 0o2750


def test_export_names_the_class_that_loads_what_is_no_sequence_classifier(
    tmp_path, finetuned, capsys, monkeypatch
):
    """A multiple-choice folder (a score per choice at its mc_token_ids) or a process reward
    model's (a score per step): not the text-classification pipeline's."""
    from gpt_ft.eval import export

    def written(clf, out, format):
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"architectures": ["GPT2DoubleHeadsModel"]}))
        return out

    monkeypatch.setattr(export, "export_classifier", written)
    export.export_checkpoint(ckpt_path=finetuned.ckpt, out=tmp_path / "mc")
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == f"wrote {tmp_path / 'mc'}: transformers' GPT2DoubleHeadsModel loads it"
    )


@pytest.mark.background(start=start_exports)
def test_gpt_multiple_choice_exports_to_double_heads_models(background):
    expected, got = served(background)
    for shape in ("gpt1", "gpt2"):
        result = got[f"choice-{shape}"]
        assert result["class"] == f"{SHAPES[shape][2]}DoubleHeadsModel"
        for outcome, probabilities in zip(expected[f"choice-{shape}"]["outcomes"], result["scores"]):
            assert probabilities == pytest.approx(list(outcome["scores"].values()), abs=1e-4)
            assert result["labels"] == list(outcome["scores"])  # mc_logits' positions named


@pytest.mark.background(start=start_exports)
def test_process_reward_models_export_to_token_classifiers_read_at_each_step(background):
    """P(right so far) at each step's separator equals `Classifier`'s, and the threshold travels."""
    expected, got = served(background)
    for shape in ("gpt2", "llama"):
        result = got[f"steps-{shape}"]
        assert result["class"] == f"{SHAPES[shape][2]}ForTokenClassification"
        assert result["threshold"] == pytest.approx(0.4) and result["labels"] == {"0": "wrong", "1": "right"}
        outcomes = expected[f"steps-{shape}"]["outcomes"]
        assert [len(o["scores"]) for o in outcomes] == [1, 2, 3, 1, 2][: len(outcomes)]
        for outcome, scores in zip(outcomes, result["scores"]):
            assert scores == pytest.approx(outcome["scores"], abs=1e-5)


def test_gpt1_process_reward_models_are_not_exported(tmp_path, tokenizer_dir):
    clf = classifier("single", "gpt1", tokenizer_dir)
    clf.task = Steps(name="prm")
    clf.head = clf.task.head(clf.gpt.config.n_embd, dropout=0.0, init_std=0.3)
    with pytest.raises(ValueError, match="transformers has no token classifier of openai-gpt models"):
        export_classifier(clf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.background(start=start_exports)
def test_onnx_export_gives_the_classifiers_outputs_in_onnxruntime(background):
    pytest.importorskip("onnxscript")
    expected, got = served(background)
    for name in ("onnx-similarity-gpt1", "onnx-similarity-llama"):
        folder = background.root / name
        assert (folder / "model.onnx").is_file() and not (folder / "model.safetensors").exists()
        assert not (folder / "model.onnx.data").exists()  # a small model is one file, to copy alone
        for outcome, logits in zip(expected[name]["outcomes"], got[name]):
            probabilities = torch.tensor(logits).softmax(-1).tolist()
            assert probabilities == pytest.approx(list(outcome["scores"].values()), abs=1e-4)


def test_a_reply_alone_is_framed_by_the_exported_tokenizer_as_training_frames_it(tokenizer_dir):
    """A reward model's card without a prompt trains on `[start] [delim] reply [extract]`, as a step
    card without a problem does its first step: the exported tokenizer frames a reply alone so,
    token for token (a prompt and reply, as a pair)."""
    from types import SimpleNamespace

    from gpt_ft.adapters import Ranking
    from gpt_ft.eval.framing import framed_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Preference(name="rm")
    trained = task.encode_examples([{"reply": "the cat sat"}], tok, specials, 64)[0].sequences[0]
    clf = SimpleNamespace(tokenizer=tok, specials=specials, task=task, max_length=64)
    framed = framed_tokenizer(clf)
    assert framed("the cat sat")["input_ids"] == trained
    assert trained[:2] == [specials.start, specials.delim]
    with_prompt = Preference(name="rm", prompt="prompt").encode_examples(
        [{"prompt": "a dog", "reply": "the cat sat"}], tok, specials, 64
    )[0]
    assert framed("a dog", "the cat sat")["input_ids"] == with_prompt.sequences[0]
    steps = Steps(name="prm", problem=None, steps="input", label="label", label_form="tagged", step_tag="ки")
    solution = {"input": "the cat ки sat down ки"}
    trained = steps.encode_examples([solution], tok, specials, 64)[0].sequences[0]
    clf.task = steps
    first = framed_tokenizer(clf)(steps.step_texts(solution)[0])["input_ids"]
    assert first == trained[: len(first)] and trained[len(first) - 1] == specials.extract
    clf.task = SingleText(name="sst2", text="sentence", labels=["0", "1"], strip_texts=True)
    trained = clf.task.encode_examples([{"sentence": " the cat sat . "}], tok, specials, 64)[0].sequences[0]
    assert framed_tokenizer(clf)(" the cat sat . ")["input_ids"] == trained  # stripped as training strips
    assert framed_tokenizer(clf)("the cat sat .")["input_ids"] == trained
    # str.strip's whitespace, Unicode's and the separators U+001C-U+001F, at either end only
    for text in ("\x1c the cat sat .\x1f", "\u3000\x1d\tthe cat sat .\x85 \x1e"):
        assert framed_tokenizer(clf)(text)["input_ids"] == trained, text
    inner = "the cat\n\x1c sat ."
    assert (
        framed_tokenizer(clf)(f" {inner}\n")["input_ids"]
        == clf.task.encode_examples([{"sentence": inner}], tok, specials, 64)[0].sequences[0]
    )
    names = ["<s>", "<d>", "<e>"]
    assert (
        Ranking(name="r", prompt=None).template(names)
        == task.template(names)
        == ("<s> <d> $A <e>", "<s> $A <d> $B <e>")
    )


def test_a_language_models_checkpoint_exports_as_a_causal_lm_that_stops_at_end_of_text(
    tmp_path, tokenizer_dir, capsys
):
    """Pretraining's checkpoint was refused ("records no task card"): it exports as transformers'
    LM-head model, its logits gpt_ft's, with the tokenizer and the end-of-text token as its eos."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpt_ft.cli import main
    from gpt_ft.data.prepare import prepare
    from gpt_ft.weights.pretrained import GPT as Pretrained
    from tests.cli.test_commands import PRETRAIN_MICRO
    from tests.helpers import ROOT, write_corpus

    tokenizer = tmp_path / "tokenizer"  # one that says 32 tokens: the folder says the model's 64
    said = load_tokenizer(str(tokenizer_dir))
    said.model_max_length = 32
    framing = [(t, said.convert_tokens_to_ids(t)) for t in ("<|start|>", "<|delim|>")]  # as [CLS] $A [SEP]
    said.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|start|> $A <|delim|>", special_tokens=framing
    )
    said.save_pretrained(tokenizer)
    prepare(out_dir=tmp_path / "tokens", tokenizer=str(tokenizer), inputs=[str(write_corpus(tmp_path))],
            validation_fraction=0.3, progress=False)  # fmt: skip
    config = str(ROOT / "configs/pretrain/cpu.yaml")
    main(["fit", "--config", config, f"--data.token_dir={tmp_path / 'tokens'}", "--data.block_size=16",
          "--data.batch_size=4", f"--model.overrides={PRETRAIN_MICRO}", "--trainer.max_steps=2",
          f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false"])  # fmt: skip
    ckpt = next((tmp_path / "runs").rglob("last.ckpt"))
    capsys.readouterr()
    main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'lm'}"])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'lm'}: pipeline('text-generation') loads it\n"
    hf, tok = (
        AutoModelForCausalLM.from_pretrained(tmp_path / "lm"),
        AutoTokenizer.from_pretrained(tmp_path / "lm"),
    )
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    assert hf.config.eos_token_id == hf.generation_config.eos_token_id == eos == tok.eos_token_id
    gpt = Pretrained.from_pretrained(str(ckpt))
    assert load_tokenizer(str(tokenizer)).model_max_length == 32
    assert tok.model_max_length == gpt.config.n_positions == 64  # the model's context, where pipelines cut
    ids = tok("the cat sat on the mat", return_tensors="pt").input_ids
    assert (
        ids[0].tolist() == tok("the cat sat on the mat", add_special_tokens=False).input_ids
    )  # as pretrained
    with torch.no_grad():
        ours = gpt.lm_logits(gpt(ids))
        torch.testing.assert_close(hf(ids).logits[..., : ours.shape[-1]], ours, rtol=0, atol=1e-5)
    onnx = ["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'onnx'}", "--format=onnx"]
    assert (
        error(capsys, *onnx)
        == "--format onnx: a language model exports as a transformers folder or GGUF file."
    )
    gguf = ["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'gpt1.gguf'}", "--format=gguf"]
    assert error(capsys, *gguf).startswith("gpt_ft writes no GGUF file of a 'openai-gpt' model")
    assert not (tmp_path / "gpt1.gguf").exists()


PHI4_LM = (
    "{n_positions: 64, n_layer: 1, rotary_dim: 8, hf_model_type: phi3, rope_scaling: {rope_type: longrope, "
    "short_factor: [1, 2, 3, 4], long_factor: [1, 4, 16, 64], original_max_position_embeddings: 16}}"
)


@pytest.mark.parametrize(
    "overrides",
    ["{n_positions: 64, n_layer: 1}", PHI4_LM, "{n_layer: 4, nope_layers: [3], hf_model_type: smollm3}"],
    ids=["llama", "phi4-longrope", "smollm3-nope"],
)
def test_a_llama_language_model_exports_as_a_gguf_file_that_reads_back_as_it(
    tmp_path, tokenizer_dir, capsys, overrides
):
    """`export --format gguf`: pretraining's Llama-family checkpoint as one GGUF file (f32 here),
    which reads back (transformers' GGUF loader; Phi-3's rotary settings by gpt_ft; SmolLM3's fourth
    layer without rotary positions) with the
    checkpoint's logits and tokens; an existing file is refused and kept."""
    from gpt_ft.cli import main
    from gpt_ft.data.prepare import prepare
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.weights.pretrained import GPT as Pretrained
    from tests.helpers import ROOT, write_corpus

    pytest.importorskip("gguf")
    prepare(out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, inputs=[str(write_corpus(tmp_path))],
            validation_fraction=0.3, progress=False)  # fmt: skip
    config = str(ROOT / "configs/pretrain/cpu.yaml")
    main(["fit", "--config", config, f"--data.token_dir={tmp_path / 'tokens'}",
          "--data.block_size=16", "--data.batch_size=4", "--model.preset=llama-micro",
          f"--model.overrides={overrides}", "--trainer.max_steps=2",
          f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false"])  # fmt: skip
    ckpt, out = next((tmp_path / "runs").rglob("last.ckpt")), tmp_path / "lm.gguf"
    capsys.readouterr()
    main(["export", f"--ckpt_path={ckpt}", f"--out={out}", "--format=gguf", "--gguf_type=f32"])
    assert capsys.readouterr().out == f"wrote {out}: llama.cpp, Ollama and LM Studio load it\n"
    import gguf

    fields = gguf.GGUFReader(out).fields
    assert fields["general.name"].contents() == "lm"  # (--out's, as Ollama shows it)
    family = next((f for f in ("phi3", "smollm3") if f in overrides), "llama")
    assert fields["general.architecture"].contents() == family
    ours, back = Pretrained.from_pretrained(str(ckpt)), Pretrained.from_pretrained(str(out))
    text = "the cat sat on the mat " * 4  # (past LongRoPE's original context of 16)
    ids = load_tokenizer(tokenizer_dir)(text, return_tensors="pt").input_ids
    assert load_tokenizer(str(out))(text, return_tensors="pt").input_ids.tolist() == ids.tolist()
    with torch.no_grad():
        torch.testing.assert_close(back.lm_logits(back(ids)), ours.lm_logits(ours(ids)), rtol=0, atol=1e-5)
    size = out.stat().st_size
    message = error(capsys, "export", f"--ckpt_path={ckpt}", f"--out={out}", "--format=gguf")
    assert message == f"--out {out} already exists: give another name (it is kept)."  # (no --overwrite)
    assert out.stat().st_size == size


def test_an_exported_models_config_names_the_tokenizers_own_bos():
    """It named the end-of-text token as bos too (SmolLM2's <|im_end|> for its <|im_start|>)."""
    from types import SimpleNamespace

    from gpt_ft.eval.framing import language_model

    gpt = GPT(GPTConfig(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    for bos, expected in ((1, 1), (None, 2)):  # (none: the end of text, as GPT-2's)
        clf = SimpleNamespace(
            gpt=gpt, specials=SimpleNamespace(eos=2, pad=3), tokenizer=SimpleNamespace(bos_token_id=bos)
        )
        config = language_model(clf).config
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (expected, 2, 3)


def test_a_built_in_tokenizer_class_exports_as_written_stripping_and_padding_on_the_right(tmp_path):
    """A Llama tokenizer (Llama 2's and Mistral's class; GPT-2's and Gemma's behave alike), which
    transformers rebuilds from its vocabulary when it loads one by name: the exported folder loads
    as it was written, so it strips a card's texts (SST-2's) and pads on the right (Llama's class
    pads on the left), and a padded batch of a similarity model scores as `Classifier` does."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    for piece in [*"abcdefghijklmnopqrstuvwxyz .,'", "▁", "▁t", "he", "▁the", "at", "▁c", "▁cat"]:
        vocab.setdefault(piece, len(vocab))
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("a", "t"), ("▁", "c"), ("▁c", "at")]
    LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True).save_pretrained(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    torch.manual_seed(0)
    config = GPTConfig.from_name("llama-micro", n_positions=48, vocab_size=len(tokenizer), n_layer=1)
    for task in (
        SingleText(name="sst2", labels=["0", "1"], strip_texts=True),
        Similarity(name="q", labels=["a", "b"]),
    ):
        head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
        clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")
        folder = export_classifier(clf, tmp_path / task.name)
        served = AutoTokenizer.from_pretrained(folder)
        assert (
            served.padding_side == json.loads((folder / "tokenizer_config.json").read_text())["padding_side"]
        )
        assert served.padding_side == "right"
        if task.strip_texts:
            texts = ["  the cat sat .  ", "the cat .  ", " a", "the cat", " ", " ▁the cat"]  # (▁: no second)
            trained = [e["input_ids"][0] for e in clf.encode([{"sentence": t} for t in texts])]
            assert served(texts)["input_ids"] == trained
            continue
        rows = [("the cat sat", "a cat"), ("a", "the")]
        model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "q", trust_remote_code=True)
        with torch.no_grad():
            batch = served(*map(list, zip(*rows)), padding=True, return_tensors="pt")
            probs = model.eval()(**batch).logits.softmax(-1)
        expected = [o["scores"] for o in clf.predict([{"sentence1": a, "sentence2": b} for a, b in rows])]
        assert probs.flatten().tolist() == pytest.approx([s[k] for s in expected for k in "ab"], abs=1e-6)


def test_a_stripping_folder_finds_a_tokenizers_own_words_in_the_stripped_text(tmp_path):
    """Gemma's tokenizer adds newlines and runs of spaces as words of its own, which tokenizers take
    from the raw text before any normalizer strips it: a text ending in a newline kept it, and the
    spaces beside a newline within a text were stripped. Stripped as training strips it now."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from tests.weights.gguf_files import tiny_pieces

    pieces = tiny_pieces()
    pieces.add_tokens([AddedToken(" " * n, normalized=False, special=False) for n in (2, 3)])
    pieces.add_tokens([AddedToken("<w>", normalized=False, special=False)])
    pieces.save_pretrained(tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    config = GPTConfig.from_name("llama-micro", n_positions=48, vocab_size=len(tokenizer), n_layer=1)
    task = SingleText(name="sst2", labels=["0", "1"], strip_texts=True)
    head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
    clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")
    served = AutoTokenizer.from_pretrained(export_classifier(clf, tmp_path / "sst2"))
    texts = ["the cat\n", "the cat  ", "   the cat", "the \n cat", " \n the  cat \n ", "\tthe cat\t",
             "the <w> cat ", " <w> the cat", "the cat <w> ", " <start_of_turn> the cat", "a\n\n  b",
             "the   cat\x1c"]  # fmt: skip
    trained = [e["input_ids"][0] for e in clf.encode([{"sentence": t} for t in texts])]
    assert served(texts)["input_ids"] == trained
    assert trained[-2][1:-1] == tokenizer("a\n\n  b", add_special_tokens=False)["input_ids"]
    # A normalizer that marks a text's start (Llama 2's layout) would spell a word "▁<w>", found
    # only after a space: such a tokenizer's words keep their raw match, as before.
    from tests.data.test_prepare import sentencepiece_style_tokenizer

    folder = sentencepiece_style_tokenizer(tmp_path / "spm", "the cat sat on the mat . " * 20)
    spm = load_tokenizer(folder)
    spm.add_tokens([AddedToken("<w>", normalized=False, special=False)])
    clf = Classifier(GPT(config).eval(), head, task, spm, max_length=48, device="cpu")
    served = AutoTokenizer.from_pretrained(export_classifier(clf, tmp_path / "spm-sst2"))
    texts = ["the<w>cat ", "<w>the cat", " the cat<w>"]
    assert served(texts)["input_ids"] == [
        e["input_ids"][0] for e in clf.encode([{"sentence": t} for t in texts])
    ]


def test_a_qwen2_folder_loads_its_tokenizer_as_written(tmp_path, tokenizer_dir):
    """transformers 5 loads a qwen2 folder's tokenizer through Qwen2Tokenizer, which rebuilds the
    normalizer and pre-tokenizer (SST-2's strip lost): the folder names a class of its own that
    loads tokenizer.json as written, with or without trust_remote_code; other folders need none."""
    from transformers import AutoTokenizer

    texts = ["  the cat sat .  ", "it is not good . ", " a"]
    task = SingleText(name="sst2", labels=["0", "1"], strip_texts=True)
    for shape in ("qwen2", "llama"):
        clf = classifier("single", shape, tokenizer_dir)
        clf.task = task
        trained = [e["input_ids"][0] for e in clf.encode([{"sentence": t} for t in texts])]
        folder = export_classifier(clf, tmp_path / shape)
        assert json.loads((folder / "config.json").read_text())["model_type"] == shape
        for trust in (False, True):
            assert (
                AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)(texts)["input_ids"] == trained
            )
        assert (folder / "tokenization_framed.py").exists() == (shape == "qwen2")


def test_a_folder_of_one_score_is_read_raw_by_a_cross_encoder_and_records_its_range(tmp_path, tokenizer_dir):
    """One output (a regression score, STS-B's similarity, a reward): sentence-transformers'
    CrossEncoder reads it raw, not through its default sigmoid (the similarity class did); a range
    the card clips its scores to is recorded for the server (transformers' classes do not clip)."""
    pair = TextPair(name="rel", premise="a", hypothesis="b", regression=True, score_range=(0, 2.5))
    for kind, task in (("sts", None), ("reward", None), ("regression", pair), ("single", None)):
        clf = classifier(kind, "llama", tokenizer_dir)
        if task is not None:
            clf.task, clf.head = task, task.head(clf.gpt.config.n_embd, dropout=0.0, init_std=0.3, bias=False)
        config = json.loads((export_classifier(clf, tmp_path / kind) / "config.json").read_text())
        raw = {"activation_fn": "torch.nn.modules.linear.Identity"}
        assert config.get("sentence_transformers") == (None if kind == "single" else raw), kind
        assert config.get("score_range") == {"sts": [0, 5], "regression": [0, 2.5]}.get(kind), kind


def test_the_onnx_graphs_classifier_numbers_positions_from_the_mask(tokenizer_dir, tmp_path):
    """A GPT-1 batch padded on the left gave the graph shifted learned positions (logits up to 0.23
    off; transformers' own model needs `position_ids` for it): the graph's wrapper numbers them from
    the attention mask, so either padding side gives each text's logits."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gpt_ft.eval.onnx import _Logits

    folder = export_classifier(classifier("single", "gpt1", tokenizer_dir, n_layer=1), tmp_path / "gpt1")
    model, tokenizer = (
        AutoModelForSequenceClassification.from_pretrained(folder),
        AutoTokenizer.from_pretrained(folder),
    )
    texts = ["a cat sat on the mat", "a dog"]
    with torch.no_grad():
        alone = torch.cat([model(**tokenizer(texts[i : i + 1], return_tensors="pt")).logits for i in (0, 1)])
        for side in ("right", "left"):
            tokenizer.padding_side = side
            batch = tokenizer(texts, padding=True, return_tensors="pt")
            torch.testing.assert_close(_Logits(model.eval())(**batch), alone, rtol=0, atol=1e-5)
        assert not torch.allclose(model(**batch).logits, alone, atol=1e-3)  # (left, without positions)
