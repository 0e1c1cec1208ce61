import inspect
import json
import os
import signal
import time

import datasets
import pytest
import torch
from torch.utils.data import Dataset

from gpt_ft.adapters import LocalFiles, Similarity, SingleText, TaskDataError, TextPair
from gpt_ft.data.task_data import TaskDataModule
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from tests.helpers import trainer_on


def pair_task(**local) -> TextPair:
    files = dict(splits={"train": "PAIRS/train.tsv", "validation": "PAIRS/dev.tsv", "test": "PAIRS/test.tsv"})
    return TextPair(
        name="pairs",
        premise="sentence1",
        hypothesis="sentence2",
        labels=["entailment", "not_entailment"],
        local=LocalFiles(**{**files, "columns": {"index": "idx"}, **local}),
    )


def test_encodes_local_tsv_exactly(pairs_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    tok = load_tokenizer(tokenizer_dir)
    ids = special_token_ids(tok)
    assert (dm.vocab_size, dm.task.output.num_outputs, dm.task.num_sequences) == (len(tok), 2, 1)
    train = dm.encoded("train", labelled=True)
    assert len(train) == 3 and train["label"] == [0, 1, 0] and train["index"] == [0, 1, 2]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    # The unbalanced quote stays part of the sentence (TSVs are read without quoting).
    assert train[1]["input_ids"] == [
        [ids.start, *enc('He said "yes.'), ids.delim, *enc("No dogs."), ids.extract]
    ]
    assert train[2]["input_ids"] == [[ids.start, ids.delim, *enc("Empty premise."), ids.extract]]
    for example in train:
        (seq,), (k,) = example["input_ids"], example["extract_index"]
        assert seq[k] == ids.extract and k == len(seq) - 1
    test = dm.encoded("test", labelled=False)
    assert test["label"] == [None, None] and test["index"] == [5, 6]


def test_a_card_from_python_as_a_file_or_mappings_reads_as_the_adapter_does(pairs_dir, tokenizer_dir):
    """TaskDataModule takes a card's file (or class_path + init_args) and an adapter its `local=`
    and `hub=` as mappings, as the command line reads them; their faults are one sentence."""
    import yaml

    files = {"splits": {"train": "PAIRS/train.tsv"}, "columns": {"index": "idx"}}
    init = dict(
        name="pairs", premise="sentence1", hypothesis="sentence2", labels=["entailment", "not_entailment"]
    )
    card = pairs_dir / "pairs.yaml"
    card.write_text(
        yaml.safe_dump({"class_path": "gpt_ft.adapters.TextPair", "init_args": {**init, "local": files}})
    )
    expected = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir)).encoded(
        "train", labelled=True
    )
    for task in (str(card), card, yaml.safe_load(card.read_text()), TextPair(**init, local=files)):
        data = TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir))
        assert isinstance(data.task.local, LocalFiles)
        assert data.encoded("train", labelled=True)["input_ids"] == expected["input_ids"]
    with pytest.raises(ValueError, match=r"^local has no field 'split'; its fields: splits, format, "):
        TextPair(**init, local={"split": files["splits"]})
    with pytest.raises(ValueError, match=r"^hub needs path\.$"):
        TextPair(**init, hub={"name": "rte"})
    with pytest.raises(FileNotFoundError, match=r"^Task card .*nope.yaml does not exist\.$"):
        TaskDataModule(str(pairs_dir / "nope.yaml"), tokenizer_dir)


def test_batches_from_the_loaders(pairs_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), batch_size=2, max_length=64)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()[0]))
    assert batch.extract_index.shape == (1, 1) and batch.labels.tolist() == [0]
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()[0]))
    assert batch.index.tolist() == [5, 6] and batch.labels is None


def test_the_loaders_pin_their_batches_for_a_gpu_only(pairs_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), batch_size=2, max_length=64)
    dm.setup("fit")
    dm.setup("predict")
    for device, pinned in [("cpu", False), ("cuda", True)]:
        dm.trainer = trainer_on(device)
        loaders = [dm.train_dataloader(), *dm.val_dataloader(), *dm.predict_dataloader()]
        assert [loader.pin_memory for loader in loaders] == [pinned] * 3


