"""A suite's results by hand: mean and sample std, the benchmark score, the markdown table, files."""

import json
import math
import zipfile

import pytest

from gpt_ft.eval.results import benchmark_score, mean_std, results_markdown, write_results
from gpt_ft.eval.suite_file import Score
from gpt_ft.eval.suite_folder import new_submission_folder, write_json, zip_submission


def test_mean_and_sample_std_of_the_defined_values():
    assert mean_std([80.0, 90.0, None, 70.0]) == {"mean": 80.0, "std": 10.0}  # sqrt(200 / 2)
    assert mean_std([75.5]) == {"mean": 75.5, "std": None}
    assert mean_std([None, None]) == {"mean": None, "std": None}
    assert mean_std([]) == {"mean": None, "std": None}


def test_benchmark_score_averages_each_tasks_metrics_first():
    def seeds(*values):
        return {"seeds": dict(enumerate(values))}

    tasks = {
        "mrpc": {"metrics": {"validation/f1": seeds(90.0, 94.0), "validation/accuracy": seeds(80.0, 82.0)}},
        "rte": {"metrics": {"validation/accuracy": seeds(60.0, 62.0)}},
        "stsb": {
            "metrics": {"validation/pearson": seeds(None, 81.0), "validation/spearman": seeds(None, 79.0)}
        },
        "qnli": {  # no run finished; zero-shot, the main metric alone counts (not a rule of its own)
            "main_metric": "validation/accuracy",
            "metrics": {
                "validation/accuracy": {"seeds": {}, "zero_shot": 55.0},
                "validation/accuracy_norm": {"seeds": {}, "zero_shot": 70.0},
            },
        },  # fmt: skip
    }
    glue = Score(name="GLUE", tasks=["mrpc", "rte", "stsb", "qnli", "cola"], paper=72.8)
    score = benchmark_score(glue, tasks)
    assert score == {
        "name": "GLUE",
        "value": 62.5,  # (86.5 + 61 + 40: the collapsed seed counted as 0, not left out) / 3
        "tasks": {"mrpc": 86.5, "rte": 61.0, "stsb": 40.0},
        "missing": ["qnli", "cola"],
        "undefined": ["stsb"],
        "zero_shot": 55.0,  # the zero-shot scores' own, over the tasks scored so
        "zero_shot_tasks": {"qnli": 55.0},
        "paper": 72.8,
    }
    line = results_markdown({"suite": "s", "config": {"seeds": [0, 1], "init_from": None, "select": "last",
                             "transfer_layers": []}, "tasks": {}, "score": score})  # fmt: skip
    assert line.splitlines()[-1] == (
        "| **GLUE** (3 of 5 tasks; missing qnli, cola; zero-shot qnli alone; an undefined correlation "
        "counted as 0 in stsb) | mean "
        "| 62.5 | 55.0 | 72.8 |"
    )
    zero_shot_alone = {**score, "value": None, "tasks": {}, "missing": glue.tasks, "undefined": []}
    line = results_markdown({"suite": "s", "config": {"seeds": [0, 1], "init_from": None, "select": "last",
                             "transfer_layers": []}, "tasks": {}, "score": zero_shot_alone})  # fmt: skip
    assert line.splitlines()[-1] == "| **GLUE** (zero-shot, 1 of 5 tasks: qnli) | mean |  | 55.0 | 72.8 |"


RESULTS = {
    "suite": "Tiny",
    "config": {"seeds": [0, 1], "init_from": None, "select": "last", "transfer_layers": [0, 2]},
    "tasks": {
        "sent": {
            "main_metric": "validation/accuracy",
            "metrics": {
                "validation/accuracy": {
                    "seeds": {"0": 80.0, "1": 90.0},
                    "mean": 85.0,
                    "std": 7.0711,
                    "paper": 91.3,
                    "zero_shot": 55.25,
                }
            },
            "transfer": {"0": {"seeds": {"0": 60.0}, "mean": 60.0, "std": None}, "2": {"mean": None}},
        },
        "sts": {"main_metric": "validation/pearson", "metrics": {"validation/pearson": {"mean": None}}},
    },
    "score": {
        "name": "Tiny score",
        "value": 85.0,
        "tasks": {"sent": 85.0},
        "missing": ["sts"],
        "paper": 70.0,
    },
}


