import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt_ft.adapters import SingleText, TaskDataError, fit_lengths


def single(**kw):
    return SingleText(name="t", labels=["neg", "pos"], **kw)


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([10, 3, 7], 12, [5, 3, 4]),
        ([4, 4], 20, [4, 4]),
        ([9, 9], 5, [2, 3]),
        ([40, 30], 62, [32, 30]),
        ([30, 40], 61, [30, 31]),
        ([0, 30], 10, [0, 10]),
        ([12], 5, [5]),
    ],
)
def test_fit_lengths_cuts_longest_first(lengths, budget, expected):
    assert fit_lengths(lengths, budget) == expected


def word_tokenizer():
    """A word-level tokenizer with GPT-1's input transform as its post-processor."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {f"w{i}": i for i in range(100)} | {"[S]": 100, "[D]": 101, "[E]": 102, "[U]": 103}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[U]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = [("[S]", 100), ("[D]", 101), ("[E]", 102)]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[S] $A [E]", pair="[S] $A [D] $B [E]", special_tokens=specials
    )
    return tokenizer


TOKENIZER = word_tokenizer()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 60), st.integers(1, 60), st.integers(3, 70))
def test_fit_lengths_is_the_tokenizers_longest_first(n1, n2, max_length):
    """What the tokenizers library keeps of a pair (and of a single text) truncated to
    `max_length`, special tokens included, is what `fit_lengths` keeps."""
    TOKENIZER.enable_truncation(max_length, strategy="longest_first")
    a, b = " ".join(f"w{i}" for i in range(n1)), " ".join(f"w{i}" for i in range(n2))
    ids = TOKENIZER.encode(a, b).ids
    delim = ids.index(101)
    assert [delim - 1, len(ids) - delim - 2] == fit_lengths([n1, n2], max_length - 3)
    if max_length >= 2:
        assert [len(TOKENIZER.encode(a).ids) - 2] == fit_lengths([n1], max_length - 2)


def test_labels_accept_names_and_integer_ids():
    task = single()
    assert [task.output.label_id(v) for v in ("neg", "pos", 0, 1, "1", " pos ")] == [0, 1, 0, 1, 1, 1]
    with pytest.raises(
        TaskDataError, match=r"label 'maybe' in field 'label' is not among the labels \['neg', 'pos'\]"
    ):
        task.output.label_id("maybe")
    with pytest.raises(TaskDataError, match="label 2 in field 'label'"):
        task.output.label_id(2)
    # a name saved decomposed (e + U+0301, as some editors write it): the same label, not "not among"
    french = SingleText(name="f", labels=["positif", "n\u00e9gatif"])
    assert [french.output.label_id(v) for v in ("ne\u0301gatif", "n\u00e9gatif", "positif")] == [1, 1, 0]
    reg = SingleText(name="t", regression=True)
    with pytest.raises(TaskDataError, match="regression score 'high' in field 'label' is not a number"):
        reg.output.label_id("high")
    for boolean in (True, np.bool_(False)):  # JSON's true is no score (1.0); a class label is refused too
        with pytest.raises(
            TaskDataError, match=rf"^regression score {boolean!r} in field 'label' is not a number\.$"
        ):
            reg.output.label_id(boolean)
    assert reg.output.label_id(np.float32(2.5)) == 2.5
    assert task.output.example_label({"label": -1}) is None and task.output.example_label({}) is None


def test_bad_cards():
    with pytest.raises(ValueError, match="unknown metric.*'bleu'.*allowed: accuracy"):
        single(metrics=["bleu"])
    with pytest.raises(ValueError, match="needs `labels`"):
        SingleText(name="t")
