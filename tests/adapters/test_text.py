import pytest

from gpt_ft.adapters import RegressionHead, Similarity, SingleText, TextPair
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


def test_empty_texts_are_just_the_special_tokens():
    assert single().texts({"sentence": None}) == [""]
    assert single().encode({"label": 0}, [[]], SPECIALS, 512).sequences == [[START, EXTRACT]]
    pair = TextPair(name="t", labels=["a", "b"]).encode({}, [[], []], SPECIALS, 512)
    assert pair.sequences == [[START, DELIM, EXTRACT]] and pair.label is None


def test_a_text_that_spells_a_special_token_is_text(tokenizer_dir):
    """`<|extract|>` inside a sentence is not GPT-1's extract token, nor `<|endoftext|>` the end of a
    text (the tokenizer's default parses them), except in a chat's rendering (preference pairs),
    whose template's tokens are meant."""
    from gpt_ft.adapters import Preference
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

    tokenizer = load_tokenizer(tokenizer_dir)
    specials, eos = special_token_ids(tokenizer), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text = "the tag <|extract|> ends <|endoftext|> here"
    (enc,) = single().encode_examples([{"sentence": text, "label": "pos"}], tokenizer, specials, 64)
    (sequence,) = enc.sequences
    assert sequence.count(specials.extract) == 1 and sequence[-1] == specials.extract and eos not in sequence
    assert tokenizer.decode(sequence[1:-1]) == text
    row = {"prompt": "say", "chosen": " it <|endoftext|>", "rejected": " no"}
    (enc,) = Preference(name="p").encode_examples([row], tokenizer, specials, 64)
    assert eos in enc.sequences[0]


