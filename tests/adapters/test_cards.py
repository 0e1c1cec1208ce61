"""Task cards: every card under tasks/ parses; a card's errors name the file; an adapter defined
outside gpt_ft works through its card."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser

from gpt_ft.adapters import TaskAdapter
from gpt_ft.adapters.cards import complete_card, load_card
from tests.background import gpt_ft
from tests.helpers import TASK_CARDS, TASKS, common_args, write_rows

CARDS = TASK_CARDS


def parse_card(card: str) -> TaskAdapter:
    parser = ArgumentParser()
    parser.add_argument("--task", type=TaskAdapter, sub_configs=True)
    cfg = parser.parse_args(["--task", str(TASKS / f"{card}.yaml")])
    return parser.instantiate(cfg).task


def test_cards_found():
    assert {"glue/rte", "glue/mnli", "snli", "race"} <= set(CARDS)


@pytest.mark.parametrize("card", CARDS)
def test_card_parses(card):
    task = parse_card(card)
    assert isinstance(task, TaskAdapter)
    assert task.name == Path(card).name
    # Every card names its hub dataset, but the templates for a user's own files and Story Cloze (its
    # hub dataset is a script over a manual download, which datasets 4 does not run).
    own = (
        "preference/pairs",
        "embedding/pairs",
        "rerank/pairs",
        "steps/steps",
        "ranking/replies",
        "storycloze",
    )
    assert (task.hub is not None or card in own) and task.local is not None
    splits = set(task.local.splits)
    evaluation_only = card in (
        "steps/processbench",
        "ranking/rewardbench2",
    )  # benchmarks without training data
    assert ("train" in splits) != evaluation_only and {*task.validation_splits, *task.test_splits} <= splits
    assert set(task.submission_files) <= set(task.test_splits)
    assert task.main_metric in task.metrics
    first_line = (TASKS / f"{card}.yaml").read_text().splitlines()[0]
    assert first_line.startswith("# "), "each card opens with a one-line comment on the task"


def test_card_errors_name_the_file(tmp_path):
    card = tmp_path / "card.yaml"
    card.write_text("class_path: gpt_ft.adapters.SingleText\ninit_args: {name: x, txt: s}\n")
    with pytest.raises(
        ValueError, match=r"^Task card \S+card.yaml: SingleText has no field 'txt'; the closest is 'text'\.$"
    ):
        load_card(card)
    card.write_text("class_path: gpt_ft.adapters.SingleText\ninit_args: {name: x, zzz: s}\n")  # nothing close
    with pytest.raises(
        ValueError, match=r"^Task card \S+card.yaml: SingleText has no field 'zzz'; its fields: \w"
    ):
        load_card(card)
    card.write_text("class_path: [\n")
    with pytest.raises(ValueError, match=r"^Task card \S+card.yaml is not valid YAML: line 2, column 1: "):
        load_card(card)
    for init_args, message in (
        ("{name: x, labels: [a, b], score_range: [0, 5]}", "score_range bounds a regression's scores; set"),
        ("{name: x, local: {splits: {train: t.tsv}, column_names: [sentence], headerless_splits: [trian]}}",
         r"local.headerless_splits names \['trian'\], which local.splits does not: it has \['train'\] "
         r"\('trian' or 'train' is misspelt\)."),
        ("{name: x, local: {splits: {train: t.tsv}, column_names: [sentence], headerless_splits: [dev]}}",
         r"local.headerless_splits names \['dev'\], which local.splits does not: it has \['train'\]\.$"),
        ("{name: x, local: {splits: {train: t.jsonl}, label_files: {dev: t-labels.lst}}}",
         r"local.label_files names \['dev'\], which local.splits does not: it has \['train'\]\.$"),
        # A misspelt field of local: (`column:`) was "Spaces not allowed in keys" where a renamed
        # column held a space.
        ("{name: x, local: {splits: {train: t.tsv}, column: {Sentence 1: sentence}}}",
         "local has no field 'column'; its fields: splits, format, column_names, headerless_splits, columns, "
         "label_files, shuffle_seed, written_by"),
        ("{name: x, hub: {name: glue}}", "hub needs path.$"),
        # Column names repeated: was the file's fault ("Duplicate names are not allowed").
        ("{name: x, local: {splits: {train: t.tsv}, column_names: [sentence, label, sentence]}}",
         r"local.column_names names \['sentence'\] twice: each column needs a name of its own\.$"),
        # An empty list of splits was the default ([test]); a split twice scored it twice.
        ("{name: x, labels: [a, b], test_splits: []}",
         r"test_splits names no split: name each split once, or leave it out for \[test\]\.$"),
        ("{name: x, labels: [a, b], validation_splits: [dev, dev]}",
         r"validation_splits names \['dev', 'dev'\], a split twice"),
    ):  # fmt: skip
        card.write_text(f"class_path: gpt_ft.adapters.SingleText\ninit_args: {init_args}\n")
        with pytest.raises(ValueError, match=rf"^Task card \S+card.yaml: .*{message}"):
            load_card(card)
    # A key beside class_path and init_args (a field a level too far out, `init_arg`): it was "the card
    # names no name", or the whole card dumped; class names YAML reads as numbers or booleans.
    for text, message in (
        ("init_arg: {name: x}", r"'init_arg' is no key of a card, which holds class_path and init_args only"),
        ("init_args: {name: x}\nmetrics: [accuracy]", r"'metrics' is no key of a card"),
        ("init_args: {name: x, labels: [0, 1]}",
         r"labels \[0, 1\]: YAML reads 0 as a number: quote each name \(\['0', '1'\]\)\.$"),
        ("init_args: {name: x, labels: [no, yes]}", r"labels \[False, True\]: YAML reads yes, no, on, off, "
         r"true and false as booleans: quote each class name \(e\.g\. \['no', 'yes'\]\)\.$"),
    ):  # fmt: skip
        card.write_text(f"class_path: gpt_ft.adapters.SingleText\n{text}\n")
        with pytest.raises(ValueError, match=rf"^Task card \S+card.yaml: {message}"):
            load_card(card)
    # An empty card, a list, no class_path: a suite read them as no card (a traceback after).
    for text, problem in (
        ("", "is empty"),
        ("- a\n", "is a list, not a mapping"),
        ("init_args: {name: x}\n", None),
    ):
        card.write_text(text)
        expected = (
            f"{problem}: a task card is a mapping" if problem else "names no class_path: a task card is"
        )
        with pytest.raises(ValueError, match=rf"^Task card \S+card.yaml {expected}"):
            load_card(card)


ADAPTER = '''
from gpt_ft.adapters import Encoded, TaskAdapter


class TripleText(TaskAdapter):
    """[start] a [delim] b [delim] c [extract]: an input shape gpt_ft does not ship."""

    def __init__(self, *, fields: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.fields = fields

    def text_fields(self):
        return self.fields

    def encode(self, example, tokens, specials, max_length):
        ids, extract = self.frame(specials, *(t[: (max_length - 4) // 3] for t in tokens))
        return Encoded([ids], [extract], self.output.example_label(example))
'''


def test_an_adapter_of_three_texts_a_sequence_is_not_exported_on_a_pair_template():
    """`gpt-ft export` wrote it on the default (single, pair) template: no input of the exported
    tokenizer gave the trained model's ids, and it said `pipeline` loads it."""
    namespace: dict = {}
    exec(ADAPTER, namespace)
    triple = namespace["TripleText"](name="triple", fields=["a", "b", "c"], labels=["x", "y"])
    with pytest.raises(ValueError, match=r"^Task 'triple' \(TripleText\) frames 3 texts in its sequence"):
        triple.template(("<s>", "<d>", "<e>"))
    pair = namespace["TripleText"](name="pair", fields=["a", "b"], labels=["x", "y"])
    assert pair.template(("<s>", "<d>", "<e>")) == ("<s> $A <e>", "<s> $A <d> $B <e>")


