"""A query's placeholder filled by each candidate (ReCoRD): the literal layout, SQuAD's
normalization and token F1 on hand-computed cases, the loss of several right candidates, the
metrics, the hub's rows and the release's records read alike, and a whole run from the release
files to predictions and `Classifier`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gpt_ft.adapters import Cloze, TaskDataError
from gpt_ft.adapters.cards import load_card
from gpt_ft.adapters.cloze import AnyRightHead, credits, normalized, token_f1
from gpt_ft.cli import main
from gpt_ft.data.files import examples_split
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.errors import CardError
from tests.helpers import TASKS, fit_and_last_validation, read_alike, write_release

SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)
NAN = math.nan


def same(a: list[float], b: list[float]) -> bool:
    """Equal lists, NaN equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_literal_layout_a_sequence_per_candidate_each_once_the_passage_shared():
    task = Cloze(name="c", max_candidates=4)
    row = {
        "passage": "p",
        "query": "@placeholder won.",
        "entities": ["Ann", "Bob", "Ann"],
        "answers": ["ann"],
    }
    assert task.texts(row) == ["p", "Ann won.", "Bob won."]
    enc = task.encode(row, [[10, 11], [20, 21], [30, 21]], SPECIALS, max_length=64)
    assert enc.sequences == [[1, 10, 11, 2, 20, 21, 3], [1, 10, 11, 2, 30, 21, 3]]
    assert enc.extract_index == [6, 6]
    assert same(enc.label, [1.0, 0.0, NAN, NAN, 1.0, 0.0, NAN, NAN])  # exact match, then token F1
    assert task.label_text(enc.label) == [0]  # the right candidates' positions
    assert task.output.example_label({**row, "answers": []}) is None  # (a test file's rows)
    assert task.output.example_label({**row, "answers": "Bob"})[:2] == [0.0, 1.0]  # one text: one answer
    with pytest.raises(
        TaskDataError, match=r"^field 'query' holds no placeholder '@placeholder': 'Ann won\.'\.$"
    ):
        task.texts({**row, "query": "Ann won."})
    with pytest.raises(TaskDataError, match=r"^field 'entities' must hold a list of candidates, got \[\]\.$"):
        task.texts({**row, "entities": []})
    assert len(task.texts({**row, "entities": list("abcd") * 2})) == 5  # 8 named, 4 candidates
    with pytest.raises(TaskDataError) as error:
        task.texts({**row, "entities": list("abcde")})
    assert (
        str(error.value)
        == "field 'entities' holds 5 candidates, more than the card's max_candidates 4: raise it."
    )
    with pytest.raises(CardError, match=r"a cloze task takes no `labels`"):
        Cloze(name="c", labels=["a", "b"])


def test_normalization_and_token_f1_as_squads_script():
    assert normalized("The U.S. Army!") == "us army" and normalized("  an  Apple a day ") == "apple day"
    assert token_f1("barack obama", "obama") == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert token_f1("obama obama", "obama") == pytest.approx(
        2 * 0.5 * 1.0 / 1.5
    )  # (tokens counted once each)
    assert token_f1("bush", "obama") == 0.0
    exact, f1 = credits(["Barack Obama", "Obama", "the U.S."], ["Obama", "US", "President Obama"])
    assert exact == [0.0, 1.0, 1.0]
    assert f1 == pytest.approx([max(2 / 3, 2 * 0.5 * 0.5 / 1.0), 1.0, 1.0])


def test_the_loss_is_minus_the_log_of_the_share_of_the_right_candidates():
    head = AnyRightHead(4, dropout=0.0, choices=3)
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, torch.finfo(torch.float32).min], [1.0, 0.0, 0.0]])
    labels = torch.tensor([[1, 0, 1, 0.5, 0, 1], [0, 1, NAN, 0, 1, NAN], [0, 0, 0, 0.2, 0, 0]])
    p = logits.softmax(dim=1)
    want = torch.stack([-(p[0, 0] + p[0, 2]).log(), -p[1, 1].log(), torch.tensor(0.0)])
    torch.testing.assert_close(head.losses(logits, labels), want)
    # one right candidate: cross-entropy; a row with none learns nothing, and its gradients stay finite
    torch.testing.assert_close(
        head.losses(logits[1:2], labels[1:2]),
        torch.nn.functional.cross_entropy(logits[1:2], torch.tensor([1]), reduction="none"),
    )
    leaf = logits.clone().requires_grad_()
    head.losses(leaf, labels).sum().backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[2] == 0).all()


