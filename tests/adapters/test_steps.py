"""Process rewards: the literal layout of a solution's steps, each label form, the loss and the
step metrics (ProcessBench's F1 included) on hand-computed cases, the threshold chosen, and a
whole run from a JSON-lines file to `Classifier`."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from gpt_ft.adapters import Steps, TaskDataError
from gpt_ft.adapters.cards import load_card
from gpt_ft.adapters.metrics import step_metric_values
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.errors import CardError
from tests.helpers import TASKS, common_args, write_solutions

SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)
NAN = math.nan


def same(a: list[float], b: list[float]) -> bool:
    """Equal lists, NaN equal to NaN."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_literal_layout_an_extract_token_after_every_step():
    task = Steps(name="s", label="labels", max_steps=4)
    example = {"problem": "p", "steps": ["a", "b", "c"], "labels": [True, "-", 0.25]}
    enc = task.encode(example, [[10, 11], [20], [30, 31], [40]], SPECIALS, max_length=64)
    assert enc.sequences == [[1, 10, 11, 2, 20, 3, 30, 31, 3, 40, 3]]
    assert enc.extract_index == [5, 8, 10] and enc.extract_sequence == [0, 0, 0]
    assert same(enc.label, [1.0, 0.0, 0.25, NAN])
    assert enc.fields() == {
        "input_ids": enc.sequences,
        "extract_index": [5, 8, 10],
        "extract_sequence": [0, 0, 0],
    }
    # Cut longest first, every special token kept: 9 tokens leave 5 for the texts.
    enc = task.encode(example | {"labels": [1, 1]}, [list(range(10, 20)), [20, 21], [30]], SPECIALS, 9)
    assert enc.sequences == [[1, 10, 11, 2, 20, 21, 3, 30, 3]] and enc.extract_index == [6, 8]
    with pytest.raises(TaskDataError, match="its 3 steps need 5 special tokens, more than max_length 4"):
        task.encode(example, [[10], [20], [30], [40]], SPECIALS, max_length=4)
    # 7 tokens leave 2 for 4 texts: steps 1 and 2 keep none of their own (a verdict reading nothing)
    lost = r"^at max_length 7 its 3 steps leave step 1 none of its 1 tokens; raise --data.max_length\.$"
    with pytest.raises(TaskDataError, match=lost):
        task.encode(example, [[10, 11], [20, 21], [30], [40]], SPECIALS, max_length=7)
    assert task.encode(example, [[10, 11], [20, 21], [], [40]], SPECIALS, 8).sequences == [
        [1, 10, 2, 20, 3, 3, 40, 3]  # a step empty in the row is no loss
    ]


def test_a_first_step_holding_the_problem_keeps_its_end_when_cut():
    """Math-Shepherd's first step holds the problem before it (`problem: None`): cut, it loses the
    problem's start, not the step its verdict judges."""
    task = Steps(name="s", problem=None, steps="input", label_form="tagged", step_tag="ки", max_steps=3)
    row = {"input": "Q? Step 1: a ки\nStep 2: b ки", "label": "Q? Step 1: a +\nStep 2: b -"}
    enc = task.encode(row, [[], list(range(10, 20)), [30, 31]], SPECIALS, max_length=10)
    assert enc.sequences == [[1, 2, 16, 17, 18, 19, 3, 30, 31, 3]] and enc.extract_index == [6, 9]
    # a card with a problem field whose row leaves it empty: the first step is a step, cut at its end
    task = Steps(name="s", max_steps=3)
    enc = task.encode({"problem": "", "steps": ["a", "b"]}, [[], list(range(10, 20)), [30, 31]], SPECIALS, 10)
    assert enc.sequences == [[1, 2, 10, 11, 12, 13, 3, 30, 31, 3]]


