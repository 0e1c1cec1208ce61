"""`gpt-ft suite`: runs over cards x seeds, resumes, aggregates, writes the table, chart and submission;
zero-shot scoring and the transfer sweep through the suite."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import zipfile
from pathlib import Path

import pytest
import torch

from gpt_ft import GPT, GPTConfig
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval import finetune, suite_folder
from gpt_ft.eval import suite as suites
from gpt_ft.eval.suite_file import data_dirs, load_suite
from gpt_ft.eval.suite_folder import mark_submission
from gpt_ft.training.runs import build_fit
from tests.helpers import MICRO, ROOT, as_list, data_of, fit_args, make_task, write_suite
from tests.training.test_checkpointing import interrupt

FIT = [
    "--data.batch_size=4",
    "--data.max_length=64",
    "--model.preset=gpt-micro",
    f"--model.overrides={MICRO}",
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def test_suite_runs_resumes_and_writes_results(tmp_path, tokenizer_dir, monkeypatch, capsys):
    single = make_task("single", tmp_path / "a")
    similarity = make_task("similarity", tmp_path / "b")
    similarity.write_text(similarity.read_text().replace("STS-B.tsv", "STS-B.jsonl"))  # a JSON-lines file
    pair = make_task("pair", tmp_path / "c")  # listed, never run here: the score lacks it
    pairs = ["the cat sat on the mat .", "two dogs run in a park .", "a cat sat .", "the dogs ran ."]
    rows = [f"{i}\t{pairs[i % 4]}\t{pairs[(i + 1) % 4]}\t{i + 0.5}" for i in range(5)]  # a correlation
    header = "index\tsentence1\tsentence2\tlabel\n"
    (tmp_path / "b" / "d" / "dev.tsv").write_text(header + "\n".join(rows) + "\n")
    suite = write_suite(
        tmp_path,
        f"""name: tiny
seeds: [0, 1]
tasks:
  - card: {single}
    paper: {{accuracy: 91.3}}
  - card: {similarity}
    paper: {{pearson: 82.0}}
  - card: {pair}
