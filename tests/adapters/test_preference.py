"""Preference pairs: the prompt split, the literal layout, Bradley-Terry's loss and the pairwise
metrics on hand-computed cases, and the shared prompt equal to two whole sequences."""

from __future__ import annotations

import math

import pytest
import torch

from gpt_ft.adapters import Preference, TaskDataError
from gpt_ft.adapters.cards import load_card
from gpt_ft.adapters.preference import split_dialogue, split_reply
from gpt_ft.data.batches import collate, collate_shared
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.errors import CardError
from tests.background import gpt_ft
from tests.helpers import MICRO, TASKS, fit_args
from tests.training.test_packing import FAMILIES, assert_same, module_for, run

MARKER = "\n\nAssistant:"
H = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: How do I boil an egg?\n\nAssistant:"


def test_the_dialogue_splits_at_the_last_marker_both_texts_share():
    prompt, chosen, rejected = split_dialogue(H + " Boil it for 8 minutes.", H + " I don't know.", MARKER)
    assert (prompt, chosen, rejected) == (H, " Boil it for 8 minutes.", " I don't know.")


def test_a_reply_that_holds_the_marker_is_not_cut_there():
    """The chosen reply writes a further turn: the prompt still ends at the shared marker."""
    chosen = H + " Boil it.\n\nHuman: Thanks\n\nAssistant: You're welcome."
    prompt, c, r = split_dialogue(chosen, H + " No idea.", MARKER)
    assert (prompt, r) == (H, " No idea.")
    assert c == " Boil it.\n\nHuman: Thanks\n\nAssistant: You're welcome."
    # Both replies start alike, past the marker: the shared words stay in the replies.
    prompt, c, r = split_dialogue(H + " Boil it for 8.", H + " Boil it for 3.", MARKER)
    assert (prompt, c, r) == (H, " Boil it for 8.", " Boil it for 3.")


def test_identical_and_markerless_pairs():
    assert split_dialogue(H + " Same.", H + " Same.", MARKER) == (H, " Same.", " Same.")
    assert split_dialogue("one reply", "another", MARKER) == ("", "one reply", "another")
    assert split_reply(H + " Boil it.", MARKER) == (H, " Boil it.")
    assert split_reply("no turns", MARKER) == ("", "no turns")


SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)


def test_literal_layout_prompt_once_per_reply_chosen_first():
    task = Preference(name="p", prompt="prompt", margin="margin")
    example = {"prompt": "p", "chosen": "c", "rejected": "r", "margin": "0.5"}
    enc = task.encode(example, [[10, 11, 12], [20, 21], [30]], SPECIALS, max_length=64)
    assert enc.sequences == [[1, 10, 11, 12, 2, 20, 21, 3], [1, 10, 11, 12, 2, 30, 3]]
    assert enc.extract_index == [7, 6]
    assert enc.label == 0.5
    assert task.output.label_text(enc.label) == "chosen preferred to rejected, margin 0.5"  # gpt-ft explain
    assert task.output.label_text(0.0) == "chosen preferred to rejected"
    assert task.output.label_text(None) is None  # one reply
    # Cut as multiple choice cuts, the prompt once for both replies, longest first, but keeping its
    # end: the last turn, which the replies answer (it lost the question of 3% of HH-RLHF's pairs).
    enc = task.encode(example, [list(range(10, 20)), [20, 21, 22, 23], [30]], SPECIALS, max_length=9)
    assert enc.sequences == [[1, 17, 18, 19, 2, 20, 21, 22, 3], [1, 17, 18, 19, 2, 30, 3]]
    enc = task.encode(example, [[10, 11], list(range(20, 30)), [30]], SPECIALS, max_length=9)
    assert enc.sequences == [[1, 10, 11, 2, 20, 21, 22, 23, 3], [1, 10, 11, 2, 30, 3]]  # replies: their start


