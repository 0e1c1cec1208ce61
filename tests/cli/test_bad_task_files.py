"""The bad-input table's rows about task files that do not parse, cards that cannot work and
config values the parser lets through: through the CLI, one sentence naming the file (and the line
as an editor counts it, header = line 1) or the option, exit code 2, nothing on disk changed.
(The same paths tried by generated inputs: tests/test_generated_inputs.py.)"""

from __future__ import annotations

import json
import re

import pytest

from gpt_ft.cli import main
from gpt_ft.errors import TaskDataError
from tests.cli.test_bad_outputs import error, files
from tests.helpers import common_args, make_task

CARD = """class_path: gpt_ft.adapters.{adapter}
init_args:
  name: sent
  labels: [negative, positive]
  local: {{splits: {{train: d/{file}, validation: d/{file}}}}}
"""


@pytest.fixture
def explain(tmp_path, tokenizer_dir, capsys):
    """`explain(file_name, data, card=None)`: writes a task file (and its card) and returns the
    error sentence of `gpt-ft explain` on it, checking nothing on disk changed (`ok`: the example it
    prints instead)."""

    def run(name: str, data: bytes, card: str | None = None, mapping: bool = False, ok: bool = False) -> str:
        (tmp_path / "d").mkdir(exist_ok=True)
        (tmp_path / "d" / name).write_bytes(data)
        path = tmp_path / "card.yaml"
        path.write_text(card if card is not None else CARD.format(adapter="SingleText", file=name))
        before = files(tmp_path)
        data_args = {"task": str(path), "tokenizer": tokenizer_dir, "data_dir": str(tmp_path)}
        if mapping:  # --data={task: ..., ...}, one option
            args = [f"--data={json.dumps(data_args)}"]
        else:
            args = [f"--data.{key}={value}" for key, value in data_args.items()]
        if ok:
            capsys.readouterr()
            main(["explain", *args])
            return capsys.readouterr().out
        message = error(capsys, "explain", *args)
        assert files(tmp_path) == before
        return message

    run.root = tmp_path
    return run


