"""A question's answers, each judged on its own (MultiRC): the literal layout, verdicts read and
refused, SuperGLUE's F1a and EM on a hand-computed case, the hub's rows and the release's records
read alike, and a whole run from the release files to predictions, `Classifier`, `gpt-ft label`
and a transformers export."""

from __future__ import annotations

import json
import math

import datasets
import pytest
import torch

from gpt_ft.adapters import Answers, MultiRC, TaskDataError
from gpt_ft.adapters.answers import answer_metric_values
from gpt_ft.adapters.cards import load_card
from gpt_ft.cli import main
from gpt_ft.data.files import examples_split, labelled_rows
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.errors import CardError
from tests.helpers import TASKS, fit_and_last_validation, read_alike, write_release

SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)
NAN = math.nan


def same(a: list[float], b: list[float]) -> bool:
    """Equal lists, NaN equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_literal_layout_a_sequence_per_answer_the_context_shared():
    task = Answers(name="mrc", context=["paragraph", "question"], max_answers=4)
    example = {"paragraph": "p", "question": "q", "answers": ["a", "b", "c"], "label": [True, "False", 1]}
    assert task.texts(example) == ["p", " q", "a", "b", "c"]
    enc = task.encode(example, [[10, 11], [12], [20], [30, 31], [40]], SPECIALS, max_length=64)
    assert enc.sequences == [
        [1, 10, 11, 12, 2, 20, 3],
        [1, 10, 11, 12, 2, 30, 31, 3],
        [1, 10, 11, 12, 2, 40, 3],
    ]
    assert enc.extract_index == [6, 7, 6]
    assert same(enc.label, [1.0, 0.0, 1.0, NAN])
    # Cut: the context once for every answer (the paragraph's end first), the longest answer's length
    cut = task.encode(example, [[10, 11, 13, 14], [12], [20], [30, 31], [40]], SPECIALS, max_length=7)
    assert cut.sequences == [[1, 10, 12, 2, 20, 3], [1, 10, 12, 2, 30, 31, 3], [1, 10, 12, 2, 40, 3]]


def test_verdicts_are_read_as_cards_and_files_write_them_and_refused_by_their_field():
    task = Answers(name="mrc", context=["paragraph"], labels=["wrong", "right"], max_answers=8)
    row = {"paragraph": "p", "answers": list("abcdefg")}
    label = task.output.example_label({**row, "label": ["right", "wrong", True, "false", 1, 0.0, None]})
    assert same(label, [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, NAN, NAN])
    assert task.output.example_label({**row, "label": [-1, "", None, NAN, "-1", None, None]}) is None
    assert task.output.example_label(row) is None  # (a test file's rows)
    with pytest.raises(
        TaskDataError, match=r"^field 'label' must hold one verdict per answer \(7\), got \[1, 0\]\.$"
    ):
        task.output.example_label({**row, "label": [1, 0]})
    with pytest.raises(TaskDataError) as error:
        task.output.example_label({**row, "label": ["maybe"] * 7})
    assert (
        str(error.value) == "verdict 'maybe' in field 'label' is none of ['wrong', 'right'], true/false, 1/0."
    )
    assert task.label_text([1.0, 0.0, NAN]) == ["right", "wrong", None]
    with pytest.raises(CardError, match=r"`labels` names a wrong answer's verdict, then a right one's"):
        Answers(name="mrc", context=["p"], labels=["a", "b", "c"])
    with pytest.raises(CardError, match=r"an answers task takes no `regression`"):
        Answers(name="mrc", context=["p"], regression=True)
    with pytest.raises(CardError, match=r"^Task 'mrc': threshold must be in \(0, 1\), got 1\.0\.$"):
        Answers(name="mrc", context=["p"], threshold=1.0)
    with pytest.raises(CardError, match=r"MultiRC's context is two fields"):
        MultiRC(name="mrc", context=["paragraph"])


def test_f1a_exact_match_and_accuracy_on_a_hand_computed_case():
    """Three questions: [1, 0, 1] judged [1, 0, 0]; [0, 0] judged [0, 1]; [1] judged [1] (0.5 is at
    the threshold: right). Right answers judged right 2, judged right 3, labelled right 3: F1a 4/6;
    one question all right of 3: EM 1/3; 4 of the 6 answers agree."""
    probabilities = torch.tensor([[0.9, 0.2, 0.4], [0.1, 0.6, 0.99], [0.5, NAN, NAN]], dtype=torch.float64)
    labels = torch.tensor([[1, 0, 1], [0, 0, NAN], [1, NAN, NAN]], dtype=torch.float64)
    threshold = torch.full((3, 1), 0.5, dtype=torch.float64)
    values = answer_metric_values(probabilities, threshold, labels)
    assert {k: float(v) for k, v in values.items()} == pytest.approx(
        {"f1": 4 / 6, "exact_match": 1 / 3, "accuracy": 4 / 6}, abs=1e-15
    )
    task = Answers(name="mrc", context=["p"], max_answers=3, metrics=["exact_match", "accuracy", "f1"])
    predictions = torch.cat([probabilities, threshold], dim=1).float()
    assert {k: float(v) for k, v in task.metric_values(predictions, labels.float()).items()} == pytest.approx(
        {"f1": 4 / 6, "exact_match": 1 / 3, "accuracy": 4 / 6}
    )
    nothing_right = answer_metric_values(probabilities[1:2], threshold[1:2] * 2, labels[1:2])
    assert float(nothing_right["f1"]) == 0.0 and float(nothing_right["exact_match"]) == 1.0


def release(idx: int, *verdicts: int, texts=(("The cat.", "A dog."), ("Nobody.",))) -> dict:
    """A MultiRC release record: a passage, its questions, their answers (labelled by `verdicts`)."""
    it = iter(verdicts)
    questions = [
        {"question": f"Who {q}?", "idx": 10 * idx + q,
         "answers": [{"text": t, "idx": k, **({"label": next(it)} if verdicts else {})}
                     for k, t in enumerate(ts)]}
        for q, ts in enumerate(texts)
    ]  # fmt: skip
    return {"idx": idx, "version": 1.1, "passage": {"text": f"Passage {idx}.", "questions": questions}}


def hub_rows(record: dict) -> list[dict]:
    """The record as aps/super_glue holds it: a row an answer, its ids in `idx`."""
    return [
        {"paragraph": record["passage"]["text"], "question": q["question"], "answer": a["text"],
         "idx": {"paragraph": record["idx"], "question": q["idx"], "answer": a["idx"]},
         "label": a.get("label", -1)}
        for q in record["passage"]["questions"] for a in q["answers"]
    ]  # fmt: skip


def test_the_hubs_rows_and_the_releases_records_are_the_same_questions(monkeypatch, tmp_path):
    task = load_card(TASKS / "superglue" / "multirc.yaml")
    records = [release(0, 1, 0, 1), release(1, 0, 0, 0)]
    hub = read_alike(task, monkeypatch, tmp_path / "MultiRC" / "val.jsonl", records, hub_rows)
    assert len(hub) == 4
    assert [task.texts(r) for r in hub][:2] == [["Passage 0.", " Who 0?", "The cat.", "A dog."],
                                                ["Passage 0.", " Who 1?", "Nobody."]]  # fmt: skip
    assert [task.output.example_label(r)[:2] for r in hub] == [[1, 0], [1, NAN], [0, 0], [0, NAN]]
    # An answer row whose question's other rows hold another paragraph: the ids do not name a question
    rows = [row for record in records for row in hub_rows(record)]
    rows[1] = {**rows[1], "paragraph": "Another."}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    with pytest.raises(TaskDataError) as error:
        examples_split(task, "validation", None)
    assert str(error.value) == (
        "hub dataset aps/super_glue split validation, row 2: its field 'paragraph' differs from that of "
        "row 1, an answer to the same question (idx.paragraph '0', idx.question '0'): `group_by` must "
        "name a question."
    )
    monkeypatch.undo()  # (local files are read through datasets too)
    (tmp_path / "MultiRC" / "val.jsonl").write_text(json.dumps({"idx": 0, "passage": {"text": "p"}}) + "\n")
    with pytest.raises(
        TaskDataError, match=r"val.jsonl, line 1 has no field 'questions' \(task 'multirc'\)\.$"
    ):
        examples_split(task, "validation", tmp_path)
    texts = release(0, 1, 0, 1)
    texts["passage"]["questions"][0]["answers"] = ["The cat."]  # answers as texts, not records
    (tmp_path / "MultiRC" / "val.jsonl").write_text(json.dumps(texts) + "\n")
    with pytest.raises(TaskDataError) as error:
        examples_split(task, "validation", tmp_path)
    assert (
        "val.jsonl, line 1: its fields are not laid out as the release's, {idx, passage: {text, questions: "
        in str(error.value)
    )


def test_a_release_files_verdicts_of_several_types_are_read_and_a_bad_one_named_by_its_line(tmp_path):
    """JSON's true on one line and 1 on the next are one column's verdicts (Arrow holds one type); a
    verdict that is none is named by the record's line, as too many answers are."""
    task = load_card(TASKS / "superglue" / "multirc.yaml")
    (tmp_path / "MultiRC").mkdir()
    path = tmp_path / "MultiRC" / "val.jsonl"
    path.write_text(
        json.dumps(release(0, True, False, True)) + "\n" + json.dumps(release(1, 0, 1, "-1")) + "\n"
    )
    read = examples_split(task, "validation", tmp_path)
    labels = [task.output.example_label(r) for r in read]
    assert [label[:2] for label in labels[:3]] == [[1, 0], [1, NAN], [0, 1]] and labels[3] is None
    path.write_text(json.dumps(release(0, 1, 0, 1)) + "\n" + json.dumps(release(1, 0, "maybe", 1)) + "\n")
    with pytest.raises(
        TaskDataError, match=r"val.jsonl, line 2: verdict 'maybe' in field 'label' is none of "
    ):
        labelled_rows(task, "validation", tmp_path)
    many = release(2, *[1] * 34, texts=[[f"a{k}" for k in range(33)], ["b"]])
    path.write_text(json.dumps(many) + "\n")
    with pytest.raises(TaskDataError) as error:
        labelled_rows(task, "validation", tmp_path)
    assert str(error.value).endswith(
        "val.jsonl, line 1: field 'answer' holds 33 answers to one question, more than the card's "
        "max_answers 32: raise it."
    )


