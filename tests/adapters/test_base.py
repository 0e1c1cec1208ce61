import pytest

from gpt_ft.adapters import SingleText, TaskDataError, fit_lengths


def single(**kw):
    return SingleText(name="t", labels=["neg", "pos"], **kw)


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [([10, 3, 7], 12, [5, 3, 4]), ([4, 4], 20, [4, 4]), ([9, 9], 5, [3, 2]), ([0, 30], 10, [0, 10])],
)
def test_fit_lengths_cuts_longest_first(lengths, budget, expected):
    assert fit_lengths(lengths, budget) == expected


def test_labels_accept_names_and_integer_ids():
    task = single()
    assert [task.label_id(v) for v in ("neg", "pos", 0, 1, "1", " pos ")] == [0, 1, 0, 1, 1, 1]
    with pytest.raises(
        TaskDataError, match=r"label 'maybe' in field 'label' is not among the labels \['neg', 'pos'\]"
    ):
        task.label_id("maybe")
    with pytest.raises(TaskDataError, match="label 2 in field 'label'"):
        task.label_id(2)
    reg = SingleText(name="t", regression=True)
    with pytest.raises(TaskDataError, match="regression score 'high' in field 'label' is not a number"):
        reg.label_id("high")
    assert task.example_label({"label": -1}) is None and task.example_label({}) is None


def test_bad_cards():
    with pytest.raises(ValueError, match="unknown metric.*'bleu'.*allowed: accuracy"):
        single(metrics=["bleu"])
    with pytest.raises(ValueError, match="needs `labels`"):
        SingleText(name="t")
