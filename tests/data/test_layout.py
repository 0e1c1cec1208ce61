"""The files a card's local layout names: labels kept in a file of their own beside the records,
one a line (AI2's releases of PIQA and Social IQa), read with the card's slices and seeded draws,
stamped for suite reruns, and each fault named with its file."""

from __future__ import annotations

import json

import datasets
import numpy
import pytest

from gpt_ft.adapters import LocalFiles, MultipleChoice, TaskDataError
from gpt_ft.adapters.cards import load_card
from gpt_ft.data.files import load_split, located_split
from gpt_ft.data.layout import task_files
from gpt_ft.eval.results import input_stamps
from gpt_ft.training.predictions import check_submission
from tests.helpers import TASKS


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def piqa(tmp_path, labels: str, rows: int = 5, **local) -> MultipleChoice:
    """PIQA's layout: record i's goal is `goal i`, its label in line i + 1 of the label file."""
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"goal": f"goal {i}", "sol1": "a", "sol2": "b"}) + "\n" for i in range(rows))
    )
    (tmp_path / "train-labels.lst").write_text(labels)
    splits = local.pop("splits", {"train": "train.jsonl"})
    files = LocalFiles(splits=splits, label_files={s: "train-labels.lst" for s in splits}, **local)
    return MultipleChoice(name="piqa", context=["goal"], choices=["sol1", "sol2"], index=None, local=files)


def test_labels_in_a_file_of_their_own_follow_their_records_through_slices_and_draws(tmp_path):
    task = piqa(
        tmp_path, "0\n1\n1\n0\n1\n", splits={"train": "train.jsonl[1:4]", "validation": "train.jsonl[4:]"}
    )
    train, origin = located_split(task, "train", tmp_path)
    assert (train["goal"], train["label"]) == (["goal 1", "goal 2", "goal 3"], ["1", "1", "0"])
    assert origin.of(0) == f"{tmp_path / 'train.jsonl'}, line 2"  # the record's line, not the slice's
    assert origin.file_columns(train.column_names) == ["goal", "sol1", "sol2"]  # `label` is not the file's
    assert load_split(task, "validation", tmp_path)["label"] == ["1"]
    # Drawn in a seeded order (Story Cloze's `shuffle_seed`): each record keeps its own label.
    task = piqa(tmp_path, "0\n1\n1\n0\n1\n", splits={"train": "train.jsonl[2:]"}, shuffle_seed=7)
    drawn = load_split(task, "train", tmp_path)
    rows = numpy.random.RandomState(7).permutation(5)[2:]
    assert drawn["goal"] == [f"goal {i}" for i in rows] and drawn["label"] == ["01101"[i] for i in rows]
    # Every file the layout reads is stamped: a changed label file reruns a suite's result.
    stamps = input_stamps(task, str(tmp_path))
    assert set(stamps) == {str(tmp_path / "train.jsonl"), str(tmp_path / "train-labels.lst")}
    assert set(task_files(task, tmp_path).values()) == {"train"}


def test_the_release_cards_read_their_labels_as_the_choices_order(tmp_path):
    """Social IQa's labels name the answers 1 to 3; PIQA's are the solution's index."""
    task = load_card(TASKS / "social_iqa.yaml")
    folder = tmp_path / "socialiqa-train-dev"
    folder.mkdir()
    row = {
        "context": "Ann won.",
        "question": "How would Ann feel?",
        "answerA": "a",
        "answerB": "b",
        "answerC": "c",
    }
    (folder / "dev.jsonl").write_text((json.dumps(row) + "\n") * 3)
    (folder / "dev-labels.lst").write_text("3\n1\n2\n")
    raw = load_split(task, "validation", tmp_path)
    assert [task.output.example_label(r) for r in raw] == [2, 0, 1]


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("0\n1\n", "{labels} holds 2 labels, one a line, but {records} holds 5 records: the labels of split "
                   "'train' must be as many, in the records' order."),
        ("0\n1\n1\n0\n1\n0\n", "{labels} holds 6 labels, one a line, but {records} holds 5 records"),
        ("0\n1\n\n0\n1\n", "{labels}, line 3 is empty: a label file holds one label a line."),
        (b"0\n1\n\xff\n0\n1\n", "{labels}, line 3: not UTF-8 text (byte 0xff"),
    ],
)  # fmt: skip
def test_a_label_file_at_fault_is_named(tmp_path, labels, message):
    task = piqa(tmp_path, "")
    path = tmp_path / "train-labels.lst"
    path.write_bytes(labels if isinstance(labels, bytes) else labels.encode())
    with pytest.raises(TaskDataError) as fault:
        load_split(task, "train", tmp_path)
    assert str(fault.value).startswith(message.format(labels=path, records=tmp_path / "train.jsonl"))