score: {{name: Tiny score, tasks: [sent, sts, pair], paper: 70.0}}
submission: {{archive: sub.zip, files: [SENT.tsv, STS-B.jsonl, AX.tsv]}}
""",
    )
    out = tmp_path / "out"
    argv = ["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}"]
    argv += ["--data_dir", as_list(f"sent={tmp_path / 'a'}", f"sts={tmp_path / 'b'}"), *fit_args(*FIT)]
    argv += ["--tasks", as_list("sent", "sts")]

    calls = []
    real_fit = suites.fit_and_evaluate

    def interrupted_after_one(build, args, select, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stops the suite during the second run
        return real_fit(build, args, select, **kwargs)

    monkeypatch.setattr(suites, "fit_and_evaluate", interrupted_after_one)
    with pytest.raises(SystemExit) as stopped:  # one line, the shell's code for Ctrl-C
        main(argv)
    assert stopped.value.code == 130
    first = out / "runs" / "sent" / "seed-0" / "result.json"
    assert first.is_file() and not (out / "runs" / "sent" / "seed-1" / "result.json").exists()
    stamp = first.stat().st_mtime_ns

    calls.clear()
    monkeypatch.setattr(suites, "fit_and_evaluate", lambda *a, **k: calls.append(a) or real_fit(*a, **k))
    capsys.readouterr()
    main(argv)
    printed, warned = capsys.readouterr()
    assert len(calls) == 3  # sent seed 1, sts seeds 0 and 1; the finished run is read back
    assert first.stat().st_mtime_ns == stamp
    assert "4 runs, 1 finished before, 3 to go" in printed and "[3/3] sts seed 1" in printed
    assert all("--seed_everything=1" in c[1] for c in calls[::2])

    results = json.loads((out / "results.json").read_text())
    assert results["config"]["seeds"] == [0, 1] and results["config"]["fit_args"] == FIT
    for name in ("sent", "sts"):
        for key, stats in results["tasks"][name]["metrics"].items():
            per_seed = []
            for seed in (0, 1):
                run = json.loads((out / "runs" / name / f"seed-{seed}" / "result.json").read_text())
                value = run["metrics"][key]
                assert stats["seeds"].get(str(seed)) == (None if value is None else 100 * value)
                per_seed.append(stats["seeds"].get(str(seed)))
            defined = [v for v in per_seed if v is not None]
            if len(defined) == 2:
                assert stats["mean"] == pytest.approx(statistics.fmean(defined))
                assert stats["std"] == pytest.approx(statistics.stdev(defined))
    sent = results["tasks"]["sent"]["metrics"]["validation/accuracy"]
    assert set(sent["seeds"]) == {"0", "1"} and sent["paper"] == 91.3
    assert set(results["tasks"]["sts"]["metrics"]) == {"validation/pearson", "validation/spearman"}
    score = results["score"]
    assert score["missing"] == ["pair"] and set(score["tasks"]) == {"sent", "sts"}
    sts = results["tasks"]["sts"]["metrics"].values()  # a seed's constant guess: no correlation, counted 0
    sts_means = [statistics.fmean(v or 0.0 for v in s["seeds"].values()) for s in sts]
    assert score["tasks"]["sent"] == pytest.approx(sent["mean"])
    assert score["tasks"]["sts"] == pytest.approx(statistics.fmean(sts_means))
    assert score["undefined"] == (["sts"] if any(None in s["seeds"].values() for s in sts) else [])
    assert score["value"] == pytest.approx(statistics.fmean(score["tasks"].values()))

    table = (out / "results.md").read_text()
    assert f"| sent | validation/accuracy | {sent['mean']:.1f} ± {sent['std']:.1f} |  | 91.3 |" in table
    assert "| **Tiny score** (2 of 3 tasks; missing pair" in table
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert "warning: the submission lacks AX.tsv" in warned  # (on stderr, with the other notes)
    with zipfile.ZipFile(out / "sub.zip") as zf:
        assert sorted(zf.namelist()) == ["SENT.tsv", "STS-B.jsonl"]
        rows = zf.read("SENT.tsv").decode().splitlines()
        scores = [json.loads(line) for line in zf.read("STS-B.jsonl").decode().splitlines()]
    assert rows[0] == "index\tprediction" and [r.split("\t")[0] for r in rows[1:]] == ["0", "1", "2"]
    assert {r.split("\t")[1] for r in rows[1:]} <= {"negative", "positive"}
    assert [s["idx"] for s in scores] == [0, 1, 2] and all(0 <= s["label"] <= 5 for s in scores)

    # Rerunning one task of the folder redoes nothing and keeps the other task's results and files.
    calls.clear()
    main([*argv, "--tasks", "sts"])
    assert calls == [] and json.loads((out / "results.json").read_text())["tasks"] == results["tasks"]
    with zipfile.ZipFile(out / "sub.zip") as zf:
        assert sorted(zf.namelist()) == ["SENT.tsv", "STS-B.jsonl"]

    # A run whose fit arguments changed is not read back but run again.
    capsys.readouterr()
    main([*argv, "--tasks", "sts", *fit_args(*FIT, "--data.batch_size=2")])
    printed = capsys.readouterr().out
    assert len(calls) == 2 and "2 runs, 0 finished before, 2 to go" in printed
    assert "sts seed 0: its inputs changed since it ran (--data.batch_size=2): running it again" in printed
    # The other task's runs came from other arguments than given now: left out of the results and the
    # submission (they were reported as this configuration's), said.
    assert (
        "sent seed 1: its inputs changed since it ran (--data.batch_size=2): left out of the results"
        in printed
    )
    sent = json.loads((out / "results.json").read_text())["tasks"]["sent"]["metrics"]["validation/accuracy"]
    assert sent == {"seeds": {}, "paper": 91.3}
    with zipfile.ZipFile(out / "sub.zip") as zf:
        assert sorted(zf.namelist()) == ["STS-B.jsonl"]

    # A rerun that fails (another data folder: the inputs changed; its training file empty) puts the
    # finished files back.
    runs = out / "runs" / "sts"
    before = {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()}
    shutil.copytree(tmp_path / "b", tmp_path / "bb")
    (tmp_path / "bb" / "d" / "train.tsv").write_text("")
    typo = ["--data_dir", as_list(f"sts={tmp_path / 'bb'}")]
    with pytest.raises(SystemExit):
        main([*argv[:4], *typo, "--tasks", "sts", *fit_args(*FIT, "--data.batch_size=2")])
    assert "its inputs changed" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in runs.iterdir()) == ["seed-0", "seed-1"]

    # A seed among the fit arguments (given last, it wins) ran every seed as that one, with a spread of 0.
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--tasks", "sts", *fit_args(*FIT, "--seed_everything=5")])
    assert refused.value.code == 2 and capsys.readouterr().err.strip().endswith(
        "task 'sts': --seed_everything 5 in the fit arguments would run each of the suite's seeds as 5; "
        "the suite sets every run's seed (seeds: in its file, or --seeds)."
    )
    assert {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()} == before
    # A logger of the fit arguments' own (configs/trainer/mlflow.yaml's list): every run's logs and
    # checkpoints went to ./runs, never deleted.
    with pytest.raises(SystemExit):
        main([*argv, "--tasks", "sts", *fit_args(*FIT, f"--config={ROOT / 'configs/trainer/mlflow.yaml'}")])
    said = capsys.readouterr().err.strip()
    assert said.endswith(
        "task 'sts': --trainer.logger CSVLogger (of a list) in the fit arguments would write every run's "
        f"logs and checkpoints outside its folder ({runs / 'seed-0'}): a suite keeps them there (its "
        "checkpoints deleted once scored); leave it the CSV logger."
    )
    assert {p: p.read_bytes() for p in runs.rglob("*") if p.is_file()} == before


def test_suite_zero_shot_and_transfer_sweep(tmp_path, tokenizer_dir, capsys):
    tok = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")  # the weights carry their tokenizer
    card = make_task("choice", tmp_path / "c")
    (tmp_path / "c" / "d" / "test.csv").unlink()  # no test file: the runs still count, with a warning
    suite = write_suite(tmp_path, f"name: mc\nseeds: [0]\ntasks:\n  - card: {card}\n")
    out = tmp_path / "out"
    fit = [a for a in FIT if not a.startswith(("--model.preset", "--model.overrides"))]
    main(
        [
            "suite",
            str(suite),
            f"--out_dir={out}",
            f"--init_from={tmp_path / 'pre'}",
            f"--data_dir={tmp_path / 'c'}",
        ]
        + ["--zero_shot=true", "--transfer_layers", "[0, 2]", "--predict=true", *fit_args(*fit)]
    )
    results = json.loads((out / "results.json").read_text())
    metrics = results["tasks"]["mc"]["metrics"]
    assert 0 <= metrics["validation/accuracy"]["zero_shot"] <= 100
    assert "zero_shot" in metrics["validation/accuracy_norm"]
    assert set(results["tasks"]["mc"]["transfer"]) == {"0", "2"}
    for k in ("0", "2"):
        assert (out / "runs" / "mc" / f"layers-{k}" / "seed-0" / "result.json").is_file()
    assert (out / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    printed, warned = capsys.readouterr()
    missing = tmp_path / "c" / "d" / "test.csv"
    warning = f"warning: no mc predictions for split 'test': {missing}: file not found"
    assert warned.count(warning) == 2  # one per run
    assert "| mc | " in (out / "results.md").read_text() and "2 layers" in (out / "results.md").read_text()
    # The main table of a sweep is its deepest transfer's (here every layer).
    deepest = json.loads((out / "runs" / "mc" / "layers-2" / "seed-0" / "result.json").read_text())
    fine_tuned = metrics["validation/accuracy"]["seeds"]
    assert fine_tuned == {"0": pytest.approx(100 * deepest["metrics"]["validation/accuracy"])}
    assert not list(out.rglob("*.ckpt"))  # checkpoints are not kept by default
    # A zero-shot pass keeps the fine-tuned scores of what it gives (the same fit arguments).
    sweep = [f"--init_from={tmp_path / 'pre'}", f"--data_dir={tmp_path / 'c'}", "--transfer_layers", "[0, 2]"]
    zero_shot = ["suite", str(suite), f"--out_dir={out}", *sweep, "--fine_tune=false", "--zero_shot=true"]
    with pytest.raises(SystemExit):  # a depth among the fit arguments: every depth run as it
        main(["suite", str(suite), f"--out_dir={out}", *sweep, *fit_args(*fit, "--model.transfer_layers=1")])
    said = "--model.transfer_layers 1 in the fit arguments would run each of the suite's depths as 1; "
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(said + "the suite sets every run's depth (--transfer_layers).")
    )
    main([*zero_shot, *fit_args(*fit)])
    again = json.loads((out / "results.json").read_text())["tasks"]["mc"]["metrics"]
    assert again["validation/accuracy"]["seeds"] == fine_tuned and "changed" not in capsys.readouterr().out
    # The card changed: its zero-shot score is computed again, and the fine-tuned ones, from the old
    # card, are left out of the results (they were reported as the new card's), said.
    card.write_text(card.read_text().replace("  labels:", "  metrics: [accuracy]\n  labels:"))
    main([*zero_shot, *fit_args(*fit)])
    printed = capsys.readouterr().out
    assert "zero-shot mc: its model, data or method changed since it ran: scoring it again" in printed
    assert "mc seed 0 (2 layers): its inputs changed since it ran (" in printed
    assert "left out of the results (run it again, or give what it ran with)" in printed
    again = json.loads((out / "results.json").read_text())["tasks"]["mc"]["metrics"]
    assert not again["validation/accuracy"]["seeds"] and 0 <= again["validation/accuracy"]["zero_shot"] <= 100
    # Other weights into the same folder: the zero-shot scores are not the first model's.
    torch.manual_seed(1)
    GPT(config).to_hf().save_pretrained(tmp_path / "other")
    tok.save_pretrained(tmp_path / "other")
    argv = ["suite", str(suite), f"--out_dir={out}", f"--init_from={tmp_path / 'other'}"]
    main([*argv, f"--data_dir={tmp_path / 'c'}", "--fine_tune=false", "--zero_shot=true"])
    assert "zero-shot mc: its model, data or method changed since it ran: scoring it again" in (
        capsys.readouterr().out
    )
    # Other weights written into the same folder: scored again too.
    torch.manual_seed(2)
    GPT(config).to_hf().save_pretrained(tmp_path / "other")
    main([*argv, f"--data_dir={tmp_path / 'c'}", "--fine_tune=false", "--zero_shot=true"])
    assert "scoring it again" in capsys.readouterr().out
    # Fine-tuned from the first weights again: the zero-shot score, the other weights', is left out
    # (it sat in the row of a model it did not score), said.
    main([*zero_shot[:-2], *fit_args(*fit)])
    assert "zero-shot mc: scored from other weights, data or method than given now: left out" in (
        capsys.readouterr().out
    )
    again = json.loads((out / "results.json").read_text())["tasks"]["mc"]["metrics"]
    assert again["validation/accuracy"]["seeds"] and "zero_shot" not in again["validation/accuracy"]
    # A depth the weights lack (or below 0) is refused before any run trains (the first run, 0 kept,
    # trained whole before the second found it).
    weights = tmp_path / "pre"
    for depths, said in (
        ([0, 3], f"--transfer_layers 3: {weights} has 2 blocks; give depths in [0, 2]."),
        ([-1, 2], "--transfer_layers -1: a depth is a number of blocks kept, from 0."),
    ):
        with pytest.raises(ValueError, match="^" + re.escape(said) + "$"):
            suites.SuiteRunner(
                str(suite), out_dir=tmp_path / "o", init_from=str(weights), transfer_layers=depths
            )


def test_weights_given_in_fit_args_that_change_run_again(tmp_path, tokenizer_dir, capsys):
    """A run's stamps are of the files its own configuration reads: weights named in --fit_args
    (not the suite's --init_from) rewritten under the same name make it run again."""
    tok = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    card = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: w\nseeds: [0]\ntasks:\n  - card: {card}\n")
    fit = [a for a in FIT if not a.startswith(("--model.preset", "--model.overrides"))]
    argv = ["suite", str(suite), f"--out_dir={tmp_path / 'out'}", f"--data_dir={tmp_path / 'a'}"]
    argv += fit_args(*fit, f"--model.init_from={tmp_path / 'pre'}")
    main(argv)
    torch.manual_seed(1)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")  # other weights, the same path
    capsys.readouterr()
    main(argv)
    printed = capsys.readouterr().out
    assert "sent seed 0: its inputs changed since it ran (the file " in printed
    assert str(tmp_path / "pre" / "model.safetensors") in printed
    assert ": 1 run, 0 finished before, 1 to go" in printed


@pytest.mark.parametrize("select", ["last", "best"])
def test_a_run_that_max_steps_ends_before_any_validation_scores_its_last_weights(
    tmp_path, tokenizer_dir, select, capsys
):
    """--trainer.max_steps inside the first epoch: the weights the run ended with are validated (its
    training is not thrown away for want of a validation), and they write the predictions (with
    --select best too: no best checkpoint was kept)."""
    card = make_task("single", tmp_path / "a")  # 6 training examples: 3 batches of 2
    suite = write_suite(tmp_path, f"name: m\nseeds: [0]\ntasks:\n  - card: {card}\n")
    out = tmp_path / "out"
    main([*suite_argv(suite, out, tokenizer_dir, tmp_path / "a"), f"--select={select}", "--predict=true",
          *fit_args(*FIT, "--data.batch_size=2", "--trainer.max_steps=1")])  # fmt: skip
    result = json.loads((out / "runs" / "sent" / "seed-0" / "result.json").read_text())
    assert result["epoch"] == 0 and set(result["metrics"]) >= {"validation/accuracy", "validation/loss"}
    accuracy = result["metrics"]["validation/accuracy"]
    assert any(accuracy == pytest.approx(k / 5) for k in range(6)), accuracy  # of the 5 dev rows
    rows = (out / "runs" / "sent" / "seed-0" / "predictions" / "SENT.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 4
    if select == "last":  # no validation at all: said, not a result without metrics
        with pytest.raises(SystemExit):
            main([*suite_argv(suite, tmp_path / "none", tokenizer_dir, tmp_path / "a"),
                  *fit_args(*FIT, "--trainer.max_steps=1", "--trainer.limit_val_batches=0")])  # fmt: skip
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith("The run validated nothing: check --trainer.limit_val_batches.")
        )


def test_only_the_first_ddp_process_of_a_suite_writes(tmp_path, tokenizer_dir, monkeypatch, capsys):
    """Under DDP fit arguments every process runs the suite (each fit needs them all): the others
    neither write results nor delete what the first writes, nor print."""
    card = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: d\nseeds: [0]\ntasks:\n  - card: {card}\n")
    monkeypatch.setattr(suites, "first_process", lambda: False)
    out = tmp_path / "out"
    data = f"--data_dir={tmp_path / 'a'}"
    main(["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}", data, *fit_args(*FIT)])
    assert not list(out.rglob("result*.json")) and not (out / "results.md").exists()
    assert "suite d" not in capsys.readouterr().out


def suite_argv(suite, out, tokenizer_dir, data_dir) -> list[str]:
    return ["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}", f"--data_dir={data_dir}"]


def test_ctrl_c_in_a_suite_says_to_rerun_the_suite(tmp_path, tokenizer_dir, capsys):
    """A suite's interrupted run starts again when the suite is rerun: the stop message says so,
    not `gpt-ft fit --ckpt_path last` (which a suite's user never typed), and names no checkpoint
    (the rerun would throw it away: none is saved)."""
    card = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: c\nseeds: [0]\ntasks:\n  - card: {card}\n")
    out = tmp_path / "out"
    argv = suite_argv(suite, out, tokenizer_dir, tmp_path / "a")
    with pytest.raises(SystemExit) as stopped:
        main([*argv, *fit_args(*FIT, *interrupt(1, signal.SIGINT))])
    assert stopped.value.code == 128 + signal.SIGINT
    captured = capsys.readouterr()
    ckpt = out / "runs" / "sent" / "seed-0" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert f"SIGINT: stopped at step 1; {finetune.SUITE_RESUME}" in captured.out and not ckpt.exists()
    assert ckpt.parent.parent.is_dir()  # the run's own folder, where a stopped fit saves
    assert captured.err.rstrip().endswith("gpt-ft: stopped by Ctrl-C (SIGINT)")


def test_a_suite_running_in_an_out_dir_holds_it(tmp_path):
    """A second suite started on an out_dir while one runs there is refused before it reads or moves
    anything (it set aside the first one's runs as interrupted, and the first crashed on a missing
    metrics.csv); once the first is done the folder is free."""
    from gpt_ft.data.folders import LOCK, held

    runner = suites.SuiteRunner(load_suite(ROOT / "configs/suites/glue.yaml"), out_dir=tmp_path, tasks="rte")
    runner._run = lambda log: pytest.fail("ran while another suite held the folder")
    with held(tmp_path, "`gpt-ft suite`"):  # (as another process holds it)
        with pytest.raises(ValueError, match=rf"^Another `gpt-ft suite` is writing to {tmp_path}; wait for"):
            runner.run()
    runner._run = lambda log: "ran"
    assert runner.run() == "ran" and not (tmp_path / LOCK).exists()


def test_a_missing_test_file_leaves_the_others_predictions(tmp_path, tokenizer_dir, capsys):
    """A card of two test splits (RTE with SuperGLUE's diagnostics) whose second file is absent:
    the run warns, predicts the readable split and the suite goes on (the predict stage does not
    set up the unreadable one)."""
    single = make_task("single", tmp_path / "a")
    single.write_text(
        single.read_text().replace("test: d/test.tsv}", "test: d/test.tsv, test_ax: d/ax.tsv}")
        + "  test_splits: [test, test_ax]\n"
    )
    suite = write_suite(
        tmp_path, f"name: s\ntasks: [{single}]\nsubmission: {{archive: s.zip, files: [SENT.tsv]}}\n"
    )
    out = tmp_path / "out"
    argv = ["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}"]
    main([*argv, f"--data_dir={tmp_path / 'a'}", *fit_args(*FIT)])
    printed, warned = capsys.readouterr()
    assert (
        f"warning: no sent predictions for split 'test_ax': {tmp_path / 'a' / 'd' / 'ax.tsv'}: file not found"
        in warned
    )
    rows = (out / "runs" / "sent" / "seed-0" / "predictions" / "SENT.tsv").read_text().splitlines()
    assert len(rows) == 4 and (out / "s.zip").is_file()


def test_a_submission_folder_of_other_files_is_refused_before_any_run(tmp_path):
    """OUT/submission is written anew at the end of a suite: files no suite wrote there (`gpt-ft
    predict`'s) stop it before it runs, kept; a suite's own output (or none to predict) passes."""
    spec = load_suite(ROOT / "configs/suites/glue.yaml")
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "RTE.tsv").write_text("index\tprediction\n0\tentailment\n")
    with pytest.raises(
        ValueError, match=r"submission holds files no suite wrote \(RTE.tsv\), and a suite writes"
    ):
        suites.SuiteRunner(spec, out_dir=tmp_path)
    assert (tmp_path / "submission" / "RTE.tsv").is_file()
    suites.SuiteRunner(spec, out_dir=tmp_path, predict=False)
    (tmp_path / "submission" / "RTE.tsv").unlink()
    folder = suite_folder.new_submission_folder(tmp_path)  # as a suite writes it: its own from then on
    (folder / "RTE.tsv").write_text("index\tprediction\n0\tnot_entailment\n")
    mark_submission(tmp_path)
    suites.SuiteRunner(spec, out_dir=tmp_path)
    # A folder of an earlier version, its marker empty: its files are copies of its runs' predictions.
    (tmp_path / ".submission-by-gpt-ft-suite").write_text("")
    kept = tmp_path / "runs" / "rte" / "seed-0" / "predictions" / "RTE.tsv"
    kept.parent.mkdir(parents=True)
    kept.write_bytes((folder / "RTE.tsv").read_bytes())
    suites.SuiteRunner(spec, out_dir=tmp_path)
    # A file of the user's put there since, or one of the suite's written over: refused, kept (a suite
    # once counted the whole folder its own, and deleted them).
    for name, text, what in (
        ("MINE.tsv", "x\n", "no suite wrote"),
        ("RTE.tsv", "index\tprediction\n0\tentailment\n", "changed since a suite wrote them"),
    ):
        (folder / name).write_text(text)
        with pytest.raises(ValueError, match=rf"submission holds files {what} \({name}\), and a"):
            suites.SuiteRunner(spec, out_dir=tmp_path)
        with pytest.raises(ValueError, match=rf"\({name}\)"):
            suite_folder.new_submission_folder(tmp_path)
        assert (folder / name).read_text() == text
        (folder / name).unlink()


