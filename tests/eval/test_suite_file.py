import pytest

from gpt_ft.adapters.cards import load_card
from gpt_ft.eval.suite_file import load_suite
from tests.helpers import ROOT, write_suite


def test_glue_suite_names_the_servers_files_and_labels():
    spec = load_suite(ROOT / "configs/suites/glue.yaml")
    cards = {t.name: t for t in (load_card(e.card) for e in spec.tasks)}
    written = {f for t in cards.values() for f in t.submission_files.values()}
    assert written == set(spec.submission.files) and len(spec.submission.files) == 11
    labels = {name: [t.submission_label(i) for i in range(t.output.num_outputs)] for name, t in cards.items()}
    for binary in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert labels[binary] == ["0", "1"]
    assert labels["mnli"] == ["entailment", "neutral", "contradiction"]
    assert labels["rte"] == labels["qnli"] == ["entailment", "not_entailment"]
    assert cards["mnli"].submission_files["test_ax"] == "AX.tsv"
    assert set(spec.score.tasks) == set(cards) and spec.score.paper == 72.8
    gpt1 = load_suite(ROOT / "configs/suites/gpt1.yaml")
    assert len(gpt1.tasks) == 12 and all(task.paper for task in gpt1.tasks)


def test_the_superglue_suite_scores_its_eight_tasks_from_one_release_folder():
    """SuperGLUE's score is the mean of its 8 tasks' (each the mean over its metrics); every card
    reads its files from the release's folders under one --data_dir."""
    spec = load_suite(ROOT / "configs/suites/superglue.yaml")
    cards = [load_card(e.card) for e in spec.tasks]
    assert (
        [t.name for t in cards]
        == spec.score.tasks
        == ["boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc"]
    )
    folders = {t.name: {path.split("/")[0] for path in t.local.splits.values()} for t in cards}
    assert folders == {"boolq": {"BoolQ"}, "cb": {"CB"}, "copa": {"COPA"}, "multirc": {"MultiRC"},
                       "record": {"ReCoRD"}, "rte": {"RTE", "AX-b", "AX-g"}, "wic": {"WiC"},
                       "wsc": {"WSC"}}  # fmt: skip
    assert {t.name: t.metrics for t in cards if len(t.metrics) > 1} == {
        "cb": ["accuracy", "f1"], "multirc": ["f1", "exact_match"], "record": ["f1", "exact_match"]
    }  # fmt: skip
    # The leaderboard's ten files, the diagnostics by the RTE model; labels as jiant writes them
    written = {f for t in cards for f in t.submission_files.values()}
    assert written == set(spec.submission.files) and len(written) == 10
    assert cards[5].submission_files == {
        "test": "RTE.jsonl",
        "test_axb": "AX-b.jsonl",
        "test_axg": "AX-g.jsonl",
    }
    labels = {
        t.name: [t.submission_label(i) for i in range(2)] for t in cards if t.output.kind == "classification"
    }
    assert labels == {"boolq": ["false", "true"], "cb": ["entailment", "contradiction"],
                      "rte": ["entailment", "not_entailment"], "wic": ["false", "true"],
                      "wsc": ["False", "True"]}  # fmt: skip


def test_a_suite_file_named_from_its_own_folder_finds_its_cards(monkeypatch):
    """configs/suites/glue.yaml names tasks/glue/*.yaml from the repository's root: found from the
    suite file's folder too (`gpt-ft suite glue.yaml` there), as the card's path resolves."""
    monkeypatch.chdir(ROOT / "configs" / "suites")
    spec = load_suite("glue.yaml")
    assert spec.tasks[0].card == str(ROOT / "tasks" / "glue" / "cola.yaml")
    assert spec.config == str(ROOT / "configs" / "finetune" / "gpt1.yaml")


def test_a_suite_file_reached_through_a_link_finds_cards_beside_the_link(tmp_path, monkeypatch):
    (tmp_path / "exp" / "cards").mkdir(parents=True)
    (tmp_path / "exp" / "cards" / "single.yaml").write_text("class_path: gpt_ft.adapters.SingleText\n")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "suite.yaml").write_text("name: s\ntasks: [{card: cards/single.yaml}]\n")
    (tmp_path / "exp" / "suite.yaml").symlink_to("../common/suite.yaml")
    monkeypatch.chdir(tmp_path)
    assert load_suite("exp/suite.yaml").tasks[0].card == str(tmp_path / "exp" / "cards" / "single.yaml")