def test_rows_read_as_pairs_or_one_reply():
    task = Preference(name="p", turn_marker=MARKER)
    assert task.texts({"chosen": H + " A.", "rejected": H + " B."}) == [H, " A.", " B."]
    assert task.output.example_label({"chosen": "a", "rejected": "b"}) == 0.0
    assert task.texts({"reply": H + " A."}) == [H, " A."]  # one reply to score
    assert task.output.example_label({"reply": "a"}) is None
    # A table (CSV, TSV, Parquet) of pairs and single replies: each row has every column.
    for blank in ("", None):
        row = {"chosen": blank, "rejected": blank, "reply": H + " A."}
        assert task.texts(row) == [H, " A."] and task.output.example_label(row) is None
    assert task.texts({"chosen": H + " A.", "rejected": H + " B.", "reply": ""}) == [H, " A.", " B."]
    with pytest.raises(
        TaskDataError, match="field 'rejected' holds a text where 'chosen' holds chat messages"
    ):
        task.texts({"chosen": [{"role": "user", "content": "hi"}], "rejected": "b"})
    with pytest.raises(  # the side that holds the messages named, whichever it is
        TaskDataError, match="field 'chosen' holds a text where 'rejected' holds chat messages"
    ):
        task.texts({"chosen": "a", "rejected": [{"role": "user", "content": "hi"}]})
    with pytest.raises(
        TaskDataError, match="field 'chosen' holds \\[\\{'role': 'user'\\}\\], not a text or chat"
    ):
        task.texts({"chosen": [{"role": "user"}], "rejected": "b"})
    with pytest.raises(TaskDataError, match=r"^field 'prompt' holds a list \['q'\], not a text\.$"):
        Preference(name="p", prompt="prompt").texts({"prompt": ["q"], "chosen": "a", "rejected": "b"})
    with pytest.raises(TaskDataError, match="margin 'wide' in field 'margin' is not a number"):
        pair = {"chosen": "a", "rejected": "b", "margin": "wide"}
        Preference(name="p", margin="margin").output.example_label(pair)


USER = {"role": "user", "content": "How do I boil an egg?"}


def test_chat_messages_split_at_the_messages_both_sides_start_with():
    """UltraFeedback's rows: the user's turn in both lists is the prompt. Without a chat template,
    HH-RLHF's layout with the roles' names."""
    task = Preference(name="p")
    row = {
        "chosen": [USER, {"role": "assistant", "content": "Boil it."}],
        "rejected": [USER, {"role": "assistant", "content": "No idea."}],
    }
    assert task.texts(row) == ["\n\nUser: How do I boil an egg?\n\nAssistant:", " Boil it.", " No idea."]
    assert task.texts({"reply": row["chosen"]}) == task.texts(row)[:2]  # one reply: all but its last message
    more = {**row, "rejected": [*row["rejected"], {"role": "user", "content": "?"}]}
    assert task.texts(more)[2] == " No idea.\n\nUser: ?"


def test_chat_messages_through_the_tokenizers_chat_template(tokenizer_dir):
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    task = Preference(name="p")
    row = {
        "chosen": [USER, {"role": "assistant", "content": "Boil it."}],
        "rejected": [USER, {"role": "assistant", "content": "No."}],
    }
    (enc,) = task.encode_examples([row], tokenizer, special_token_ids(tokenizer), max_length=64)
    texts = [tokenizer.decode(seq[1:-1]) for seq in enc.sequences]
    delim = tokenizer.decode([special_token_ids(tokenizer).delim])
    assert texts == [f"<user>How do I boil an egg?</s><assistant>{delim}Boil it.</s>",
                     f"<user>How do I boil an egg?</s><assistant>{delim}No.</s>"]  # fmt: skip
    assert task._chat is None  # bound only while encoding
    # A template that refuses a dialogue (Gemma's: no system turn) names the example in one sentence.
    tokenizer.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('No system role') }}{% endif %}"
    )
    system = {
        "chosen": [{"role": "system", "content": "Be brief."}, *row["chosen"]],
        "rejected": row["rejected"],
    }
    refused = r"^example 0: the tokenizer's chat template refuses these messages: No system role$"
    with pytest.raises(TaskDataError, match=refused):  # a jinja2 traceback before
        task.encode_examples([system], tokenizer, special_token_ids(tokenizer), max_length=64)