def test_ctrl_c_in_a_runs_last_validation_stops_the_suite_after_that_run(tmp_path, tokenizer_dir, capsys):
    """Once that validation has ended the run ends on its own (no step left to stop at): the suite
    went on with every other run and exited 0 after saying it would stop. It keeps the finished run
    and stops before the next."""
    card = make_task("single", tmp_path / "a")  # 6 rows, batch 4: its last validation after batch 2
    suite = write_suite(tmp_path, f"name: tiny\nseeds: [0, 1]\ntasks:\n  - card: {card}\n")
    out = tmp_path / "out"
    argv = ["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}", "--predict=false"]
    sigint = [*interrupt(2, int(signal.SIGINT)), "--trainer.callbacks.validation_end=true"]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, f"--data_dir={tmp_path / 'a'}", *fit_args(*FIT, *sigint)])
    assert stopped.value.code == 130
    printed = capsys.readouterr().out
    assert "SIGINT: stopped after sent seed 0 finished: the same gpt-ft suite command goes on" in printed
    assert (out / "runs" / "sent" / "seed-0" / "result.json").is_file()
    assert not (out / "runs" / "sent" / "seed-1").exists()


def test_a_folder_of_a_users_results_md_is_refused_before_any_run(tmp_path):
    """A folder that is no suite's (no runs/) holding results.md: refused, kept (it was written over)."""
    spec = load_suite(ROOT / "configs/suites/glue.yaml")
    (tmp_path / "results.md").write_text("# my notes\n")
    with pytest.raises(
        ValueError, match=r"^--out_dir .* holds results.md, which a suite writes, and no suite's"
    ):
        suites.SuiteRunner(spec, out_dir=tmp_path, predict=False)
    assert (tmp_path / "results.md").read_text() == "# my notes\n"
    (tmp_path / "runs").mkdir()  # a suite's folder: its own results
    suites.SuiteRunner(spec, out_dir=tmp_path, predict=False)
    # The submission's archive is a file a suite writes too (a user's own was written over).
    (tmp_path / "runs").rmdir()
    (tmp_path / "results.md").unlink()
    (tmp_path / "glue_submission.zip").write_text("my archive\n")
    with pytest.raises(ValueError, match=r"^--out_dir .* holds glue_submission.zip, which a suite writes"):
        suites.SuiteRunner(spec, out_dir=tmp_path)
    assert (tmp_path / "glue_submission.zip").read_text() == "my archive\n"
    suites.SuiteRunner(spec, out_dir=tmp_path, predict=False)  # (no archive written)