def parquet_bytes(columns: dict[str, list]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table(columns), out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        (
            "t.tsv",
            b"\n\nsentence\tlabel\na\tpositive\n",
            ", line 1 is empty: the header (the columns' names) must be",
        ),
        (  # a quoted empty text alone: a row to the loader (every later row and line was one off)
            "t.csv",
            b'sentence,label\na cat,positive\n""\nb,negative\n',
            ", line 3: 1 field where there are 2 columns (cut short?)",
        ),
        (  # ... after a quote Python's strict reader refuses (`"a "b" c"`), which the loader reads
            "t.csv",
            b'sentence,label\n"a "b" c",positive\nonly a sentence\nb,negative\n',
            ", line 3: 1 field where there are 2 columns (cut short?)",
        ),
        (  # a ragged row: a comma in an unquoted text
            "t.csv",
            b"sentence,label\na cat,positive\nyes, a dog,negative\n",
            ", line 3: 3 fields where there are 2 columns (a text with commas in it needs quotes?)",
        ),
        (
            "t.tsv",
            b"sentence\tlabel\na\tpositive\nb\tc\tnegative\n",
            ", line 3: 3 fields where there are 2 columns (a text with tabs in it?)",
        ),
        (  # the first row wider: the loader would take its first field for a row index, silently
            "t.tsv",
            b"sentence\tlabel\na cat\tsat\tpositive\nb\tnegative\n",
            ", line 2: 3 fields where there are 2 columns (a text with tabs in it?)",
        ),
        (  # a tab at the end of every line: each row one field wider than the header
            "t.tsv",
            b"sentence\tlabel\na\tpositive\t\nb\tnegative\t\n",
            ", line 2: 3 fields where there are 2 columns (a text with tabs in it?)",
        ),
        (  # a stray quote opens a field that swallows the rest of the file
            "t.csv",
            b'sentence,label\na,positive\n"b,negative\nc,positive\n',
            ", line 3: a quoted field opens here and never closes",
        ),
        (  # one broken JSON line, after a blank one
            "t.jsonl",
            b'{"sentence": "a", "label": "positive"}\n\n{"sentence": "b" "label": "negative"}\n',
            ", line 3, column 18: not valid JSON (Expecting ',' delimiter)",
        ),
        ("t.jsonl", b'{"sentence": "a", "label": "positive"}\n[1, 2]\n', ", line 2: a JSON object"),
        (
            "t.json",
            b"null",
            ": a JSON file holds records (an array of objects, or an object a line), not null",
        ),
        (
            "t.jsonl",
            b"null\n",
            ": a JSON file holds records (an array of objects, or an object a line), not null",
        ),
        (
            "t.json",
            b"5",
            ": a JSON file holds records (an array of objects, or an object a line), not a number",
        ),
        (
            "t.json",
            b'[{"sentence": "a", "label": "positive"}, 2]',
            ": record 2 of its array is a number, not a JSON",
        ),
        (
            "t.json",
            b'[\n {"sentence": "a", "label": "positive"},\n {"sentence": "b" "label": "x"}\n]',
            ", line 3, column 19: not valid JSON (Expecting ',' delimiter)",
        ),
        (  # half of a surrogate pair, escaped alone (Python's json reads it; the table dropped it)
            "t.json",
            b'[{"sentence": "a", "label": "positive"},\n {"sentence": "lone \\ud800 x", "label": "x"}]',
            ", line 2: \\ud800 escapes half of a UTF-16 surrogate pair alone, which is no text;",
        ),
        (  # its other half, after a whole pair
            "t.jsonl",
            b'{"sentence": "\\ud83d\\ude00", "label": "positive"}\n\n'
            b'{"sentence": "[\\udc00]", "label": "x"}\n',
            ", line 3: \\udc00 escapes half of a UTF-16 surrogate pair alone",
        ),
        (  # a comma after the last record: named where JSON says, not at the record before it
            "t.json",
            b'[\n {"sentence": "a", "label": "positive"},\n {"sentence": "b", "label": "x"},\n]\n',
            ", line 4, column 1: not valid JSON (Expecting value)",
        ),
        (  # a comma missing between two records
            "t.json",
            b'[\n {"sentence": "a", "label": "positive"}\n {"sentence": "b", "label": "x"}\n]\n',
            ", line 3, column 2: not valid JSON (Expecting ',' delimiter)",
        ),
        (  # Latin-1 on the third line
            "t.tsv",
            "sentence\tlabel\na\tpositive\ncafé\tnegative\n".encode("latin-1"),
            ", line 3: not UTF-8 text (byte 0xe9: invalid continuation byte); save it as UTF-8",
        ),
        (  # past the loaders' first look at a file (a few kB): a traceback's words before
            "t.tsv",
            b"sentence\tlabel\n" + b"a fine film\tpositive\n" * 600 + "café\tpositive\n".encode("latin-1"),
            ", line 602: not UTF-8 text (byte 0xe9: invalid continuation byte); save it as UTF-8",
        ),
        (  # inside a JSON string: read by pyarrow without a word, then a failure far from the file
            "t.jsonl",
            b'{"sentence": "a", "label": "positive"}\n{"sentence": "caf\xe9", "label": "positive"}\n',
            ", line 2: not UTF-8 text (byte 0xe9: invalid continuation byte); save it as UTF-8",
        ),
        (  # a parquet text column of bytes that are no UTF-8 text (bytes that are, are their text)
            "t.parquet",
            parquet_bytes({"sentence": [b"good", b"caf\xe9"], "label": ["positive", "positive"]}),
            ", record 2: field 'sentence' holds bytes that are not UTF-8 text (unexpected end of data)",
        ),
        (
            "t.csv",
            b"sentence,label,sentence\na,positive,b\n",
            ", line 1: column name(s) ['sentence'] appear more than once in the header",
        ),
        ("t.parquet", b"PAR1 not really", ": cannot be read as parquet (Parquet magic bytes not found"),
        (  # nested past Python's recursion limit: a RecursionError's traceback before
            "t.jsonl",
            b'{"sentence": "a", "label": "positive"}\n{"sentence": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
            ", line 2: values nested too deeply to read (objects or arrays one inside another",
        ),
        ("t.json", b"[" * 5000 + b"]" * 5000, ": values nested too deeply to read"),
    ],
)
def test_a_task_file_that_does_not_parse_names_the_line(explain, name, data, problem):
    assert explain(name, data).startswith(f"{explain.root / 'd' / name}{problem}")


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        # header, 2 rows, a blank line, then the bad row: line 5
        ("t.tsv", b"sentence\tlabel\na\tpositive\nb\tnegative\n\nc\tmaybe\n", "line 5"),
        # a quoted text over two lines moves the bad row to line 4
        ("t.csv", b'sentence,label\n"two\nlines",positive\nc,maybe\n', "line 4"),
        ("t.csv", b"\xef\xbb\xbfsentence,label\r\na,positive\r\nc,maybe\r\n", "line 3"),
        (
            "t.jsonl",
            b'{"sentence": "a", "label": "positive"}\n\n{"sentence": "c", "label": "maybe"}\n',
            "line 3",
        ),
        (
            "t.json",
            b'[{"sentence": "a", "label": "positive"},\n\n {"sentence": "c", "label": "maybe"}]',
            "line 3",
        ),
    ],
)
def test_a_bad_label_names_its_line_as_an_editor_counts_it(explain, name, data, where):
    assert explain(name, data) == (
        f"{explain.root / 'd' / name}, {where}: label 'maybe' in field 'label' is not among the labels "
        "['negative', 'positive']."
    )


