"""RewardBench 2's published score on a hand-computed case (the best-of-4 share, the Ties formula,
the mean of the subsets), its rows' labels, bad rows in one sentence, and `gpt-ft validate` of a
ranking checkpoint on its card reporting the score its rewards give."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from gpt_ft.adapters import RewardBench2, TaskDataError
from gpt_ft.adapters.rewardbench import SUBSET_METRICS, rewardbench2_values
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import SpecialTokenIds
from tests.helpers import TASKS, common_args

SPECIALS = SpecialTokenIds(start=1, delim=2, extract=3, pad=0, eos=None)
NAN = math.nan
MATH, SAFETY, FOCUS, TIES = 2.0, 3.0, 4.0, 5.0
REF, TIED = 1.0, 2.0


def rows(*given: tuple[list[float], int, list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards, scores, tags) of rows given as (rewards, how many chosen, tags), padded to 4."""
    rewards = [r + [NAN] * (4 - len(r)) for r, _, _ in given]
    scores = [[1.0] * n + [0.0] * (len(r) - n) + [NAN] * (4 - len(r)) for r, n, _ in given]
    return torch.tensor(rewards), torch.tensor(scores), torch.tensor([t for _, _, t in given])


def test_the_published_score_by_hand():
    got = rewardbench2_values(
        *rows(
            ([2.0, 1.0, 0.0, 1.0], 1, [MATH, 0, 0]),  # the chosen reply alone at the top: 1
            ([1.0, 1.0, 0.0, 0.0], 1, [MATH, 0, 0]),  # tied there with one rejected: 1/2
            ([0.0, 1.0, 0.0, 0.0], 1, [SAFETY, 0, 0]),  # below: 0
            ([3.0, 1.0, 2.0], 1, [FOCUS, 0, 0]),
            # Ties, prompt 5: ref margin 2 - 1 = 1; tied margin 2.5 - 2 = 0.5, its right answers' spread 0.5
            ([2.0, 1.0, 0.5], 1, [TIES, REF, 5]),
            ([3.0, 2.5, 1.0, 2.0], 2, [TIES, TIED, 5]),
            # prompt 6: ref margin 1 - 1.5 = -0.5 (wrong); tied margin 2, spread 0
            ([1.0, 1.5], 1, [TIES, REF, 6]),
            ([2.0, 2.0, 0.0], 2, [TIES, TIED, 6]),
        )
    )
    assert got["math"].item() == 0.75 and got["safety"].item() == 0.0 and got["focus"].item() == 1.0
    assert math.isnan(got["factuality"]) and math.isnan(got["precise_if"])  # no rows
    # 0.3 · tied accuracy 1 + 0.3 · ref accuracy 1/2 + 0.2 · (0.5 > 0.5, 2 > 0: 1/2)
    # + 0.2 · (min(1, 0.5) > 0.5, min(-0.5, 2) > 0: 0) + 0.01 · mean(tanh(0.5/0.5 - 1), tanh(-0.5/0))
    assert got["ties"].item() == pytest.approx(0.3 + 0.15 + 0.1 + 0.0 + 0.01 * (0 - 1) / 2, abs=1e-12)
    assert got["rewardbench2"].item() == pytest.approx((0.75 + 0 + 1 + 0.545) / 4, abs=1e-12)
    # A tie at the top within the last bits is a tie; 0/0 of a margin and a spread both 0 counts 0.
    near = rewardbench2_values(*rows(([1.0, 1.0 + 3e-8, 0.0, 0.0], 1, [MATH, 0, 0])))
    assert near["math"].item() == 0.5
    flat = rewardbench2_values(*rows(([1.0, 0.0], 1, [TIES, REF, 1]), ([1.0, 1.0, 1.0], 2, [TIES, TIED, 1])))
    assert flat["ties"].item() == pytest.approx(0.3 * 0 + 0.3 * 1 + 0.2 * 0 + 0.2 * 0 + 0.0)
    # Ties rows without their pair score nothing, and so does the benchmark (which pairs them all).
    unpaired = rewardbench2_values(*rows(([1.0, 0.0], 1, [TIES, REF, 1]), ([1.0, 0.0], 1, [MATH, 0, 0])))
    assert math.isnan(unpaired["ties"]) and math.isnan(unpaired["rewardbench2"])
    # A row of one side orders nothing (evaluation leaves it out): it makes no group.
    one_sided = [([1.0, 0.0], 1, [TIES, REF, 1]), ([2.0, 1.5, 0.0], 2, [TIES, TIED, 1])]
    one_sided.append(([3.0, 2.0], 2, [TIES, TIED, 1]))  # (counted, its 3 would widen the spread to 1.5)
    assert rewardbench2_values(*rows(*one_sided))["ties"].item() == pytest.approx(1.0 + 0.01 * math.tanh(1))
    # Margins in float64: a tied margin of 1 + 2**-40 exceeds a spread of 1.
    close = rows(([3.0, 0.0], 1, [TIES, REF, 1]), ([1.0, 2.0, -(2**-40)], 2, [TIES, TIED, 1]))
    assert rewardbench2_values(*close)["ties"].item() == pytest.approx(
        1.0 + 0.01 * math.tanh(2**-40), abs=1e-12
    )
    # Rewards all -inf tie at the top, all four.
    assert rewardbench2_values(*rows(([-math.inf] * 4, 1, [MATH, 0, 0])))["math"].item() == 0.25