def test_problem_end_frames_the_text_before_it_as_the_problem():
    """Math-Shepherd's card: the first step's text before "Step 1:" is the problem, laid out as
    ProcessBench's (`[start] problem [delim] step_1 [extract]`), and its tokenizer frames a pair; a
    row without the marker keeps the problem in its first step."""
    task = Steps(name="s", problem=None, problem_end="Step 1:", steps="input", label_form="tagged",
                 step_tag="ки", max_steps=3)  # fmt: skip
    row = {"input": "Q? Step 1: a ки\nStep 2: b ки", "label": "Q? Step 1: a +\nStep 2: b -"}
    assert task.texts(row) == ["Q?", "Step 1: a ", "\nStep 2: b "]
    enc = task.encode(row, [[10], list(range(20, 26)), [30, 31]], SPECIALS, max_length=10)
    assert enc.sequences == [[1, 10, 2, 20, 21, 22, 3, 30, 31, 3]] and same(enc.label, [1.0, 0.0, NAN])
    assert task.template(("<s>", "<d>", "<e>")) == ("<s> <d> $A <e>", "<s> $A <d> $B <e>")
    plain = {"input": "Q? a ки", "label": "Q? a +"}
    assert task.texts(plain) == ["", "Q? a "]
    with pytest.raises(
        CardError, match="problem_end splits the problem off the first step: give `problem: null`"
    ):
        Steps(name="s", problem_end="Step 1:")
    with pytest.raises(CardError, match="problem_end must not be empty"):
        Steps(name="s", problem=None, problem_end="")


def test_each_label_form():
    first = Steps(name="s", label_form="first_error", max_steps=4).output
    assert same(first.padded_labels(1, 3), [1.0, 0.0, NAN, NAN])  # the steps after it unlabelled
    assert same(first.padded_labels(-1, 3), [1.0, 1.0, 1.0, NAN])
    assert first.padded_labels(None, 3) is None
    errors = Steps(name="s", label_form="error_steps", one_based=True, max_steps=4).output
    assert same(errors.padded_labels([1, 3], 3), [0.0, 1.0, 0.0, NAN])
    assert same(errors.padded_labels([], 3), [1.0, 1.0, 1.0, NAN])
    per_step = Steps(name="s", max_steps=3).output
    assert same(per_step.padded_labels(["+", False, None], 3), [1.0, 0.0, NAN])
    assert per_step.padded_labels([None, None], 2) is None  # no labelled step: an unlabelled row
    tagged = Steps(name="s", problem=None, steps="input", label_form="tagged", step_tag="ки", max_steps=3)
    row = {"input": "Q? Step 1: a ки\nStep 2: b ки", "label": "Q? Step 1: a +\nStep 2: b -"}
    assert tagged.texts(row) == ["", "Q? Step 1: a ", "\nStep 2: b "]
    assert same(tagged.encode(row, [[10], [11], [12]], SPECIALS, 64).label, [1.0, 0.0, NAN])
    # a last step without its tag is a step still, unlabelled (it has no mark); blanks after a tag none
    untagged = {"input": row["input"] + " Step 3: c", "label": row["label"] + " Step 3: c"}
    assert tagged.texts(untagged) == ["", "Q? Step 1: a ", "\nStep 2: b ", " Step 3: c"]
    assert same(tagged.encode(untagged, [[10], [11], [12], [13]], SPECIALS, 64).label, [1.0, 0.0, NAN])
    assert tagged.texts({"input": row["input"] + " \n"})[1:] == tagged.texts(row)[1:]
    for field in ("input", "label"):  # each bad field named
        with pytest.raises(TaskDataError, match=rf"^field '{field}' holds a list \['x'\], not a text\.$"):
            tagged.texts({**row, field: ["x"]}) if field == "input" else tagged.encode(
                {**row, field: ["x"]}, [[10], [11], [12]], SPECIALS, 64
            )


def test_bad_labels_are_named():
    first = Steps(name="s", label_form="first_error", max_steps=4).output
    outside = r"step index 3 in field 'label' is outside the solution's 3 steps \(numbered 0 to 2\)"
    with pytest.raises(TaskDataError, match=outside):
        first.padded_labels(3, 3)
    errors = Steps(name="s", label_form="error_steps", one_based=True).output
    with pytest.raises(TaskDataError, match=r"step index 4 .* \(numbered 1 to 3\)"):
        errors.padded_labels([4], 3)
    with pytest.raises(TaskDataError, match="step index 'two' in field 'label' is not an integer"):
        errors.padded_labels(["two"], 3)
    with pytest.raises(TaskDataError, match="must hold a list of step indices"):
        errors.padded_labels(2, 3)
    with pytest.raises(TaskDataError, match=r"^field 'steps' holds a list \['b'\], not a text\.$"):
        Steps(name="s").step_texts({"problem": "p", "steps": ["a", ["b"]]})
    with pytest.raises(TaskDataError, match=r"^step 2 in field 'steps' has no value \(null\)\.$"):
        Steps(name="s").step_texts({"problem": "p", "steps": ["a", None]})  # not an empty step
    per_step = Steps(name="s").output
    with pytest.raises(TaskDataError, match=r"must hold one label per step \(3\), got \[1, 0\]"):
        per_step.padded_labels([1, 0], 3)
    with pytest.raises(TaskDataError, match="step label 'maybe' in field 'label' is not true/false"):
        per_step.padded_labels(["maybe", 1, 1], 3)
    with pytest.raises(TaskDataError, match="holds 3 steps, more than the card's max_steps 2"):
        Steps(name="s", max_steps=2).texts({"problem": "p", "steps": ["a", "b", "c"]})
    tagged = Steps(name="s", steps="input", label_form="tagged", step_tag="ки")
    with pytest.raises(TaskDataError, match="does not repeat field 'input' with \\+ or - in each 'ки'"):
        tagged.encode({"input": "a ки", "label": "b +"}, [[], [10]], SPECIALS, 64)