def test_a_file_without_its_label_column_is_refused_as_fit_refuses_it(explain):
    """explain checks a card before training: a split that trains lacking its labels is the same
    sentence as fit's, not an example shown with "label None"."""
    assert explain("t.tsv", b"sentence\tgold\na\tpositive\n") == (
        f"{explain.root / 'd' / 't.tsv'}: missing column 'label' (the labels); split 'train' is used for "
        "training or evaluation, so every example needs one; the file has ['sentence', 'gold']."
    )


@pytest.mark.parametrize("selection", ["[a:b]", "[5:2]", "[50%:10%]"])
def test_a_slice_that_is_none_names_the_split_not_the_file(explain, selection):
    """A slice that ends before it starts was taken as datasets reads it: no rows ("split 'train' has no
    examples", as of an empty file), or, as [2:1], all but two."""
    card = CARD.format(adapter="SingleText", file="t.tsv").replace(
        "train: d/t.tsv", f"train: 'd/t.tsv{selection}'"
    )
    assert explain("t.tsv", b"sentence\tlabel\na\tpositive\n", card) == (  # the card is at fault
        f"{explain.root / 'card.yaml'}: Task 'sent': local split 'train' (d/t.tsv{selection}) ends in "
        f"{selection}, which is no slice of rows: write [start:end], in rows or percentages ([:90%])."
    )


def test_a_slice_of_none_of_the_rows_and_records_of_no_field_are_named_as_such(tmp_path):
    from gpt_ft.data.files import read_table

    (tmp_path / "t.tsv").write_text("sentence\tlabel\n" + "a\tpositive\n" * 20)
    for selection in (
        "[3:3]",
        "[3:-18]",
        "[10:1%]",
        "[-2:-5]",
        "[50%:10]",
    ):  # (datasets read [3:-18] as 17 rows)
        said = rf"t.tsv: split 'train' has no examples: its slice {re.escape(selection)} takes none of"
        with pytest.raises(TaskDataError, match=said):
            read_table(tmp_path / "t.tsv", selection=selection, split="train")
    assert len(read_table(tmp_path / "t.tsv", selection="[2:-15]", split="train")) == 3
    (tmp_path / "e.jsonl").write_text("{}\n{}\n")  # (it was said to hold no rows)
    with pytest.raises(TaskDataError, match=r"e.jsonl: its records hold no field \(\{\} on every line\)\.$"):
        read_table(tmp_path / "e.jsonl")