def test_a_subset_of_a_suites_tasks(tmp_path):
    spec = load_suite(ROOT / "configs/suites/glue.yaml")
    runner = suites.SuiteRunner(spec, out_dir=tmp_path, tasks=["sst2", "rte", "stsb"], seeds=[0, 1])
    assert list(runner.cards) == ["sst2", "rte", "stsb"]
    assert [str(r) for r in runner.runs()][:3] == ["sst2 seed 0", "sst2 seed 1", "rte seed 0"]
    with pytest.raises(ValueError, match=r"--tasks \['sts2'\]: suite 'GLUE' has"):
        suites.SuiteRunner(spec, out_dir=tmp_path, tasks=["sts2"])
    assert data_dirs(["glue", "rte=r"]) == {None: "glue", "rte": "r"}
    assert data_dirs(["x/y=z"]) == {None: "x/y=z"}  # a path with "=" in it
    with pytest.raises(ValueError, match=r"^--data_dir gives a DIR for every task twice \(a and b\)\.$"):
        data_dirs(["a", "b"])
    with pytest.raises(ValueError, match=r"^--data_dir gives rte=DIR twice \(a and b\)\.$"):
        data_dirs(["rte=a", "rte=b"])
    with pytest.raises(
        ValueError, match=r"^--seeds \[0, 0\]: give one or more seeds in \[0, 4294967295\], each once"
    ):
        suites.SuiteRunner(spec, out_dir=tmp_path, seeds=[0, 0])
    with pytest.raises(ValueError, match=r"^--seeds \[1, -1\]: give one or more seeds in \[0, 4294967295\]"):
        suites.SuiteRunner(spec, out_dir=tmp_path, seeds=[1, -1])  # named as fit's --seed_everything
    with pytest.raises(
        ValueError, match=r"^--train_sizes -3: a size is a positive number of examples, or all"
    ):
        suites.SuiteRunner(spec, out_dir=tmp_path, train_sizes=[2, -3])  # before any run trains
    for kwargs, said in (  # each a run a seed: a second ran the first again, over its folder
        (dict(train_sizes=[4, "all", 4]), "--train_sizes 4: a size is a positive number of examples, or all, "
                                          "each once."),
        (dict(train_sizes=["all", "all"]), "--train_sizes all: "),
        (dict(train_sizes=[0, 4]), "--train_sizes 0: "),  # (said "all": 0 is falsy)
        (dict(transfer_layers=[1, 1], init_from="w"), "--transfer_layers names 1 twice: each depth is one "
                                                      "run a seed."),
    ):  # fmt: skip
        with pytest.raises(ValueError, match="^" + re.escape(said)):
            suites.SuiteRunner(spec, out_dir=tmp_path, **kwargs)
    card = write_suite(tmp_path, "name: p\ntasks:\n  - card: tasks/glue/rte.yaml\n    paper: {acuracy: 56}\n")
    with pytest.raises(
        ValueError, match=rf"^Suite file {card}, task 'rte': paper names \['acuracy'\], not among"
    ):
        suites.SuiteRunner(str(card), out_dir=tmp_path)
    card.write_text("name: p\ntasks: [tasks/glue/rte.yaml, tasks/glue/rte.yaml]\n")
    with pytest.raises(
        ValueError, match=rf"^Suite file {card} lists task 'rte' twice \(tasks/glue/rte.yaml is"
    ):
        suites.SuiteRunner(str(card), out_dir=tmp_path)
    card = write_suite(
        tmp_path, "name: s\ntasks: [tasks/glue/sst2.yaml]\nscore: {name: x, tasks: [sst2, cola]}\n"
    )
    with pytest.raises(
        ValueError, match=rf"^Suite file {card}: its score names task\(s\) \['cola'\] not in suite 's'\.$"
    ):
        suites.SuiteRunner(str(card), out_dir=tmp_path)  # a score that no run could ever complete
    with pytest.raises(ValueError, match=r"^--data_dir names task\(s\) \['cola2'\] not in suite 'GLUE'\.$"):
        suites.SuiteRunner(spec, out_dir=tmp_path, data_dir=["cola2=c"])


def test_a_bad_argument_of_any_task_stops_the_suite_before_it_trains(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    """A typo in the last task's `args` is found before the first task trains, not hours later."""
    single, pair = make_task("single", tmp_path / "a"), make_task("pair", tmp_path / "b")
    suite = write_suite(
        tmp_path, f"name: s\ntasks:\n  - {single}\n  - card: {pair}\n    args: [--trainer.bogus=1]\n"
    )
    calls = []
    monkeypatch.setattr(suites, "fit_and_evaluate", lambda *args, **kwargs: calls.append(args))
    argv = [
        "suite",
        str(suite),
        f"--out_dir={tmp_path / 'out' / 'deep'}",
        f"--tokenizer={tokenizer_dir}",
        *fit_args(*FIT),
    ]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--data_dir", as_list(f"sent={tmp_path / 'a'}", f"pair={tmp_path / 'b'}")])
    assert stopped.value.code == 2 and calls == [] and not (tmp_path / "out").exists()  # nothing left
    err = capsys.readouterr().err.strip()
    assert (
        err == f"gpt-ft: error: Suite file {suite}, task 'pair': unrecognized arguments: --trainer.bogus=1."
    )
    # a bad field of the model's overrides too: found when the model is built, after the first task
    suite.write_text(suite.read_text().replace("--trainer.bogus=1", "'--model.overrides={n_layerr: 1}'"))
    argv = [*argv[:4], *fit_args(*(a for a in FIT if not a.startswith("--model.overrides")))]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--data_dir", as_list(f"sent={tmp_path / 'a'}", f"pair={tmp_path / 'b'}")])
    assert stopped.value.code == 2 and calls == [] and not (tmp_path / "out").exists()
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith(
            f"gpt-ft: error: Suite file {suite}, task 'pair': Unknown GPTConfig field(s) ['n_layerr']"
        )
    )
    # the last task's folder missing: named before the first task trains, not when its turn comes
    suite.write_text(f"name: s\ntasks:\n  - {single}\n  - {pair}\n")
    with pytest.raises(SystemExit) as stopped:
        main(
            [*argv[:4], *fit_args(*FIT), "--data_dir", as_list(f"sent={tmp_path / 'a'}", f"pair={tmp_path}")]
        )
    assert stopped.value.code == 2 and calls == [] and not (tmp_path / "out").exists()
    assert capsys.readouterr().err.strip() == (
        f"gpt-ft: error: {tmp_path / 'd' / 'train.tsv'}: file not found (split 'train' of task 'pair'); "
        "no run started."
    )
    # the command line's --fit_args at fault, not the file: named as they are
    with pytest.raises(SystemExit) as stopped:
        data_dirs = as_list(f"sent={tmp_path / 'a'}", f"pair={tmp_path / 'b'}")
        main([*argv[:4], *fit_args(*FIT, "--trainer.bogus=1"), "--data_dir", data_dirs])
    assert stopped.value.code == 2 and calls == []
    err = capsys.readouterr().err.strip()
    assert err == "gpt-ft: error: --fit_args: unrecognized arguments: --trainer.bogus=1.", err
    # weights named by a path that is not there: found before the first task trains, not when its run starts
    suite.write_text(
        f"name: s\ntasks:\n  - {single}\n  - card: {pair}\n    args: [--model.init_from=/nope/w.ckpt]\n"
    )
    with pytest.raises(SystemExit) as stopped:
        main([*argv[:4], *fit_args(*FIT), "--data_dir", data_dirs])
    assert stopped.value.code == 2 and calls == []
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"gpt-ft: error: Suite file {suite}, task 'pair': --model.init_from /nope/w.ckpt does not exist."
    ), err
    suite.write_text(
        f"name: s\ntasks:\n  - {single}\n  - card: {pair}\n    args: [--data.tokenizer=/nope/tok]\n"
    )
    with pytest.raises(SystemExit):  # (the data module's arguments, under its class's init_args)
        main([*argv[:4], *fit_args(*FIT), "--data_dir", data_dirs])
    assert capsys.readouterr().err.strip().endswith("task 'pair': --data.tokenizer /nope/tok does not exist.")


