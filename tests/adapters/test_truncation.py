"""Which examples `max_length` cuts, and the line that counts them per split."""

import logging

from gpt_ft.adapters import (
    Embedding,
    MultipleChoice,
    Preference,
    Ranking,
    Reranker,
    Similarity,
    SingleText,
    Steps,
    TextPair,
)
from gpt_ft.adapters.truncation import ALIKE, CUT, TRAINED, WHOLE, cut_report
from gpt_ft.data.task_data import TaskDataModule
from gpt_ft.data.tokenizer import SpecialTokenIds
from tests.helpers import BAD, GOOD, make_task

SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)


class Words:
    """A tokenizer of texts like "w4 w7": each word is its number."""

    def __call__(self, texts, **_):
        return {"input_ids": [[int(w[1:]) for w in text.split()] for text in texts]}


def words(*numbers: int) -> str:
    return " ".join(f"w{n}" for n in numbers)


def kinds(task, examples: list[dict], max_length: int) -> list[int]:
    return [enc.cut for enc in task.encode_examples(examples, Words(), SPECIALS, max_length)]


def test_an_example_that_fills_max_length_exactly_is_whole():
    single = SingleText(name="s", labels=["a", "b"])
    four, five = {"sentence": words(10, 11, 12, 13)}, {"sentence": words(10, 11, 12, 13, 14)}
    assert kinds(single, [four, five, {"sentence": words(10)}], max_length=6) == [WHOLE, CUT, WHOLE]
    pair = TextPair(name="p", premise="a", hypothesis="b", labels=["x", "y"])
    fits, over = {"a": words(10, 11), "b": words(12, 13)}, {"a": words(10, 11), "b": words(12, 13, 14)}
    assert kinds(pair, [fits, over], max_length=7) == [WHOLE, CUT]
    similar = Similarity(name="t", first="a", second="b", regression=True)
    assert kinds(similar, [fits, over], max_length=7) == [WHOLE, CUT]  # both orders, as long


def test_choices_that_differ_only_past_the_cut_are_alike():
    mc = MultipleChoice(name="m", context=["story"], choices=["a", "b"], labels=["1", "2"])
    story = words(*range(10, 30))
    # a budget of 7: the context keeps 4 tokens, each answer 3 of its 4
    tails = {"story": story, "a": words(40, 41, 42, 43), "b": words(40, 41, 42, 44)}
    heads = {"story": story, "a": words(40, 41, 42, 43), "b": words(50, 41, 42, 43)}
    same = {"story": story, "a": words(40), "b": words(40)}  # alike whole: nothing cut made them so
    assert kinds(mc, [tails, heads, same], max_length=10) == [ALIKE, CUT, CUT]


def test_sequences_that_stand_for_one_thing_may_become_alike():
    """Two wrong choices, two replies of one score, two negatives: alike once cut, nothing lost."""
    mc = MultipleChoice(name="m", context=["story"], choices=["a", "b", "c"], labels=["1", "2", "3"])
    story, long = words(*range(10, 30)), words(40, 41, 42)  # a budget of 7: answers keep 3 tokens
    row = {"story": story, "a": f"{long} w43", "b": f"{long} w44", "c": words(50)}
    assert kinds(mc, [row | {"label": "3"}, row | {"label": "1"}], max_length=10) == [CUT, ALIKE]
    ranking = Ranking(name="r", max_replies=3)
    row = {"prompt": words(10), "replies": [f"{long} w43", f"{long} w44", words(50)]}
    tie, ordered = row | {"scores": [1, 1, 0]}, row | {"scores": [2, 1, 0]}
    assert kinds(ranking, [tie, ordered, row | {"scores": [1, None, 0]}], max_length=7) == [CUT, ALIKE, ALIKE]
    rerank = Reranker(name="q", negatives=["n1", "n2"])
    row = {"query": words(10), "positive": words(50), "n1": f"{long} w43", "n2": f"{long} w44"}
    assert kinds(rerank, [row, row | {"positive": f"{long} w45"}], max_length=7) == [CUT, ALIKE]
    embed = Embedding(name="e", negatives=["n1", "n2"])
    row = {"anchor": words(1), "positive": words(2), "n1": f"{long} w43", "n2": f"{long} w44"}
    assert kinds(embed, [row, row | {"positive": f"{long} w45"}], max_length=5) == [CUT, ALIKE]