def test_a_slice_and_dropped_rows_still_name_the_right_line(explain):
    data = b"sentence\tlabel\na\tpositive\nb\t-\nc\tnegative\nd\tmaybe\n"
    card = CARD.format(adapter="SingleText", file="t.tsv").replace("d/t.tsv", "'d/t.tsv[1:]'")
    card += "  ignore_labels: ['-']\n"
    assert explain("t.tsv", data, card).startswith(f"{explain.root / 'd' / 't.tsv'}, line 5: label 'maybe'")


@pytest.mark.parametrize(
    ("score", "problem"),
    [
        ("inf", "regression score 'inf' in field 'label' is not a finite number a 32-bit float holds."),
        ("1e39", "regression score '1e39' in field 'label' is not a finite number a 32-bit float holds."),
        ("7.5", "regression score '7.5' in field 'label' is outside the card's score_range [0, 5]."),
    ],
)
def test_a_score_that_cannot_be_trained_on(explain, score, problem):
    card = """class_path: gpt_ft.adapters.Similarity
init_args: {name: sts, regression: true, score_range: [0, 5], local: {splits: {train: d/s.tsv}}}
"""
    data = f"sentence1\tsentence2\tlabel\na\tb\t1.0\nc\td\t{score}\n".encode()
    assert explain("s.tsv", data, card) == f"{explain.root / 'd' / 's.tsv'}, line 3: {problem}"


PREFERENCE_CARD = """class_path: gpt_ft.adapters.Preference
init_args: {name: prefs, prompt: prompt, local: {splits: {train: d/p.jsonl.gz, validation: d/p.jsonl.gz}}}
"""


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (
            '{"prompt": "a", "chosen": "b"}',
            "line 3: field 'rejected' has no value: a pair needs both replies.",
        ),
        (
            '{"prompt": "a", "chosen": null, "rejected": "c"}',
            "line 3: field 'chosen' has no value: a pair needs both replies.",
        ),
        (
            '{"prompt": "a", "chosen": [{"role": "user", "text": "b"}], "rejected": "c"}',
            "line 3: field 'chosen' holds [{'role': 'user', 'text': 'b'}], not a text or chat messages "
            "([{'role': ..., 'content': ...}, ...]).",
        ),
        (
            '{"prompt": "a", "chosen": "b", "rejected": }',
            "line 3, column 44: not valid JSON (Expecting value).",
        ),
    ],
)
def test_a_bad_preference_pair_names_its_line_in_a_gzipped_file(explain, lines, problem):
    import gzip

    good = '{"prompt": "a", "chosen": "b", "rejected": "c"}'
    data = gzip.compress("\n".join([good, good, lines, good]).encode() + b"\n")
    message = explain("p.jsonl.gz", data, PREFERENCE_CARD)
    assert message.startswith(f"{explain.root / 'd' / 'p.jsonl.gz'}"), message
    assert message.endswith(problem), message