def test_results_markdown_by_hand():
    assert results_markdown(RESULTS).splitlines() == [
        "# Tiny",
        "",
        "Fine-tuned from scratch, 2 seed(s) (0, 1), scores in percent on the validation splits (a margin as "
        "it is), the model at the last epoch; mean ± sample std over seeds. The GPT-1 paper's values are "
        "test-set scores (Radford et al., 2018).",
        "",
        "| task | metric | fine-tuned | zero-shot | GPT-1 paper |",
        "|---|---|---|---|---|",
        "| sent | validation/accuracy | 85.0 ± 7.1 | 55.2 | 91.3 |",
        "| sts | validation/pearson |  |  |  |",
        "| **Tiny score** (1 of 2 tasks; missing sts) | mean | 85.0 |  | 70.0 |",
        "",
        "Main metric by number of pretrained layers transferred (GPT-1 Fig. 2 left):",
        "",
        "| task | 0 layers | 2 layers |",
        "|---|---|---|",
        "| sent | 60.0 (1 of 2 seeds) |  |",
    ]
    one_seed = {**RESULTS, "config": {**RESULTS["config"], "init_from": "pre"}, "score": None}
    one_seed["tasks"] = {"sent": {"metrics": {"acc": {"seeds": {"0": 50.0}, "mean": 50.0, "std": None}}}}
    table = results_markdown(one_seed)
    # One of the two seeds scored (the other's correlation undefined, or its run not there): said.
    assert (
        "Fine-tuned from `pre`, 2 seed(s)" in table and "| sent | acc | 50.0 (1 of 2 seeds) |  |  |" in table
    )
    assert "**" not in table and "layers transferred" not in table
    # A zero-shot pass alone says so, and nothing of seeds or epochs it never had; nor of the paper's
    # values where the suite quotes none (SuperGLUE's)
    zero = {**one_seed, "tasks": {"sent": {"metrics": {"acc": {"seeds": {}, "zero_shot": 61.0}}}}}
    lines = results_markdown(zero).splitlines()
    assert lines[2] == "Zero-shot scores of `pre`, not fine-tuned, in percent on the validation splits."
    quoted = {"sent": {"metrics": {"acc": {"seeds": {}, "zero_shot": 61.0, "paper": 91.3}}}}
    assert results_markdown({**zero, "tasks": quoted}).splitlines()[2] == (
        "Zero-shot scores of `pre`, not fine-tuned, in percent on the validation splits. The GPT-1 paper's "
        "values are test-set scores (Radford et al., 2018)."
    )
    assert "| sent | acc |  | 61.0 |  |" in lines
    # Zero-shot alone, every task without a method (skipped): still a zero-shot pass, its score row
    # under the table's header
    skipped = {
        **one_seed,
        "config": {**one_seed["config"], "fine_tune": False},
        "tasks": {"wic": {"metrics": {}}},
    }
    skipped["score"] = {"name": "SuperGLUE score", "tasks": {}, "missing": ["wic"], "value": None,
                        "paper": None, "zero_shot": None, "zero_shot_tasks": {}}  # fmt: skip
    lines = results_markdown(skipped).splitlines()
    assert lines[2].startswith("Zero-shot scores of `pre`, not fine-tuned")
    assert lines[4:] == ["| task | metric | fine-tuned | zero-shot | GPT-1 paper |", "|---|---|---|---|---|",
                         "| **SuperGLUE score** (0 of 1 tasks; missing wic) | mean |  |  |  |"]  # fmt: skip