def test_an_adapter_that_builds_more_sequences_than_it_declares_is_refused(tokenizer_dir):
    """One sequence per choice (`choice_sequences`) under the default one-class output: the head
    summed the choices' states, so no order of them told the right one apart, and it trained."""
    from gpt_ft.adapters import Encoded, TaskAdapter
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

    class PickOne(TaskAdapter):
        def text_fields(self):
            return ["q", "a", "b"]

        def encode(self, example, tokens, specials, max_length):
            sequences, extract = self.choice_sequences(specials, tokens[0], tokens[1:], max_length)
            return Encoded(sequences, extract, self.output.example_label(example))

    tokenizer = load_tokenizer(tokenizer_dir)
    task = PickOne(name="pick", labels=["a", "b"])
    with pytest.raises(
        ValueError, match=r"^Task 'pick' \(PickOne\) built 2 sequences, past its num_sequences \(1\)"
    ):
        task.encode_examples(
            [{"q": "x", "a": "y", "b": "z", "label": "a"}], tokenizer, special_token_ids(tokenizer), 32
        )


def test_an_adapter_without_a_method_every_shape_needs_or_a_type_hint_is_named(tmp_path, monkeypatch):
    """An adapter without `encode` failed in the middle of encoding on a bare NotImplementedError; an
    argument without a type hint was "Problem with given class_path '...TaskDataModule'"."""
    from gpt_ft.adapters.cards import as_task
    from gpt_ft.errors import CardError

    (tmp_path / "unfinished.py").write_text(
        "from gpt_ft.adapters import TaskAdapter\n\n"
        "class NoEncode(TaskAdapter):\n"
        "    def __init__(self, *, fields: list[str], **kwargs):\n"
        "        super().__init__(**kwargs)\n        self.fields = fields\n\n"
        "    def text_fields(self):\n        return self.fields\n\n"
        "class NoFields(NoEncode):\n    text_fields = TaskAdapter.text_fields\n"
        "    def encode(self, example, tokens, specials, max_length):\n        pass\n\n"
        "class NoHint(NoEncode):\n    def __init__(self, *, fields, **kwargs):\n"
        "        super().__init__(fields=fields, **kwargs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, method in (("NoEncode", "encode"), ("NoFields", "text_fields")):
        card = {
            "class_path": f"unfinished.{name}",
            "init_args": {"name": "t", "fields": ["a"], "labels": ["x", "y"]},
        }
        with pytest.raises(
            CardError, match=rf"^Task 't' \(unfinished.{name}\) does not implement {method}\(\)"
        ):
            as_task(card)
    card = {"class_path": "unfound.NoHint", "init_args": {"name": "t", "fields": ["a"], "labels": ["x", "y"]}}
    with pytest.raises(
        ValueError, match=r"'unfound' \(a module of your own is found where PYTHONPATH names its"
    ):
        as_task(card)
    card = {
        "class_path": "unfinished.NoHint",
        "init_args": {"name": "t", "fields": ["a"], "labels": ["x", "y"]},
    }
    with pytest.raises(ValueError, match=r"^task: unfinished.NoHint's argument 'fields' has no type hint"):
        as_task(card)


def start_external_adapter(root, tokenizer_dir):
    """A card naming `my_tasks.TripleText` from root/my_tasks.py; `fit` finds it through PYTHONPATH alone."""
    (root / "my_tasks.py").write_text(ADAPTER)
    write_rows(
        root / "d/train.tsv", ["a", "b", "c", "label"], [["one", "two", "three", i % 2] for i in range(4)]
    )
    write_rows(root / "d/dev.tsv", ["a", "b", "c", "label"], [["one", "two", "three", 1]])
    card = root / "triple.yaml"
    card.write_text(
        "class_path: my_tasks.TripleText\ninit_args:\n  name: triple\n  fields: [a, b, c]\n"
        "  labels: ['no', 'yes']\n  local: {splits: {train: d/train.tsv, validation: d/dev.tsv}}\n"
    )
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    args = [*common_args(card, tokenizer_dir, root), "--trainer.max_epochs=1"]
    return [gpt_ft("fit", *args, cwd=root, env=env, fresh=True)]  # a fresh process: PYTHONPATH alone


@pytest.mark.background(start=start_external_adapter)
def test_an_adapter_defined_outside_gpt_ft_works_through_its_card(
    background, tokenizer_dir, monkeypatch, capsys
):
    """`fit` in a process of its own (PYTHONPATH names the adapter's folder); `explain` in this process
    with that folder on sys.path."""
    from gpt_ft.cli import main

    root = background.root
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.chdir(root)
    capsys.readouterr()
    main(
        [
            "explain",
            f"--data.task={root / 'triple.yaml'}",
            f"--data.tokenizer={tokenizer_dir}",
            f"--data.data_dir={root}",
            "--json=true",
        ]
    )
    shown = capsys.readouterr().out
    sys.modules.pop("my_tasks", None)  # this process forgets the adapter module again
    tokens = json.loads(shown)["sequences"][0]["tokens"]
    assert tokens.count("<|delim|>") == 2 and "<|start|>one<|delim|>two<|delim|>three" in shown  # (its text)
    (fit,) = background.runs
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert "validation/accuracy" in fit.stdout


def test_a_card_given_whole_names_every_field():
    """The command line's YAML loader completes each card it reads, so a card given over an earlier
    one replaces it: each field left out is the field's default, not the earlier card's."""
    card = {"class_path": "gpt_ft.adapters.SingleText", "init_args": {"name": "t", "labels": ["a", "b"]}}
    whole = complete_card({"data": {"init_args": {"task": card}}, "seeds": [0, 1]})
    fields = whole["data"]["init_args"]["task"]["init_args"]
    assert (fields["name"], fields["labels"], fields["label"], fields["text"]) == (
        "t",
        ["a", "b"],
        "label",
        "sentence",
    )
    assert fields["submission_labels"] is None and fields["regression"] is False
    assert whole["seeds"] == [0, 1]
    assert complete_card({"class_path": "lightning.pytorch.loggers.CSVLogger"}) == {
        "class_path": "lightning.pytorch.loggers.CSVLogger"
    }


def test_a_card_given_over_another_takes_none_of_its_file_layout(tmp_path):
    """`local` and `hub` are completed too: CoLA's headerless layout, given first, made the next
    card's files read as headerless (jsonargparse merges a nested dataclass field by field)."""
    from gpt_ft.training.runs import build_fit

    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: one\n  labels: ['0', '1']\n"
        "  hub: {path: nyu-mll/glue, name: cola, columns: {sentence: text}, splits: {train: 'train[:9]'}}\n"
        "  local:\n    splits: {train: a.tsv, validation: b.tsv}\n    columns: {index: idx}\n"
        "    column_names: [source, label, x, sentence]\n    headerless_splits: [train]\n"
    )
    second.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: two\n  labels: ['0', '1']\n"
        "  hub: {path: me/mine}\n  local: {splits: {train: c.tsv}}\n"
    )
    task = build_fit.resolve([f"--data.task={first}", f"--data.task={second}"])["data"]["init_args"]["task"]
    assert task["init_args"]["local"] == {"splits": {"train": "c.tsv"}, "format": None, "column_names": None,
                                          "headerless_splits": None, "columns": None, "label_files": None,
                                          "shuffle_seed": None, "written_by": None}  # fmt: skip
    assert task["init_args"]["hub"] == {
        "path": "me/mine", "name": None, "columns": None, "splits": None, "configs": None, "data_dir": None
    }  # fmt: skip