class SignalledInTheWorker(Dataset):
    """Its one item sends SIGTERM to the process reading it (a scheduler's kill of a job)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # (where the signal ends the worker, it has ended)
        return i


def test_loader_workers_leave_sigterm_to_the_main_process(pairs_dir, tokenizer_dir):
    """torch's workers die on SIGTERM, and a kill of the job then failed the run ("DataLoader worker
    is killed by signal") before it saved: every loader's workers ignore it, the main process stops."""
    from torch.utils.data import DataLoader

    from gpt_ft.data.pinning import leave_stops_to_the_main_process

    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"):
        list(DataLoader(SignalledInTheWorker(), num_workers=1))
    quiet = leave_stops_to_the_main_process
    got = list(DataLoader(SignalledInTheWorker(), num_workers=1, worker_init_fn=quiet))
    assert got == [torch.tensor(0)]
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), batch_size=2, num_workers=1)
    dm.setup("fit")
    dm.setup("predict")
    loaders = [dm.train_dataloader(), *dm.val_dataloader(), *dm.predict_dataloader()]
    assert {loader.worker_init_fn for loader in loaders} == {quiet}


def test_loader_workers_started_afresh_take_the_examples_alone(pairs_dir, tokenizer_dir):
    """A worker started afresh (spawn, and forkserver: Python 3.14's default) takes its loader's
    dataset and collate function pickled; the collate function was the data module's own, which
    brought its trainer and model along (a model's activation is a lambda: no pickle at all)."""
    import dataclasses
    import pickle

    from gpt_ft.data.batches import collate_batch
    from tests.helpers import trainer_on

    def fields(batch) -> dict:
        return {k: v.tolist() if torch.is_tensor(v) else v for k, v in dataclasses.asdict(batch).items()}

    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), batch_size=2, num_workers=1)
    dm.trainer = trainer_on("cpu")
    dm.trainer.model = lambda x: x  # what a fit attaches: no pickle
    dm.setup("fit")
    for split, loader in zip(("train", "validation"), (dm.train_dataloader(), *dm.val_dataloader())):
        dataset, collate = pickle.loads(pickle.dumps((loader.dataset, loader.collate_fn)))
        examples = [loader.dataset[i] for i in range(len(dataset))]
        expected = fields(collate_batch(examples, dm.special_ids, packing=True, split=split))
        assert fields(collate(list(dataset))) == fields(loader.collate_fn(examples)) == expected


def test_similarity_encodes_two_sequences(pairs_dir, tokenizer_dir):
    task = Similarity(
        name="sim",
        labels=["entailment", "not_entailment"],
        local=LocalFiles(splits={"train": "PAIRS/train.tsv"}, columns={"index": "idx"}),
    )
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    row = dm.encoded("train", labelled=True)[0]
    a, b = row["input_ids"]
    assert len(a) == len(b) and a != b and row["extract_index"] == [len(a) - 1] * 2