def test_card_mistakes_are_one_sentence():
    with pytest.raises(CardError, match="`label_form: tagged` and `step_tag` go together"):
        Steps(name="s", label_form="tagged")
    with pytest.raises(CardError, match="label_form 'first' is not one of"):
        Steps(name="s", label_form="first")
    with pytest.raises(CardError, match="a step task takes no `labels`"):
        Steps(name="s", labels=["a", "b"])
    with pytest.raises(CardError, match="threshold must be in \\(0, 1\\)"):
        Steps(name="s", threshold=1.0)


def test_loss_is_each_solutions_mean_over_its_labelled_steps():
    head = Steps(name="s", max_steps=4).head(8, dropout=0.0, init_std=0.02)
    low = torch.finfo(torch.float32).min  # a step the solution has not
    logits = torch.tensor([[2.0, -1.0, low], [0.0, 1.0, -3.0]])
    labels = torch.tensor([[1.0, 0.0, NAN, NAN], [0.5, 1.0, NAN, NAN]])
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731  BCE(x, y) = softplus(x) - x·y
    expected = [(softplus(-2.0) + softplus(-1.0)) / 2, (math.log(2.0) + softplus(-1.0)) / 2]
    torch.testing.assert_close(head.losses(logits, labels), torch.tensor(expected), rtol=0, atol=1e-6)


def test_step_metrics_by_hand():
    """Five solutions at threshold 0.5 (a step below it judged wrong):
    A: wrong at 2, judged wrong first at 2 (a hit);  B: right, judged wrong at 1 and 2;
    C: wrong at 1 (the rest unlabelled), judged right;  D and E: right, judged right."""
    rows = [[0.9, 0.8, 0.3, NAN], [0.9, 0.4, 0.2, 0.6], [0.7, 0.6, NAN, NAN], [0.8, 0.9, NAN, NAN],
            [0.6, NAN, NAN, NAN]]  # fmt: skip
    probabilities = torch.tensor(rows, dtype=torch.float64)
    rows = [[1, 1, 0, NAN], [1, 1, 1, 1], [1, 0, NAN, NAN], [1, 1, NAN, NAN], [1, NAN, NAN, NAN]]
    labels = torch.tensor(rows, dtype=torch.float64)
    values = step_metric_values(probabilities, torch.full((5, 1), 0.5, dtype=torch.float64), labels)
    assert values["step_accuracy"].item() == pytest.approx(9 / 12)  # A 3, B 2 of 4, C 1 of 2, D 2, E 1
    assert values["step_f1"].item() == pytest.approx(2 * 1 / (3 + 2))  # judged wrong 3, wrong 2, both 1
    assert values["first_error_accuracy"].item() == pytest.approx(3 / 5)  # A, D, E
    on_errors, on_correct = 1 / 2, 2 / 3  # A of A, C; D, E of B, D, E
    assert values["processbench_f1"].item() == pytest.approx(
        2 * on_errors * on_correct / (on_errors + on_correct)
    )
    task = Steps(name="s", max_steps=4)
    assert task.main_metric == "processbench_f1" and task.output.default_lm_coef == 0.0
    predictions = torch.cat([probabilities, torch.full((5, 1), 0.5, dtype=torch.float64)], dim=1)
    assert task.metric_values(predictions, labels)["processbench_f1"].item() == pytest.approx(4 / 7)


