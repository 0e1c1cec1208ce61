"""Multi-label classification (`gpt_ft.adapters.MultiLabel`): labels parsed from lists and joined
names, the head's loss, predictions and metrics by hand, and cards written as the README shows
fitting, predicting and refusing an unknown label through the command line."""

import json
import math
from pathlib import Path

import pytest
import torch

from gpt_ft.adapters import MultiLabel, TaskDataError
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.errors import CardError
from gpt_ft.training.eval_metrics import EvalMetrics
from tests.helpers import common_args, write_rows

SPECIALS = SpecialTokenIds(start=100, delim=101, extract=102, pad=103, eos=None)
LABELS = ["joy", "anger", "fear"]


def task(**kw) -> MultiLabel:
    return MultiLabel(name="emo", text="text", label="tags", labels=LABELS, **kw)


def test_labels_from_lists_joined_names_and_ids():
    t = task()
    assert t.output.example_label({"tags": ["fear", "joy"]}) == [1, 0, 1]
    assert t.output.example_label({"tags": "anger, fear"}) == [0, 1, 1]
    assert t.output.example_label({"tags": ""}) == [0, 0, 0]  # an empty text: no label
    assert t.output.example_label({"tags": [2]}) == [0, 0, 1]  # hub datasets store ids
    assert t.output.example_label({"tags": [1.0, 2.0]}) == [0, 1, 1]  # a JSON column read as floats
    with pytest.raises(TaskDataError, match=r"label 1.5 in field 'tags' is not among the labels"):
        t.output.example_label({"tags": [1.5]})
    assert t.output.example_label({"tags": "0,2"}) == [1, 0, 1]
    assert t.output.example_label({"text": "no tags field"}) is None
    assert task(label_separator="|").output.example_label({"tags": "joy|fear"}) == [1, 0, 1]
    with pytest.raises(TaskDataError, match=r"label 'surprise' in field 'tags' is not among the labels"):
        t.output.example_label({"tags": "joy,surprise"})


def test_labels_that_are_numbers_are_names_never_positions():
    """As a class's: the labels '10', '20', '30' read "2" and 0 as positions (['30'] and ['10'])."""
    t = MultiLabel(name="n", text="text", label="tags", labels=["10", "20", "30"])
    assert t.output.example_label({"tags": ["30", 10.0]}) == [1, 0, 1]
    for value in ("2", 0):
        with pytest.raises(
            TaskDataError, match=r"\(the labels are numbers: a value is a label, never an index\)"
        ):
            t.output.example_label({"tags": [value]})


def test_layout_is_start_text_extract():
    enc = task().encode({"tags": ["joy"]}, [[5, 6, 7]], SPECIALS, 4)
    assert enc.sequences == [[100, 5, 6, 102]] and enc.extract_index == [3] and enc.label == [1, 0, 0]


def test_bad_cards():
    with pytest.raises(ValueError, match="unknown metric"):
        task(metrics=["accuracy"])
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\), got 1.5"):
        task(threshold=1.5)
    with pytest.raises(ValueError, match="cannot be a regression"):
        task(regression=True)


def test_head_loss_predictions_and_written_form_by_hand():
    t = task(threshold=0.6)
    head = t.head(4, dropout=0.0, init_std=0.02)
    extract = torch.randn(2, 1, 4)
    outputs = head(extract)
    torch.testing.assert_close(outputs, extract[:, 0] @ head.weight.T + head.bias)
    labels = torch.tensor([[1, 0, 1], [0, 0, 0]])
    p = outputs.sigmoid()
    by_hand = -(labels * p.log() + (1 - labels) * (1 - p).log()).mean(dim=1)
    torch.testing.assert_close(head.losses(outputs, labels), by_hand)
    logits = torch.tensor([[2.0, 0.0, 0.5], [0.3, -1.0, 0.41]])  # sigmoid: .88 .5 .62 / .57 .27 .601
    assert head.predictions(logits).tolist() == [[1, 0, 1], [0, 0, 1]]
    assert t.format_prediction(torch.tensor([1, 0, 1])) == "joy,fear"
    assert t.format_prediction(torch.tensor([0, 0, 0])) == ""
    assert t.output.label_text([0, 1, 1]) == ["anger", "fear"]