@pytest.mark.parametrize(
    ("setup", "split", "message"),
    [
        (
            lambda d: (d / "PAIRS/dev.tsv").unlink(),
            "validation",
            r"PAIRS/dev.tsv: file not found \(split 'validation'",
        ),
        (lambda d: (d / "PAIRS/dev.tsv").write_text(""), "validation", r"PAIRS/dev.tsv: file is empty"),
        (
            lambda d: (d / "PAIRS/dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n"),
            "validation",
            r"split 'validation' has no examples",
        ),
        (
            lambda d: (d / "PAIRS/dev.tsv").write_text("index\tsentence1\tlabel\n0\ta\tentailment\n"),
            "validation",
            r"PAIRS/dev.tsv: missing column\(s\) \['sentence2'\] needed by task 'pairs'",
        ),
        (
            lambda d: (d / "PAIRS/dev.tsv").write_text(
                "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n"
            ),
            "validation",
            r"PAIRS/dev.tsv, line 2: label 'maybe' in field 'label' is not among the labels",
        ),
        (
            lambda d: (d / "PAIRS/dev.tsv").write_text(
                "index\tsentence1\tsentence2\tlabel\n7\ta\tb\tentailment\n8\tc\td\tentailment\n"
                "7\te\tf\tentailment\n"
            ),
            "validation",
            r"PAIRS/dev.tsv, line 4 repeats the index of \S+PAIRS/dev.tsv, line 2 \(7\): each example needs",
        ),
        (
            lambda d: None,
            "test",
            r"PAIRS/test.tsv: missing column 'label' \(the labels\); split 'test' is used for training or "
            r"evaluation, so every example needs one; the file has \['index', 'sentence1', 'sentence2'\]\.$",
        ),
        (
            lambda d: (d / "PAIRS/dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\t\n"),
            "validation",
            r"PAIRS/dev.tsv, line 2: no label \(field .label.\); split .validation. is used",
        ),
        (lambda d: None, "dev", r"no local split 'dev'; its card defines \['test', 'train', 'validation'\]"),
    ],
)
def test_bad_data_is_one_clear_sentence(pairs_dir, tokenizer_dir, setup, split, message):
    setup(pairs_dir)
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    with pytest.raises(TaskDataError, match=message):
        dm.encoded(split, labelled=True)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            "0\ta\tb\tmaybe\n",
            "PAIRS/dev.tsv, line 2: label 'maybe' in field 'label' is not among the labels ['entailment', "
            "'not_entailment'] ('label' is the column 'gold', renamed by the card's `columns`).",
        ),
        (
            "0\ta\tb\t\n",
            "PAIRS/dev.tsv, line 2: no label (field 'label'); split 'validation' is used for training or "
            "evaluation, so every example needs one ('label' is the column 'gold', renamed by the card's "
            "`columns`).",
        ),
    ],
)
def test_errors_name_the_column_a_renamed_field_is_read_from(pairs_dir, tokenizer_dir, rows, message):
    """Where the card's `columns` reads a field from a column of another name, a message about the
    field names that column too: the user looks for it in the file."""
    (pairs_dir / "PAIRS/dev.tsv").write_text("idx\tfirst\tsentence2\tgold\n" + rows)
    task = pair_task(columns={"idx": "index", "first": "sentence1", "gold": "label"})
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    with pytest.raises(TaskDataError) as raised:
        dm.encoded("validation", labelled=True)
    assert str(raised.value) == f"{pairs_dir / message}"
    (pairs_dir / "PAIRS/dev.tsv").write_text("idx\tfirst\tsentence2\n" + rows.rsplit("\t", 1)[0] + "\n")
    with pytest.raises(TaskDataError, match=r"dev.tsv: missing column 'gold' \(the labels\); .* the file has "
                       r"\['idx', 'first', 'sentence2'\]\.$"):  # fmt: skip
        TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir)).encoded("validation", labelled=True)
    (pairs_dir / "PAIRS/dev.tsv").write_text("idx\tsecond\tsentence2\tgold\n" + rows)
    with pytest.raises(TaskDataError, match=r"missing column\(s\) \['first'\] needed by task 'pairs'; the "
                       r"file has \['idx', 'second', 'sentence2', 'gold'\]\.$"):  # fmt: skip
        TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir)).encoded("validation", labelled=True)
    # a column the card renames away from the field read: said (it read "missing 'sentence2'; the file has
    # ['sentence2', ...]")
    away = pair_task(columns={"idx": "index", "first": "sentence1", "gold": "label", "sentence2": "other"})
    (pairs_dir / "PAIRS/dev.tsv").write_text("idx\tfirst\tsentence2\tgold\n" + rows)
    said = r"\['idx', 'first', 'sentence2' \(read as 'other': the card's `columns`\), 'gold'\]"
    with pytest.raises(
        TaskDataError,
        match=rf"missing column\(s\) \['sentence2'\] needed by task 'pairs'; the file has {said}\.$",
    ):
        TaskDataModule(away, tokenizer_dir, data_dir=str(pairs_dir)).encoded("validation", labelled=True)
    away = pair_task(
        columns={"idx": "index", "first": "sentence1", "label": "other"}
    )  # the labels' column too
    (pairs_dir / "PAIRS/dev.tsv").write_text("idx\tfirst\tsentence2\tlabel\n" + rows)
    said = r"\['idx', 'first', 'sentence2', 'label' \(read as 'other': the card's `columns`\)\]"
    with pytest.raises(
        TaskDataError, match=rf"missing column 'label' \(the labels\); .* the file has {said}\.$"
    ):
        TaskDataModule(away, tokenizer_dir, data_dir=str(pairs_dir)).encoded("validation", labelled=True)