@pytest.mark.parametrize(
    ("card", "problem"),
    [
        ("", "{card} is empty: a task card is a mapping with class_path and init_args (see tasks/)."),
        ("- a\n- b\n", "{card} is a list, not a mapping: a task card is a mapping with class_path"),
        (
            "init_args:\n  name: s\n",
            "{card} names no class_path: a task card is class_path (e.g. gpt_ft.adapters.SingleText) and "
            "init_args (see tasks/).",
        ),
        (
            "class_path: gpt_ft.adapters.SingleText\ninit_args: {name: s, labels: [a], local: d/t.tsv}\n",
            "{card.parent}/d/t.tsv is no card file: a card's local files are `local: {{splits: {{train:",
        ),
        (
            "name: s\nlabels: [a, b]\n",  # the fields alone: the parser would build the abstract TaskAdapter
            "{card} names no class_path: a task card is class_path",
        ),
        (
            CARD.format(adapter="SingleText", file="t.tsv").replace("SingleText", "TaskDataError"),
            "--data.task: class_path 'gpt_ft.adapters.TaskDataError' is not a subclass of TaskAdapter",
        ),
        (
            CARD.format(adapter="SingleText", file="t.tsv") + "  regression: [1]\n",
            "--data.task.regression: expected bool, got '[1]' (in {card}).",
        ),
        (
            CARD.format(adapter="SingleText", file="t.tsv").replace(
                "}}\n", "}, headerless_splits: [train]}\n"
            ),
            "{card}: local.headerless_splits needs local.column_names: the names of those files' columns.",
        ),
        (
            CARD.format(adapter="SingleText", file="t.tsv") + "  metrics: [pearson]\n",
            "{card}: Task 'sent': unknown metric(s) ['pearson']; allowed: accuracy, f1, matthews",
        ),
        (
            CARD.format(adapter="SingleText", file="t.tsv") + "  label: null\n",
            "--data.task.label: expected str, got null (in {card}).",
        ),
        (  # a required field given as null is not given
            CARD.format(adapter="SingleText", file="t.tsv").replace("name: sent", "name: null"),
            "{card}: the card names no name; SingleText needs it.",
        ),
    ],
)
def test_a_card_that_cannot_work_is_named(explain, card, problem):
    message = explain("t.tsv", b"sentence\tlabel\na\tpositive\n", card)
    assert message.startswith(problem.format(card=explain.root / "card.yaml"))


@pytest.mark.parametrize("name", ["t.jsonl", "t.json"])
def test_a_json_record_without_a_text_field_names_its_line(explain, name):
    """A record that lacks the text field (a typo'd key) is refused by its line, where a table gives
    it as a null and it would be trained on as an empty text; a null stays an empty text."""
    rows = [{"sentence": "a", "label": "positive"}, {"sentence": None, "label": "negative"}]
    rows += [{"sentense": "b", "label": "negative"}, {"label": "positive"}]
    lines = [json.dumps(row) for row in rows]
    data = ("\n".join(lines) if name == "t.jsonl" else "[\n" + ",\n".join(lines) + "\n]") + "\n"
    message = explain(name, data.encode())
    line = 3 if name == "t.jsonl" else 4
    assert message == (
        f"{explain.root / 'd' / name}, line {line}: the record has no field 'sentence', a text the task "
        "reads (null: an empty one)."
    )
    for cut, fault in (("[1:]", f"line {line}"), ("[2:]", f"line {line}"), ("[:2]", None)):
        sliced = CARD.format(adapter="SingleText", file=name).replace(f"d/{name}", f'"d/{name}{cut}"')
        if fault is None:  # the slice leaves the faulty records out: a null is an empty text
            assert explain(name, data.encode(), sliced, ok=True)
        else:  # counted from the slice's first record, named by the file's line
            assert explain(name, data.encode(), sliced).startswith(f"{explain.root / 'd' / name}, {fault}: ")
    if name == "t.jsonl":  # the file's own name for a field the card renames (`columns`)
        card = CARD.format(adapter="SingleText", file=name).replace(
            "t.jsonl}}", "t.jsonl}, columns: {review: sentence}}"
        )
        data = '{"review": "a", "label": "positive"}\n{"label": "negative"}\n'
        assert explain(name, data.encode(), card).endswith(
            "line 2: the record has no field 'review', a text the task reads (null: an empty one)."
        )