def test_a_suite_stopped_by_a_missing_data_file_leaves_no_new_out_dir(tmp_path, tokenizer_dir, capsys):
    """Its run folders were made before the file was found missing: a tree of empty folders was left."""
    single = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: s\ntasks:\n  - {single}\n")
    argv = ["suite", str(suite), f"--out_dir={tmp_path / 'out' / 'deep'}", f"--tokenizer={tokenizer_dir}"]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, *fit_args(*FIT), f"--data_dir={tmp_path / 'none'}"])
    assert stopped.value.code == 2 and "file not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_zero_shot_only_skips_tasks_without_a_method(tmp_path, tokenizer_dir, capsys):
    tok = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    single, choice = make_task("single", tmp_path / "a"), make_task("choice", tmp_path / "c")
    suite = write_suite(tmp_path, f"name: z\ntasks:\n  - card: {single}\n  - card: {choice}\n")
    out = tmp_path / "out"
    main(
        ["suite", str(suite), f"--out_dir={out}", f"--init_from={tmp_path / 'pre'}", "--fine_tune=false"]
        + ["--zero_shot=true", "--data_dir", as_list(f"sent={tmp_path / 'a'}", f"mc={tmp_path / 'c'}")]
    )
    assert "zero-shot: sent has no method" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["tasks"]["sent"]["metrics"] == {}
    assert set(results["tasks"]["mc"]["metrics"]) == {
        "validation/accuracy",
        "validation/accuracy_norm",
        "validation/accuracy_token",
    }


def test_a_zero_shot_entry_that_cannot_score_its_task_is_named_before_any_work(tmp_path):
    """A multiple-choice card's entry said "need class labels" (it has some), an empty verbalizer
    "A continuation to score has no tokens" after the model loaded: each is named at once."""
    single, choice = make_task("single", tmp_path / "a"), make_task("choice", tmp_path / "c")
    for card, method, message in (
        (
            choice,
            "{verbalizers: [' a', ' b']}",
            r"task 'mc': multiple choice is scored on its own choices; leave",
        ),
        (
            single,
            "{verbalizers: [' a']}",
            r"task 'sent': 1 verbalizers given for 2 labels \['negative', 'pos",
        ),
        (single, "{verbalizers: ['', ' b']}", r"zero_shot: a verbalizer is empty: each is a continuation"),
    ):
        suite = write_suite(tmp_path, f"name: z\ntasks:\n  - card: {card}\n    zero_shot: {method}\n")
        with pytest.raises(ValueError, match=rf"{re.escape(str(suite))}.*{message}"):
            suites.SuiteRunner(str(suite), out_dir=str(tmp_path / "out"), zero_shot=True, init_from="w")
    # Where no zero-shot scoring runs (fine-tuning only, or another task), an entry is not read.
    unused = write_suite(
        tmp_path, f"name: z\ntasks:\n  - card: {single}\n    zero_shot: {{verbalizers: [' a']}}\n"
    )
    suites.SuiteRunner(str(unused), out_dir=str(tmp_path / "out"))


def test_learning_curves_rows_sizes_and_resume(tmp_path, tokenizer_dir, monkeypatch, capsys):
    """A pretrained row and a from-scratch row x (2 examples, all 6) x one seed: the subset's run is
    raised to min_steps, both rows train on the same subset, the scratch row drops --init_from, the
    results hold each row's curve, the table and chart are written, and a rerun redoes nothing."""
    tok = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    single = make_task("single", tmp_path / "a")
    single.write_text(single.read_text() + "  ignore_labels: ['-']\n")  # a 7th record, no example
    with (tmp_path / "a" / "d" / "train.tsv").open("a") as train:
        train.write("6\ta cat .\t-\n")
    suite = write_suite(
        tmp_path,
        f"""name: curves
seeds: [0]
tasks: [{single}]
rows:
  pretrained: [--model.lr=1e-4]
  from scratch: [--model.init_from=null, --model.preset=gpt-micro, "--model.overrides={MICRO}",
                 --model.lr=1e-3]
train_sizes: [2, 4]
min_steps: 3
submission: {{archive: sub.zip, files: [SENT.tsv]}}
""",
    )
    out = tmp_path / "out"
    argv = [
        "suite",
        str(suite),
        f"--out_dir={out}",
        f"--init_from={tmp_path / 'pre'}",
        f"--data_dir={tmp_path / 'a'}",
    ]
    fit = [a for a in FIT if not a.startswith(("--model.preset", "--model.overrides"))]
    sized = [*argv, "--train_sizes", "[2, all]"]
    # a size among the fit arguments (given last, it wins) trained every size on it, labelled apart
    with pytest.raises(SystemExit):
        main([*sized, *fit_args(*fit, "--data.train_size=3")])
    said = "--data.train_size 3 in the fit arguments would run each of the suite's sizes as 3; the suite "
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(said + "sets every run's size (train_sizes: in its file, or --train_sizes).")
    )
    assert not (out / "runs").exists()
    argv = [*sized, *fit_args(*fit)]  # the command line's sizes replace the file's
    calls = []
    real_fit = suites.fit_and_evaluate
    monkeypatch.setattr(
        suites, "fit_and_evaluate", lambda *a, **k: calls.append((a[1], k)) or real_fit(*a, **k)
    )
    main(argv)
    assert len(calls) == 4
    sizes = [data_of(args).get("train_size") for args, _ in calls]
    subset = [(args, kw) for (args, kw), size in zip(calls, sizes, strict=True) if size == 2]
    assert len(subset) == 2 and all(kw["min_steps"] == 3 and "--seed_everything=0" in a for a, kw in subset)
    whole = [kw["min_steps"] for (_, kw), size in zip(calls, sizes, strict=True) if size is None]
    assert whole == [None, None]
    runs = out / "runs"
    small = json.loads((runs / "pretrained" / "sent" / "size-2" / "seed-0" / "result.json").read_text())
    assert small["size"] == 2 and small["row"] == "pretrained" and small["epoch"] == 2  # 1 batch an epoch: 3
    full = json.loads((runs / "pretrained" / "sent" / "seed-0" / "result.json").read_text())
    assert full["epoch"] == 0  # the whole split keeps the config's one epoch
    (scratch,) = (runs / "from-scratch" / "sent" / "size-2").rglob("hparams.yaml")
    (pretrained,) = (runs / "pretrained" / "sent" / "size-2").rglob("hparams.yaml")
    assert (
        "init_from: null" in scratch.read_text()
        and f"init_from: {tmp_path / 'pre'}" in pretrained.read_text()
    )

    results = json.loads((out / "results.json").read_text())
    curves = results["tasks"]["sent"]["curves"]
    assert list(curves) == ["pretrained", "from scratch"] and list(curves["pretrained"]) == ["2", "all"]
    assert [p["examples"] for p in curves["from scratch"].values()] == [2, 6]
    assert curves["pretrained"]["2"]["seeds"]["0"] == pytest.approx(
        100 * small["metrics"]["validation/accuracy"]
    )
    main_table = results["tasks"]["sent"]["metrics"]["validation/accuracy"]["seeds"]["0"]
    assert main_table == curves["pretrained"]["all"]["mean"]  # the first row's whole-split runs
    saved = results["tasks"]["sent"]["labels_saved"]
    assert (
        saved["row"] == "pretrained" and saved["against"] == "from scratch" and saved["target_examples"] == 6
    )
    table = (out / "results.md").read_text()
    assert "| sent | 2 | all |" in table and "| from scratch | " in table
    assert "Rows (each with its own fit arguments, in results.json): pretrained, from scratch" in table
    # The tokenizer (a row may drop --init_from) is the weights' from the start: a zero-shot score,
    # recorded before the runs, came from it too (it was found later, and the score left out).
    runner = suites.SuiteRunner(str(suite), out_dir=tmp_path / "again", init_from=str(tmp_path / "pre"))
    assert runner.tokenizer == str(tmp_path / "pre") and runner._zero_shot_inputs("sent")["tokenizer"] == str(
        tmp_path / "pre"
    )
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with zipfile.ZipFile(out / "sub.zip") as zf:  # the first row's predictions, from under its folder
        assert zf.namelist() == ["SENT.tsv"]

    calls.clear()
    baseline = tmp_path / "tfidf.json"  # a curve measured elsewhere on the same subsets, drawn beside
    points = {
        "2": {"0": 50, "1": 70},
        "3": {"0": 55},
        "all": {"0": 80.5},
    }  # seed 1 and size 3: not the suite's
    baseline.write_text(json.dumps({"name": "TF-IDF + linear", "tasks": {"sent": points, "other": {}}}))
    main([*argv[:5], f"--baselines={baseline}", *argv[5:]])
    assert calls == []  # nothing run again
    curves = json.loads((out / "results.json").read_text())["tasks"]["sent"]["curves"]
    assert list(curves) == ["pretrained", "from scratch", "TF-IDF + linear"]
    assert curves["TF-IDF + linear"]["2"] == {"examples": 2, "seeds": {"0": 50.0}, "mean": 50.0, "std": None}
    assert (
        list(curves["TF-IDF + linear"]) == ["2", "all"] and curves["TF-IDF + linear"]["all"]["mean"] == 80.5
    )
    assert "| TF-IDF + linear | 50.0 | 80.5 |" in (out / "results.md").read_text()


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "is not JSON: Expecting property name"),
        (
            '{"tasks": {}}',
            'is not a learning curve: expected {"name": NAME, "tasks": {TASK: {SIZE: {SEED: SCORE}}}}.',
        ),
        (
            '{"name": "x", "tasks": {"sent": {"many": {"0": 1}}}}',
            "task sent: size 'many' is not a positive whole",
        ),
        (  # digits of other scripts: int() took '١٠' for 10, and failed on '²' in no sentence
            '{"name": "x", "tasks": {"sent": {"\u00b2": {"0": 1}}}}',
            "task sent: size '²' is not a positive whole",
        ),
        ('{"name": "x", "tasks": {"sent": {"\u0661\u0660": {"0": 1}}}}', "size '١٠' is not a positive whole"),
        (
            '{"name": "x", "tasks": {"sent": {"2": {"0": "high"}}}}',
            "size 2: seed '0' with score 'high' is not",
        ),
        (
            '{"name": "pretrained", "tasks": {}}',
            "names its curve 'pretrained', as a row or another file does.",
        ),
        (None, "cannot be read: No such file or directory"),
    ],
)
def test_a_baseline_file_that_is_not_a_curve_is_named(tmp_path, text, words):
    from gpt_ft.eval.curves import read_baselines

    path = tmp_path / "b.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=f"^Baseline file {re.escape(str(path))}") as e:
        read_baselines([path], ["pretrained", "from scratch"])
    assert words in str(e.value)
    # A suite without rows: its one curve is "fine-tuned", which a baseline of that name replaced.
    path.write_text('{"name": "fine-tuned", "tasks": {}}')
    with pytest.raises(ValueError, match="names its curve 'fine-tuned', as a row or another file does"):
        read_baselines([path], [])