@pytest.mark.parametrize("first", ["q-7", "123456789012345678901234", "007", "1_0"])
def test_ids_that_are_not_all_integers_number_the_rows(pairs_dir, tokenizer_dir, first):
    """A text id (ProcessBench's "gsm8k-0", a zero-padded "007", which int() read as 7, another row's)
    or one past 64 bits: every row is numbered, not that row alone (its number was another row's id,
    refused as a repeat), nothing overflows, and predictions are named by the ids as written."""
    rows = "index\tsentence1\tsentence2\tlabel\n" + "".join(
        f"{i}\t{a}\t{b}\tentailment\n" for i, a, b in ((first, "a", "b"), (0, "c", "d"), (7, "e", "f"))
    )
    (pairs_dir / "PAIRS/dev.tsv").write_text(rows)
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    assert dm.encoded("validation", labelled=True)["index"] == [0, 1, 2]
    (pairs_dir / "PAIRS/dev.tsv").write_text(rows.replace(first, "5"))
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    assert dm.encoded("validation", labelled=True)["index"] == [5, 0, 7]
    # A test split's predictions are written under its ids as the file has them.
    (pairs_dir / "PAIRS/test.tsv").write_text(rows)
    assert dm.encoded("test", labelled=False)["index"] == [0, 1, 2]
    assert dm.id_names["test"] == {0: first, 1: "0", 2: "7"}


def test_text_ids_that_cannot_name_a_prediction(pairs_dir, tokenizer_dir):
    """A blank id numbers the rows (and says so); a text id given twice is refused, naming both lines."""
    head = "index\tsentence1\tsentence2\tlabel\n"
    (pairs_dir / "PAIRS/test.tsv").write_text(head + "q-1\ta\tb\t\n \tc\td\t\n")
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    said = r"PAIRS/test.tsv, line 3: index ' ' names no prediction, so the predictions of this split number"
    with pytest.warns(UserWarning, match=said):
        assert dm.encoded("test", labelled=False)["index"] == [0, 1]
    assert "test" not in dm.id_names
    (pairs_dir / "PAIRS/test.tsv").write_text(head + "q-1\ta\tb\t\n3\tc\td\t\nq-1\te\tf\t\n")
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    said = r"test.tsv, line 4 repeats the index of .*test.tsv, line 2 \('q-1'\): each example needs an id"
    with pytest.raises(TaskDataError, match=said):
        dm.encoded("test", labelled=False)


def test_a_test_split_without_the_column_the_card_names_as_its_index_is_refused(pairs_dir, tokenizer_dir):
    """A card's own `index` (not the default `idx`) that the test file lacks, a misspelt column most
    often: its predictions were numbered by row without a word, a submission keyed by ids wrong."""
    (pairs_dir / "PAIRS/test.tsv").write_text("row id\tsentence1\tsentence2\tlabel\n r7\ta\tb\t\n")
    task = pair_task(columns={})
    task.sources.index = "rowid"
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    said = (
        r"test.tsv has no field 'rowid', the card's index .*; its fields: row id, sentence1, sentence2, lab"
    )
    with pytest.raises(TaskDataError, match=said):
        dm.encoded("test", labelled=False)
    validation = dm.encoded("validation", labelled=True)  # not refused: no prediction is named there
    assert validation["index"] == list(range(len(validation)))
    import datasets

    from gpt_ft.data.files import Origin
    from gpt_ft.data.ids import example_ids

    rows = datasets.Dataset.from_list([{"sentence1": "a", "sentence2": "b"}])  # a hub dataset's: numbered
    assert example_ids(task, "test", rows, Origin(source="hub dataset x split test"))[1:] == (None, {})
    task.sources.index = "row id"
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    assert dm.encoded("test", labelled=False)["index"] == [0] and dm.id_names["test"] == {0: " r7"}


