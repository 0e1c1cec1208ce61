"""Output kinds: chosen once from the card (a shape's own kind, else `regression` picks a score or a
class), each with its head, labels, metrics and written predictions; a card read into its parts;
and a user's adapter bringing an output kind of its own."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters import (
    AnswerOutput,
    ChoiceHead,
    ChoiceOutput,
    ClassificationHead,
    ClassificationOutput,
    ClozeOutput,
    EmbeddingOutput,
    HubDataset,
    LabelSpec,
    LocalFiles,
    MultiLabel,
    MultiLabelHead,
    MultiLabelOutput,
    MultipleChoice,
    PreferenceOutput,
    RankingOutput,
    RegressionHead,
    RegressionOutput,
    RerankOutput,
    RewardBench2Output,
    Similarity,
    SingleText,
    StepOutput,
    TaskHead,
    TaskOutput,
    TextPair,
)
from gpt_ft.adapters.cards import load_card
from gpt_ft.adapters.outputs import score_text
from tests.helpers import TASK_CARDS, TASKS


def test_the_card_chooses_the_output_kind_and_the_kind_its_head():
    cases = [
        (SingleText(name="t", labels=["neg", "pos"]), ClassificationOutput, ClassificationHead, 2),
        (Similarity(name="s", regression=True), RegressionOutput, RegressionHead, 1),
        (MultipleChoice(name="m", context=["c"], choices=["a", "b"]), ChoiceOutput, ChoiceHead, 1),
        (MultiLabel(name="e", labels=["a", "b", "c"]), MultiLabelOutput, MultiLabelHead, 3),
    ]
    for task, kind, head, outputs in cases:
        assert type(task.output) is kind and task.output.num_outputs == outputs
        built = task.head(8, dropout=0.0, init_std=0.02)
        assert type(built) is head and built.out_features == outputs


@pytest.mark.parametrize("card", TASK_CARDS)
def test_every_shipped_card_keeps_its_output_kind(card):
    task = load_card(TASKS / f"{card}.yaml")
    expected = {"glue/stsb": RegressionOutput, "go_emotions": MultiLabelOutput}
    choices = [
        "arc_challenge",
        "arc_easy",
        "commonsense_qa",
        "hellaswag",
        "mmlu",
        "openbookqa",
        "piqa",
        "race",
        "social_iqa",
        "storycloze",
    ]
    expected |= dict.fromkeys([*choices, "superglue/copa", "swag", "winogrande"], ChoiceOutput)
    preference = ["preference/hh_rlhf", "preference/pairs", "preference/ultrafeedback_binarized"]
    expected |= dict.fromkeys(preference, PreferenceOutput)
    embeddings = ["embedding/pairs", "embedding/stsb", "embedding/snli", "embedding/mnli"]
    expected |= dict.fromkeys(embeddings, EmbeddingOutput)
    expected["rerank/pairs"] = RerankOutput
    steps = ("steps", "prmbench", "processbench", "math_shepherd")
    expected |= {f"steps/{name}": StepOutput for name in steps}
    rankings = ("replies", "ultrafeedback", "prmbench")
    expected |= {f"ranking/{name}": RankingOutput for name in rankings}
    expected["ranking/rewardbench2"] = RewardBench2Output
    expected["superglue/multirc"] = AnswerOutput
    expected["superglue/record"] = ClozeOutput
    assert type(task.output) is expected.get(card, ClassificationOutput)


def test_a_shape_with_outputs_of_its_own_cannot_be_a_regression():
    with pytest.raises(ValueError, match=r"^Task 'm': a multiple-choice task cannot be a regression.$"):
        MultipleChoice(name="m", context=["c"], choices=["a", "b"], regression=True)
    with pytest.raises(ValueError, match=r"^Task 'e': a multi-label task cannot be a regression.$"):
        MultiLabel(name="e", labels=["a"], regression=True)


def test_a_classification_of_one_class_is_refused_at_the_card():
    """One class is never wrong, and its metrics cannot be computed: the card says so."""
    with pytest.raises(
        ValueError, match=r"^Task 'one': `labels` \['only'\] name one class: give two or more\.$"
    ):
        SingleText(name="one", labels=["only"])


def test_metric_defaults_and_choices_come_from_the_kind():
    assert SingleText(name="t", labels=["a", "b"]).metrics == ["accuracy"]
    assert Similarity(name="s", regression=True).metrics == ["pearson", "spearman"]
    assert MultiLabel(name="e", labels=["a"]).metrics == ["micro_f1", "macro_f1"]
    assert MultiLabel(name="e", labels=["a"]).main_metric == "micro_f1"
    with pytest.raises(ValueError, match=r"unknown metric\(s\) \['micro_f1'\]; allowed: accuracy, f1"):
        TextPair(name="p", labels=["a", "b"], metrics=["micro_f1"])


def test_written_predictions_and_shown_labels_by_kind():
    cls = SingleText(name="t", labels=["neg", "pos"], submission_labels=["0", "1"])
    assert cls.format_prediction(torch.tensor(1)) == "1"
    assert cls.format_prediction(torch.tensor(1), submission=False) == "pos"
    assert cls.output.label_text(0) == "neg" and cls.output.label_text(None) is None
    assert cls.output.outcome(torch.tensor(1), torch.tensor([0.25, 0.75])) == {
        "label": "pos",
        "scores": {"neg": 0.25, "pos": 0.75},
    }
    reg = Similarity(name="s", regression=True, score_range=(0, 5))
    # six significant digits: three tied STS-B scores that differ, and moved its Spearman from the file's
    assert reg.format_prediction(torch.tensor(3.14159)) == "3.14159" and reg.output.label_text(2.5) == 2.5
    assert reg.format_prediction(torch.tensor(0.7668541)) != reg.format_prediction(torch.tensor(0.7671))
    # More digits where float32 needs them: a collapsed embedding model's cosines were all "1".
    near = torch.tensor([0.99999964, 1.0, 0.9999994])
    assert [score_text(v) for v in near.tolist()] == ["0.99999964", "1", "0.9999994"]
    assert all(torch.tensor(float(score_text(v))).item() == v for v in torch.randn(1000).tolist())
    assert [score_text(v) for v in (3.5e38, -1e39, 1e-50, 0.0)] == [
        "3.5e+38",
        "-1e+39",
        "1e-50",
        "0",
    ]  # not float32's
    assert reg.output.outcome(torch.tensor(1.5), torch.tensor(1.5)) == {"label": 1.5, "scores": 1.5}
    mc = MultipleChoice(name="m", context=["c"], choices=["a", "b"], labels=["1", "2"])
    assert mc.format_prediction(torch.tensor(1)) == "2" and mc.output.label_text(1) == "2"
    assert (
        mc.output.class_names is None
        and cls.output.class_names == ["neg", "pos"]
        and reg.output.class_names is None
    )


def test_minus_one_marks_an_unlabelled_row_unless_the_card_has_it_as_a_label():
    """The hub's test splits mark a missing label -1; a card with a class "-1" (negative of three
    sentiments) or a score range that holds -1 reads it as that label."""
    plain = SingleText(name="t", labels=["neg", "pos"]).output
    three = SingleText(name="t", labels=["-1", "0", "1"]).output
    ranged = Similarity(name="s", regression=True, score_range=[-1.0, 1.0]).output
    unranged = Similarity(name="s", regression=True).output
    assert [plain.example_label({"label": v}) for v in (-1, "-1", 1)] == [None, None, 1]
    assert [three.example_label({"label": v}) for v in (-1, "-1", "1")] == [0, 0, 2]
    assert [ranged.example_label({"label": v}) for v in (-1, "-1", "0.5")] == [-1.0, -1.0, 0.5]
    assert [unranged.example_label({"label": v}) for v in (-1, "-1", "0.5")] == [None, None, 0.5]
    multi = MultiLabel(name="m", labels=["-1", "a"]).output
    assert multi.example_label({"label": "-1"}) == [1, 0]


def test_where_labels_are_numbers_a_value_is_a_label_never_an_index():
    """Story Cloze's endings are labelled '1' and '2': a file counting them from 0 is refused, not
    read with 0 as the first ending and 1 as the first too; names that are words still take ids."""
    from gpt_ft.adapters import MultipleChoice, TaskDataError

    cloze = MultipleChoice(name="c", context=["story"], choices=["e1", "e2"], labels=["1", "2"]).output
    assert [cloze.label_id(v) for v in ("1", 2, " 2 ")] == [0, 1, 1]
    with pytest.raises(
        TaskDataError, match=r"^label 0 in field 'label' is not among the labels \['1', '2'\] \("
    ):
        cloze.label_id(0)
    three = SingleText(name="t", labels=["-1", "0", "1"]).output
    with pytest.raises(TaskDataError, match="the labels are numbers"):
        three.label_id(2)
    words = SingleText(name="t", labels=["neg", "pos"]).output
    assert [words.label_id(v) for v in ("pos", 0, "1")] == [1, 0, 1]
    # a JSON column with one fraction is read as floats: its whole numbers are ids, the fraction named
    assert [words.label_id(v) for v in (0.0, 1.0)] == [0, 1] and cloze.label_id(2.0) == 1
    floats = SingleText(name="t", labels=["1.0", "0.0"]).output  # names that are numbers: by value
    assert [floats.label_id(v) for v in (1.0, 0.0, "0.0", 1, "1", 0)] == [0, 1, 1, 0, 0, 1]
    with pytest.raises(TaskDataError, match=r"^label 0.5 in field 'label' is not among the labels"):
        words.label_id(0.5)
    with pytest.raises(
        TaskDataError, match=r"^label '²' in field 'label' is not among the labels \['neg', 'pos'\]\.$"
    ):
        words.label_id("²")
    for bad in ("--1", "١", "+1", "1_0"):  # read as no id (int() takes the last three), never a crash
        with pytest.raises(
            TaskDataError, match=f"^label {re.escape(repr(bad))} in field 'label' is not among"
        ):
            words.label_id(bad)
    with pytest.raises(TaskDataError, match="^label '١' in field 'label' is not among the labels"):
        three.label_id("١")


def test_a_card_is_read_into_its_parts_under_the_card_names():
    task = TextPair(
        name="nli",
        label="gold",
        labels=["yes", "no"],
        ignore_labels=["-"],
        metrics=["accuracy", "f1"],
        main_metric="f1",
        index=None,
        hub=HubDataset(path="org/nli"),
        local=LocalFiles(splits={"train": "t.tsv", "dev": "d.tsv"}),
        validation_splits=["dev"],
        submission_files={"test": "NLI.tsv"},
        submission_labels=["1", "0"],
    )
    assert task.output.spec == LabelSpec(field="gold", names=["yes", "no"], ignore=["-"])
    assert (task.scoring.metrics, task.scoring.main_metric) == (["accuracy", "f1"], "f1")
    assert task.sources.hub == HubDataset(path="org/nli") and task.sources.local.splits["dev"] == "d.tsv"
    assert (task.sources.validation_splits, task.sources.test_splits, task.sources.index) == (
        ["dev"],
        ["test"],
        None,
    )
    assert (task.submission.files, task.submission.labels) == ({"test": "NLI.tsv"}, ["1", "0"])
    # What the data, training and evaluation code reads, by the card's own names.
    assert (task.label, task.labels, task.ignore_labels, task.main_metric) == (
        "gold",
        ["yes", "no"],
        ["-"],
        "f1",
    )
    assert (task.validation_splits, task.index, task.submission_files) == (["dev"], None, {"test": "NLI.tsv"})
    assert task.submission_label(0) == "1" and task.regression is False


class HingeHead(TaskHead):
    """One score; hinge loss on labels ±1; its sign."""

    def losses(self, outputs: Tensor, labels: Tensor) -> Tensor:
        return F.relu(1 - outputs.squeeze(-1) * labels)

    def predictions(self, outputs: Tensor) -> Tensor:
        return (outputs.squeeze(-1) > 0).long() * 2 - 1


class Sign(TaskOutput):
    """A user's output kind: +1 or -1 per example, scored by accuracy, written as a sign."""

    kind = "sign"

    @property
    def num_outputs(self) -> int:
        return 1

    def head(self, n_embd, *, dropout, init_std):
        return HingeHead(n_embd, 1, dropout=dropout, init_std=init_std)

    def metric_values(self, predictions, labels, metrics):
        return {name: (predictions == labels).float().mean() for name in metrics}

    def format_prediction(self, prediction, name):
        return "+" if prediction > 0 else "-"

    def label_id(self, value):
        return 1 if str(value) == "+" else -1