def test_a_baselines_nan_or_infinity_is_an_undefined_score(tmp_path):
    """A correlation of constant predictions, as Python's json writes it (NaN): read as undefined, as
    the suite's own runs are; it stopped the suite when the table was written, after every run."""
    from gpt_ft.eval.curves import baseline_curves, read_baselines

    path = tmp_path / "b.json"
    path.write_text(
        '{"name": "TF-IDF", "tasks": {"sst2": {"100": {"0": NaN, "1": 60.0}, "all": {"0": Infinity}}}}'
    )
    read = read_baselines([path], [None])
    assert read == {"TF-IDF": {"sst2": {100: {0: None, 1: 60.0}, None: {0: None}}}}
    points = baseline_curves(read, "sst2", [100, None], [0, 1], lambda: 1000)["TF-IDF"]
    assert (points["100"]["mean"], points["100"]["std"], points["all"]["mean"]) == (60.0, None, None)
    path.write_text('{"name": "TF-IDF", "tasks": {"sst2": {"100": {"0": true}}}}')
    with pytest.raises(ValueError, match="seed '0' with score True is not SEED: SCORE"):
        read_baselines([path], [None])


def test_a_size_beyond_the_split_counts_the_examples_it_trained_on():
    """RTE's 2,490 training rows at a size of 3,000: the run trains on the whole split, and the curve
    (which the labels saved read) counts 2,490 examples, not 3,000."""
    from gpt_ft.eval.curves import collect_curves

    scores = {(None, 2): 60.0, (None, 30): 80.0, (None, None): 80.0, ("scratch", 30): 80.0}
    curves = collect_curves(lambda row, size, seed: scores.get((row, size)), [None, "scratch"], [2, 30, None],
                            [0], whole=lambda: 6)  # fmt: skip
    for curve in curves.values():
        assert [p["examples"] for p in curve.values()] == [2, 6, 6]


def test_labels_saved_reads_the_first_rows_curve_against_the_seconds_largest_size():
    from gpt_ft.eval.curves import curve, labels_saved
    from gpt_ft.eval.results import results_markdown

    examples = {100: 100, 1000: 1000, None: 67000}
    pretrained = curve({100: {0: 60.0, 1: 62.0}, 1000: {0: 77.0}, None: {0: 80.0}}, examples)
    scratch = curve({100: {0: 50.0}, 1000: {0: 66.0}, None: {0: 76.5}}, examples)
    saved = labels_saved({"pretrained": pretrained, "from scratch": scratch})
    assert saved == {"row": "pretrained", "against": "from scratch", "target": 76.5, "target_examples": 67000,
                     "examples": 1000, "ratio": 67.0}  # fmt: skip
    assert pretrained["100"]["mean"] == 61.0 and list(pretrained) == ["100", "1000", "all"]
    never = labels_saved({"scratch": scratch, "pretrained": pretrained})
    assert never["examples"] is None and never["ratio"] is None and never["target"] == 80.0
    assert labels_saved({"one": pretrained}) is None
    unread = {100: 100, 1000: 1000, None: None}  # the training split could not be read: "all" has no size
    pretrained, scratch = curve({100: {0: 80.0}, None: {0: 90.0}}, unread), curve({100: {0: 60.0}}, unread)
    assert labels_saved({"pretrained": pretrained, "from scratch": scratch})["examples"] == 100
    assert labels_saved({"stale": {}, "from scratch": scratch}) is None  # a row with no point: no sentence
    # The second row measured on fewer sizes: the first reaches its score with more labels, not fewer
    ex = {100: 100, 300: 300, 1000: 1000}
    first = curve({100: {0: 50.0}, 300: {0: 60.0}, 1000: {0: 80.0}}, ex)
    second = curve({100: {0: 55.0}, 300: {0: 70.0}, 1000: {0: None}}, ex)
    saved = labels_saved({"pretrained": first, "scratch": second})
    assert (saved["examples"], saved["target_examples"], saved["ratio"]) == (1000, 300, 0.3)
    item = {"metrics": {}, "curves": {"pretrained": first, "scratch": second}, "labels_saved": saved}
    config = {"seeds": [0], "init_from": None, "select": "last", "rows": ["pretrained", "scratch"]}
    table = results_markdown({"suite": "Curves", "config": config, "tasks": {"sst2": item}})
    assert "sst2: pretrained reaches scratch's 70.0 at 300 examples with 1000 (3.3× more labels)." in table


def test_a_baseline_and_rows_with_other_sizes_measured_reach_the_table_whole():
    """A baseline's `all` trains on as many examples as a row's (it had none: off the chart, and the
    labels-saved target its largest numbered size); the table's columns are every row's sizes (they
    were the first row's alone: a stale first row emptied it)."""
    from gpt_ft.eval.curves import baseline_curves, collect_curves, labels_saved
    from gpt_ft.eval.results import curves_markdown

    tfidf = {"TF-IDF": {"t": {100: {0: 55.0}, 1000: {0: 70.0}, None: {0: 80.0}}}}
    base = baseline_curves(tfidf, "t", [100, 1000, None], [0], whole=lambda: 5000)["TF-IDF"]
    assert [(k, p["examples"]) for k, p in base.items()] == [("100", 100), ("1000", 1000), ("all", 5000)]
    scores = {("bert", 100): 60.0, ("bert", None): 90.0, ("stale", 1000): 75.0}
    rows = collect_curves(lambda r, n, s: scores.get((r, n), suites.MISSING), ["bert", "stale"],
                          [100, 1000, None], [0], whole=lambda: 5000)  # fmt: skip
    saved = labels_saved({"bert": rows["bert"], "TF-IDF": base})
    assert (saved["target"], saved["target_examples"], saved["examples"]) == (80.0, 5000, 5000)
    table = curves_markdown({"t": {"curves": {**rows, **{"TF-IDF": base}}}}, [0])
    assert table[3:7] == ["| t | 100 | 1000 | all |", "|---|---|---|---|", "| bert | 60.0 | – | 90.0 |",
                          "| stale | – | 75.0 | – |"]  # fmt: skip
    # A suite of two seeds of which one scored: the cell says so, as the main table's do
    table = curves_markdown({"t": {"curves": rows}}, [0, 1])
    assert table[5] == "| bert | 60.0 (1 of 2 seeds) | – | 90.0 (1 of 2 seeds) |"