def test_an_empty_label_cell_is_unlabelled_as_a_null_is(pairs_dir, tokenizer_dir):
    """A test file with its label column left empty is predicted; training on one is refused."""
    rows = "index\tsentence1\tsentence2\tlabel\n0\ta\tb\t\n1\tc\td\t \n"
    (pairs_dir / "PAIRS/test.tsv").write_text(rows)
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=64)
    assert dm.encoded("test", labelled=False)["label"] == [None, None]
    assert dm.task.output.example_label({"label": float("nan")}) is None  # a float column's null (parquet)
    from gpt_ft.adapters import Preference
    from gpt_ft.adapters.steps import Steps

    margin = Preference(name="p", margin="margin").output.example_label
    first_error = Steps(name="s", label_form="first_error").output.example_label
    for null in (None, float("nan")):  # as a null, in every output kind reading its own labels
        assert margin({"chosen": "a", "rejected": "b", "margin": null}) == 0.0
        assert first_error({"problem": "q", "steps": ["a", "b"], "label": null}) is None
    with pytest.raises(TaskDataError, match=r"PAIRS/test.tsv, line 2: no label \(field .label.\)"):
        dm.encoded("test", labelled=True)


def test_non_numeric_regression_score(tmp_path, tokenizer_dir):
    (tmp_path / "s.tsv").write_text("sentence1\tsentence2\tscore\na\tb\t4.2\nc\td\thigh\n")
    task = Similarity(name="sts", regression=True, label="score", local=LocalFiles(splits={"train": "s.tsv"}))
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), max_length=32)
    with pytest.raises(
        TaskDataError, match=r"s.tsv, line 3: regression score 'high' in field 'score' is not a number"
    ):
        dm.encoded("train", labelled=True)


def test_truncation_to_max_length_keeps_specials(pairs_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(pairs_dir), max_length=5)
    ids = dm.special_ids
    for row in dm.encoded("train", labelled=True):
        (seq,) = row["input_ids"]
        assert len(seq) <= 5 and seq[0] == ids.start and seq[-1] == ids.extract and ids.delim in seq


def test_encodings_are_cached_for_the_next_process(pairs_dir, tokenizer_dir):
    """The fingerprint of a split's encodings names the card's values, never an object's address:
    two readings of one card (as two processes make) find the same cache."""
    from gpt_ft.adapters.cards import load_card
    from tests.helpers import TASKS

    for card in ("glue/rte.yaml", "steps/prmbench.yaml", "ranking/ultrafeedback.yaml"):
        tasks = [load_card(TASKS / card) for _ in range(2)]
        assert repr(tasks[0].output) == repr(tasks[1].output) and " at 0x" not in repr(tasks[0].output)
    modules = [TaskDataModule(load_card(TASKS / "glue/rte.yaml"), tokenizer_dir) for _ in range(2)]
    raw = datasets.Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [0]})
    assert modules[0]._fingerprint(raw, "train") == modules[1]._fingerprint(raw, "train")