def test_suite_file_errors_name_the_file(tmp_path):
    bad = write_suite(tmp_path, "name: x\ntasks:\n  - card: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match="suite.yaml: task card nowhere.yaml does not exist"):
        load_suite(bad)
    bad.write_text("name: x\ntasks: []\n")
    with pytest.raises(ValueError, match="lists no tasks"):
        load_suite(bad)
    # A field left empty (null) is its default: `seeds:`, `args:`, a task's `paper:` crashed in Python.
    (tmp_path / "single.yaml").write_text("class_path: gpt_ft.adapters.SingleText\n")
    bad.write_text("name: x\nseeds:\nargs:\nmin_steps:\ntasks:\n  - {card: single.yaml, paper: , args: }\n")
    spec = load_suite(bad)
    assert (spec.seeds, spec.args, spec.tasks[0].paper, spec.tasks[0].args) == ([0], [], {}, [])
    bad.write_text("name: x\ntasks: [single.yaml, 5]\n")  # "expected a SuiteTask ..., got None"
    with pytest.raises(
        ValueError, match=r"suite.yaml, task 2 \(5\): give a card's path, or a mapping with card\.$"
    ):
        load_suite(bad)
    bad.write_text("name: x\nseeds: one\ntasks: []\n")
    with pytest.raises(ValueError, match=r"suite.yaml: seeds: expected"):
        load_suite(bad)
    card = tmp_path / "card.yaml"
    card.write_text("class_path: gpt_ft.adapters.SingleText\ninit_args: {name: x, txt: s}\n")
    bad.write_text("name: x\ntasks:\n  - card: card.yaml\n    zero_shot: {verbalizer: [' a', ' b']}\n")
    with pytest.raises(
        ValueError,
        match=r"^Suite file \S+suite.yaml: tasks.zero_shot: unknown key 'verbalizer' \(it takes verbalizers,",
    ):
        load_suite(bad)
    # the parser's words for these: "Group 'suite' does not accept", "class_path ...: required"
    bad.write_text("name: x\nseedz: [1]\ntasks: [card.yaml]\n")
    with pytest.raises(
        ValueError, match=r"suite.yaml: unknown key 'seedz' \(it takes name, tasks, config, args, seeds,"
    ):
        load_suite(bad)
    bad.write_text("name: x\ntasks:\n  - card: card.yaml\n    papr: {acc: 1}\nsubmission: {archive: a.zip}\n")
    with pytest.raises(
        ValueError,
        match=r"suite.yaml: tasks: unknown key 'papr' \(it takes card, paper, args, zero_shot\)\.$",
    ):
        load_suite(bad)
    bad.write_text(
        "name: x\ntasks: [card.yaml]\nsubmission: {archive: a.zip}\n"
    )  # "class_path ...: required"
    with pytest.raises(ValueError, match=r"suite.yaml: submission: 'files' is missing\.$"):
        load_suite(bad)
    bad.write_text("name: x\ntasks: [card.yaml]\nsubmission: {archive: ../a.zip, files: [x.tsv]}\n")
    with pytest.raises(
        ValueError, match=r"suite.yaml: submission.archive '\.\./a\.zip' would be written outside"
    ):
        load_suite(bad)  # (it was written above --out_dir)
    with pytest.raises(ValueError, match=r"^Suite file \S+ is a folder; give the suite's YAML file\.$"):
        load_suite(tmp_path)
    bad.write_text("name: x\ntasks: [card.yaml]\nname: y\n")  # YAML's loaders keep the last silently
    with pytest.raises(ValueError, match=r"^Suite file \S+suite.yaml, line 3: key 'name' appears twice\.$"):
        load_suite(bad)
    bad.write_text("name: x\ntasks: [\n")
    with pytest.raises(
        ValueError, match=r"suite.yaml is not valid YAML: line 3, column 1: expected the node"
    ):
        load_suite(bad)
    card.write_text("class_path: gpt_ft.adapters.SingleText\ninit_args: {name: x}\n")
    bad.write_text("name: x\ntasks:\n  - card: card.yaml\nrows:\n  a/b: []\n  a-b: []\n  c: []\n")
    with pytest.raises(ValueError, match=r"rows \['a-b', 'a/b'\] would share a folder; give them names"):
        load_suite(bad)