def test_a_missing_label_file_or_a_label_column_of_the_records_own_is_refused(tmp_path):
    task = piqa(tmp_path, "0\n")
    (tmp_path / "train-labels.lst").unlink()
    with pytest.raises(TaskDataError) as missing:
        load_split(task, "train", tmp_path)
    labels = tmp_path / "train-labels.lst"
    assert str(missing.value) == f"{labels}: file not found (the labels of split 'train' of task 'piqa')."
    labels.write_text("1\n")
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}) + "\n"
    )
    with pytest.raises(TaskDataError) as both:
        load_split(task, "train", tmp_path)
    assert str(both.value) == (
        f"{tmp_path / 'train.jsonl'} has a column 'label' of its own (or the card's `columns` renames one to "
        f"it or it away), and the card's local.label_files gives split 'train' its labels in {labels} too: "
        "drop one of the two."
    )


def test_a_bad_label_names_the_file_it_is_read_from(tmp_path):
    """Its message named the records' file and line alone, and a field the records do not have."""
    from gpt_ft.data.files import labelled_rows

    task = piqa(tmp_path, "0\n1\n7\n0\n1\n")
    with pytest.raises(TaskDataError) as bad:
        labelled_rows(task, "train", tmp_path)
    assert str(bad.value) == (
        f"{tmp_path / 'train.jsonl'}, line 3: label '7' in field 'label' is not among the labels [0, 1] "
        f"('label' is read from {tmp_path / 'train-labels.lst'}, a line a record)."
    )
    # Lines end at line breaks only (a form feed ended one for str.splitlines, which then counted 6).
    (tmp_path / "train-labels.lst").write_text("0\x0c\n1\n1\n0\n1\n")
    assert load_split(task, "train", tmp_path)["label"] == ["0", "1", "1", "0", "1"]


@pytest.mark.parametrize("columns", [{"gold": "label"}, {"label": "old_label"}])
def test_a_label_column_the_cards_renames_make_or_take_is_refused(tmp_path, columns):
    """A column renamed to the label field was refused as "its column 'label' is kept", which the
    records do not have; one renamed away from it would have renamed the label file's labels."""
    task = piqa(tmp_path, "1\n", rows=1, columns=columns)
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"goal": "g", "sol1": "a", "sol2": "b", **{k: 0 for k in columns}}) + "\n"
    )
    with pytest.raises(
        TaskDataError, match=r"has a column 'label' of its own \(or the card's `columns` renames"
    ):
        load_split(task, "train", tmp_path)


def test_predictions_never_replace_a_label_file(tmp_path):
    """A card whose test predictions are written where its labels are read (`--model.predictions_dir`
    the data folder) is refused before any work, as for its split files."""
    task = piqa(tmp_path, "0\n", splits={"train": "train.jsonl", "test": "train.jsonl[:1]"})
    task.sources.local.label_files = {"train": "piqa-test.tsv"}
    with pytest.raises(ValueError, match=r"piqa-test.tsv, the task's own 'train' split file"):
        check_submission(task, tmp_path, tmp_path)