def test_rows_dropped_by_ignore_labels_keep_the_others_numbers(tmp_path, tokenizer_dir):
    """A card numbering examples by row (SNLI's: no index field): the ids written beside predictions
    stay the file's rows when the rows labelled '-' before them are dropped."""
    rows = [
        "premise\thypothesis\tlabel",
        "a\tb\tentailment",
        "c\td\t-",
        "e\tf\tneutral",
        "g\th\t-",
        "i\tj\tneutral",
    ]
    (tmp_path / "test.tsv").write_text("\n".join(rows) + "\n")
    local, labels = LocalFiles(splits={"test": "test.tsv"}), ["entailment", "neutral"]
    task = TextPair(name="p", premise="premise", hypothesis="hypothesis", labels=labels, index=None,
                    ignore_labels=["-"], local=local)  # fmt: skip
    encoded = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path)).encoded("test", labelled=True)
    assert encoded["index"] == [0, 2, 4] and encoded["label"] == [0, 1, 1]
    (tmp_path / "test.tsv").write_text("\n".join(rows[:1] + [rows[2], rows[4]]) + "\n")
    with pytest.raises(
        TaskDataError, match=r"test.tsv: split 'test' has no examples: every row's label is in"
    ):
        TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path)).encoded("test", labelled=True)
    with pytest.raises(ValueError, match="^eval_batch_size must be >= 1, got 0.$"):
        TaskDataModule(task, tokenizer_dir, eval_batch_size=0)
    with pytest.raises(ValueError, match="^batch_size must be an integer, got '32'.$"):  # (from Python)
        TaskDataModule(task, tokenizer_dir, batch_size="32")
    import numpy as np

    assert TaskDataModule(task, tokenizer_dir, batch_size=np.int64(4)).batch_size == 4  # numpy's too
    # The hub's -1 (no gold label) in a float column (pandas' integers with a missing value): -1.0
    records = [
        {"premise": "a", "hypothesis": "b", "label": 0.0},
        {"premise": "c", "hypothesis": "d", "label": -1.0},
    ]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    hub = TextPair(name="p", premise="premise", hypothesis="hypothesis", labels=labels, index=None,
                   ignore_labels=["-", "-1"], local=LocalFiles(splits={"test": "test.jsonl"}))  # fmt: skip
    encoded = TaskDataModule(hub, tokenizer_dir, data_dir=str(tmp_path)).encoded("test", labelled=True)
    assert encoded["index"] == [0] and encoded["label"] == [0]


class Shouting(SingleText):
    """A user's own adapter: the built-in one's examples, each token shifted."""

    def encode(self, example, tokens, specials, max_length):
        return super().encode(example, [[t + 1 for t in tokens[0]]], specials, max_length)


def single_file(folder, rows: list[str], name: str = "train.tsv", cls=SingleText) -> SingleText:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("sentence\tlabel\n" + "".join(f"{row}\t0\n" for row in rows))
    return cls(name="s", labels=["a", "b"], index=None, local=LocalFiles(splits={"train": name}))


def texts(task, folder, tokenizer_dir) -> list[str]:
    tok = load_tokenizer(tokenizer_dir)
    encoded = TaskDataModule(task, tokenizer_dir, data_dir=str(folder)).encoded("train", labelled=True)
    return [tok.decode(seq[1:-1]) for row in encoded for seq in row["input_ids"]]


def test_a_users_adapter_and_its_edits_get_encodings_of_their_own(tmp_path, tokenizer_dir):
    """Not the built-in class's of the same name (its cache would be served), nor its own before an edit."""
    task = single_file(tmp_path, ["the cat sat"])
    plain = texts(task, tmp_path, tokenizer_dir)
    namesake = type("SingleText", (Shouting,), {"__module__": "my_tasks"})  # the built-in class's name
    for cls in (Shouting, namesake):  # the same file, read once
        task = cls(name="s", labels=["a", "b"], index=None, local=LocalFiles(splits={"train": "train.tsv"}))
        assert texts(task, tmp_path, tokenizer_dir) != plain
    from gpt_ft.data.task_data import adapter_code

    code = adapter_code(Shouting)
    assert "tests.data.test_task_data.Shouting" in code and "each token shifted" in code  # its source
    assert "gpt_ft.adapters.text.SingleText" in code and inspect.getsource(SingleText) not in code


def test_a_file_rewritten_with_its_size_and_time_kept_is_read_again(tmp_path, tokenizer_dir):
    """As a copy of another version of it (`cp -p`, `rsync -a`, an archive) leaves it."""
    task = single_file(tmp_path, ["the cat sat", "the dog ran"])
    assert texts(task, tmp_path, tokenizer_dir) == ["the cat sat", "the dog ran"]
    file = tmp_path / "train.tsv"
    stat = file.stat()
    file.write_text(file.read_text().replace("cat sat", "cow ate"))
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert texts(task, tmp_path, tokenizer_dir) == ["the cow ate", "the dog ran"]