def test_bradley_terry_loss_and_centering_by_hand():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 2.0]])
    margins = torch.tensor([0.0, 0.0, 0.5])
    head = Preference(name="p").head(4, dropout=0.0, init_std=0.02)
    expected = [math.log1p(math.exp(-1.0)), math.log(2.0), math.log1p(math.exp(3.5))]
    torch.testing.assert_close(head.losses(rewards, margins), torch.tensor(expected), rtol=0, atol=1e-6)
    centered = Preference(name="p", center_rewards=0.01).head(4, dropout=0.0, init_std=0.02)
    squares = torch.tensor([1.0, 0.0, 1.0])  # (r_chosen + r_rejected)²
    torch.testing.assert_close(
        centered.losses(rewards, margins), torch.tensor(expected) + 0.01 * squares, rtol=0, atol=1e-6
    )
    # The softmax over the two scores with the chosen one right is the same loss (margin 0).
    ce = torch.nn.functional.cross_entropy(rewards, torch.zeros(3, dtype=torch.long), reduction="none")
    torch.testing.assert_close(head.losses(rewards, torch.zeros(3)), ce)


def test_pairwise_accuracy_and_margin_by_hand():
    task = Preference(name="p")
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5], [-1.0, 2.0], [3.0, 1.0]])
    values = task.metric_values(rewards, torch.zeros(4))
    assert values["accuracy"].item() == pytest.approx(2.5 / 4)  # two right, one tie (half), one wrong
    assert values["margin"].item() == pytest.approx((1 + 0 - 3 + 2) / 4)
    # Identical replies placed elsewhere in a packed row score a few last bits apart: still a tie,
    # whichever way the bits fall (the batch size moved the accuracy); 2**-16 apart is not one.
    near = torch.tensor([[0.3, 0.3 + 3e-8], [0.3 + 3e-8, 0.3], [-2.0, -2.0 + 1e-6], [0.25, 0.25 + 2**-16]])
    assert task.metric_values(near, torch.zeros(4))["accuracy"].item() == pytest.approx(1.5 / 4)
    assert [task.format_prediction(r) for r in near] == ["0", "0", "0", "-1.5258789e-05"]  # -2**-16
    assert task.format_prediction(torch.tensor([1.25, -0.5])) == "1.75"
    sides = [task.output.outcome(r, r)["label"] for r in near]
    assert sides == ["chosen", "chosen", "chosen", "rejected"]  # the first on a tie
    assert task.format_prediction(torch.tensor([0.1234567, math.nan])) == "0.1234567"  # one reply
    assert task.main_metric == "accuracy" and task.output.default_lm_coef == 0.0


def test_predictions_and_outcomes_of_a_pair_and_of_one_reply():
    task = Preference(name="p")
    head = task.head(4, dropout=0.0, init_std=0.02)
    outputs = head(torch.randn(2, 2, 4), torch.tensor([[True, True], [True, False]]))
    predictions = head.predictions(outputs)
    assert not predictions[0].isnan().any() and predictions[1, 1].isnan()
    pair, one = (
        task.output.outcome(predictions[0], predictions[0]),
        task.output.outcome(predictions[1], predictions[1]),
    )
    r0, r1 = predictions[0].tolist()
    assert pair["label"] == ("chosen" if r0 >= r1 else "rejected")
    assert pair["scores"] == {"chosen": r0, "rejected": r1}
    assert pair["probability"] == pytest.approx(1 / (1 + math.exp(r1 - r0)))
    assert one == {"label": predictions[1, 0].item(), "scores": predictions[1, 0].item()}
    assert torch.tensor(float(task.format_prediction(predictions[0]))).item() == torch.tensor(r0 - r1).item()


def test_card_mistakes_are_one_sentence():
    with pytest.raises(CardError, match="give `prompt` \\(a field\\) or `turn_marker`, not both"):
        Preference(name="p", prompt="prompt", turn_marker=MARKER)
    with pytest.raises(CardError, match="a preference task takes no `labels`"):
        Preference(name="p", labels=["a", "b"])
    with pytest.raises(CardError, match="center_rewards must be >= 0"):
        Preference(name="p", center_rewards=-1.0)
    with pytest.raises(CardError, match="unknown metric"):
        Preference(name="p", metrics=["f1"])