def test_validation_chooses_the_lowest_threshold_with_the_best_processbench_f1():
    """The wrong step at 0.345 and the right one at 0.455: any threshold in (0.345, 0.455] gets both."""
    output = Steps(name="s", max_steps=2).output
    predictions = torch.tensor([[0.9, 0.345, 0.5], [0.9, 0.455, 0.5]])
    labels = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert output.choose(predictions, labels) == {
        "threshold": 0.35
    }  # as written (linspace: 0.35000000000000003)
    # Only erroneous solutions: ProcessBench's F1 is that side's first-error accuracy (it was 0 at
    # every threshold), which finds both wrong steps (at 0.3 and 0.455, after right ones) from 0.46 up.
    predictions = torch.tensor([[0.9, 0.3, 0.5], [0.9, 0.455, 0.5]])
    labels = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert output.choose(predictions, labels) == {"threshold": 0.46}
    values = output.metric_values(predictions, labels, ["processbench_f1", "first_error_accuracy"])
    assert float(values["processbench_f1"]) == float(values["first_error_accuracy"]) == 1.0  # at 0.5


def test_predictions_carry_the_threshold_and_outcomes_name_the_first_error():
    task = Steps(name="s", label_form="error_steps", one_based=True, max_steps=4)
    head = task.head(8, dropout=0.0, init_std=0.02)
    head.threshold = 0.6
    logits = head(torch.randn(2, 3, 8), torch.tensor([[True, True, True], [True, False, False]])).detach()
    logits[0], logits[1, 0] = torch.tensor([2.0, 0.0, -2.0]), 1.0  # σ: .88 .5 .12; one step: .73
    predictions = head.predictions(logits)
    assert predictions.shape == (2, 5) and predictions[:, -1].tolist() == pytest.approx([0.6, 0.6])
    assert predictions[1, 1:4].isnan().all()
    outcome = task.output.outcome(predictions[0], predictions[0])
    assert outcome["label"] == 2 and outcome["scores"] == pytest.approx([0.8808, 0.5, 0.1192], abs=1e-4)
    assert task.output.outcome(predictions[1], predictions[1])["label"] == -1  # none below 0.6
    assert task.format_prediction(predictions[0]) == "2"  # counted from 1, as the card counts
    assert "threshold" in head.state_dict()  # saved with the model


def test_the_threshold_survives_casts_and_loads_from_the_state_dict():
    """bf16-true and FSDP's buffer dtype cast a module's floating tensors: the chosen threshold is
    kept exactly (a bf16 buffer made 0.37 0.369140625), saved as a float64 `threshold`."""
    task = Steps(name="s", label_form="error_steps", max_steps=4)
    head = task.head(8, dropout=0.0, init_std=0.02)
    head.threshold = 0.37
    head.to(torch.bfloat16)
    assert head.threshold == 0.37
    state = head.state_dict()
    assert state["threshold"].dtype == torch.float64 and float(state["threshold"]) == 0.37
    other = task.head(8, dropout=0.0, init_std=0.02).to(torch.bfloat16)
    other.load_state_dict(state)
    assert other.threshold == 0.37 and float(other.predictions(torch.zeros(1, 2))[0, -1]) == pytest.approx(
        0.37
    )
    with pytest.raises(RuntimeError, match='Missing key.*"threshold"'):
        other.load_state_dict({k: v for k, v in state.items() if k != "threshold"})


def test_shipped_cards_read():
    prm = load_card(TASKS / "steps" / "prmbench.yaml")
    assert (prm.problem, prm.steps, prm.label, prm.one_based) == ("modified_question", "modified_process",
                                                                  "error_steps", True)  # fmt: skip
    pb = load_card(TASKS / "steps" / "processbench.yaml")
    assert pb.label_form == "first_error" and pb.test_splits == ["math", "olympiadbench", "omnimath"]
    shepherd = load_card(TASKS / "steps" / "math_shepherd.yaml")
    assert shepherd.step_tag == "ки" and shepherd.problem is None and shepherd.problem_end == "Step 1:"
    assert load_card(TASKS / "steps" / "steps.yaml").label == "labels"


CARD = """class_path: gpt_ft.adapters.Steps
init_args:
  name: sums
  label_form: first_error
  max_steps: 4
  index: id
  local: {splits: {train: train.json, validation: "train.json[:12]", test: "train.json[:12]"}}
"""