def test_a_path_with_pattern_characters_is_a_name(tmp_path, tokenizer_dir):
    task = single_file(tmp_path / "data [v2]", ["the real one"], name="train[1].tsv")
    single_file(tmp_path / "data v", ["a decoy"], name="train1.tsv")  # what the patterns match
    single_file(tmp_path / "data [v2]", ["a decoy"], name="train1.tsv")
    assert texts(task, tmp_path / "data [v2]", tokenizer_dir) == ["the real one"]


def test_a_tsv_row_with_fewer_fields_than_columns_is_named(tmp_path, tokenizer_dir):
    """A quoted text with a line break: read a row per line, its second line is a row of its own."""
    (tmp_path / "train.tsv").write_text('sentence\tlabel\none\t0\n"two\nlines"\t1\n')
    task = SingleText(
        name="s", labels=["a", "b"], index=None, local=LocalFiles(splits={"train": "train.tsv"})
    )
    message = r"train.tsv, line 3: 1 field where there are 2 columns \(a text with a line break\?"
    with pytest.raises(TaskDataError, match=message):
        TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path)).encoded("train", labelled=True)


@pytest.mark.parametrize(
    ("card", "rows", "source"),
    [
        (  # UltraFeedback: the scores are in the replies, not a column of their own
            "ranking/ultrafeedback.yaml",
            [{"instruction": "say hi", "completions": [{"response": "hi", "overall_score": 9},
                                                       {"response": "no", "overall_score": 2}]},
             {"instruction": "say yo", "completions": [{"response": "yo", "overall_score": None},
                                                       {"response": "no", "overall_score": None}]}],
            "each reply's 'overall_score'",
        ),
        (  # a pair's label is its sides: a row of one reply cannot train
            "preference/pairs.yaml",
            [{"prompt": "p", "chosen": "good", "rejected": "bad"}, {"prompt": "q", "reply": "fine"}],
            "a pair: fields 'chosen' and 'rejected'",
        ),
    ],
    ids=["ranking", "preference"],
)  # fmt: skip
def test_a_row_without_a_label_is_named_by_what_gives_it_one(tmp_path, tokenizer_dir, card, rows, source):
    """A shape whose labels come of other fields than one column names the row that has none, and
    what it lacks, not a column the card never reads."""
    import json

    from gpt_ft.adapters.cards import load_card
    from tests.helpers import TASKS

    task = load_card(TASKS / card)
    name = "ultrafeedback.jsonl" if "ultrafeedback" in card else "train.jsonl"
    (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows * 50))
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), max_length=64)
    with pytest.raises(TaskDataError) as error:
        dm.encoded("train", labelled=True)
    assert str(error.value) == (
        f"{tmp_path / name}, line 2: no label ({source}); split 'train' is used for training or "
        "evaluation, so every example needs one."
    )


def test_encoding_draws_its_bar_on_a_terminal_and_on_the_first_process_only(
    tmp_path, tokenizer_dir, capsys, monkeypatch
):
    """datasets' "Encoding" bar redraws with carriage returns: in a log or a pipe it is noise, and
    on a DDP run's other process its unfinished line took the start of the first's error line
    (which then began "Encoding sent train: 0%|"). Set back as it was each time."""
    import sys

    from tests.helpers import make_task

    card = make_task("single", tmp_path)

    def bar(split: str, rank: str, terminal: bool) -> bool:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
        module = TaskDataModule(card, tokenizer_dir, data_dir=str(tmp_path), num_proc=None)
        capsys.readouterr()
        module.encoded(split, labelled=split != "test")
        assert not datasets.are_progress_bars_disabled()
        return "Encoding sent" in capsys.readouterr().err

    datasets.disable_caching()  # (each split encoded afresh)
    try:
        assert bar("train", "0", terminal=True)
        assert not bar("validation", "0", terminal=False)
        assert not bar("test", "1", terminal=True)
    finally:
        datasets.enable_caching()