def test_a_json_record_without_a_nested_text_field_names_its_line(explain):
    """A text read by its path (`a.text`): a record whose `a` lacks it (a typo'd key, which Arrow's
    merged records give as a null) or holds a text instead, trained on as an empty text while
    `gpt-ft label` refused the row; a null stays an empty text."""
    card = CARD.format(adapter="SingleText", file="t.jsonl").replace(
        "name: sent\n", "name: sent\n  text: a.text\n"
    )
    rows = [{"a": {"text": "x"}, "label": "positive"}, {"a": {"text": None}, "label": "negative"}]
    for bad in ({"txt": "y"}, "y"):
        lines = [json.dumps(row) for row in [*rows, {"a": bad, "label": "negative"}]]
        message = explain("t.jsonl", "\n".join(lines).encode(), card)
        assert message == (
            f"{explain.root / 'd' / 't.jsonl'}, line 3: the record has no field 'a.text', a text the task "
            "reads (null: an empty one)."
        )
    assert explain("t.jsonl", "\n".join(json.dumps(row) for row in rows).encode(), card, ok=True)
    # the path's first part renamed (`columns`): looked for under the card's name, every record lacked it
    renamed = card.replace("t.jsonl}}", "t.jsonl}, columns: {body: a}}")
    lines = [json.dumps({"body": row["a"], "label": row["label"]}) for row in rows]
    assert explain("t.jsonl", "\n".join(lines).encode(), renamed, ok=True)


def test_a_grouped_record_without_a_reply_names_its_line(explain):
    """Records grouped into one example each (PRMBench's solutions by question): the record at
    fault is named by its line, as an ungrouped one is."""
    card = """class_path: gpt_ft.adapters.Ranking
init_args: {name: prm, group_by: q, chosen: original, rejected: modified, prompt: null,
            local: {splits: {train: d/r.jsonl, validation: d/r.jsonl}}}
"""
    good = '{"q": "Q1", "original": ["1. a"], "modified": ["1. b"]}'
    message = explain("r.jsonl", f'{good}\n{{"q": "Q2", "original": ["1. a"]}}\n'.encode(), card)
    assert message == (
        f"{explain.root / 'd' / 'r.jsonl'}, line 2: field 'modified' holds a reply that is not a text: None."
    )