def test_fit_chooses_the_threshold_and_classifier_names_each_solutions_first_error(
    tmp_path, tokenizer_dir, capsys
):
    from gpt_ft import Classifier

    write_solutions(tmp_path / "train.json", 24, seed=0)
    card = tmp_path / "sums.yaml"
    card.write_text(CARD)
    main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=2", "--model.lr=1e-2"])
    out = capsys.readouterr().out
    assert "validation/processbench_f1" in out and "validation/threshold" in out
    last = next((tmp_path / "runs").rglob("last.ckpt"))
    clf = Classifier.from_checkpoint(last)
    threshold = float(clf.head.threshold)
    logged = [
        line.split(",") for line in next((tmp_path / "runs").rglob("metrics.csv")).read_text().splitlines()
    ]
    chosen = [float(row[logged[0].index("validation/threshold")]) for row in logged[1:]
              if row[logged[0].index("validation/threshold")]]  # fmt: skip
    assert len(chosen) == 2 and threshold == pytest.approx(chosen[-1])  # the last validation's choice, kept
    rows = json.loads((tmp_path / "train.json").read_text())[:3]
    predicted = clf.predict(rows)
    for row, got in zip(rows, predicted):
        assert len(got["scores"]) == len(row["steps"])
        below = [i for i, p in enumerate(got["scores"]) if p < threshold]
        assert got["label"] == (below[0] if below else -1)
    # gpt-ft label: each row again, with its first error and its steps' scores
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(
        [
            "label",
            f"--ckpt_path={last}",
            f"--input={tmp_path / 'in.jsonl'}",
            f"--output={tmp_path / 'out.jsonl'}",
        ]
    )
    labelled = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in labelled] == [p["label"] for p in predicted]
    for r, p in zip(labelled, predicted):
        assert r["scores"] == pytest.approx(p["scores"])
    # scored at another card's threshold: that one, over the one validation chose (it was kept), said;
    # above every step's probability, every step is judged wrong
    probabilities = [p for got in clf.predict(json.loads((tmp_path / "train.json").read_text())[:12])
                     for p in got["scores"]]  # fmt: skip
    above = round(max(probabilities) + (1 - max(probabilities)) / 2, 12)
    accuracy = {}
    for given in (None, above):
        override = [f"--data.task.init_args.threshold={given}"] * (given is not None)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            logs = f"--trainer.logger.init_args.save_dir={tmp_path / 'scored'}"  # (not the working folder's)
            main(["validate", f"--ckpt_path={last}", *override, logs])
        accuracy[given] = float(capsys.readouterr().out.split("validation/step_accuracy ")[1].split(",")[0])
        said = [str(w.message) for w in warned if "another task card" in str(w.message)]
        assert len(said) == (given is not None) and all(
            f"threshold {threshold!r} -> {given!r}." in m for m in said
        )
    rows = json.loads((tmp_path / "train.json").read_text())[:12]  # (judged: each step up to the first wrong)
    judged = sum(row["label"] + 1 if row["label"] >= 0 else len(row["steps"]) for row in rows)
    wrong = sum(row["label"] >= 0 for row in rows)
    assert accuracy[above] == pytest.approx(wrong / judged, abs=1e-4) and accuracy[above] != accuracy[None]
    with pytest.raises(SystemExit):  # a verdict per step: its own sigmoid, against the threshold chosen
        main(["calibrate", f"--ckpt_path={last}", f"--output={tmp_path / 'hot.ckpt'}"])
    said = "Task 'sums' has no softmax over labels to calibrate: `gpt-ft calibrate` fits classifiers' and "
    assert capsys.readouterr().err.strip().endswith(said + "multiple choice's.")


def test_a_trained_model_refusing_a_row_too_long_names_its_own_max_length(tokenizer_dir):
    """`Classifier` (and `gpt-ft label`) read at the model's max_length, which no option raises."""
    from gpt_ft import GPT, Classifier, GPTConfig
    from gpt_ft.data.tokenizer import load_tokenizer

    tokenizer, task = load_tokenizer(tokenizer_dir), Steps(name="s", label="labels", max_steps=4)
    config = GPTConfig.from_name("gpt-micro", n_positions=16, vocab_size=len(tokenizer), n_embd=32)
    head = task.head(config.n_embd, dropout=0.0, init_std=0.02, bias=True)
    clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=9, device="cpu")
    with pytest.raises(TaskDataError) as refused:
        clf.encode([{"problem": "the cat sat", "steps": ["a", "b", "c", "d"]}])
    assert str(refused.value).endswith(
        "none of its 1 tokens; a model reads at most the max_length it was trained at: train one at a "
        "larger --data.max_length."
    )


