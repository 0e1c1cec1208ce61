"""Learning-curve subsets: class-stratified, seeded, the same rows whatever trains on them, drawn
from the training split only, and the whole split where it has no more rows."""

import json
import random

import pytest

from gpt_ft.data.subsets import stratified_subset
from gpt_ft.data.task_data import TaskDataModule
from tests.helpers import TASKS, write_rows


def test_each_class_keeps_its_share():
    labels = ["a"] * 90 + ["b"] * 10
    chosen = stratified_subset(labels, 20, seed=0)
    assert len(chosen) == 20 and sorted(chosen) == chosen
    assert [labels[i] for i in chosen].count("b") == 2
    # 50/30/20 at 7 rows: floors 3, 2, 1; the one left goes to the largest remainder (a's 0.5)
    labels = ["c"] * 20 + ["a"] * 50 + ["b"] * 30
    picked = [labels[i] for i in stratified_subset(labels, 7, seed=3)]
    assert (picked.count("a"), picked.count("b"), picked.count("c")) == (4, 2, 1)


def test_a_class_of_at_least_n_over_size_rows_is_never_left_out():
    labels = ["big"] * 95 + ["small"] * 5
    for seed in range(20):
        picked = [labels[i] for i in stratified_subset(labels, 20, seed)]
        assert picked.count("small") == 1


def test_seeded_and_larger_sizes_mean_the_whole_split():
    labels = [i % 3 for i in range(60)]
    assert stratified_subset(labels, 12, seed=5) == stratified_subset(labels, 12, seed=5)
    assert stratified_subset(labels, 12, seed=5) != stratified_subset(labels, 12, seed=6)
    assert stratified_subset(labels, 60, seed=0) == stratified_subset(labels, 600, seed=1) == list(range(60))
    with pytest.raises(ValueError, match="train_size must be a positive number of examples, got 0"):
        stratified_subset(labels, 0, seed=0)


def test_real_valued_labels_are_stratified_by_quintile():
    labels = [i / 10 + 0.05 for i in range(50)]  # 0.05 ... 4.95
    chosen = stratified_subset(labels, 10, seed=0)
    assert sorted(int(labels[i] * 10) // 10 for i in chosen) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # Scores as a TSV cell holds them (STS-B's "3.800"): the same quintiles, the same rows; a row
    # without a score is a stratum of its own. As texts they were each a class of one, and the
    # lowest scores were kept whatever the seed.
    texts = [f"{x:.3f}" for x in labels]
    for seed in (0, 1):
        assert stratified_subset(texts, 10, seed) == stratified_subset(labels, 10, seed)
    assert stratified_subset(texts, 10, 0) != stratified_subset(texts, 10, 1)
    chosen = stratified_subset([*texts, ""], 10, seed=0)
    assert sorted(int(float(texts[i]) * 10) // 10 for i in chosen) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_labels_that_are_lists_are_drawn_at_random_not_in_their_texts_order():
    """A step's labels or a ranking's scores: one stratum, a seeded draw (ordered by their texts,
    the first rows would all be "[0, ...]")."""
    labels = [[i % 2, 1] for i in range(100)]
    chosen = stratified_subset(labels, 10, seed=0)
    assert chosen == sorted(random.Random(0).sample(range(100), 10))


def test_a_solutions_tagged_steps_are_no_class_and_their_subset_is_one_seeded_draw(tmp_path, tokenizer_dir):
    """Math-Shepherd's label is the solution again with each step tagged: a text per row, no class.
    Taken for classes, every row was a stratum of its own and the rows whose texts sort first were
    kept, whatever the seed."""
    from gpt_ft.adapters.cards import load_card

    words = ["zebra", "apple", "mango", "kiwi", "banana"] * 10
    rows = [
        {"input": f"{w} {i} ? Step 1: a ки\nStep 2: b ки", "label": f"{w} {i} ? Step 1: a +\nStep 2: b -"}
        for i, w in enumerate(words)
    ]
    (tmp_path / "math-shepherd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = load_card(TASKS / "steps" / "math_shepherd.yaml")
    whole = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path)).encoded("train", labelled=True)
    assert len(whole) == 49  # the card's first 98%
    for seed in (0, 1):
        module = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), train_size=6, seed=seed)
        drawn = sorted(random.Random(seed).sample(range(49), 6))
        assert module.encoded("train", labelled=True)["input_ids"] == [whole["input_ids"][i] for i in drawn]


