import pytest
import torch

from gpt_ft.adapters import (
    ChoiceHead,
    MultipleChoice,
    RegressionHead,
    Similarity,
    SingleText,
    TaskDataError,
    TextPair,
    fit_lengths,
)
from gpt_ft.data.batches import IGNORE_INDEX, collate
from gpt_ft.data.tokenizer import SpecialTokenIds

SPECIALS = SpecialTokenIds(start=100, delim=101, extract=102, pad=103, eos=None)
START, DELIM, EXTRACT, PAD = 100, 101, 102, 103


def single(**kw):
    return SingleText(name="t", labels=["neg", "pos"], **kw)


def test_single_text_layout():
    enc = single().encode({"label": "pos"}, [[5, 6, 7]], SPECIALS, 512)
    assert enc.sequences == [[START, 5, 6, 7, EXTRACT]]
    assert enc.extract_index == [4]
    assert enc.label == 1


def test_text_pair_layout_and_truncation_keeps_specials():
    pair = TextPair(name="t", labels=["entailment", "not_entailment"])
    enc = pair.encode({"label": "not_entailment"}, [[1, 2], [3]], SPECIALS, 512)
    assert enc.sequences == [[START, 1, 2, DELIM, 3, EXTRACT]] and enc.extract_index == [5] and enc.label == 1
    # 10 + 3 text tokens into a budget of 10 - 3 specials = 7: the longer premise is cut to 4.
    enc = pair.encode({"label": 0}, [list(range(1, 11)), [20, 21, 22]], SPECIALS, 10)
    assert enc.sequences == [[START, 1, 2, 3, 4, DELIM, 20, 21, 22, EXTRACT]]
    assert enc.extract_index == [9]


def test_similarity_gives_both_orders():
    sim = Similarity(name="t", regression=True, score_range=(0, 5))
    enc = sim.encode({"label": "3.800"}, [[1, 2], [3]], SPECIALS, 512)
    assert enc.sequences == [[START, 1, 2, DELIM, 3, EXTRACT], [START, 3, DELIM, 1, 2, EXTRACT]]
    assert enc.extract_index == [5, 5]
    assert enc.label == pytest.approx(3.8)
    assert sim.num_sequences == 2 and isinstance(sim.head(8, dropout=0.0, init_std=0.02), RegressionHead)


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


def test_empty_texts_are_just_the_special_tokens():
    assert single().texts({"sentence": None}) == [""]
    assert single().encode({"label": 0}, [[]], SPECIALS, 512).sequences == [[START, EXTRACT]]
    pair = TextPair(name="t", labels=["a", "b"]).encode({}, [[], []], SPECIALS, 512)
    assert pair.sequences == [[START, DELIM, EXTRACT]] and pair.label is None


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
    with pytest.raises(ValueError, match="num_choices. is required"):
        MultipleChoice(name="t", context=["c"], choices="options")


def test_collate_right_padding_hand_checked():
    examples = [
        {"input_ids": [[START, 5, 6, EXTRACT]], "extract_index": [3], "label": 1, "index": 7},
        {"input_ids": [[START, 7, EXTRACT]], "extract_index": [2], "label": 0, "index": 9},
    ]
    batch = collate(examples, PAD)
    X = IGNORE_INDEX
    assert batch.input_ids.tolist() == [[[START, 5, 6, EXTRACT]], [[START, 7, EXTRACT, PAD]]]
    assert batch.attention_mask.tolist() == [[[1, 1, 1, 1]], [[1, 1, 1, 0]]]
    assert batch.lm_targets.tolist() == [[[5, 6, EXTRACT, X]], [[7, EXTRACT, X, X]]]
    assert batch.extract_index.tolist() == [[3], [2]]
    assert batch.labels.tolist() == [1, 0] and batch.labels.dtype == torch.long
    assert batch.index.tolist() == [7, 9]
    assert batch.choice_mask.tolist() == [[True], [True]]


def test_collate_left_padding_moves_the_extract_index():
    examples = [
        {"input_ids": [[START, 5, 6, EXTRACT]], "extract_index": [3], "label": 0.5, "index": 0},
        {"input_ids": [[START, 7, EXTRACT]], "extract_index": [2], "label": 2.0, "index": 1},
    ]
    batch = collate(examples, PAD, padding_side="left")
    X = IGNORE_INDEX
    assert batch.input_ids.tolist() == [[[START, 5, 6, EXTRACT]], [[PAD, START, 7, EXTRACT]]]
    assert batch.lm_targets.tolist() == [[[5, 6, EXTRACT, X]], [[X, 7, EXTRACT, X]]]
    assert batch.extract_index.tolist() == [[3], [3]]
    ids = batch.input_ids
    assert all(ids[b, 0, batch.extract_index[b, 0]] == EXTRACT for b in range(2))
    assert batch.labels.dtype == torch.float


def test_collate_multiple_choice_with_a_missing_choice():
    examples = [
        {
            "input_ids": [[START, 1, EXTRACT], [START, 2, EXTRACT], [START, 3, EXTRACT]],
            "extract_index": [2, 2, 2],
            "label": 2,
            "index": 0,
        },
        {
            "input_ids": [[START, 4, EXTRACT], [START, 5, 6, EXTRACT]],
            "extract_index": [2, 3],
            "label": 0,
            "index": 1,
        },
    ]
    batch = collate(examples, PAD)
    assert batch.input_ids.shape == (2, 3, 4)
    assert batch.choice_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.input_ids[1, 2].tolist() == [PAD] * 4
    assert batch.lm_targets[1, 2].tolist() == [IGNORE_INDEX] * 4
    assert batch.extract_index.tolist() == [[2, 2, 2], [2, 3, 0]]


def test_collate_without_labels_has_no_labels_key():
    batch = collate([{"input_ids": [[START, EXTRACT]], "extract_index": [1], "label": None, "index": 0}], PAD)
    assert batch.labels is None
