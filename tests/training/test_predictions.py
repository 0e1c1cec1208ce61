"""Prediction files: index<TAB>prediction, in example order, each example once, written whole."""

import torch

from gpt_ft.adapters import Similarity, SingleText
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