def test_exact_match_and_f1_are_the_chosen_candidates_credits():
    task = Cloze(name="c", max_candidates=3)
    labels = torch.tensor([[0, 1, NAN, 0.5, 1, NAN], [1, 0, 0, 1, 0.4, 0], [0, 0, 1, 0, 0.25, 1]])
    predictions = torch.tensor([0, 1, 2])  # credits (0, 0.5), (0, 0.4), (1, 1)
    values = {k: float(v) for k, v in task.metric_values(predictions, labels).items()}
    assert values == pytest.approx({"f1": (0.5 + 0.4 + 1) / 3, "exact_match": 1 / 3})


def release(idx: int, *answers: str, queries: int = 1) -> dict:
    """A ReCoRD release record: a passage, its entities as spans (`end` inclusive), its queries."""
    text = "Ann met Bob in Rome.\n@highlight\nBob left\n@highlight\nAnn stayed"
    spans = [
        {"start": text.index(e), "end": text.index(e) + len(e) - 1} for e in ("Rome", "Bob", "Ann", "Bob")
    ]
    given = {"answers": [{"text": a} for a in answers]} if answers else {}
    qas = [{"query": f"@placeholder waved {q}.", "idx": 10 * idx + q, **given} for q in range(queries)]
    return {"idx": idx, "passage": {"text": text, "entities": spans}, "qas": qas}


def hub_rows(record: dict) -> list[dict]:
    """The record as aps/super_glue holds it: a row a query, its entities each once, sorted."""
    text = record["passage"]["text"]
    entities = sorted({text[e["start"] : e["end"] + 1] for e in record["passage"]["entities"]})
    return [
        {"passage": text, "query": qa["query"], "entities": entities,
         "answers": [a["text"] for a in qa.get("answers", [])],
         "idx": {"passage": record["idx"], "query": qa["idx"]}}
        for qa in record["qas"]
    ]  # fmt: skip


def test_the_hubs_rows_and_the_releases_records_are_the_same_queries(monkeypatch, tmp_path):
    task = load_card(TASKS / "superglue" / "record.yaml")
    records = [release(0, "Bob", queries=2), release(1, "Rome")]
    hub = read_alike(task, monkeypatch, tmp_path / "ReCoRD" / "val.jsonl", records, hub_rows)
    assert len(hub) == 3
    assert task.texts(hub[0]) == [
        "Ann met Bob in Rome.\n\n  - Bob left.\n  - Ann stayed.\n",  # as lm-evaluation-harness renders it
        "Ann waved 0.",
        "Bob waved 0.",
        "Rome waved 0.",
    ]
    assert [task.label_text(task.output.example_label(r)) for r in hub] == [[1], [1], [2]]
    (tmp_path / "ReCoRD" / "val.jsonl").write_text(json.dumps({"idx": 0, "passage": {"text": "p"}}) + "\n")
    with pytest.raises(
        TaskDataError, match=r"val.jsonl, line 1 has no field 'entities' \(task 'record'\)\.$"
    ):
        examples_split(task, "validation", tmp_path)
    # answers as the hub writes them (texts), not the release's records; a span past the passage
    hubs_answers = release(0, "Bob")
    hubs_answers["qas"][0]["answers"] = ["Bob"]
    outside = release(0, "Bob")
    outside["passage"]["entities"].append({"start": 70, "end": 74})
    for record, said in (
        (hubs_answers, "its fields are not laid out as the release's, {idx, passage: {text, entities: "
         "[{start, end}]}, qas: [{query, idx, answers: [{start, end, text}]}]} (string indices must be"),
        (outside, "entity span 70 to 74 lies outside its passage's 62 characters."),
    ):  # fmt: skip
        (tmp_path / "ReCoRD" / "val.jsonl").write_text(json.dumps(record) + "\n")
        with pytest.raises(TaskDataError) as error:
            examples_split(task, "validation", tmp_path)
        assert f"val.jsonl, line 1: {said}" in str(error.value)


