"""Prediction files: index<TAB>prediction (or SuperGLUE's JSON records), in example order, each
example once, written whole."""

import json

import pytest
import torch

from gpt_ft.adapters import CauseEffect, MultiRC, ReCoRD, Similarity, SingleText
from gpt_ft.training.predictions import write_predictions


def test_rows_in_example_order_each_once_in_the_leaderboards_file(tmp_path):
    task = SingleText(name="sst2", labels=["negative", "positive"], submission_files={"test": "SST-2.tsv"})
    index = torch.tensor([2, 0, 3, 1, 0])  # a distributed sampler repeated example 0
    predictions = torch.tensor([1, 0, 1, 1, 1])
    path = write_predictions(task, "test", index, predictions, tmp_path / "pred")
    assert path == tmp_path / "pred" / "SST-2.tsv"
    assert path.read_text() == "index\tprediction\n0\tnegative\n1\tpositive\n2\tpositive\n3\tpositive\n"
    assert [p.name for p in path.parent.iterdir()] == ["SST-2.tsv"]  # no temporary file left


def test_a_file_in_a_folder_of_its_own_written_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    import locale

    monkeypatch.setattr(locale, "getpreferredencoding", lambda *_: "ascii")  # (the C locale's)
    task = SingleText(name="x", labels=["négatif", "positif"], submission_files={"test": "glue/X.tsv"})
    path = write_predictions(task, "test", torch.tensor([0, 1]), torch.tensor([0, 1]), tmp_path / "pred")
    assert path == tmp_path / "pred" / "glue" / "X.tsv"
    assert path.read_bytes().decode("utf-8") == "index\tprediction\n0\tnégatif\n1\tpositif\n"


def test_a_split_without_a_submission_file_and_scores(tmp_path):
    task = Similarity(name="sts", regression=True, score_range=(0, 5))
    path = write_predictions(task, "validation", torch.tensor([1, 0]), torch.tensor([4.25, 0.5]), tmp_path)
    assert path.name == "sts-validation.tsv"
    assert path.read_text().splitlines() == ["index\tprediction", "0\t0.5", "1\t4.25"]


def test_text_ids_name_their_rows(tmp_path):
    """Story Cloze's and ProcessBench's ids are texts: each prediction is written under its own."""
    task = SingleText(name="sst2", labels=["negative", "positive"])
    names = {0: "138d5bfb-05cc", 1: "gsm8k-0"}
    path = write_predictions(task, "test", torch.tensor([1, 0, 1]), torch.tensor([0, 1, 0]), tmp_path, names)
    assert path.read_text() == "index\tprediction\n138d5bfb-05cc\tpositive\ngsm8k-0\tnegative\n"


def records(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_json_lines_as_superglue_takes_them(tmp_path):
    """A `.jsonl` submission file: {idx, label} a line, the label as the card writes it for the
    leaderboard (BoolQ's lower-case words), a choice nobody names as its number (COPA's)."""
    boolq = SingleText(name="boolq", labels=["False", "True"], submission_labels=["false", "true"],
                       submission_files={"test": "BoolQ.jsonl"})  # fmt: skip
    path = write_predictions(boolq, "test", torch.tensor([1, 0, 1]), torch.tensor([0, 1, 0]), tmp_path)
    assert path.read_text() == '{"idx": 0, "label": "true"}\n{"idx": 1, "label": "false"}\n'
    copa = CauseEffect(name="copa", premise="premise", question="question", choices=["choice1", "choice2"],
                       submission_files={"test": "COPA.jsonl"})  # fmt: skip
    path = write_predictions(
        copa, "test", torch.tensor([0, 1]), torch.tensor([1, 0]), tmp_path, {0: "a7", 1: "b"}
    )
    assert records(path) == [{"idx": "a7", "label": 1}, {"idx": "b", "label": 0}]


def test_a_record_query_is_written_with_its_chosen_entity(tmp_path):
    task = ReCoRD(
        name="record", label="answers", index="idx.query", submission_files={"test": "ReCoRD.jsonl"}
    )
    choices = {0: ["Ann", "Bob"], 1: ["0", "Zoe"]}  # (an entity that reads as a number stays a text)
    path = write_predictions(
        task, "test", torch.tensor([0, 1]), torch.tensor([1, 0]), tmp_path, None, choices
    )
    assert records(path) == [{"idx": 0, "label": "Bob"}, {"idx": 1, "label": "0"}]


def test_multirc_questions_nested_in_their_passages(tmp_path):
    """SuperGLUE's MultiRC.jsonl: a line a passage, its questions in order, each answer's verdict
    (1 right) under the answer's own id; the TSV of the same predictions names each question by
    its ids, as JSON."""
    task = MultiRC(name="multirc", index="idx", submission_files={"test": "MultiRC.jsonl"})
    ids = {
        0: {"paragraph": 4, "question": 40, "answers": [7, 8]},
        1: {"paragraph": 4, "question": 41, "answers": [9]},
        2: {"paragraph": 5, "question": 50, "answers": [10, 11, 12]},
    }
    nan = float("nan")
    probabilities = torch.tensor([[0.9, 0.2, nan, 0.5], [0.4, nan, nan, 0.5], [0.6, 0.7, 0.1, 0.5]])
    path = write_predictions(task, "test", torch.tensor([2, 0, 1]), probabilities[[2, 0, 1]], tmp_path, ids)
    assert records(path) == [
        {"idx": 4, "passage": {"questions": [
            {"idx": 40, "answers": [{"idx": 7, "label": 1}, {"idx": 8, "label": 0}]},
            {"idx": 41, "answers": [{"idx": 9, "label": 0}]},
        ]}},
        {"idx": 5, "passage": {"questions": [
            {"idx": 50, "answers": [{"idx": 10, "label": 1}, {"idx": 11, "label": 1},
                                    {"idx": 12, "label": 0}]},
        ]}},
    ]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"^Task 'multirc': question 40 has 2 answers and a probability for 1: the ot"
    ):
        broken = torch.tensor([[nan, 0.2, nan, 0.5]])  # the first answer's probability NaN
        write_predictions(task, "test", torch.tensor([0]), broken, tmp_path, ids)
    task.submission.files = {}
    lines = write_predictions(task, "test", torch.tensor([0]), probabilities[:1], tmp_path, ids).read_text()
    assert lines == 'index\tprediction\n{"paragraph": 4, "question": 40, "answers": [7, 8]}\tTrue,False\n'