def test_configurations_are_written_as_yaml_that_reads_back_as_the_same_values():
    """`dump_yaml` (libyaml's emitter): what PyYAML's own writes for a plain configuration, and any
    value, quoted strings with escapes and non-ASCII text among them, read back unchanged."""
    import yaml

    from gpt_ft.adapters.cards import dump_yaml

    plain = {
        "trainer": {"max_epochs": 3, "precision": "bf16-mixed", "logger": None},
        "model": {"lr": 6.25e-05},
    }
    flags = dict(default_flow_style=False, allow_unicode=True, sort_keys=False)
    assert dump_yaml(plain) == yaml.safe_dump(plain, **flags)
    odd = {"text": "tab\there, \"quoted\" ünïcødé — " * 6, "lines": "a\nb: c\n", "empty": "", "yes": "yes",
           "number": "1e-3", "list": [1, 2.5, None, True], "nested": {"k": "#not a comment"}}  # fmt: skip
    assert yaml.safe_load(dump_yaml(odd)) == odd


@pytest.mark.parametrize(
    "fields, said",
    [
        ("name: ../../x", r"Task name '\.\./\.\./x' names the files and folders written for it: give a name"),
        ("name: a\\b", r"Task name 'a\\\\b' names the files"),
        (
            "submission_files: {test: /tmp/victim.txt}",
            r"Task 'x': submission file of split 'test', '/tmp/victim",
        ),
        (
            "submission_files: {test: ../up.tsv}",
            r"split 'test', '\.\./up\.tsv' would be written outside the folder",
        ),
        ("submission_files: {test: 'C:\\x.tsv'}", r"split 'test', 'C:\\\\x\.tsv' would be written outside"),
        (
            "validation_splits: [../../s]",
            r"validation_splits' split '\.\./\.\./s' names the files and folders",
        ),
        ("test_splits: ['.']", r"test_splits' split '\.' names the files and folders"),
    ],
)
def test_a_card_names_no_file_outside_the_folder_given_for_it(tmp_path, fields, said):
    """A card's task name, split names and submission files become the names of files written for it
    (predictions, reports, a suite's run folders): `../` or an absolute path wrote outside the folder
    the command was given (a card or checkpoint from elsewhere could replace any file)."""
    fields = fields if fields.startswith("name:") else f"name: x\n  {fields}"
    card = tmp_path / "card.yaml"
    card.write_text(f"class_path: gpt_ft.adapters.SingleText\ninit_args:\n  labels: [a, b]\n  {fields}\n")
    with pytest.raises(ValueError, match=said):
        load_card(card)
    card.write_text("class_path: gpt_ft.adapters.SingleText\ninit_args: {name: x, labels: [a, b], "
                    "submission_files: {test: glue/X.tsv}}\n")  # fmt: skip
    assert load_card(card).submission_files == {"test": "glue/X.tsv"}  # a folder inside it: kept


def test_a_card_of_aliases_repeated_inside_aliases_is_refused_before_it_unfolds(tmp_path):
    """A kilobyte of YAML aliases nested nine deep (387 million values once written out) ran on,
    its memory growing, while the card was completed and checked."""
    from gpt_ft.adapters.cards import load_yaml

    lines = ["class_path: gpt_ft.adapters.SingleText", "init_args:", "  name: x", "  labels: [a, b]"]
    lines += ["  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    card = tmp_path / "laughs.yaml"
    card.write_text("\n".join([*lines, "  ignore_labels: *a8"]) + "\n")
    said = (
        r"unfolds to more than 1,000,000 values \(YAML aliases repeated inside aliases\): write them out\.$"
    )
    with pytest.raises(ValueError, match=rf"^Task card {card} {said}"):
        load_card(card)
    with pytest.raises(ValueError, match=rf"^The value {said}"):
        load_yaml(card.read_text())
    assert load_yaml("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}  # an alias or two: read