def test_a_card_that_strips_texts_reads_a_trailing_space_as_none(tokenizer_dir):
    """SST-2's training and validation sentences end in a space, its test sentences not: with a
    byte-level tokenizer a token stood before the extract token in training and never in test. Its
    card reads each text without the spaces around it; others keep them."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
    from tests.helpers import ROOT

    tokenizer = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tokenizer)
    sst2 = load_card(ROOT / "tasks" / "glue" / "sst2.yaml")
    assert sst2.strip_texts and not single().strip_texts

    def sequence(task, text: str) -> list[int]:
        (enc,) = task.encode_examples([{"sentence": text}], tokenizer, specials, 64)
        return enc.sequences[0]

    assert sequence(sst2, " a charming journey . ") == sequence(sst2, "a charming journey .")
    assert sequence(single(), "a charming journey . ") != sequence(single(), "a charming journey .")


def test_a_text_field_holding_a_list_or_mapping_is_refused(tokenizer_dir):
    """Its repr (`['the', 'cat']`) was trained on without a word; a number is its digits."""
    from gpt_ft.adapters import TaskDataError
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

    tokenizer = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tokenizer)
    rows = [{"sentence": 7, "label": "pos"}, {"sentence": ["the", "cat"], "label": "pos"}]
    with pytest.raises(
        TaskDataError, match=r"^example 1: field 'sentence' holds a list \['the', 'cat'\], not a text\.$"
    ):
        single().encode_examples(rows, tokenizer, specials, 64)
    (enc,) = single().encode_examples(rows[:1], tokenizer, specials, 64)
    assert tokenizer.decode(enc.sequences[0][1:-1]) == "7"


def test_numpy_values_read_as_python_values_do():
    """A pandas frame's rows hold numpy values: a float32 NaN is missing (not the text "nan"), an
    array is refused as a list is (not trained as its repr), numpy numbers are their digits."""
    import numpy as np

    from gpt_ft.adapters import TaskDataError
    from gpt_ft.adapters.sources import field_text

    assert [field_text(v) for v in (np.float32("nan"), np.float64(1.5), np.int64(3), np.str_("hi"))] == [
        "",
        "1.5",
        "3",
        "hi",
    ]
    with pytest.raises(TaskDataError, match=r"^field 'f' holds a ndarray array\(\['a', 'b'\]"):
        field_text(np.array(["a", "b"]), "f")


def test_pandas_missing_values_are_missing_and_half_a_surrogate_pair_is_refused():
    """pd.NA, NaT and Decimal's NaN were the texts "<NA>", "NaT" and "NaN"; a lone surrogate half
    (Python's JSON reads one from an escape) reached the tokenizer, which refused it without a word
    of which field; a list field's NumPy array (pandas' records) is its list."""
    from decimal import Decimal

    import numpy as np
    import pandas as pd

    from gpt_ft.adapters import TaskDataError
    from gpt_ft.adapters.embedding import negative_texts
    from gpt_ft.adapters.ranking import _as_list
    from gpt_ft.adapters.sources import field_text
    from gpt_ft.adapters.steps import Steps

    assert [field_text(v) for v in (pd.NA, pd.NaT, Decimal("NaN"), Decimal("2.5"), np.datetime64("NaT"))] == [
        "", "", "", "2.5", ""]  # fmt: skip
    with pytest.raises(
        TaskDataError, match=r"^field 'f' holds \\ud83d, half of a UTF-16 surrogate pair alone"
    ):
        field_text("broken \ud83d emoji", "f")
    assert field_text("whole \U0001f600") == "whole \U0001f600"
    assert negative_texts({"n": np.array(["x", "y"])}, "n", 2) == ["x", "y"]
    assert _as_list(np.array(["a", "b"]), "replies") == ["a", "b"]
    assert Steps(name="s", label="labels").step_texts({"steps": np.array(["a", "b"])}) == ["a", "b"]


def test_a_text_of_several_fields_reads_as_their_joined_text(tmp_path):
    """`text: [title, body]`: one text, the fields joined by a space and tokenized whole (no "▁"
    between them from a Llama 2-style tokenizer), stripped field by field; zero-shot reads the
    joined text and a template each field as it holds it; an export frames it as one text."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.eval.zeroshot import ZeroShot
    from tests.eval.test_zeroshot import sentencepiece_style_tokenizer

    tok = sentencepiece_style_tokenizer()
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert tok.convert_ids_to_tokens(ids(" too close"))[0] == "▁"  # the token the text never has
    task = single(text=["title", "body"], strip_texts=True)
    row = {"title": "the cat was ", "body": " too close", "label": "pos"}
    (enc,) = task.encode_examples([row], tok, SPECIALS, 64)
    assert enc.sequences == [[START, *ids("the cat was too close"), EXTRACT]] and enc.label == 1
    (enc,) = task.encode_examples([{**row, "title": ""}], tok, SPECIALS, 64)  # the body opens the text
    assert enc.sequences == [[START, *ids("too close"), EXTRACT]]
    assert ZeroShot(verbalizers=[" no", " yes"]).text(task, row) == "the cat was too close"
    assert (
        ZeroShot(verbalizers=[" no", " yes"], template="{body}: {title}").text(task, row)
        == "too close: the cat was"
    )
    assert task.template(("<s>", "<d>", "<e>"))[0] == "<s> $A <e>"  # one text: the single template
    pair = TextPair(
        name="wic", premise=["word", "sentence1"], hypothesis="sentence2", labels=["False", "True"]
    )
    row = {"word": "the", "sentence1": "cat was too close", "sentence2": "the edge", "label": True}
    (enc,) = pair.encode_examples([row], tok, SPECIALS, 64)
    assert enc.sequences == [[START, *ids("the cat was too close"), DELIM, *ids("the edge"), EXTRACT]]
    assert pair.text_fields() == ["word", "sentence1", "sentence2"] and enc.label == 1
    # cut as one text: the premise's end goes first, whichever field it is in
    (enc,) = pair.encode_examples([row], tok, SPECIALS, 3 + 2 + len(ids("the edge")))
    assert enc.sequences == [[START, *ids("the cat")[:2], DELIM, *ids("the edge"), EXTRACT]]
    card = tmp_path / "c.yaml"
    card.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args: {name: t, text: [title, body], labels: [a, b]}\n"
    )
    assert load_card(card).text_fields() == ["title", "body"]
    card.write_text(
        "class_path: gpt_ft.adapters.TextPair\ninit_args: {name: t, premise: [], labels: [a, b]}\n"
    )
    with pytest.raises(ValueError, match=r"Task 't': text 1 names no field\.$"):
        load_card(card)
