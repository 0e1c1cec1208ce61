import pytest

from gpt_ft.adapters import ChoiceHead, MultipleChoice, TaskDataError
from gpt_ft.data.tokenizer import SpecialTokenIds

SPECIALS = SpecialTokenIds(start=100, delim=101, extract=102, pad=103, eos=None)
START, DELIM, EXTRACT, PAD = 100, 101, 102, 103


def test_multiple_choice_layout_and_shared_truncated_context():
    mc = MultipleChoice(name="t", context=["story"], choices=["a", "b"], labels=["1", "2"])
    example = {"story": "x", "a": "y", "b": "z", "label": "2"}
    enc = mc.encode(example, [[1, 2, 3], [7], [8, 9]], SPECIALS, 512)
    assert enc.sequences == [[START, 1, 2, 3, DELIM, 7, EXTRACT], [START, 1, 2, 3, DELIM, 8, 9, EXTRACT]]
    assert enc.extract_index == [6, 7] and enc.label == 1
    assert mc.num_sequences == 2 and isinstance(mc.head(8, dropout=0.0, init_std=0.02), ChoiceHead)
    # Context 20 and longest answer 4 into a budget of 7: context 4, answers at most 3, the same
    # context tokens in every choice.
    enc = mc.encode(example, [list(range(1, 21)), [7], [8, 9, 10, 11]], SPECIALS, 10)
    assert enc.sequences == [
        [START, 1, 2, 3, 4, DELIM, 7, EXTRACT],
        [START, 1, 2, 3, 4, DELIM, 8, 9, 10, EXTRACT],
    ]
    assert all(len(s) <= 10 for s in enc.sequences)


def test_multiple_choice_texts_join_context_fields_and_read_list_fields():
    mc = MultipleChoice(name="race", context=["article", "question"], choices="options", num_choices=4)
    row = {"article": "A long story.", "question": "Who?", "options": ["Ann", "Bob", "Cy"], "label": 2}
    assert mc.texts(row) == ["A long story. Who?", "Ann", "Bob", "Cy"]
    with pytest.raises(TaskDataError, match="must hold a list of 1 to 4 choices"):
        mc.texts({**row, "options": "Ann"})
    with pytest.raises(TaskDataError, match="points past the row's 2 choices"):
        mc.encode({"label": 2}, [[1], [2], [3]], SPECIALS, 64)


def test_bad_cards():
    with pytest.raises(ValueError, match="num_choices. is required"):
        MultipleChoice(name="t", context=["c"], choices="options")