def test_results_are_written_whole(tmp_path):
    write_results(tmp_path, RESULTS)
    assert json.loads((tmp_path / "results.json").read_text()) == RESULTS
    assert (tmp_path / "results.md").read_text() == results_markdown(RESULTS)
    for chart in ("results.png", "transfer.png"):
        assert (tmp_path / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_json(tmp_path / "sub" / "x.json", {"nan": None, "pi": math.pi})
    assert json.loads((tmp_path / "sub" / "x.json").read_text()) == {
        "nan": None,
        "pi": pytest.approx(math.pi),
    }
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["x.json"]  # no temporary file left


def test_a_chart_bar_names_its_split_where_a_task_has_several():
    from gpt_ft.eval.results import bar_label

    mnli = {"validation_matched/accuracy": {}, "validation_mismatched/accuracy": {}}
    assert [bar_label(k, mnli) for k in mnli] == ["matched accuracy", "mismatched accuracy"]
    stsb = {"validation/pearson": {}, "validation/spearman": {}}
    assert [bar_label(k, stsb) for k in stsb] == ["pearson", "spearman"]


def test_a_preference_margin_is_no_percentage_and_no_part_of_a_score():
    """A mean reward gap of 1.2445 was shown as 124.5 and averaged into the benchmark score."""
    from gpt_ft.eval.results import benchmark_score, percent
    from gpt_ft.eval.suite_file import Score

    assert percent(0.25, "validation/accuracy") == 25.0 and percent(1.2445, "validation/margin") == 1.2445
    tasks = {
        "pairs": {
            "metrics": {
                "validation/accuracy": {"seeds": {"0": 80.0}},
                "validation/margin": {"seeds": {"0": 1.2}},
            }
        }
    }
    assert benchmark_score(Score(name="s", tasks=["pairs"]), tasks)["value"] == 80.0


def test_a_metric_over_seeds_in_percent_a_raw_one_as_it_is_and_a_lone_value_without_spread():
    from gpt_ft.eval.results import pm, seeds_stats

    runs = {0: {"metrics": {"validation/accuracy": 0.5, "validation/margin": 1.5}}, 1: None,
            2: {"metrics": {"validation/accuracy": 0.7, "validation/margin": 3.5}},
            3: {"metrics": {"validation/accuracy": None}}}  # fmt: skip
    accuracy = seeds_stats(runs, "validation/accuracy")  # by seed, as the main table's: seed 1 not run
    assert accuracy["seeds"] == {"0": 50.0, "2": 70.0, "3": None} and accuracy["mean"] == pytest.approx(60.0)
    assert seeds_stats(runs, "validation/margin")["seeds"] == {"0": 1.5, "2": 3.5, "3": None}  # no fraction
    one = {"seeds": {"0": 40.0, "1": None, "2": None}, **mean_std([40.0, None, None])}
    assert pm(one) == "40.0"  # one seed defines it: no "± 0.0", as if three agreed
    assert pm({"seeds": {"0": 40.0, "1": 50.0}, **mean_std([40.0, 50.0])}) == "45.0 ± 7.1"


def test_the_archive_holds_the_files_the_leaderboard_expects_and_says_what_it_left(tmp_path):
    """A card's own file that the suite's `submission.files` does not list stays out of the zip."""
    folder = new_submission_folder(tmp_path)
    for name in ("SST-2.tsv", "pair-test.tsv"):
        (folder / name).write_text("index\tprediction\n0\t1\n")
    said = []
    archive = zip_submission(tmp_path, "sub.zip", ["SST-2.tsv", "CoLA.tsv"], log=said.append)
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist() == ["SST-2.tsv"]
    assert said == [
        "warning: the submission lacks CoLA.tsv (tasks not in this run or without test files)",
        "warning: pair-test.tsv left out of sub.zip: not among the submission's files",
        f"wrote {tmp_path / 'sub.zip'} (1 file)",
    ]