def test_a_suite_run_is_built_from_its_configuration(tmp_path, tokenizer_dir):
    """The build hands the LightningCLI the configuration its arguments resolve to: the trainer is
    built with the suite's History and with the epochs `--trainer.min_steps` needs."""
    from gpt_ft.training.callbacks import History

    card = make_task("single", tmp_path / "a")
    args = [f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}", f"--data.data_dir={tmp_path / 'a'}"]
    args += [f"--trainer.default_root_dir={tmp_path / 'run'}", "--seed_everything=0", "--data.train_size=2"]
    args += ["--trainer.min_steps=3"]
    config = build_fit.resolve([*args, *FIT])
    assert config["trainer"]["max_epochs"] == 1 and config["trainer"]["min_steps"] == 3
    assert config["data"]["init_args"]["train_size"] == 2 and config["model"]["preset"] == "gpt-micro"
    model, data, trainer = build_fit([*args, *FIT])
    assert trainer.max_epochs == 3  # 2 examples: one batch, one optimizer step an epoch
    assert [type(c) for c in trainer.callbacks].count(History) == 1
    model, data, trainer = build_fit([*args[:-1], *FIT])
    assert trainer.max_epochs == 1  # no min_steps: the config's epochs
    six = [a for a in args if not a.startswith("--data.train_size")] + FIT  # 6 examples, 4 a batch
    assert build_fit([*six, "--trainer.min_steps=4"])[2].max_epochs == 2  # 2 steps an epoch
    ddp = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    assert build_fit([*six, "--trainer.min_steps=4", *ddp])[2].max_epochs == 4  # 3 examples a rank: 1 step


def test_a_rerun_compares_configurations_not_spellings(tmp_path, tokenizer_dir, monkeypatch, capsys):
    single = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: r\nseeds: [0]\ntasks: [{single}]\n")
    argv = ["suite", str(suite), f"--out_dir={tmp_path / 'out'}", f"--tokenizer={tokenizer_dir}"]
    argv += [f"--data_dir={tmp_path / 'a'}"]
    fit = ["--model.preset=gpt-micro"]
    calls = []
    scored = ({"validation/accuracy": 0.5}, 0)
    monkeypatch.setattr(suites, "fit_and_evaluate", lambda *a, **k: calls.append(a[1]) or scored)
    main([*argv, *fit_args(*fit, "--data.batch_size=4", "--model.lr=1e-4")])
    assert len(calls) == 1
    main([*argv, *fit_args(*fit, "--model.lr", "0.0001", "--data.batch_size", "4")])  # spelled otherwise
    assert len(calls) == 1
    main([*argv, "--fit_args=--model.preset 'gpt-micro' --data.batch_size=4 --model.lr=1e-4"])  # one text
    assert len(calls) == 1
    main([*argv, "--fit_args=[--model.preset=gpt-micro, --data.batch_size, 4, --model.lr, 1e-4]"])  # numbers
    assert len(calls) == 1
    main(
        [*argv[:-1], f"--data_dir={tmp_path}/./a/", *fit_args(*fit, "--data.batch_size=4", "--model.lr=1e-4")]
    )
    assert len(calls) == 1  # the same folder
    capsys.readouterr()
    main([*argv, *fit_args(*fit, "--data.batch_size=4", "--model.lr=2e-4")])
    assert len(calls) == 2
    printed = capsys.readouterr().out
    assert "sent seed 0: its inputs changed since it ran (--model.lr=0.0002): running it again" in printed
    config = json.loads((tmp_path / "out" / "runs" / "sent" / "seed-0" / "result.json").read_text())["config"]
    assert config["model"]["lr"] == 0.0002 and config["data"]["init_args"]["batch_size"] == 4
    # A result written before runs recorded their configuration holds their arguments: resolved now.
    result_file = tmp_path / "out" / "runs" / "sent" / "seed-0" / "result.json"
    result = json.loads(result_file.read_text())
    result["args"] = calls[-1]
    del result["config"]
    result_file.write_text(json.dumps(result))
    main([*argv, *fit_args(*fit, "--data.batch_size=4", "--model.lr=2e-4")])
    assert len(calls) == 2  # the same arguments: finished
    result["args"] = [*calls[-1][:-1], "--data.task=gone.yaml"]  # no longer resolves
    result_file.write_text(json.dumps(result))
    main([*argv, *fit_args(*fit, "--data.batch_size=4", "--model.lr=2e-4")])
    assert len(calls) == 3 and "its inputs changed since it ran ((not comparable))" in capsys.readouterr().out
    # Another epoch reported, or test predictions asked of a run that wrote none: run again.
    same = fit_args(*fit, "--data.batch_size=4", "--model.lr=2e-4")
    main([*argv, "--select=best", *same])
    assert len(calls) == 4 and "(--select best): running it again" in capsys.readouterr().out
    main([*argv, "--select=best", "--predict=true", *same])
    assert len(calls) == 5 and "(--predict true): running it again" in capsys.readouterr().out
    main([*argv, "--select=best", "--predict=true", *same])
    assert len(calls) == 5
    # Other rows in the dev file, its size and modification time kept (a copy of another version).
    dev = tmp_path / "a" / "d" / "dev.tsv"
    stat, text = dev.stat(), dev.read_text()
    dev.write_text(text.replace("the cat sat", "the cow ate"))
    os.utime(dev, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    main([*argv, "--select=best", "--predict=true", *same])
    assert len(calls) == 6 and f"(the file {dev}): running it again" in capsys.readouterr().out
    # The same files named relative to the working folder, then from another: nothing to run again.
    for folder, up in ((tmp_path, ""), (tmp_path / "a", "../")):
        monkeypatch.chdir(folder)
        relative = [
            f"{up}{suite.name}",
            f"--out_dir={up}out",
            f"--tokenizer={os.path.relpath(tokenizer_dir)}",
        ]
        main(["suite", *relative, f"--data_dir={up}a", "--select=best", "--predict=true", *same])
        assert len(calls) == 6, capsys.readouterr().out
    # A rerun killed outright (SIGKILL) left the finished run aside and its own files unfinished:
    # the finished one is put back, and with its configuration there is nothing to run again.
    run = tmp_path / "out" / "runs" / "sent" / "seed-0"
    run.rename(run.with_name("seed-0.previous"))
    (run / "lightning_logs").mkdir(parents=True)
    main([*argv, "--select=best", "--predict=true", *same])
    assert (
        len(calls) == 6 and (run / "result.json").is_file() and not run.with_name("seed-0.previous").exists()
    )


def test_rows_layers_and_sizes_together_each_reach_the_results(tmp_path, tokenizer_dir, monkeypatch):
    """Rows, transferred layers and training sizes in one suite (the runs faked: each scores its
    layers and seed): a `--tasks` rerun keeps the other task's runs, the transfer table reads the
    first row's runs and the curves those of the layers transferred."""
    single, pair = make_task("single", tmp_path / "a"), make_task("pair", tmp_path / "b")
    suite = write_suite(tmp_path, f"name: s\nseeds: [1]\ntasks: [{single}, {pair}]\n"
                                  "rows: {big: [], small: []}\ntrain_sizes: [2, all]\n")  # fmt: skip
    calls = []

    def fake(build, args, select, **kwargs):
        calls.append(args)
        seed = int(next(a for a in args if a.startswith("--seed_everything=")).split("=")[1])
        layers = int(next(a for a in args if a.startswith("--model.transfer_layers=")).split("=")[1])
        return {"validation/accuracy": (10 * layers + seed) / 100}, 0

    monkeypatch.setattr(suites, "fit_and_evaluate", fake)
    out, pre = tmp_path / "out", tmp_path / "pre"  # (read for their depth only: the runs are faked)
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(load_tokenizer(tokenizer_dir)), n_layer=1)
    GPT(config).to_hf().save_pretrained(pre)
    argv = ["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}", f"--init_from={pre}",
            "--transfer_layers=[1]", *fit_args("--model.preset=gpt-micro")]  # fmt: skip
    dirs = as_list(f"sent={tmp_path / 'a'}", f"pair={tmp_path / 'b'}")
    main([*argv, "--data_dir", dirs, "--tasks=[sent]"])
    main([*argv, "--data_dir", dirs, "--tasks=[pair]"])
    assert len(calls) == 2 * 2 * 2  # tasks x rows x sizes
    results = json.loads((out / "results.json").read_text())
    assert set(results["tasks"]) == {"sent", "pair"}
    sent = results["tasks"]["sent"]
    assert sent["transfer"]["1"]["seeds"] == {"1": 11.0}  # by seed, as the main table's
    curve = json.dumps(sent["curves"])
    assert (
        "11.0" in curve and '"mean": null' not in curve
    )  # each row's points, from the transferred layers' runs
    # A rerun of sent killed outright (its finished run set aside), then a --tasks run of pair: sent's
    # finished run is put back and reported (it was reported missing until sent ran again)
    run = next(p for p in (out / "runs").rglob("result.json") if "sent" in p.parts).parent
    run.rename(run.with_name(f"{run.name}.previous"))
    (run / "lightning_logs").mkdir(parents=True)
    main([*argv, "--data_dir", dirs, "--tasks=[pair]"])
    assert len(calls) == 8 and (run / "result.json").is_file()
    assert json.loads((out / "results.json").read_text())["tasks"]["sent"] == sent