def test_micro_and_macro_f1_by_hand_counting_each_example_once():
    t = task()
    metrics = EvalMetrics(t, lm_coef=0.5)
    tt = torch.tensor
    predictions = tt([[1, 0, 1], [1, 1, 0], [0, 0, 1]])
    labels = tt([[1, 0, 0], [1, 0, 0], [0, 1, 1]])
    zeros = torch.zeros(3)
    metrics.update(tt([0, 1, 2]), zeros, zeros + 1, zeros, predictions, labels)
    # A distributed sampler's repeat of example 0, with other values, to show it is ignored.
    metrics.update(tt([0]), tt([0.0]), tt([1.0]), tt([0.0]), tt([[0, 1, 1]]), tt([[1, 1, 1]]))
    values = {k: float(v) for k, v in metrics.compute().items()}
    # joy: TP 2 FP 0 FN 0 -> F1 1; anger: TP 0 FP 1 FN 1 -> 0; fear: TP 1 FP 1 FN 0 -> 2/3.
    assert values["macro_f1"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    # micro: TP 3, FP 2, FN 1 -> 2*3 / (2*3 + 2 + 1).
    assert values["micro_f1"] == pytest.approx(6 / 9)
    assert not math.isnan(values["loss"])
    # A label neither in the split nor predicted has no F1: the labels seen are averaged (it counted
    # 0, and a perfect model scored 2/3), as single-label f1 averages the classes seen.
    perfect = tt([[1, 0, 0], [0, 1, 0], [1, 1, 0]])
    got = t.output.metric_values(perfect, perfect.clone(), ["micro_f1", "macro_f1"])
    assert (float(got["micro_f1"]), float(got["macro_f1"])) == (1.0, 1.0)
    wrong = t.output.metric_values(tt([[1, 0, 1], [0, 1, 0]]), tt([[1, 0, 0], [0, 1, 0]]), ["macro_f1"])
    assert float(wrong["macro_f1"]) == pytest.approx((1 + 1 + 0) / 3)  # predicted, never gold: seen
    # One label (a "spam" tag) is a card of its own: its F1, per label too (torchmetrics refused it).
    spam = MultiLabel(name="tags", labels=["spam"])
    got = spam.output.metric_values(tt([[1], [0], [1]]), tt([[1], [0], [0]]), ["micro_f1", "macro_f1"])
    assert (float(got["micro_f1"]), float(got["macro_f1"])) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    report = spam.output.per_class(tt([[1], [0], [1]]), tt([[1], [0], [0]]))
    assert report == {"spam": {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1.0}}
    # Nothing gold and nothing predicted: 0, scikit-learn's zero_division=0.
    assert float(spam.output.metric_values(tt([[0]]), tt([[0]]), ["micro_f1"])["micro_f1"]) == 0.0


# ---- through the command line, with a card written as the README shows ----

CARD = """class_path: gpt_ft.adapters.MultiLabel
init_args:
  name: tags
  text: text
  label: tags
  labels: [animal, place, food]
  label_separator: ","
  threshold: 0.5
  metrics: [micro_f1, macro_f1]
  local: {{splits: {{train: train.{ext}, validation: dev.{ext}, test: test.{ext}}}}}
"""
TEXTS = [
    ("the cat sat on the mat .", ["animal", "place"]),
    ("two dogs run in a park .", ["animal", "place"]),
    ("she decides to bake a batch of brownies .", ["food"]),
    ("he is happy now .", []),
]


def write_tagged(root: Path, ext: str) -> Path:
    for split, n in (("train", 8), ("dev", 4), ("test", 3)):
        rows = [TEXTS[i % len(TEXTS)] for i in range(n)]
        if ext == "jsonl":
            lines = [
                json.dumps({"text": text, **({"tags": tags} if split != "test" else {})})
                for text, tags in rows
            ]
            (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        elif split == "test":
            write_rows(root / f"{split}.tsv", ["text"], [[text] for text, _ in rows])
        else:
            write_rows(
                root / f"{split}.tsv", ["text", "tags"], [[text, ",".join(tags)] for text, tags in rows]
            )
    card = root / "tags.yaml"
    card.write_text(CARD.format(ext=ext))
    return card


@pytest.mark.parametrize("ext", ["jsonl", "tsv"])
def test_fit_prints_micro_and_macro_f1_and_predict_writes_label_names(ext, tmp_path, tokenizer_dir, capsys):
    card = write_tagged(tmp_path, ext)
    args = common_args(card, tokenizer_dir, tmp_path)
    main(["fit", *args, "--trainer.max_epochs=2", "--model.lr=1e-2"])
    out = capsys.readouterr().out
    assert "validation/micro_f1" in out and "validation/macro_f1" in out
    last = next((tmp_path / "runs").rglob("last.ckpt"))
    main(["predict", *args, f"--ckpt_path={last}", f"--model.predictions_dir={tmp_path / 'pred'}"])
    lines = (tmp_path / "pred" / "tags-test.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == ["0", "1", "2"]
    for line in lines[1:]:
        names = line.split("\t")[1]
        assert set(filter(None, names.split(","))) <= {"animal", "place", "food"}


def test_an_unknown_label_names_file_line_and_value(tmp_path, tokenizer_dir, capsys):
    card = write_tagged(tmp_path, "tsv")
    write_rows(tmp_path / "train.tsv", ["text", "tags"], [["a cat .", "animal"], ["a dog .", "animal,plant"]])
    before = (tmp_path / "train.tsv").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *common_args(card, tokenizer_dir, tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the datasets progress bars
    assert err == (
        f"gpt-ft: error: {tmp_path / 'train.tsv'}, line 3: label 'plant' in field 'tags' is not among the "
        "labels ['animal', 'place', 'food']."
    )
    assert (tmp_path / "train.tsv").read_bytes() == before


def test_head_parameters_keep_the_checkpoint_keys_of_a_linear_layer():
    head = task().head(8, dropout=0.1, init_std=0.02)
    assert set(head.state_dict()) == {"weight", "bias"} and head.weight.shape == (3, 8)
    assert float(head.bias.abs().max()) == 0.0


def test_a_label_that_holds_the_separator_is_refused_at_the_card():
    """It loaded, and its files' cells could not name it ("label 'anger' ... is not among the labels")."""
    with pytest.raises(
        CardError, match=r"label 'anger,rage' holds the label_separator ',', which would split"
    ):
        MultiLabel(name="tags", labels=["joy", "anger,rage"])
    assert MultiLabel(name="tags", labels=["joy", "anger,rage"], label_separator="|").output.separator == "|"