def test_shipped_cards_read():
    hh = load_card(TASKS / "preference" / "hh_rlhf.yaml")
    assert hh.turn_marker == MARKER and hh.prompt is None and hh.hub.data_dir == "helpful-base"
    pairs = load_card(TASKS / "preference" / "pairs.yaml")
    assert pairs.prompt == "prompt" and pairs.metrics == ["accuracy", "margin"]
    ultra = load_card(TASKS / "preference" / "ultrafeedback_binarized.yaml")
    assert ultra.hub.splits == {"train": "train_prefs", "validation": "test_prefs", "test": "test_prefs"}
    assert ultra.prompt is None


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_shared_prompt_equals_two_whole_sequences(tokenizer_dir, family):
    """The prompt run once (padded shared-context batch) gives the losses, gradients and rewards of
    both whole sequences run apart, to 1e-5; λ = 0.5 so the LM terms are compared too."""
    module, rows, specials = module_for(tokenizer_dir, "preference", family)
    module.train()
    whole = collate(rows, specials.pad)
    shared = collate_shared(rows, specials.pad, specials.delim)
    assert shared is not None and shared.answer_ids.shape[1] == 2
    assert_same(run(module, whole), run(module, shared), whole.choice_mask)


def write_dialogues(folder, n: int, seed: int) -> None:
    """HH-RLHF's layout: `n` pairs of whole dialogues, gzipped JSON lines; the chosen reply is the
    one that says "happy" (both replies are random words otherwise)."""
    import gzip
    import json
    import random

    from tests.helpers import WORDS

    rng = random.Random(seed)
    words = [w for w in WORDS if w != "happy"]
    say = lambda k: " ".join(rng.choice(words) for _ in range(k))  # noqa: E731
    with gzip.open(folder / ("train.jsonl.gz" if seed == 0 else "test.jsonl.gz"), "wt") as f:
        for _ in range(n):
            dialogue = f"\n\nHuman: {say(rng.randint(2, 8))}{MARKER}"
            good, bad = say(rng.randint(1, 4)).split(), say(rng.randint(1, 5))
            good.insert(rng.randint(0, len(good)), "happy")
            pair = {"chosen": f"{dialogue} {' '.join(good)}", "rejected": f"{dialogue} {bad}"}
            f.write(json.dumps(pair) + "\n")