def test_replies_alike_once_cut_and_a_text_past_its_room():
    pairs = Preference(name="p", prompt="prompt")
    long = words(*range(20, 30))
    rows = [
        {"prompt": words(10), "chosen": f"{long} w7", "rejected": f"{long} w8"},
        {"prompt": words(*range(10, 20)), "chosen": words(7), "rejected": words(8)},  # the prompt alone
    ]
    assert kinds(pairs, rows, max_length=12) == [ALIKE, CUT]
    embed = Embedding(name="e")  # [start] text [extract]: 3 tokens of each text at max_length 5
    rows = [{"anchor": words(1, 2, 3), "positive": words(5)}, {"anchor": words(1, 2, 3, 4), "positive": "w5"}]
    rows.append({"anchor": words(1, 2, 3, 4), "positive": words(1, 2, 3, 5)})  # a positive alike the anchor
    assert kinds(embed, rows, max_length=5) == [WHOLE, CUT, ALIKE]
    steps = Steps(name="s", label="labels", max_steps=4)
    row = {"problem": words(10, 11, 12), "steps": [words(20), words(30)], "labels": [1, 0]}
    assert kinds(steps, [row], max_length=9) == [WHOLE] and kinds(steps, [row], max_length=8) == [CUT]


def test_the_line_counts_the_cut_and_the_alike():
    assert cut_report("rte train", [WHOLE, WHOLE], 64) is None
    assert cut_report("rte train", [WHOLE, CUT, ALIKE, WHOLE], 64) == (
        "rte train: 2 of 4 examples (50.0%) are longer than max_length 64 and are cut; in 1 of them two of "
        "their sequences (choices, replies, texts) become the same tokens, which no model can tell apart: "
        "raise --data.max_length."
    )
    assert cut_report("f.tsv", [ALIKE], 64, remedy=TRAINED).endswith(
        "tell apart: a model reads at most the max_length it was trained at: train one at a larger "
        "--data.max_length."
    )
    assert cut_report("sst2 validation", [CUT] + [WHOLE] * 2999, 128) == (
        "sst2 validation: 1 of 3,000 examples (<0.1%) are longer than max_length 128 and are cut."
    )
    assert "2,999 of 3,000 examples (>99.9%)" in cut_report("t", [CUT] * 2999 + [WHOLE], 8)
    assert "3 of 3 examples (100.0%)" in cut_report("t", [CUT] * 3, 8)


def test_the_data_module_says_how_many_of_a_split_it_cut(tmp_path, tokenizer_dir, caplog):
    card = make_task("single", tmp_path)  # even rows: 10 tokens; odd: 9
    data = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path))
    assert [len(data.tokenizer(t)["input_ids"]) for t in (BAD, GOOD)] == [10, 9]
    caplog.set_level(logging.INFO)
    for _ in range(2):  # encoded, then read from the cache: said both times
        caplog.clear()
        data = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), max_length=11)
        data.setup("fit")
        assert [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()] == [
            "sent train: 3 of 6 examples (50.0%) are longer than max_length 11 and are cut.",
            "sent validation: 3 of 5 examples (60.0%) are longer than max_length 11 and are cut.",
        ]
        assert data.encoded("train", labelled=True)["cut"] == [CUT, WHOLE] * 3
    caplog.clear()
    TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), max_length=12).setup("fit")
    assert not [r for r in caplog.records if "max_length" in r.getMessage()]


def test_alike_sequences_at_the_models_whole_context_are_not_told_to_raise_it(
    tmp_path, tokenizer_dir, caplog
):
    """A max_length that is the model's context cannot be raised: the line says so (it advised raising it)."""
    from types import SimpleNamespace

    card = make_task("choice", tmp_path)  # at max_length 6 the two endings become one "He"
    caplog.set_level(logging.INFO)
    for context, remedy in [
        (64, "raise --data.max_length."),
        (6, "max_length 6 is the model's context: shorten the texts."),
    ]:
        data = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), max_length=6)
        model = SimpleNamespace(gpt=SimpleNamespace(config=SimpleNamespace(n_positions=context)))
        data.trainer = SimpleNamespace(lightning_module=model)  # (as fit attaches one)
        caplog.clear()
        data.encoded("train", labelled=True)
        said = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
        assert said == [f"mc train: 6 of 6 examples (100.0%) are longer than max_length 6 and are cut; in 6 "
                        "of them two of their sequences (choices, replies, texts) become the same tokens, "
                        f"which no model can tell apart: {remedy}"]  # fmt: skip