def test_fit_on_the_release_files_then_predict_and_the_classifier_agree(tmp_path, tokenizer_dir, capsys):
    """Validation logs the chosen candidates' credits (recomputed here from the classifier's
    choices); `predict` writes each query's chosen entity under the query's id."""
    from gpt_ft import Classifier

    train = [release(i, ["Ann", "Bob", "Rome"][i % 3], queries=2) for i in range(4)]
    val = [release(9, "Ann", queries=2), release(10, "Bob", "bob")]
    write_release(tmp_path / "ReCoRD", {"train": train, "val": val, "test": [release(11, queries=3)]})
    card = TASKS / "superglue" / "record.yaml"
    logged, last = fit_and_last_validation(card, tokenizer_dir, tmp_path)
    assert "validation/exact_match" in capsys.readouterr().out
    clf = Classifier.from_checkpoint(last)
    task = clf.task
    examples = list(examples_split(task, "validation", tmp_path))
    predicted = clf.predict(examples)
    entities = ["Ann", "Bob", "Rome"]
    assert [list(p["scores"]) for p in predicted] == [entities] * 3
    assert all(p["label"] == max(p["scores"], key=p["scores"].get) for p in predicted)
    chosen = [credits([p["label"]], task.candidates_and_answers(e)[1]) for p, e in zip(predicted, examples)]
    for name, k in (("exact_match", 0), ("f1", 1)):
        want = sum(c[k][0] for c in chosen) / len(chosen)
        assert float(logged[f"validation/{name}"]) == pytest.approx(want)

    main(["predict", f"--ckpt_path={last}", f"--data.data_dir={tmp_path}",
          "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}",
          f"--model.predictions_dir={tmp_path / 'p'}"])  # fmt: skip
    lines = (tmp_path / "p" / "ReCoRD.jsonl").read_text().splitlines()  # SuperGLUE's, by the queries' ids
    test_predicted = clf.predict(list(examples_split(task, "test", tmp_path)))
    assert [json.loads(line) for line in lines] == [
        {"idx": 110 + q, "label": p["label"]} for q, p in enumerate(test_predicted)
    ]
    # A release record of one query is read as its hub row is (its candidates, the passage's entities)
    assert clf.predict([release(12)]) == clf.predict(hub_rows(release(12)))
    assert list(clf.predict([release(12)])[0]["scores"]) == entities


def test_zero_shot_scores_the_candidate_each_rule_picks_by_its_credits(tokenizer_dir):
    """The query filled by each candidate is scored after the passage (as lm-evaluation-harness
    scores ReCoRD's, its rendering aside); each rule's pick is scored by ReCoRD's own metrics."""
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.zeroshot import ZeroShotScorer, evaluate
    from tests.eval.test_zeroshot import unigram_gpt

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    task = load_card(TASKS / "superglue" / "record.yaml")
    rows = hub_rows(release(0, "Rome"))
    scorer = ZeroShotScorer(unigram_gpt(len(tok), torch.zeros(len(tok))), tok)
    asked = []
    # summed, Bob's query is likeliest; per character ("Rome waved 0." is the longest), Rome's
    scorer.logprobs = lambda requests: asked.extend(requests) or [-3.0, -2.0, -2.1]
    got = evaluate(task, scorer, lambda split: rows)
    passage = task.texts(rows[0])[0]
    lead = scorer.start or []
    assert [request[0] for request in asked] == [lead + ids(passage.rstrip())] * 3
    assert [request[1] for request in asked] == [
        ids(f"{passage.rstrip()}\n {e} waved 0.")[len(ids(passage.rstrip())) :]
        for e in ("Ann", "Bob", "Rome")
    ]
    per_token = max(range(3), key=lambda k: [-3.0, -2.0, -2.1][k] / len(asked[k][1]))
    assert got == {
        "validation/f1": 0.0,
        "validation/exact_match": 0.0,
        "validation/f1_norm": 1.0,
        "validation/exact_match_norm": 1.0,
        "validation/f1_token": float(per_token == 2),
        "validation/exact_match_token": float(per_token == 2),
    }