def start_preference_fit(root, tokenizer_dir):
    """HH-RLHF's card on gzipped dialogues, a micro model, 6 epochs: in a process of its own."""
    write_dialogues(root, 96, seed=0)
    write_dialogues(root, 40, seed=1)
    return [
        gpt_ft(
            "fit",
            f"--data.task={TASKS / 'preference' / 'hh_rlhf.yaml'}",
            f"--data.tokenizer={tokenizer_dir}",
            f"--data.data_dir={root}",
            "--data.batch_size=8",
            "--data.max_length=48",
            "--model.preset=gpt-micro",
            f"--model.overrides={MICRO}",
            "--model.lr=3e-3",
            "--model.warmup_fraction=0.1",
            "--trainer.max_epochs=6",
            "--seed_everything=0",
            f"--trainer.default_root_dir={root}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        )  # fmt: skip
    ]


@pytest.mark.background(start=start_preference_fit)
def test_gpt_ft_fit_learns_a_synthetic_preference(background):
    """A micro model reaches pairwise accuracy >= 0.9 on pairs whose chosen reply says "happy"."""
    import csv

    (run,) = background.runs
    assert run.returncode == 0, run.stderr[-3000:]
    (metrics,) = background.root.rglob("metrics.csv")
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    validation = [r for r in rows if r.get("validation/accuracy")]
    accuracy = [float(r["validation/accuracy"]) for r in validation]
    assert len(accuracy) == 6 and accuracy[0] < 0.9 <= accuracy[-1], accuracy
    assert float(validation[-1]["validation/margin"]) > 0
    assert not any(r.get("train/lm_loss") for r in rows)  # λ = 0 by default
    check_rewards_from_the_checkpoint(background.root, accuracy[-1])


def check_rewards_from_the_checkpoint(root, accuracy: float) -> None:
    """`Classifier` on the dev pairs: the logged pairwise accuracy, each pair's rewards equal to
    its replies scored one at a time, and `gpt-ft label` writing the preferred side and rewards."""
    import gzip
    import json

    from gpt_ft import Classifier
    from gpt_ft.cli import main

    (ckpt,) = root.rglob("last.ckpt")
    clf = Classifier.from_checkpoint(ckpt, device="cpu")
    pairs = [json.loads(line) for line in gzip.open(root / "test.jsonl.gz", "rt")]
    outcomes = clf.predict(pairs, batch_size=7)
    gaps = torch.tensor([o["scores"]["chosen"] - o["scores"]["rejected"] for o in outcomes])
    assert ((gaps > 0).float() + 0.5 * (gaps == 0).float()).mean().item() == pytest.approx(accuracy, abs=1e-6)
    singles = clf.predict([{"reply": p[side]} for p in pairs[:6] for side in ("chosen", "rejected")])
    expected = [o["scores"][side] for o in outcomes[:6] for side in ("chosen", "rejected")]
    scored = torch.tensor([o["label"] for o in singles])
    torch.testing.assert_close(scored, torch.tensor(expected), rtol=0, atol=1e-5)
    for o in outcomes[:6]:
        gap = o["scores"]["chosen"] - o["scores"]["rejected"]
        assert o["label"] == ("chosen" if gap >= 0 else "rejected")
        assert o["probability"] == pytest.approx(1 / (1 + math.exp(-gap)))
    source = root / "pairs.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in pairs[:3]))
    main(["label", f"--ckpt_path={ckpt}", f"--input={source}", f"--output={root / 'labelled.jsonl'}"])
    written = [json.loads(line) for line in (root / "labelled.jsonl").read_text().splitlines()]
    assert [w["prediction"] for w in written] == [o["label"] for o in outcomes[:3]]
    rewards = lambda rows: [r["scores"][side] for r in rows for side in ("chosen", "rejected")]  # noqa: E731
    assert rewards(written) == pytest.approx(rewards(outcomes[:3]), abs=1e-5)


def start_preference_suite(root, tokenizer_dir):
    data = root / "hh"
    data.mkdir()
    write_dialogues(data, 24, seed=0)
    write_dialogues(data, 8, seed=1)
    suite = root / "suite.yaml"
    suite.write_text(f"name: rm\nseeds: [0]\ntasks: [{TASKS / 'preference' / 'hh_rlhf.yaml'}]\n")
    return [
        gpt_ft(
            "suite",
            str(suite),
            f"--out_dir={root / 'out'}",
            f"--tokenizer={tokenizer_dir}",
            f"--data_dir={data}",
            "--train_sizes",
            "[8]",
            *fit_args(
                "--data.batch_size=4",
                "--data.max_length=48",
                "--model.preset=gpt-micro",
                f"--model.overrides={MICRO}",
                "--trainer.max_epochs=1",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
            ),
        )  # fmt: skip
    ]


@pytest.mark.background(start=start_preference_suite)
def test_suite_and_learning_curves_take_a_preference_card(background):
    """`gpt-ft suite` on HH-RLHF's card: pairwise accuracy is the main metric, and a training-size
    curve draws its subsets from pairs (which have no label column)."""
    import json

    (run,) = background.runs
    assert run.returncode == 0, run.stderr[-3000:]
    out = background.root / "out"
    task = json.loads((out / "results.json").read_text())["tasks"]["hh_rlhf"]
    assert task["main_metric"] == "validation/accuracy"
    (point,) = next(iter(task["curves"].values())).values()
    assert point["examples"] == 8  # of 24 pairs
    (result,) = (out / "runs").rglob("result.json")
    metrics = json.loads(result.read_text())["metrics"]
    assert point["mean"] == pytest.approx(100 * metrics["validation/accuracy"])  # pairwise accuracy, percent
    assert {"validation/accuracy", "validation/margin"} <= set(metrics)