@pytest.mark.parametrize(
    "card",
    [
        CARD.format(adapter="NoSuchAdapter", file="t.tsv"),
        CARD.format(adapter="SingleText", file="t.tsv") + "  labelz: [a]\n",
        CARD.format(adapter="SingleText", file="t.tsv") + "  regression: [1]\n",
    ],
    ids=["class", "option", "value"],
)
def test_a_card_inside_a_data_mapping_is_named_as_when_given_alone(explain, card):
    """`--data={task: CARD, ...}` names the card's file and the fault as `--data.task=CARD` does
    (not the mapping as a file that cannot be read)."""
    alone = explain("t.tsv", b"sentence\tlabel\na\tpositive\n", card)
    card_file = str(explain.root / "card.yaml")  # first, or in the sentence on --data.task
    assert card_file in alone and alone.startswith(("--data.task", f"{card_file}: ")), alone
    assert explain("t.tsv", b"sentence\tlabel\na\tpositive\n", card, mapping=True) == alone


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model:\n  lr: null\n", "--model.lr: expected float, got null."),
        (
            "trainer:\n  accumulate_grad_batches: 0\n",
            "config.yaml: trainer.accumulate_grad_batches must be >= 1, got 0.",
        ),
        (
            "trainer:\n  devices: -2\n",
            "--trainer.devices -2: on the CPU, give a count of processes (1, 2, ...) or 'auto'.",
        ),
        (
            "trainer:\n  limit_train_batches: -1\n",
            "for limit_train_batches, it has to be in [0.0, 1.0] or an int.",  # -1 or -1.0 before it
        ),
        ("seed_everything: -1\n", "config.yaml: seed_everything must be in [0, 4294967295], got -1."),
        (
            "trainer:\n  accelerator: cpu\n  strategy: gpt_ft.training.strategies.BlockFSDP\n",
            "--trainer.strategy: FSDP shards a model over GPUs; on the CPU use ddp.",
        ),
        (  # it trained, saved, then exited 2 naming Lightning's temporary file; ddp_spawn: a traceback
            "trainer:\n  strategy: ddp_fork\n  devices: 2\n",
            "--trainer.strategy ddp_fork: gpt-ft starts its processes as ddp does; use ddp.",
        ),
        (  # an alias: the same launch
            "trainer:\n  strategy: ddp_spawn_find_unused_parameters_true\n  devices: 2\n",
            "--trainer.strategy ddp_spawn_find_unused_parameters_true: gpt-ft starts its processes as ddp",
        ),
        (  # no launcher: Lightning picked a free port of its own and waited for the other node forever
            "trainer:\n  accelerator: cpu\n  devices: 1\n  num_nodes: 2\n",
            "--trainer.num_nodes 2: nothing tells the nodes where node 0 listens (MASTER_ADDR and "
            "MASTER_PORT unset), so each would wait for the others forever: start every node under torchrun",
        ),
    ],
)
def test_a_config_value_the_parser_lets_through(
    setting, message, tmp_path, tokenizer_dir, capsys, monkeypatch
):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    card = make_task("single", tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(setting)
    before = files(tmp_path)
    args = [*common_args(card, tokenizer_dir, tmp_path), f"--config={config}", "--trainer.max_epochs=1"]
    assert message in error(capsys, "fit", *args)
    assert files(tmp_path) == before


def test_a_validation_split_named_train(tmp_path, tokenizer_dir):
    from gpt_ft.cli import main

    card = make_task("single", tmp_path)
    args = [*common_args(card, tokenizer_dir, tmp_path), "--data.task.init_args.validation_splits=[train]"]
    main(["fit", *args, "--trainer.max_epochs=1"])  # the split's metrics under a key of their own
    assert list(tmp_path.glob("runs/lightning_logs/version_0/checkpoints/best-0-*.ckpt"))


def test_a_card_a_config_file_names_is_named_as_it_opens_from_the_working_folder(
    tmp_path, tokenizer_dir, capsys, monkeypatch
):
    """A config's card path is relative to the config file: the card was named by that path
    ("../cards/card.yaml", from configs/), which opens nothing from the working folder."""
    (tmp_path / "cards").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "cards" / "card.yaml").write_text(CARD.format(adapter="SingleText", file="t.tsv"))
    (tmp_path / "configs" / "run.yaml").write_text(
        f"data:\n  task: ../cards/card.yaml\n  tokenizer: {tokenizer_dir}\n"
    )
    monkeypatch.chdir(tmp_path)
    message = error(capsys, "explain", "--config=configs/run.yaml", "--data.task.init_args.metrics=[acuracy]")
    assert message.startswith("cards/card.yaml: Task 'sent': unknown metric(s) ['acuracy']"), message


@pytest.mark.parametrize("command", ["fit", "explain"])
def test_a_split_the_card_lacks_names_the_card(command, tmp_path, tokenizer_dir, capsys):
    """A split found missing as the data loads (a validation split the card's files lack; explain's
    --split, named) is named with the card's file, as faults found while the card is built are."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "t.tsv").write_text("sentence\tlabel\na\tpositive\n")
    card = tmp_path / "card.yaml"
    card.write_text(CARD.format(adapter="SingleText", file="t.tsv"))
    args = [f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}", f"--data.data_dir={tmp_path}"]
    wrong = ["--trainer.max_epochs=1", "--data.task.init_args.validation_splits=[dev]",
             f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]  # fmt: skip
    before = files(tmp_path)
    message = error(capsys, command, *args, *(wrong if command == "fit" else ["--split=dev"]))
    assert message == ("--split dev: " if command == "explain" else "") + (
        f"{card}: Task 'sent' has no local split 'dev'; its card defines ['train', 'validation']."
    ), message
    assert files(tmp_path) == before