def test_the_data_module_subsets_the_training_split_only_and_alike_for_every_model(tmp_path, tokenizer_dir):
    """Two data modules that differ in what the model sees (max_length, batch size) draw the same
    training rows at one seed; the validation split is whole."""
    from gpt_ft.adapters import SingleText
    from gpt_ft.adapters.base import LocalFiles

    rows = [[i, f"sentence number {i} .", int(i % 4 == 0)] for i in range(40)]  # 10 positives
    for split in ("train", "dev"):
        write_rows(tmp_path / f"{split}.tsv", ["index", "sentence", "label"], rows)
    task = SingleText(name="t", labels=["0", "1"], local=LocalFiles(splits={"train": "train.tsv",
                      "validation": "dev.tsv"}))  # fmt: skip

    def module(**kw):
        return TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), train_size=8, seed=1, **kw)

    a, b = module(max_length=64), module(max_length=128, batch_size=2)
    train_a, train_b = a.encoded("train", labelled=True), b.encoded("train", labelled=True)
    assert train_a["input_ids"] == train_b["input_ids"] and len(train_a) == 8
    assert train_a["label"].count(1) == 2  # a quarter positive, as in the split
    assert len(a.encoded("validation", labelled=True)) == 40
    other_seed = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), train_size=8, seed=2)
    assert other_seed.encoded("train", labelled=True)["input_ids"] != train_a["input_ids"]
    with pytest.raises(ValueError, match="train_size must be a positive number of examples, got -1"):
        TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), train_size=-1)


def test_labels_spelled_as_names_or_as_indices_give_the_same_subset(tmp_path, tokenizer_dir):
    """A card's label is a name in `labels` or its index: SNLI's release file (names) and the hub's
    (0, 1, 2) drew different rows at one seed, the classes taken in their spellings' order."""
    from gpt_ft.adapters import SingleText
    from gpt_ft.adapters.base import LocalFiles

    names = ["entailment", "neutral", "contradiction"]
    drawn = []
    for spelled in (lambda k: names[k], lambda k: k):
        rows = [[i, f"sentence number {i} .", spelled((i * 7) % 3)] for i in range(30)]
        write_rows(tmp_path / "train.tsv", ["index", "sentence", "label"], rows)
        task = SingleText(name="t", labels=names, local=LocalFiles(splits={"train": "train.tsv"}))
        data = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), train_size=9, seed=0)
        drawn.append(data.encoded("train", labelled=True)["index"])
    assert drawn[0] == drawn[1] and len(drawn[0]) == 9


def test_a_bad_label_is_refused_whatever_the_subset_draws(tmp_path, tokenizer_dir):
    """A label no class of the card's, or none, in a row the subset leaves out: refused with its line
    as in the whole split (a stratum of its own, of quota 0, it was never encoded nor checked)."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.errors import TaskDataError
    from tests.helpers import make_task

    card = load_card(make_task("single", tmp_path))
    train = tmp_path / "d" / "train.tsv"
    for bad, problem in (
        ("maybe", "label 'maybe' in field 'label' is not among the labels"),
        ("", "no label"),
    ):
        lines = train.read_text().splitlines()
        lines[4] = "\t".join([*lines[4].split("\t")[:2], bad])
        train.write_text("\n".join(lines) + "\n")
        module = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), train_size=2, seed=0)
        with pytest.raises(TaskDataError, match=f"^{train}, line 5: {problem}"):
            module.encoded("train", labelled=True)


def test_a_rankings_subset_is_one_seeded_draw_of_its_size():
    """A ranking's label is its replies' scores, no class: row 0, taken for a row without a class,
    was added to every draw (4 rows for 3 on some seeds)."""
    import datasets

    from gpt_ft.adapters import Ranking
    from gpt_ft.data.subsets import training_subset

    task = Ranking(name="r", prompt="prompt", replies="replies", scores="scores")
    rows = [{"prompt": f"p{i}", "replies": ["a", "b"], "scores": [1.0, float(i % 2)]} for i in range(10)]
    raw = datasets.Dataset.from_list(rows)
    for seed in range(4):
        assert training_subset(task, raw, 3, seed) == sorted(random.Random(seed).sample(range(10), 3))