def test_fit_on_the_release_files_then_predict_label_and_export_agree(tmp_path, tokenizer_dir, capsys):
    """A run from the release files: validation logs F1a and EM (recomputed here from the
    classifier's scores), `predict` writes a line a question, `gpt-ft label` the same scores for
    the hub's rows (an answer each), and the export's sigmoid is the classifier's P(right)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gpt_ft import Classifier

    texts = (("The cat sat.", "A dog.", "Two dogs run."), ("Nobody.", "He is happy now."))
    train = [release(i, *[(i + k) % 2 for k in range(5)], texts=texts) for i in range(6)]
    val = [release(9, 1, 0, 0, 1, 1, texts=texts), release(10, 0, 1, 1, 0, 0, texts=texts)]
    test = [release(11, texts=texts), release(12, texts=texts[1:])]
    write_release(tmp_path / "MultiRC", {"train": train, "val": val, "test": test})
    card = TASKS / "superglue" / "multirc.yaml"
    logged, last = fit_and_last_validation(card, tokenizer_dir, tmp_path)
    assert "validation/exact_match" in capsys.readouterr().out
    clf = Classifier.from_checkpoint(last)
    task = clf.task
    examples = list(examples_split(task, "validation", tmp_path))
    predicted = clf.predict(examples)
    assert [len(p["scores"]) for p in predicted] == [3, 2, 3, 2]
    n = task.output.max_answers
    scores = torch.tensor(
        [p["scores"] + [NAN] * (n - len(p["scores"])) for p in predicted], dtype=torch.float64
    )
    labels = torch.tensor([task.output.example_label(e) for e in examples], dtype=torch.float64)
    values = answer_metric_values(scores, torch.full((4, 1), 0.5, dtype=torch.float64), labels)
    for name in ("f1", "exact_match"):
        assert float(logged[f"validation/{name}"]) == pytest.approx(float(values[name]))
    for p in predicted:
        assert p["label"] == ["True" if s >= 0.5 else "False" for s in p["scores"]]

    main(["predict", f"--ckpt_path={last}", f"--data.data_dir={tmp_path}",
          "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}",
          f"--model.predictions_dir={tmp_path / 'p'}"])  # fmt: skip
    lines = (tmp_path / "p" / "MultiRC.jsonl").read_text().splitlines()  # SuperGLUE's layout
    verdicts = [
        [int(v == "True") for v in p["label"]] for p in clf.predict(examples_split(task, "test", tmp_path))
    ]
    assert [len(v) for v in verdicts] == [3, 2, 2]
    answers = [[{"idx": k, "label": v} for k, v in enumerate(question)] for question in verdicts]
    assert [json.loads(line) for line in lines] == [
        {
            "idx": 11,
            "passage": {
                "questions": [{"idx": 110, "answers": answers[0]}, {"idx": 111, "answers": answers[1]}]
            },
        },
        {"idx": 12, "passage": {"questions": [{"idx": 120, "answers": answers[2]}]}},
    ]

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hub_rows(val[0])))
    main(
        [
            "label",
            f"--ckpt_path={last}",
            f"--input={tmp_path / 'rows.jsonl'}",
            f"--output={tmp_path / 'out.jsonl'}",
        ]
    )
    labelled = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["scores"][0] for r in labelled] == pytest.approx(
        predicted[0]["scores"] + predicted[1]["scores"]
    )
    assert [r["prediction"] for r in labelled] == [[v] for v in predicted[0]["label"] + predicted[1]["label"]]

    main(["export", f"--ckpt_path={last}", f"--out={tmp_path / 'hf'}"])
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert model.config.problem_type == "multi_label_classification" and model.config.id2label == {0: "True"}
    context = "".join(task.texts(examples[0])[:2])  # the paragraph, a space, the question
    with torch.no_grad():
        logits = model(**tokenizer([context] * 3, list(texts[0]), return_tensors="pt", padding=True)).logits
    assert logits.sigmoid().flatten().tolist() == pytest.approx(predicted[0]["scores"], abs=1e-5)
