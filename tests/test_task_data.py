import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpt_ft.adapters import LocalFiles, Similarity, TaskDataError, TextPair
from gpt_ft.data.task_data import TaskDataModule
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

ROWS = {
    "train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tThe cat sat.\tA cat sat.\tentailment\n"
    '1\tHe said "yes.\tNo dogs.\tnot_entailment\n2\t\tEmpty premise.\tentailment\n',
    "dev.tsv": "index\tsentence1\tsentence2\tlabel\n0\tTwo dogs run.\tDogs run.\tentailment\n",
    "test.tsv": "index\tsentence1\tsentence2\n5\tIs it true?\tYes.\n6\tNo.\tIt is.\n",
}

CARD = """class_path: gpt_ft.adapters.TextPair
init_args:
  name: pairs
  premise: sentence1
  hypothesis: sentence2
  labels: [entailment, not_entailment]
  local:
    splits: {train: PAIRS/train.tsv, validation: PAIRS/dev.tsv, test: PAIRS/test.tsv}
    columns: {index: idx}
"""


def pair_task(**local) -> TextPair:
    files = dict(splits={"train": "PAIRS/train.tsv", "validation": "PAIRS/dev.tsv", "test": "PAIRS/test.tsv"})
    return TextPair(
        name="pairs",
        premise="sentence1",
        hypothesis="sentence2",
        labels=["entailment", "not_entailment"],
        local=LocalFiles(**{**files, "columns": {"index": "idx"}, **local}),
    )


@pytest.fixture
def data_dir(tmp_path) -> Path:
    (tmp_path / "PAIRS").mkdir()
    for name, text in ROWS.items():
        (tmp_path / "PAIRS" / name).write_text(text)
    return tmp_path


def test_encodes_local_tsv_exactly(data_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(data_dir), max_length=64)
    tok = load_tokenizer(tokenizer_dir)
    ids = special_token_ids(tok)
    assert (dm.vocab_size, dm.task.num_labels, dm.task.num_sequences) == (len(tok), 2, 1)
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


def test_batches_from_the_loaders(data_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(data_dir), batch_size=2, max_length=64)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()[0]))
    assert batch.input_ids.shape[:2] == (1, 1) and batch.labels.tolist() == [0]
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()[0]))
    assert batch.index.tolist() == [5, 6] and batch.labels is None


def test_similarity_encodes_two_sequences(data_dir, tokenizer_dir):
    task = Similarity(
        name="sim",
        labels=["entailment", "not_entailment"],
        local=LocalFiles(splits={"train": "PAIRS/train.tsv"}, columns={"index": "idx"}),
    )
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(data_dir), max_length=64)
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
            r"PAIRS/dev.tsv, row 0: label 'maybe' in field 'label' is not among the labels",
        ),
        (lambda d: None, "test", r"PAIRS/test.tsv: split 'test' has examples without a label"),
        (lambda d: None, "dev", r"no local split 'dev'; its card defines \['test', 'train', 'validation'\]"),
    ],
)
def test_bad_data_is_one_clear_sentence(data_dir, tokenizer_dir, setup, split, message):
    setup(data_dir)
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(data_dir), max_length=64)
    with pytest.raises(TaskDataError, match=message):
        dm.encoded(split, labelled=True)


def test_non_numeric_regression_score(tmp_path, tokenizer_dir):
    (tmp_path / "s.tsv").write_text("sentence1\tsentence2\tscore\na\tb\t4.2\nc\td\thigh\n")
    task = Similarity(name="sts", regression=True, label="score", local=LocalFiles(splits={"train": "s.tsv"}))
    dm = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), max_length=32)
    with pytest.raises(
        TaskDataError, match=r"s.tsv, row 1: regression score 'high' in field 'score' is not a number"
    ):
        dm.encoded("train", labelled=True)


def test_truncation_to_max_length_keeps_specials(data_dir, tokenizer_dir):
    dm = TaskDataModule(pair_task(), tokenizer_dir, data_dir=str(data_dir), max_length=5)
    ids = dm.special_ids
    for row in dm.encoded("train", labelled=True):
        (seq,) = row["input_ids"]
        assert len(seq) <= 5 and seq[0] == ids.start and seq[-1] == ids.extract and ids.delim in seq


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpt_ft", *args], capture_output=True, text=True, cwd=cwd)


def test_explain_json(data_dir, tokenizer_dir):
    card = data_dir / "pairs.yaml"
    card.write_text(CARD)
    out = run_cli(
        "explain",
        "--data.task",
        str(card),
        "--data.tokenizer",
        tokenizer_dir,
        "--data.data_dir",
        str(data_dir),
        "--split",
        "train",
        "--index",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    tok = load_tokenizer(tokenizer_dir)
    ids = special_token_ids(tok)
    expected_ids = [
        ids.start,
        *tok('He said "yes.', add_special_tokens=False)["input_ids"],
        ids.delim,
        *tok("No dogs.", add_special_tokens=False)["input_ids"],
        ids.extract,
    ]
    assert shown == {
        "label": "not_entailment",
        "sequences": [
            {
                "tokens": tok.convert_ids_to_tokens(expected_ids),
                "ids": expected_ids,
                "extract_index": len(expected_ids) - 1,
            }
        ],
    }
    assert (
        shown["sequences"][0]["tokens"][0] == "<|start|>"
        and shown["sequences"][0]["tokens"][-1] == "<|extract|>"
    )


def test_explain_text_and_fit_config(data_dir, tokenizer_dir):
    card = data_dir / "pairs.yaml"
    card.write_text(CARD)
    config = data_dir / "fit.yaml"
    config.write_text(
        f"trainer: {{max_epochs: 3}}\nmodel: {{lm_coef: 0.5}}\n"
        f"data: {{task: {card}, tokenizer: {tokenizer_dir}, data_dir: {data_dir}}}\n"
    )
    out = run_cli("explain", "--config", str(config), "--split", "validation")
    assert out.returncode == 0, out.stderr
    assert "label 'entailment'" in out.stdout and "<|start|>" in out.stdout and "extract at" in out.stdout


def test_explain_bad_input_exits_nonzero_with_one_sentence(data_dir, tokenizer_dir):
    card = data_dir / "pairs.yaml"
    card.write_text(CARD)
    (data_dir / "PAIRS/train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    out = run_cli(
        "explain",
        "--data.task",
        str(card),
        "--data.tokenizer",
        tokenizer_dir,
        "--data.data_dir",
        str(data_dir),
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1:] == [  # above it, only progress bars
        f"gpt-ft: error: {data_dir}/PAIRS/train.tsv, row 0: label 'maybe' in field 'label' is not among the "
        "labels ['entailment', 'not_entailment']."
    ]
    out = run_cli(
        "explain",
        "--data.task",
        str(card),
        "--data.tokenizer",
        tokenizer_dir,
        "--data.data_dir",
        str(data_dir),
        "--index",
        "7",
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