def test_rows_carry_their_subset_and_ties_prompt_after_the_scores():
    task = RewardBench2(name="rb2", max_replies=4)
    row = {"id": "tied:12", "prompt": "p", "chosen": ["a", "b"], "rejected": ["c"], "subset": "Ties"}
    label = task.encode(row, [[9], [10], [11], [12]], SPECIALS, 64).label
    assert label[:3] == [1.0, 1.0, 0.0] and math.isnan(label[3]) and label[4:] == [TIES, TIED, 12.0]
    assert task.label_text(label) == [1.0, 1.0, 0.0, None]  # explain shows the replies' scores
    math_row = {**row, "id": "31", "subset": "Math", "chosen": ["a"], "rejected": ["b", "c", "d"]}
    assert task.encode(math_row, [[9]] * 5, SPECIALS, 64).label == [1.0, 0.0, 0.0, 0.0, MATH, 0.0, 0.0]
    assert task.metrics == ["rewardbench2", *SUBSET_METRICS, "best_of_n", "pairwise_accuracy", "kendall_tau"]
    for bad, said in [
        (
            {"subset": "Chat"},
            r"^field 'subset' holds 'Chat', not a RewardBench 2 subset \(Factuality, Precise IF, ",
        ),
        ({"id": "tied-12"}, r"^field 'id' of a Ties row holds 'tied-12'; it takes ref:N or tied:N "),
        (
            {"id": f"ref:{2**24}"},
            r"^field 'id' of a Ties row holds 'ref:16777216'; it takes ref:N or tied:N ",
        ),
    ]:
        with pytest.raises(TaskDataError, match=said):
            task.encode({**row, **bad}, [[9], [10], [11], [12]], SPECIALS, 64)


@pytest.mark.parametrize("trained_on", ["ranking/replies", "preference/pairs"])
def test_validate_reports_the_published_score_of_a_reward_model(tmp_path, tokenizer_dir, capsys, trained_on):
    """A reward model trained on a `Ranking` or a `Preference` card, validated on RewardBench 2's:
    the score printed is the one its rewards give by the benchmark's rules."""
    from gpt_ft import Classifier

    if trained_on == "ranking/replies":
        train = [
            {"prompt": f"q {i}", "replies": ["good good", "bad", "good"], "scores": [2, 0, 1]}
            for i in range(8)
        ]
    else:
        train = [{"prompt": f"q {i}", "chosen": "good good", "rejected": "bad"} for i in range(8)]
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    card = tmp_path / "card.yaml"
    card.write_text((TASKS / f"{trained_on}.yaml").read_text())
    main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.max_steps=2"])
    ckpt = next((tmp_path / "runs").rglob("last.ckpt"))
    bench = [
        {
            "id": "1",
            "prompt": "q 1",
            "chosen": ["good"],
            "rejected": ["bad", "bad bad", "good bad"],
            "subset": "Math",
        },
        {
            "id": "2",
            "prompt": "q 2",
            "chosen": ["bad"],
            "rejected": ["good", "good good", "x"],
            "subset": "Focus",
        },
        {"id": "ref:3", "prompt": "q 3", "chosen": ["good"], "rejected": ["bad", "x"], "subset": "Ties"},
        {
            "id": "tied:3",
            "prompt": "q 3",
            "chosen": ["good", "good good"],
            "rejected": ["bad"],
            "subset": "Ties",
        },
    ]
    data = tmp_path / "bench"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench))
    capsys.readouterr()
    card = TASKS / "ranking" / "rewardbench2.yaml"
    main(["validate", f"--data.task={card}", f"--data.data_dir={data}", f"--ckpt_path={ckpt}",
          "--trainer.enable_progress_bar=false", "--trainer.logger=false",
          f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    out = capsys.readouterr().out
    printed = {
        m: float(re.search(rf"test/{m} ([-\d.]+)", out)[1]) for m in ("rewardbench2", "math", "focus", "ties")
    }
    model = Classifier.from_checkpoint(ckpt)
    rewards, scores = torch.full((4, 64), NAN), torch.full((4, 64), NAN)
    for i, r in enumerate(bench):
        replies = r["chosen"] + r["rejected"]
        if trained_on == "ranking/replies":  # the card's own fields: a row of replies, or one reply
            got = model.predict([{"prompt": r["prompt"], "replies": replies}])[0]["scores"]
        else:
            got = [s["scores"] for s in model.predict([{"prompt": r["prompt"], "reply": t} for t in replies])]
        rewards[i, : len(replies)] = torch.tensor(got)
        scores[i, : len(replies)] = torch.tensor([1.0] * len(r["chosen"]) + [0.0] * len(r["rejected"]))
    tags = torch.tensor([[MATH, 0, 0], [FOCUS, 0, 0], [TIES, REF, 3], [TIES, TIED, 3]])
    want = rewardbench2_values(rewards, scores, tags)
    for name, value in printed.items():
        assert value == pytest.approx(want[name].item(), abs=2e-4), name
