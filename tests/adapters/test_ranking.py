"""Rankings of N replies: the literal layout, each row layout (scores, ranks, chosen and rejected
lists, records, PRMBench grouped by question), the three listwise losses and the ranking metrics on
hand-computed cases, Bradley-Terry's pair as the N = 2 case, and a whole run."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from gpt_ft.adapters import Preference, Ranking, TaskDataError
from gpt_ft.adapters.cards import load_card
from gpt_ft.adapters.ranking import rank_metric_values, ranking_losses
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.errors import CardError
from tests.helpers import TASKS, common_args

SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)
NAN = math.nan


def same(a, b) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_literal_layout_the_prompt_once_per_reply():
    task = Ranking(name="r", max_replies=4)
    example = {"prompt": "p", "replies": ["a", "b", "c"], "scores": [2, None, 7.5]}
    enc = task.encode(example, [[10, 11], [20], [30, 31], [40]], SPECIALS, max_length=64)
    assert enc.sequences == [[1, 10, 11, 2, 20, 3], [1, 10, 11, 2, 30, 31, 3], [1, 10, 11, 2, 40, 3]]
    assert enc.extract_index == [5, 6, 5] and same(enc.label, [2.0, NAN, 7.5, NAN])
    assert task.texts(example) == ["p", "a", "b", "c"]
    assert task.texts({**example, "replies": '["a", "b", "c"]'}) == ["p", "a", "b", "c"]  # a csv's cell
    cut = task.encode(example, [list(range(10, 16)), [20], [30, 31], [40]], SPECIALS, max_length=7)
    assert cut.sequences == [
        [1, 14, 15, 2, 20, 3],
        [1, 14, 15, 2, 30, 31, 3],
        [1, 14, 15, 2, 40, 3],
    ]  # its end
    assert (
        task.encode({"prompt": "p", "replies": ["a"]}, [[10], [20]], SPECIALS, 64).label is None
    )  # one to score


def test_each_row_layout():
    ranks = Ranking(name="r", scores=None, ranks="ranks", max_replies=3)
    enc = ranks.encode(
        {"prompt": "p", "replies": ["a", "b"], "ranks": [2, 1]}, [[9], [10], [11]], SPECIALS, 64
    )
    assert same(enc.label, [-2.0, -1.0, NAN])  # rank 1 the best: the highest
    bench = Ranking(name="r", chosen="chosen", rejected="rejected")  # RewardBench 2
    row = {"prompt": "p", "chosen": ["good"], "rejected": ["bad", "worse", "worst"]}
    assert bench.texts(row) == ["p", "good", "bad", "worse", "worst"]
    assert same(bench.encode(row, [[9]] * 5, SPECIALS, 64).label, [1.0, 0.0, 0.0, 0.0])
    ultra = Ranking(name="r", prompt="instruction", replies="completions", reply_text="response",
                    reply_score="overall_score")  # fmt: skip
    row = {
        "instruction": "p",
        "completions": [{"response": "x", "overall_score": 7}, {"response": "y", "overall_score": 3.5}],
    }
    assert ultra.texts(row) == ["p", "x", "y"]
    assert same(ultra.encode(row, [[9]] * 3, SPECIALS, 64).label, [7.0, 3.5, NAN, NAN])


def test_prmbench_grouped_by_question_the_original_above_its_modified_solutions():
    task = Ranking(name="r", group_by="q", chosen="original", rejected="modified")
    records = [
        {"q": "Q1", "original": ["1. a", "2. b"], "modified": ["1. a", "2. c"]},
        {"q": "Q2", "original": ["1. x"], "modified": ["1. y"]},
        {"q": "Q1", "original": ["1. a", "2. b"], "modified": ["1. d"]},
        {"q": "Q1", "original": ["1. a", "2. b"], "modified": ["1. a", "2. c"]},  # a duplicate: once
        {"q": "Q3", "original": ["1. z"], "modified": ["1. z"]},  # one solution: it orders nothing, left out
    ]
    rows, first = task.regroup(records)
    assert first == [0, 1] and [row["q"] for row in rows] == ["Q1", "Q2"]
    assert rows[0] == {"q": "Q1", "original": ["1. a\n2. b"], "modified": ["1. a\n2. c", "1. d"]}
    assert task.texts(rows[0]) == ["Q1", "1. a\n2. b", "1. a\n2. c", "1. d"]
    # A modified solution without errors (PRMBench's alternative right ones) ranks with the original:
    # it was ranked below it, a wrong label.
    sorted_ = Ranking(name="r", group_by="q", chosen="original", rejected="modified", rejected_errors="err")
    marked = [{**r, "err": [] if r["modified"] == ["1. d"] else [2]} for r in records]
    rows, _ = sorted_.regroup(marked)
    assert rows[0] == {"q": "Q1", "original": ["1. a\n2. b", "1. d"], "modified": ["1. a\n2. c"]}
    alone, _ = sorted_.regroup(marked, alone=True)  # to score: the file's order, its errors unread
    assert alone[0]["original"] == ["1. a\n2. b"] and alone[0]["modified"] == ["1. a\n2. c", "1. d"]
    with pytest.raises(CardError, match="`rejected_errors` sorts what `group_by` gathers"):
        Ranking(name="r", chosen="original", rejected="modified", rejected_errors="err")


def test_classifier_scores_a_record_as_training_reads_it(tokenizer_dir):
    """`Classifier` (and `gpt-ft label`) take a file's records: PRMBench's, its steps joined into one
    reply per solution as `regroup` joins them, and records of replies whose scores are missing."""
    from gpt_ft import GPT, GPTConfig
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.classifier import Classifier

    tokenizer = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name("gpt-micro", n_positions=48, vocab_size=len(tokenizer), n_embd=32)
    prm = Ranking(name="r", group_by="q", chosen="original", rejected="modified")
    ultra = Ranking(name="u", prompt="instruction", replies="completions", reply_text="response",
                    reply_score="overall_score")  # fmt: skip
    record = {"q": "Q1", "original": ["1. a", "2. b", "3. c"], "modified": ["1. a", "2. x", "3. y"]}
    rated = {"instruction": "p", "completions": [{"response": "x", "overall_score": 7}, {"response": "y"}]}
    for task, row, replies in (
        (prm, record, ["1. a\n2. b\n3. c", "1. a\n2. x\n3. y"]),
        (ultra, rated, ["x", "y"]),
    ):
        torch.manual_seed(0)
        head = task.head(config.n_embd, dropout=0.0, init_std=0.3, bias=config.bias)
        clf = Classifier(GPT(config).eval(), head, task, tokenizer, max_length=48, device="cpu")
        (got,) = clf.predict([row])
        prompt = row.get("q") or row["instruction"]
        (alone,) = Ranking(name="plain", max_replies=4).encode_examples(
            [{"prompt": prompt, "replies": replies}], tokenizer, clf.specials, 48
        )
        assert clf.encode([row])[0]["input_ids"] == alone.fields()["input_ids"]
        assert len(got["scores"]) == 2
    # A PRMBench record whose modified solution is the original: one reply, its reward (a split
    # leaves such a record out: it orders nothing). A record without a field is named.
    same, clf.task = {"q": "Q2", "original": ["1. a"], "modified": ["1. a"]}, prm
    (alone,) = Ranking(name="plain").encode_examples(
        [{"prompt": "Q2", "replies": ["1. a"]}], tokenizer, clf.specials, 48
    )
    assert clf.encode([same])[0]["input_ids"] == alone.fields()["input_ids"]
    (one,) = clf.predict([same])
    assert isinstance(one["scores"], float) and one["label"] == one["scores"]
    with pytest.raises(TaskDataError, match=r"^example 1 has no field 'modified' \(task 'r'\)\.$"):
        clf.predict([record, {"q": "Q3", "original": ["1. a"]}])
    # RewardBench 2's layout (a list of chosen, a list of rejected): a row of one reply, its reward,
    # whichever side holds it (a one-reply row was refused: one reply with a score orders nothing).
    clf.task = Ranking(name="rb2", chosen="chosen", rejected="rejected", max_replies=4)
    for row in (
        {"prompt": "Q2", "chosen": ["1. a"], "rejected": []},
        {"prompt": "Q2", "chosen": [], "rejected": ["1. a"]},
    ):
        assert clf.encode([row])[0]["input_ids"] == alone.fields()["input_ids"]
        (reward,) = clf.predict([row])
        assert reward["scores"] == pytest.approx(one["scores"], abs=1e-6)
    # Identical replies tie whatever the batch: the first is the best.
    clf.task = Ranking(name="plain", max_replies=4)
    rows = [
        {"prompt": f"add {i} .", "replies": [f"add {i} .", f"add {i} .", "add 2 ."][: 2 + i % 2]}
        for i in range(7)
    ]
    labels = {size: [got["label"] for got in clf.predict(rows, batch_size=size)] for size in (1, 3, 32)}
    assert labels[1] == labels[3] == labels[32]
    assert all(label in (0, 2) for label in labels[1])


def test_bad_rows_and_cards_are_one_sentence():
    task = Ranking(name="r", max_replies=3)
    with pytest.raises(TaskDataError, match="field 'scores' holds 1 values for 2 replies"):
        task.texts({"prompt": "p", "replies": ["a", "b"], "scores": [1]})
    with pytest.raises(TaskDataError, match="the row has 4 replies; the card takes 1 to max_replies 3"):
        task.texts({"prompt": "p", "replies": ["a", "b", "c", "d"]})
    with pytest.raises(TaskDataError, match="score 'high' in field 'scores' is not a number"):
        task.texts({"prompt": "p", "replies": ["a", "b"], "scores": ["high", 1]})
    with pytest.raises(TaskDataError, match=r"^field 'prompt' holds a dict \{'a': 1\}, not a text\.$"):
        task.texts({"prompt": {"a": 1}, "replies": ["a", "b"]})
    ranked = Ranking(name="r", ranks="ranks", scores=None, max_replies=3)  # 0-based, negative, 1.5
    for bad in (0, -5, 1.5):
        said = f"rank {bad!r} in field 'ranks' is not a whole number from 1 (the best)."
        with pytest.raises(TaskDataError, match="^" + re.escape(said) + "$"):
            ranked.texts({"prompt": "p", "replies": ["a", "b"], "ranks": [1, bad]})
    assert ranked._replies({"prompt": "p", "replies": ["a", "b"], "ranks": [2.0, None]})[0][1] == -2.0
    grouped = Ranking(name="r", group_by="question", chosen="c", rejected="x", max_replies=3)
    with pytest.raises(TaskDataError, match=r"^field 'question' holds a list \['q'\], not a text\.$"):
        grouped.texts({"question": ["q"], "c": ["a"], "x": ["b"]})
    with pytest.raises(TaskDataError, match=r"^field 'replies' holds a reply that is not a text"):
        task.texts({"prompt": "p", "replies": ["a", {"t": "b"}]})
    with pytest.raises(TaskDataError, match="holds a reply without 'response'"):
        Ranking(name="r", reply_text="response", reply_score="s").texts(
            {"prompt": "p", "replies": [{"s": 1}]}
        )
    records = Ranking(
        name="r", reply_text="response", reply_score="s"
    )  # a record to predict: quoted as written
    with pytest.raises(TaskDataError, match=r"holds a reply without 'response': \{'text': 'a'\}\.$"):
        records.texts(records.to_predict({"prompt": "p", "replies": [{"response": "b"}, {"text": "a"}]}))
    # One reply with a score orders nothing: left out of training and evaluation as a row of replies
    # scored alike (it was refused, a test file with it too); unscored, it is one to score.
    pairs = Ranking(name="r", chosen="c", rejected="x", max_replies=3)
    assert task.orders_nothing([{"prompt": "p", "replies": ["a"], "scores": [3]}]) == [0]
    assert pairs.orders_nothing(
        [{"prompt": "p", "c": ["a"], "x": []}, {"prompt": "p", "c": [], "x": ["a"]}]
    ) == [0, 1]
    assert (
        task.orders_nothing([{"prompt": "p", "replies": ["a"]}, {"prompt": "p", "replies": ["a", "b"]}]) == []
    )
    assert task.encode({"prompt": "p", "replies": ["a"]}, [[5], [6]], SPECIALS, 32).label is None
    with pytest.raises(CardError, match="give `chosen` and `rejected` together"):
        Ranking(name="r", chosen="c")
    with pytest.raises(CardError, match="loss 'listnet' is not one of"):
        Ranking(name="r", loss="listnet")
    with pytest.raises(CardError, match="a ranking task takes no `labels`"):
        Ranking(name="r", labels=["a"])


def lse(*x: float) -> float:
    return math.log(sum(math.exp(v) for v in x))


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_the_three_losses_by_hand():
    """Rewards (0.5, -1, 2) against scores (2, 0, 1): reply 0 above reply 2 above reply 1; then a tie
    at the top, (1, 1, 0); then the middle reply unranked, (1, NaN, 0); then one chosen reply above
    two rejected ones that tie, (1, 0, 0), which are last in either order."""
    r0, r1, r2 = 0.5, -1.0, 2.0
    rewards = torch.tensor([[r0, r1, r2]] * 4, dtype=torch.float64)
    scores = torch.tensor([[2, 0, 1], [1, 1, 0], [1, NAN, 0], [1, 0, 0]], dtype=torch.float64)
    expected = {
        "plackett_luce": [lse(r0, r1, r2) - r0 + lse(r1, r2) - r2,
                          lse(r0, r1, r2) - r0 + lse(r0, r1, r2) - r1,  # a tie's replies share their rivals
                          lse(r0, r1, r2) - r0 + lse(r1, r2) - r2,  # the unranked reply a rival of both
                          lse(r0, r1, r2) - r0],  # the tied rejected replies: no term
        "softmax": [lse(r0, r1, r2) - r0, lse(r0, r1, r2) - lse(r0, r1), lse(r0, r1, r2) - r0,
                    lse(r0, r1, r2) - r0],
        "pairwise": [(softplus(r1 - r0) + softplus(r2 - r0) + softplus(r1 - r2)) / 3,
                     (softplus(r2 - r0) + softplus(r2 - r1)) / 2, softplus(r2 - r0),
                     (softplus(r1 - r0) + softplus(r2 - r0)) / 2],
    }  # fmt: skip
    for loss, values in expected.items():
        got = ranking_losses(rewards, scores, loss)
        torch.testing.assert_close(
            got, torch.tensor(values, dtype=torch.float64), rtol=0, atol=1e-12, msg=loss
        )


@pytest.mark.parametrize("loss", ["plackett_luce", "softmax", "pairwise"])
def test_two_replies_are_the_pairwise_reward_models_bradley_terry(loss):
    outputs = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 2.0]])
    ranking = Ranking(name="r", loss=loss, max_replies=3).head(4, dropout=0.0, init_std=0.02)
    pair = Preference(name="p").head(4, dropout=0.0, init_std=0.02)
    scores = torch.tensor([[1.0, 0.0, NAN]] * 3)
    torch.testing.assert_close(ranking.losses(outputs, scores), pair.losses(outputs, torch.zeros(3)))


def test_ranking_metrics_by_hand():
    """A: rewards order the replies as the scores do. B: one chosen reply below two rejected ones
    that tie. C: two replies of equal reward, the first the better: half a hit, and τ 0 (the rewards
    order nothing: the row counts, as the pair does)."""
    rewards = torch.tensor([[3, 1, 2], [1, 2, 2], [5, 5, NAN]], dtype=torch.float64)
    scores = torch.tensor([[2, 0, 1], [1, 0, 0], [1, 0, NAN]], dtype=torch.float64)
    values = rank_metric_values(rewards, scores)
    assert values["best_of_n"].item() == pytest.approx((1 + 0 + 0.5) / 3)
    assert values["pairwise_accuracy"].item() == pytest.approx((1 + 0 + 0.5) / 3)
    assert values["kendall_tau"].item() == pytest.approx((1 + -1 + 0) / 3)  # B: (0 - 2) / sqrt(2 · 2)
    assert rank_metric_values(torch.full((2, 3), 0.5), torch.tensor([[3.0, 2, 1]] * 2))["kendall_tau"] == 0
    # D: the top reward on an unranked reply, below the one ranked: a miss. E: one reply, F: all
    # tied, G: nothing ranked: no wrong pick to avoid, so no best-of-N (nor pairs, nor τ).
    rewards = torch.cat([rewards, torch.tensor([[0, 3, 4], [7, NAN, NAN], [1, 2, 3], [1, 2, NAN]])])
    scores = torch.cat([scores, torch.tensor([[5, NAN, NAN], [1, NAN, NAN], [7, 7, 7], [NAN, NAN, NAN]])])
    values = rank_metric_values(rewards, scores)
    assert values["best_of_n"].item() == pytest.approx((1 + 0 + 0.5 + 0) / 4)
    assert values["pairwise_accuracy"].item() == pytest.approx((1 + 0 + 0.5) / 3)
    task = Ranking(name="r")
    assert task.main_metric == "best_of_n" and task.output.default_lm_coef == 0.0
    # H: the chosen reply and a rejected one a few last bits apart (the same reply placed elsewhere
    # in a packed row): a tie, as the predicted best is the first of them (it was a miss, while the
    # prediction named the chosen one).
    near = torch.tensor([[2.0, 2.0000002, -1.0]], dtype=torch.float64)
    values = rank_metric_values(near, torch.tensor([[1.0, 0, 0]], dtype=torch.float64))
    assert (values["best_of_n"].item(), values["pairwise_accuracy"].item()) == (0.5, 0.75)
    assert task.output.outcome(near[0], None)["label"] == 0
    # I: rewards all -inf (an overflowed head) tie at the top: a third of a hit (it was none).
    low = torch.full((1, 3), -math.inf, dtype=torch.float64)
    assert rank_metric_values(low, torch.tensor([[1.0, 0, 0]]))["best_of_n"].item() == pytest.approx(1 / 3)


def test_outcomes_name_the_best_reply():
    task = Ranking(name="r", max_replies=3)
    head = task.head(4, dropout=0.0, init_std=0.02)
    outputs = torch.tensor(
        [[0.5, 2.0, -1.0], [1.5, torch.finfo(torch.float32).min, torch.finfo(torch.float32).min]]
    )
    predictions = head.predictions(outputs)
    assert predictions.shape == (2, 3) and predictions[1, 1:].isnan().all()
    assert task.output.outcome(predictions[0], predictions[0]) == {"label": 1, "scores": [0.5, 2.0, -1.0]}
    assert task.output.outcome(predictions[1], predictions[1]) == {"label": 1.5, "scores": 1.5}  # one reply
    assert task.format_prediction(predictions[0]) == "1"
    # The same reply placed elsewhere in a packed row scores a few last bits apart: a tie, the first
    # wins whatever the batch; a real difference still wins.
    for rewards, best in (([-0.0129002453, -0.0129002416, -0.0129002453], 0), ([0.1, 0.3, 0.3 + 4e-9], 1)):
        assert task.output.outcome(torch.tensor(rewards, dtype=torch.float64), None)["label"] == best
    assert task.output.outcome(torch.tensor([0.1, 0.3, 0.3001]), None)["label"] == 2


def test_shipped_cards_read():
    bench = load_card(TASKS / "ranking" / "rewardbench2.yaml")
    assert (bench.chosen, bench.rejected, bench.loss) == ("chosen", "rejected", "plackett_luce")
    ultra = load_card(TASKS / "ranking" / "ultrafeedback.yaml")
    assert (ultra.reply_text, ultra.reply_score) == ("response", "overall_score")
    prm = load_card(TASKS / "ranking" / "prmbench.yaml")
    assert (prm.group_by, prm.chosen, prm.rejected, prm.rejected_errors) == (
        "original_question",
        "original_process",
        "modified_process",
        "error_steps",
    )
    assert load_card(TASKS / "ranking" / "replies.yaml").scores == "scores"


def test_fit_and_classifier_rank_replies(tmp_path, tokenizer_dir, capsys):
    from gpt_ft import Classifier

    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(24):  # the better reply says "good" more often
        n = int(torch.randint(2, 5, (), generator=g))
        goods = torch.randint(0, 4, (n,), generator=g).tolist()
        replies = [" ".join(["good"] * k + ["bad"]) for k in goods]
        rows.append({"prompt": f"rate {i % 5} .", "replies": replies, "scores": goods})
    for split, part in (("train", rows), ("validation", rows[:9]), ("test", rows[:5])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    card = tmp_path / "replies.yaml"
    card.write_text((TASKS / "ranking" / "replies.yaml").read_text())
    main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=2", "--model.lr=1e-2"])
    out = capsys.readouterr().out
    assert all(f"validation/{m}" in out for m in ("best_of_n", "pairwise_accuracy", "kendall_tau"))
    clf = Classifier.from_checkpoint(next((tmp_path / "runs").rglob("last.ckpt")))
    for row, got in zip(rows[:3], clf.predict(rows[:3])):
        assert len(got["scores"]) == len(row["replies"])
        assert got["label"] == max(range(len(got["scores"])), key=got["scores"].__getitem__)


def test_explain_shows_a_label_for_every_reply_the_unranked_too(tmp_path, tokenizer_dir, capsys):
    """A ranking's label was cut at its last ranked reply ([2.0, 1.0] for three replies): each
    reply now has its score, None where it is unranked; the padding to max_replies is cut off."""
    row = {"prompt": "p", "replies": ["a", "b", "c"], "scores": [2.0, 1.0, None]}
    (tmp_path / "validation.jsonl").write_text(json.dumps(row) + "\n")
    args = [f"--data.task={TASKS / 'ranking' / 'replies.yaml'}", f"--data.tokenizer={tokenizer_dir}"]
    capsys.readouterr()
    main(["explain", *args, f"--data.data_dir={tmp_path}", "--split=validation", "--json=true"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["label"] == [2.0, 1.0, None] and len(shown["sequences"]) == 3
    # A `ranks` card's label is its ranks as given (it showed the negatives it trains on).
    ranked = Ranking(name="r", ranks="ranks", scores=None)
    row = {"prompt": "p", "replies": ["a", "b", "c"], "ranks": [2, 1, 3]}
    label = ranked.encode(row, [[10], [20], [30], [40]], SPECIALS, max_length=64).label
    assert same(label, [-2.0, -1.0, -3.0, NAN]) and ranked.label_text(label) == [2.0, 1.0, 3.0, None]


def test_a_reply_spelling_a_special_token_is_that_token_as_in_a_preference_card(tokenizer_dir):
    """A reply written out with a template's tokens (`Yes<|endoftext|>`) reads the end-of-text
    token, as a `Preference` card reads it (docs/tasks.md), not its characters."""
    from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids

    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    reply = "Yes<|endoftext|>"
    pair = Preference(name="p", prompt="prompt").encode_examples(
        [{"prompt": "Is it true?", "chosen": reply, "rejected": "No"}], tok, specials, 64
    )[0]
    ranked = Ranking(name="r").encode_examples(
        [{"prompt": "Is it true?", "replies": [reply, "No"], "scores": [1, 0]}], tok, specials, 64
    )[0]
    assert ranked.sequences[0] == pair.sequences[0]
    assert ranked.sequences[0][-2:] == [tok.convert_tokens_to_ids("<|endoftext|>"), specials.extract]


def test_rows_whose_replies_all_score_alike_are_left_out_of_training_and_evaluation(tmp_path):
    """A row of replies all scored alike (UltraFeedback's four 4.5s, two chosen and no rejected) has
    a loss of 0 that would halve the others' and no metric: training and evaluation leave it out,
    saying how many; a row with an unranked reply still orders it below; predictions keep every row."""
    import datasets

    from gpt_ft.data.files import Origin, task_examples

    task = Ranking(name="r", validation_splits=["validation"], test_splits=["test"])
    rows = [
        {"prompt": "a", "replies": ["x", "y"], "scores": [4.5, 4.5]},  # line 1: alike
        {"prompt": "b", "replies": ["x", "y"], "scores": [1.0, 2.0]},
        {"prompt": "c", "replies": ["x", "y"], "scores": [3.0, None]},  # above the unranked one
        {"prompt": "d", "replies": ["x", "y", "z"], "scores": [2, 2, 2]},  # line 4: alike
    ]
    raw, origin = datasets.Dataset.from_list(rows), Origin("train.jsonl")
    said = r"each one's label is its replies' scores, all alike \(it orders nothing\)\.$"
    for split in ("train", "validation"):
        with pytest.warns(UserWarning, match=rf"^train.jsonl: 2 rows of split '{split}' left out: {said}"):
            kept, where = task_examples(task, split, raw, origin)
        assert kept["prompt"] == ["b", "c"] and where.of(1) == "train.jsonl, row 3"
    assert task_examples(task, "test", raw, origin)[0]["prompt"] == ["a", "b", "c", "d"]
    chosen = Ranking(name="c", chosen="chosen", rejected="rejected", scores=None)
    two_chosen = datasets.Dataset.from_list([{"prompt": "p", "chosen": ["x", "y"], "rejected": []}])
    with pytest.raises(
        TaskDataError, match=r"^train.jsonl: split 'train' has no examples: every row's label is its"
    ):
        task_examples(chosen, "train", two_chosen, origin)


def test_a_test_split_is_scored_without_its_rows_that_order_nothing_and_predicted_whole(
    tmp_path, tokenizer_dir
):
    """`test` left the rows of a test split that order nothing in, each a loss of 0 that lowered its
    loss where `validate` on the same file left them out: both leave them out now, saying how many;
    its predictions keep every row, and a validation split's too (they were left out)."""
    from gpt_ft.adapters import LocalFiles
    from gpt_ft.data.task_data import TaskDataModule

    rows = [
        {"prompt": p, "replies": ["x", "y"], "scores": s}
        for p, s in (("a", [2, 2]), ("b", [1, 2]), ("c", [1, 1]))
    ]
    for split in ("validation", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    splits = {"validation": "validation.jsonl", "test": "test.jsonl"}
    task = Ranking(
        name="r", validation_splits=["validation"], test_splits=["test"], local=LocalFiles(splits=splits)
    )
    data = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), max_length=32)
    said = r"2 rows of split '{}' left out: each one's label is its replies' scores, all alike"
    for split in ("validation", "test"):
        with pytest.warns(UserWarning, match=said.format(split)):
            assert len(data.encoded(split, labelled=True)) == 1
    assert len(data.encoded("test", labelled=True)) == 1 and len(data.encoded("test", labelled=False)) == 3
    assert data.encoded("test", labelled=True)["index"] == [1]
    assert data.origins["test (scored)"].of(0).endswith("line 2")
    assert len(data.encoded("validation", labelled=False)) == 3  # a validation split predicted: every row
    rows[2] = {"prompt": "c", "replies": ["x", "y"]}  # line 3 unscored, after line 1's tie: named as it is
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = TaskDataModule(task, tokenizer_dir, data_dir=str(tmp_path), max_length=32)
    with pytest.raises(
        TaskDataError, match=r"test.jsonl, line 3: no label \(field 'scores'\); split 'test' is used"
    ):
        data.encoded("test", labelled=True)
