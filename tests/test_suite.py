"""`gpt-ft suite`: runs over cards x seeds, resumes, aggregates, writes the table, chart and submission;
zero-shot scoring; transferring the first k layers."""

from __future__ import annotations

import json
import math
import statistics
import zipfile
from pathlib import Path

import pytest
import torch
from test_cli import MICRO, make_task

from gpt_ft.adapters.cards import load_card
from gpt_ft.cli import main
from gpt_ft.cli.lightning import build_fit
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval import finetune
from gpt_ft.eval import suite as suites
from gpt_ft.eval.suite_file import load_suite
from gpt_ft.eval.zeroshot import ZeroShot, ZeroShotScorer, best_threshold, continuation_logprobs, evaluate
from gpt_ft.model import GPT, GPTConfig
from gpt_ft.training.module import GPTModule

ROOT = Path(__file__).resolve().parents[1]
FIT = [
    "--data.batch_size=4",
    "--data.max_length=64",
    "--model.preset=gpt-micro",
    f"--model.overrides={MICRO}",
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def write_suite(root: Path, body: str) -> Path:
    path = root / "suite.yaml"
    path.write_text(body)
    return path


def test_suite_runs_resumes_and_writes_results(tmp_path, tokenizer_dir, monkeypatch, capsys):
    single = make_task("single", tmp_path / "a")
    similarity = make_task("similarity", tmp_path / "b")
    suite = write_suite(
        tmp_path,
        f"""name: tiny
seeds: [0, 1]
tasks:
  - card: {single}
    paper: {{accuracy: 91.3}}
  - card: {similarity}
    paper: {{pearson: 82.0}}
score: {{name: Tiny score, tasks: [sent, sts, absent], paper: 70.0}}
submission: {{archive: sub.zip, files: [SENT.tsv, STS-B.tsv, AX.tsv]}}
""",
    )
    out = tmp_path / "out"
    argv = ["suite", str(suite), f"--out_dir={out}", f"--tokenizer={tokenizer_dir}"]
    argv += ["--data_dir", f"sent={tmp_path / 'a'}", f"sts={tmp_path / 'b'}", "--", *FIT]

    calls = []
    real_fit = suites.fit_and_evaluate

    def interrupted_after_one(build, args, select, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stops the suite during the second run
        return real_fit(build, args, select, **kwargs)

    monkeypatch.setattr(suites, "fit_and_evaluate", interrupted_after_one)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    first = out / "runs" / "sent" / "seed-0" / "result.json"
    assert first.is_file() and not (out / "runs" / "sent" / "seed-1" / "result.json").exists()
    stamp = first.stat().st_mtime_ns

    calls.clear()
    monkeypatch.setattr(suites, "fit_and_evaluate", lambda *a, **k: calls.append(a) or real_fit(*a, **k))
    capsys.readouterr()
    main(argv)
    printed = capsys.readouterr().out
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
    assert score["missing"] == ["absent"] and set(score["tasks"]) == {"sent", "sts"}
    sts_means = [s["mean"] for s in results["tasks"]["sts"]["metrics"].values() if s["mean"] is not None]
    assert score["tasks"]["sent"] == pytest.approx(sent["mean"])
    assert score["tasks"]["sts"] == pytest.approx(statistics.fmean(sts_means))
    assert score["value"] == pytest.approx(statistics.fmean(score["tasks"].values()))

    table = (out / "results.md").read_text()
    assert f"| sent | validation/accuracy | {sent['mean']:.1f} ± {sent['std']:.1f} |  | 91.3 |" in table
    assert "| **Tiny score** (2 of 3 tasks; missing absent) | mean |" in table
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert "warning: the submission lacks AX.tsv" in printed
    with zipfile.ZipFile(out / "sub.zip") as zf:
        assert sorted(zf.namelist()) == ["SENT.tsv", "STS-B.tsv"]
        rows = zf.read("SENT.tsv").decode().splitlines()
    assert rows[0] == "index\tprediction" and [r.split("\t")[0] for r in rows[1:]] == ["0", "1", "2"]
    assert {r.split("\t")[1] for r in rows[1:]} <= {"negative", "positive"}

    # Rerunning one task of the folder redoes nothing and keeps the other task's results and files.
    calls.clear()
    main([*argv[:4], "--tasks", "sts", *argv[4:]])
    assert calls == [] and json.loads((out / "results.json").read_text())["tasks"] == results["tasks"]
    with zipfile.ZipFile(out / "sub.zip") as zf:
        assert sorted(zf.namelist()) == ["SENT.tsv", "STS-B.tsv"]

    # A run whose fit arguments changed is not read back but run again.
    capsys.readouterr()
    main([*argv[:4], "--tasks", "sts", *argv[4:], "--data.batch_size=2"])
    printed = capsys.readouterr().out
    assert len(calls) == 2 and "2 runs, 0 finished before, 2 to go" in printed
    assert "sts seed 0: its arguments changed since it ran (--data.batch_size=2): running it again" in printed


def test_glue_suite_names_the_servers_files_and_labels():
    spec = load_suite(ROOT / "configs/suites/glue.yaml")
    cards = {t.name: t for t in (load_card(e.card) for e in spec.tasks)}
    written = {f for t in cards.values() for f in t.submission_files.values()}
    assert written == set(spec.submission.files) and len(spec.submission.files) == 11
    labels = {name: [t.submission_label(i) for i in range(t.num_labels)] for name, t in cards.items()}
    for binary in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert labels[binary] == ["0", "1"]
    assert labels["mnli"] == ["entailment", "neutral", "contradiction"]
    assert labels["rte"] == labels["qnli"] == ["entailment", "not_entailment"]
    assert cards["mnli"].submission_files["test_ax"] == "AX.tsv"
    assert set(spec.score.tasks) == set(cards) and spec.score.paper == 72.8
    gpt1 = load_suite(ROOT / "configs/suites/gpt1.yaml")
    assert len(gpt1.tasks) == 12 and all(task.paper for task in gpt1.tasks)


def test_suite_file_errors_name_the_file(tmp_path):
    bad = write_suite(tmp_path, "name: x\ntasks:\n  - card: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match="suite.yaml: task card nowhere.yaml does not exist"):
        load_suite(bad)
    bad.write_text("name: x\ntasks: []\n")
    with pytest.raises(ValueError, match="lists no tasks"):
        load_suite(bad)
    bad.write_text("name: x\nseeds: one\ntasks: []\n")
    with pytest.raises(ValueError, match=r"suite.yaml: seeds: expected"):
        load_suite(bad)
    card = tmp_path / "card.yaml"
    card.write_text("class_path: gpt_ft.adapters.SingleText\ninit_args: {name: x, txt: s}\n")
    bad.write_text("name: x\ntasks:\n  - card: card.yaml\n    zero_shot: {verbalizer: [' a', ' b']}\n")
    with pytest.raises(
        ValueError, match=r"^Suite file \S+suite.yaml: tasks.zero_shot: Option 'verbalizer' is not"
    ):
        load_suite(bad)
    bad.write_text("name: x\ntasks: [\n")
    with pytest.raises(
        ValueError, match=r"suite.yaml is not valid YAML: line 3, column 1: expected the node"
    ):
        load_suite(bad)
    with pytest.raises(ValueError, match=r"^Task card \S+card.yaml: Option 'txt' is not accepted.$"):
        load_card(card)
    card.write_text("class_path: [\n")
    with pytest.raises(ValueError, match=r"^Task card \S+card.yaml is not valid YAML: line 2, column 1: "):
        load_card(card)


def test_best_epoch_ranks_an_undefined_score_last(monkeypatch):
    from types import SimpleNamespace

    task = SimpleNamespace(validation_splits=["validation"], test_splits=[], name="sts")
    evaluations = [(0, {"validation/pearson": None}), (1, {"validation/pearson": 0.25}), (2, {})]
    monkeypatch.setattr(finetune, "main_key", lambda task: "validation/pearson")

    class Trainer:
        callbacks, sanity_checking = [], False

        def fit(self, model, datamodule):
            history = self.callbacks[-1]
            history.evaluations.extend(evaluations)

    build = lambda argv: (SimpleNamespace(task=task), None, Trainer())  # noqa: E731
    assert finetune.fit_and_evaluate(build, [], "best", predict=False) == ({"validation/pearson": 0.25}, 1)
    assert finetune.fit_and_evaluate(build, [], "last", predict=False) == ({}, 2)


# ---- zero-shot ----


def unigram_gpt(vocab_size: int, logits: torch.Tensor) -> GPT:
    """A GPT-1 whose next-token distribution is softmax(logits) at every position: the last block's
    LayerNorm outputs a constant unit vector e_0, and the tied head reads column 0 of the embedding."""
    config = GPTConfig.from_name("gpt-micro", vocab_size=vocab_size, n_embd=16, n_layer=1, n_head=2)
    gpt = GPT(config).eval()
    with torch.no_grad():
        gpt.h[-1].ln_2.weight.zero_()
        gpt.h[-1].ln_2.bias.zero_()
        gpt.h[-1].ln_2.bias[0] = 1.0
        gpt.wte.weight[: len(logits), 0] = logits
    return gpt


def test_multiple_choice_zero_shot_matches_hand_computed_likelihoods(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    short, long = "happy", "the cat sat on the mat"
    assert not set(ids(" " + short)) & set(ids(" " + long))
    logits = torch.zeros(len(tok))
    logits[ids(" " + long)] = 8.0
    logits[ids(" " + short)] = 7.0
    gpt = unigram_gpt(len(tok), logits)
    logp = torch.log_softmax(logits, dim=0)
    expected = {c: float(logp[ids(" " + c)].sum()) for c in (short, long)}
    # The context does not matter to a unigram model; the sums are the choices' token log-probs.
    got = continuation_logprobs(
        gpt, [(ids("a story ."), ids(" " + short)), (ids("a story ."), ids(" " + long))]
    )
    assert got == pytest.approx([expected[short], expected[long]], abs=1e-4)
    # Summed, the one-token answer wins; per character, the long one does.
    assert expected[short] > expected[long]
    assert expected[short] / len(short) < expected[long] / len(long)

    from gpt_ft.adapters import MultipleChoice

    task = MultipleChoice(name="mc", context=["story"], choices=["a", "b"], labels=["1", "2"])
    rows = [{"story": "a story .", "a": short, "b": long, "label": "1"}]
    scorer = ZeroShotScorer(gpt, tok)
    assert evaluate(task, scorer, lambda split: rows) == {
        "validation/accuracy": 1.0,
        "validation/accuracy_norm": 0.0,
    }


def test_verbalizers_and_threshold_heuristics(tokenizer_dir):
    from gpt_ft.adapters import SingleText

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    logits = torch.zeros(len(tok))
    logits[ids(" dogs")] = 3.0  # the model likes " dogs" more than " cat"
    gpt = unigram_gpt(len(tok), logits)
    task = SingleText(name="s", labels=["neg", "pos"], metrics=["accuracy"])
    rows = [{"sentence": "the mat", "label": "pos"}, {"sentence": "a man", "label": "neg"}]
    spec = ZeroShot(suffix=" very", verbalizers=[" cat", " dogs"])
    scorer = ZeroShotScorer(gpt, tok)
    assert scorer.verbalizers(task, spec, rows).tolist() == [1, 1]
    assert evaluate(task, scorer, lambda split: rows, spec) == {"validation/accuracy": 0.5}

    # Threshold: the cut that maximises the metric on calibration scores, above it is label 1.
    scores = torch.tensor([-3.0, -1.0, -2.0, -0.5])
    labels = torch.tensor([0, 1, 0, 1])
    accuracy = lambda p, y: float((p == y).float().mean())  # noqa: E731
    assert best_threshold(scores, labels, accuracy) == pytest.approx(-1.5)
    # Average log-probability of " dogs dogs" beats " cat cat" under this model: with the
    # threshold learnt on these two, each is classified right.
    calibration = [{"sentence": "dogs dogs", "label": "pos"}, {"sentence": "cat cat", "label": "neg"}]
    average = scorer.average_logprobs(task, calibration)
    assert average[0] > average[1]
    result = evaluate(task, scorer, lambda split: calibration, ZeroShot(threshold=True))
    assert result == {"validation/accuracy": 1.0}
    with pytest.raises(ValueError, match="`verbalizers` or `threshold: true`"):
        ZeroShot()


# ---- transfer depth ----


def test_transfer_layers_keeps_the_first_k_blocks(tmp_path, tokenizer_dir):
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(load_tokenizer(tokenizer_dir)), n_layer=3)
    pretrained = GPT(config)
    pretrained.to_hf().save_pretrained(tmp_path / "pre")
    module = GPTModule(init_from=str(tmp_path / "pre"), transfer_layers=1)
    kept, fresh = module.gpt.h[0].state_dict(), module.gpt.h[1].state_dict()
    for key, value in pretrained.h[0].state_dict().items():
        assert torch.equal(kept[key], value), key
    n = config.vocab_size  # (the padding rows are not exported)
    assert torch.equal(module.gpt.wte.weight[:n], pretrained.wte.weight[:n])
    for key, value in pretrained.h[1].state_dict().items():
        if key.endswith("attn.c_attn.weight") or key.endswith("mlp.c_fc.weight"):
            assert not torch.equal(fresh[key], value), key
    assert torch.equal(module.gpt.h[2].ln_1.weight, torch.ones(config.n_embd))  # LayerNorms reset too
    with pytest.raises(ValueError, match=r"Cannot keep 4 of the model's 3 blocks"):
        GPTModule(init_from=str(tmp_path / "pre"), transfer_layers=4)
    with pytest.raises(ValueError, match="transfer_layers needs pretrained weights"):
        GPTModule(preset="gpt-micro", transfer_layers=1)


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
        + ["--zero_shot=true", "--transfer_layers", "0", "2", "--predict=true", "--", *fit]
    )
    results = json.loads((out / "results.json").read_text())
    metrics = results["tasks"]["mc"]["metrics"]
    assert 0 <= metrics["validation/accuracy"]["zero_shot"] <= 100
    assert "zero_shot" in metrics["validation/accuracy_norm"]
    assert set(results["tasks"]["mc"]["transfer"]) == {"0", "2"}
    for k in ("0", "2"):
        assert (out / "runs" / "mc" / f"layers-{k}" / "seed-0" / "result.json").is_file()
    assert (out / "transfer.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    missing = tmp_path / "c" / "d" / "test.csv"
    warning = f"warning: no mc predictions for split 'test': {missing}: file not found"
    assert printed.count(warning) == 2  # one per run
    assert "| mc | " in (out / "results.md").read_text() and "2 layers" in (out / "results.md").read_text()
    assert not list(out.rglob("*.ckpt"))  # checkpoints are not kept by default


def test_a_subset_of_a_suites_tasks(tmp_path):
    spec = load_suite(ROOT / "configs/suites/glue.yaml")
    runner = suites.SuiteRunner(
        spec, tmp_path, build_run=build_fit, tasks=["sst2", "rte", "stsb"], seeds=[0, 1]
    )
    assert list(runner.cards) == ["sst2", "rte", "stsb"]
    assert [str(r) for r in runner.runs()][:3] == ["sst2 seed 0", "sst2 seed 1", "rte seed 0"]
    with pytest.raises(ValueError, match=r"--tasks \['sts2'\]: suite 'GLUE' has"):
        suites.SuiteRunner(spec, tmp_path, build_run=build_fit, tasks=["sts2"])
    assert suites._data_dirs(["glue", "rte=r"]) == {None: "glue", "rte": "r"}
    assert suites._data_dirs(["x/y=z"]) == {None: "x/y=z"}  # a path with "=" in it
    with pytest.raises(ValueError, match=r"^--data_dir gives a DIR for every task twice \(a and b\)\.$"):
        suites._data_dirs(["a", "b"])
    with pytest.raises(ValueError, match=r"^--data_dir gives rte=DIR twice \(a and b\)\.$"):
        suites._data_dirs(["rte=a", "rte=b"])


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
        + ["--zero_shot=true", "--data_dir", f"sent={tmp_path / 'a'}", f"mc={tmp_path / 'c'}"]
    )
    assert "zero-shot: sent has no method" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["tasks"]["sent"]["metrics"] == {}
    assert set(results["tasks"]["mc"]["metrics"]) == {"validation/accuracy", "validation/accuracy_norm"}


def test_average_logprob_of_a_text_longer_than_the_context(tokenizer_dir):
    from gpt_ft.adapters import SingleText

    tok = load_tokenizer(tokenizer_dir, add_specials=False)
    logits = torch.zeros(len(tok))
    gpt = unigram_gpt(len(tok), logits)  # uniform: every token's log-probability is -log(V)
    text = " ".join(["dogs"] * 300)
    assert len(tok(text, add_special_tokens=False)["input_ids"]) > gpt.config.n_positions
    task = SingleText(name="s", labels=["neg", "pos"], metrics=["accuracy"])
    averages = ZeroShotScorer(gpt, tok).average_logprobs(task, [{"sentence": text, "label": "neg"}])
    # The earliest tokens fall out of the context unscored; the average is over the scored ones.
    assert averages.tolist() == pytest.approx([-math.log(len(tok))], abs=1e-4)