class SignedText(SingleText):
    def own_output(self, spec: LabelSpec) -> TaskOutput:
        return Sign(self.name, spec)


def test_a_users_adapter_brings_its_own_output_kind():
    task = SignedText(name="signs", text="t")
    assert isinstance(task.head(4, dropout=0.0, init_std=0.02), HingeHead)
    assert [task.output.example_label({"label": v}) for v in ("+", "-", None)] == [1, -1, None]
    assert task.metric_values(torch.tensor([1, -1]), torch.tensor([1, 1])) == {"accuracy": 0.5}
    assert task.format_prediction(torch.tensor(-1)) == "-" and task.output.class_names is None
    with pytest.raises(ValueError, match="a sign task cannot be a regression"):
        SignedText(name="signs", regression=True)


def test_explain_shows_labels_as_the_card_writes_them():
    """Story Cloze's right ending '1' showed as 0 (its index); a step label's padding as NaN, which
    `--json true` wrote as invalid JSON."""
    import json
    import math

    from gpt_ft.adapters import MultipleChoice, Steps

    cloze = MultipleChoice(name="c", context=["story"], choices=["e1", "e2"], labels=["1", "2"])
    assert cloze.output.label_text(0) == "1" and cloze.output.label_text(None) is None
    swag = MultipleChoice(name="s", context=["story"], choices=["e1", "e2"])
    assert swag.output.label_text(1) == 1
    shown = Steps(name="p", max_steps=4).output.label_text([1.0, math.nan, 0.0, math.nan])
    assert shown == [1.0, None, 0.0, None] and json.loads(json.dumps(shown, allow_nan=False)) == shown