def test_sizes_without_all_fill_the_table_with_the_largest(tmp_path, tokenizer_dir, monkeypatch):
    """`--train_sizes '[2, 4]'`: the main table (and the best seed's submission) are the 4-example
    runs'; they were the whole split's, never run, so the table was empty."""
    single = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: r\nseeds: [0, 1]\ntasks: [{single}]\n")
    out = tmp_path / "out"
    argv = suite_argv(suite, out, tokenizer_dir, tmp_path / "a")
    scores = {"2": 0.5, "4": 0.75}
    size = lambda args: str(data_of(args)["train_size"])  # noqa: E731
    monkeypatch.setattr(
        suites,
        "fit_and_evaluate",
        lambda build, args, *a, **k: ({"validation/accuracy": scores[size(args)]}, 0),
    )
    main([*argv, "--train_sizes=[2, 4]", *fit_args("--model.preset=gpt-micro")])
    results = json.loads((out / "results.json").read_text())["tasks"]["sent"]
    assert results["metrics"]["validation/accuracy"]["seeds"] == {"0": 75.0, "1": 75.0}
    assert [p["mean"] for p in results["curves"]["fine-tuned"].values()] == [50.0, 75.0]


def test_rows_without_sizes_each_reach_the_results(tmp_path, tokenizer_dir, monkeypatch):
    """GPT-1's Table 5 as rows (full, no auxiliary LM): each row's main metric is reported (only the
    first row's was, the others trained and left out)."""
    single = make_task("single", tmp_path / "a")
    suite = write_suite(tmp_path, f"name: t\nseeds: [0, 1]\ntasks: [{single}]\n"
                                  "rows: {full: [], no aux LM: [--model.lm_coef=0]}\n")  # fmt: skip
    out = tmp_path / "out"

    def fake(build, args, *a, **k):
        seed = int(next(a for a in args if a.startswith("--seed_everything=")).split("=")[1])
        return {"validation/accuracy": (0.25 if "--model.lm_coef=0" in args else 0.5) + seed / 100}, 0

    monkeypatch.setattr(suites, "fit_and_evaluate", fake)
    main([*suite_argv(suite, out, tokenizer_dir, tmp_path / "a"), *fit_args("--model.preset=gpt-micro")])
    results = json.loads((out / "results.json").read_text())["tasks"]["sent"]
    assert results["metrics"]["validation/accuracy"]["seeds"] == {"0": 50.0, "1": 51.0}
    assert {row: stats["seeds"] for row, stats in results["by_row"].items()} == {
        "full": {"0": 50.0, "1": 51.0}, "no aux LM": {"0": 25.0, "1": 26.0}}  # fmt: skip
    table = (out / "results.md").read_text()
    assert "the table's scores are the first row's; each row's main metric below." in table
    assert "| task | full | no aux LM |\n|---|---|---|\n| sent | 50.5 ± 0.7 | 25.5 ± 0.7 |" in table


def test_a_curve_row_with_no_scored_size_is_left_out_of_the_chart(tmp_path):
    """A from-scratch row whose Pearson is undefined at every size (a constant prediction) draws no
    line; the chart, and the files written after it, still come."""
    from gpt_ft.eval.results import plot_curves

    point = lambda mean: {"examples": 10, "mean": mean, "std": None}  # noqa: E731
    curves = {"from scratch": {"10": point(None)}, "pretrained": {"10": point(61.5)}}
    plot_curves({"stsb": {"main_metric": "validation/pearson", "curves": curves}}, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.parametrize("text", ["", '{"scores": {"validation/accuracy": 0.5', "[1, 2]", "\udcff"])
def test_a_damaged_result_file_is_named(tmp_path, text):
    from gpt_ft.eval.suite_folder import read_json

    path = tmp_path / "result.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))} is not a result the suite wrote .*: del"):
        read_json(path)
    assert read_json(tmp_path / "none.json") is None


def test_a_trainer_given_plugins_still_writes_checkpoints_whole(tmp_path, tokenizer_dir):
    """A cluster's environment plugin (as a SLURM setup passes) kept the atomic checkpoint writer
    out: a run killed mid-save left a truncated last.ckpt. One given is kept as given."""
    from lightning.fabric.plugins import TorchCheckpointIO

    from gpt_ft.training.checkpointing import AtomicCheckpointIO

    card = make_task("single", tmp_path / "a")
    args = [f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}", f"--data.data_dir={tmp_path / 'a'}"]
    args += [f"--trainer.default_root_dir={tmp_path / 'run'}", *FIT]
    environment = "--trainer.plugins=lightning.fabric.plugins.environments.LightningEnvironment"
    trainer = build_fit([*args, environment])[2]
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    assert type(trainer._accelerator_connector.cluster_environment).__name__ == "LightningEnvironment"
    trainer = build_fit([*args, "--trainer.plugins=lightning.fabric.plugins.TorchCheckpointIO"])[2]
    assert type(trainer.strategy.checkpoint_io) is TorchCheckpointIO


def zero_shot_suite(suite: Path, tmp_path: Path, tokenizer_dir: str) -> dict:
    """`gpt-ft suite SUITE --fine_tune false --zero_shot true` on each card's own files
    (tests/data/test_files.py's validation splits) with a tiny untrained model: its results."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.layout import split_file
    from tests.data.test_files import FIXTURES, LABEL_FILES

    for entry in load_suite(suite).tasks:
        task, card = load_card(entry.card), os.path.relpath(entry.card, ROOT / "tasks").removesuffix(".yaml")
        for split in task.validation_splits:
            text = FIXTURES[card][split][0]
            path = split_file(task, split, tmp_path / "data")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
            if split in LABEL_FILES.get(card, {}):  # PIQA's, Social IQa's
                (tmp_path / "data" / task.local.label_files[split]).write_text(LABEL_FILES[card][split])
    tok = load_tokenizer(tokenizer_dir)
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=1)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")
    tok.save_pretrained(tmp_path / "pre")
    out = tmp_path / "out"
    main(["suite", str(suite), f"--out_dir={out}", f"--init_from={tmp_path / 'pre'}", "--fine_tune=false",
          "--zero_shot=true", f"--data_dir={tmp_path / 'data'}"])  # fmt: skip
    return json.loads((out / "results.json").read_text())


def test_the_commonsense_suite_scores_every_task_zero_shot(tmp_path, tokenizer_dir, capsys):
    """configs/suites/commonsense.yaml: every multiple-choice and fill-in card by its choices'
    likelihoods, BoolQ by its verbalizers."""
    results = zero_shot_suite(ROOT / "configs/suites/commonsense.yaml", tmp_path, tokenizer_dir)
    names = [
        "hellaswag",
        "winogrande",
        "piqa",
        "social_iqa",
        "arc_easy",
        "arc_challenge",
        "openbookqa",
        "commonsense_qa",
        "copa",
        "boolq",
    ]
    assert list(results["tasks"]) == names and "has no method" not in capsys.readouterr().out
    for name in names:
        score = results["tasks"][name]["metrics"]["validation/accuracy"]["zero_shot"]
        assert score in (0.0, 100.0), name  # one example each


def test_the_superglue_suite_scores_seven_of_its_tasks_zero_shot(tmp_path, tokenizer_dir, capsys):
    """configs/suites/superglue.yaml: ReCoRD by its filled queries' likelihoods and its own metrics,
    COPA by its choices', BoolQ, CB, RTE, WiC and WSC by their verbalizers (WiC's and WSC's prompts
    Jinja templates, from the release's fields); MultiRC has no method, said."""
    results = zero_shot_suite(ROOT / "configs/suites/superglue.yaml", tmp_path, tokenizer_dir)
    out = capsys.readouterr().out
    assert "zero-shot: multirc has no method" in out and out.count("has no method") == 1
    names = ("boolq", "cb", "copa", "record", "rte", "wic", "wsc")
    metrics = {name: results["tasks"][name]["metrics"] for name in names}
    for name in ("boolq", "cb", "copa", "rte", "wic", "wsc"):
        assert metrics[name]["validation/accuracy"]["zero_shot"] in (0.0, 100.0), name  # one example each
    assert metrics["record"]["validation/f1"]["zero_shot"] in (0.0, 100.0)  # one query: its pick's credit
    assert (
        metrics["record"]["validation/exact_match"]["zero_shot"]
        == metrics["record"]["validation/f1"]["zero_shot"]
    )