def test_a_step_index_outside_the_solution_names_file_and_line(tmp_path, tokenizer_dir, capsys):
    rows = [{"problem": "p", "steps": ["a", "b"], "error_steps": [1]},
            {"problem": "q", "steps": ["a", "b"], "error_steps": [3]}]  # fmt: skip
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = tmp_path / "card.yaml"
    card.write_text("""class_path: gpt_ft.adapters.Steps
init_args:
  name: s
  label: error_steps
  label_form: error_steps
  one_based: true
  index: null
  local: {splits: {train: train.jsonl, validation: train.jsonl}}
""")
    before = (tmp_path / "train.jsonl").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *common_args(card, tokenizer_dir, tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"gpt-ft: error: {tmp_path / 'train.jsonl'}, line 2: step index 3 in field 'error_steps' is outside "
        "the solution's 2 steps (numbered 1 to 2)."
    )
    assert (tmp_path / "train.jsonl").read_bytes() == before


def test_first_errors_given_as_numbers_and_strings_train(tmp_path, tokenizer_dir):
    """A label column mixing 2 and "2" (datasets reads it as JSON) still gives each solution's step
    labels, padded with NaN: the file's column lends the encoded one no type."""
    from gpt_ft.data.batches import collate, gold
    from gpt_ft.data.task_data import TaskDataModule

    rows = [
        {"problem": "p", "steps": ["a", "b"], "label": -1},
        {"problem": "q", "steps": ["a", "b"], "label": "1"},
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = tmp_path / "card.yaml"
    card.write_text(CARD.replace("max_steps: 4", "max_steps: 3").replace("index: id", "index: null")
                    .replace("train.json", "train.jsonl"))  # fmt: skip
    task = load_card(card)
    data = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), max_length=64)
    encoded = data.encoded("train", labelled=True)
    labels = gold(collate([encoded[0], encoded[1]], pad_id=0).labels)
    assert same(labels[0].tolist(), [1.0, 1.0, math.nan]) and same(labels[1].tolist(), [1.0, 0.0, math.nan])


def test_prmscore_and_wrong_steps_listed_past_the_end():
    """PRMScore by hand: the mean of the F1 of the wrong steps and of the right ones; PRMBench's
    card leaves out wrong steps listed past a solution's end (its own evaluation reads the steps)."""
    probabilities = torch.tensor([[0.9, 0.3, 0.2], [0.8, 0.7, 0.4]], dtype=torch.float64)
    labels = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    values = step_metric_values(probabilities, torch.full((2, 1), 0.5, dtype=torch.float64), labels)
    f1_wrong, f1_right = 2 * 1 / (3 + 1), 2 * 3 / (3 + 5)  # judged wrong 3, wrong 1; judged right 3, right 5
    assert values["prmscore"].item() == pytest.approx((f1_wrong + f1_right) / 2)
    assert values["step_f1"].item() == pytest.approx(f1_wrong)
    card = load_card(TASKS / "steps" / "prmbench.yaml")
    assert card.output.padded_labels([2, 34], 3)[:3] == [1.0, 0.0, 1.0] and "prmscore" in card.metrics
    with pytest.raises(TaskDataError, match=r"step index 0 .* \(numbered 1 to 3\)"):
        card.output.padded_labels([0], 3)  # before the first step: still refused
    with pytest.raises(TaskDataError, match=r"step index 4 .* \(numbered 1 to 3\)"):
        Steps(name="s", label_form="error_steps", one_based=True).output.padded_labels([4], 3)
    with pytest.raises(CardError, match="ignore_outside applies to `label_form: error_steps` only"):
        Steps(name="s", ignore_outside=True)
    with pytest.raises(CardError, match="prmscore"):
        Steps(name="s", metrics=["prmscore", "auc"])


def test_a_solution_without_steps_is_said_as_such():
    """An empty list is a list: the sentence asks for a step, not for a list."""
    task = Steps(name="s", max_steps=3)
    with pytest.raises(TaskDataError, match=r"^field 'steps' must hold at least one step, got \[\]\.$"):
        task.step_texts({"steps": []})
    with pytest.raises(TaskDataError, match=r"^field 'steps' must hold a list of steps, got 'a b'\.$"):
        task.step_texts({"steps": "a b"})
