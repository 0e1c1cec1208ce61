"""The GPU checklist in one command: the CUDA tests, then the GPU figures, as one Markdown report.

1. `pytest -k cuda tests`: logits equal transformers' (GPT-1 and GPT-2, fp32), the bf16-mixed loss
   stays near fp32's, every batch layout equals the plain one, packed rows run the variable-length
   or flex kernel and equal padded ones, cached generation equals uncached and the CUDA-graph
   decoder equals both, pretraining and right-padded fine-tuning run a fused attention kernel, `fit`
   logs tokens/s and MFU and waits for the host on no step, the quickstart learns through
   configs/trainer/gpu.yaml (eager and compiled), DDP and FSDP on one GPU equal the plain run;
2. benchmarks/gpu_figures.py, one process per group of rows: tokens/s, MFU, where a step's time
   goes, attention kernels, `fit` vs a raw loop, generation, with the speed goals checked;
3. with --glue, `gpt-ft fit` against transformers' Trainer end to end on all of SST-2 (one epoch,
   bf16, batch 32 then 256; benchmarks/bench_vs_trainer.py): wall time, dev accuracy and real
   tokens/s of ours, the default Trainer and the Trainer with `group_by_length`; goal: the default
   Trainer takes 2x ours or more, at dev accuracy within a point. It starts from --init-from's
   weights or, with --tokenizer, from random ones of SmolLM2-135M's shape, and adds 300 s to the
   default budget for each batch.

Every part runs in a process group of its own under a hard limit (killed, not asked: SIGKILL to
the group) and its row is written whatever happens; a part killed at its limit says how far it got.
The report is written after every row; on SIGTERM the running part's group is killed and the
report ends with a row saying where the checklist stopped.
The parts share one budget (`--budget`, default 480 s), so the whole checklist ends within it, and
torch.compile's on-disk cache, so a graph one part compiled is read back by the next.

Exit status 1 when an installed package is older than gpt_ft's floor for it, a test fails, a part
is killed or a goal is missed. With `--device cpu` the tests
are skipped and the figures run, as one part, on a small model (`--quick`: a tiny one, in a few
minutes; the test suite runs it).

    python benchmarks/gpu_check.py                          # on a GPU, with the project installed
    python benchmarks/gpu_check.py --device cpu --quick     # on a CPU
    python benchmarks/gpu_check.py --glue GLUE_DIR --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/gpu_check.py --skip-tests --skip-figures --glue GLUE_DIR --init-from ...  # that alone
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import Report, Row, report_argument, verdict
from parts import ROOT, Part, floors_missed, run_part
from paths import existing

FIGURES = ["environment", "training_throughput", "fit_vs_loop", "generation", "finetune_step", "profile",
           "shapes", "attention", "fit_quickstart"]  # fmt: skip
"""gpu_figures.py's groups of rows in its order, those with a goal first (a spent budget cuts the
last); each is a part of its own on a GPU."""
LIMITS = {"tests": 200, "training_throughput": 120, "fit_quickstart": 75, "fit_vs_loop": 75,
          "generation": 200, "shapes": 200, "vs_trainer": 300}  # fmt: skip
"""Seconds each part may run on a GPU (60 where not named); on a CPU the figures, one part, get what
is left of the budget."""
TEST_PATHS = ["tests/test_cuda.py", "tests/model", "tests/training"]
"""Where the CUDA tests run first (the model's and the step's checks), before those elsewhere in
tests/ (the quickstart, compiled too, last): a part cut at its limit cuts the last."""
OUTCOME = re.compile(r"^(\S+::.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)
"""A finished test's line of `pytest -v` (a test's id may hold spaces, in its parameters)."""


def tests_row(part: Part, limit: float) -> Row:
    """The CUDA tests' row: pytest's summary, or, killed (at its limit, or by a signal: a segfault, the
    OOM killer), the test it was in and the counts before it."""
    name = "CUDA tests (`pytest -k cuda tests`)"
    if part.returncode is not None and part.returncode >= 0:  # pytest's summary, or what ended it first
        summary = (part.stdout.strip() or part.stderr.strip() or "no output").splitlines()[-1].strip("= ")
        failed = [test for test, outcome in OUTCOME.findall(part.stdout) if outcome in ("FAILED", "ERROR")]
        if part.returncode != 0:
            print(part.stdout[-4000:], part.stderr[-2000:], file=sys.stderr)
        which = f"; failed: {', '.join(failed)}" if failed else ""
        return Row(name, f"{summary} ({part.seconds:.0f} s){which}", verdict(part.returncode == 0))
    outcomes = OUTCOME.findall(part.stdout)
    counts = {o: sum(r == o for _, r in outcomes) for o in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    started = re.findall(r"^\S+::.*$", part.stdout, re.M)  # -v writes a test's id as it starts
    last = started[-1].strip() if started else "collection"
    running = "between two tests" if OUTCOME.match(last) else last
    done = ", ".join(f"{n} {o.lower()}" for o, n in counts.items() if n) or "none finished"
    if part.returncode is not None:
        print(part.stdout[-4000:], part.stderr[-2000:], file=sys.stderr)
        return Row(name, f"killed by signal {-part.returncode} in {running}; before it: {done}", "FAIL")
    return Row(name, f"killed at its {limit:.0f} s limit in {running}; before it: {done}", "FAIL")


def figures_rows(name: str, part: Part, report: Path, limit: float) -> list[Row]:
    """The rows a figures part wrote (it writes its report after every row), and one for its end
    when it was killed or failed without a row."""
    try:
        rows = Report.read(report.with_suffix(".json")).rows
    except (FileNotFoundError, ValueError, KeyError, TypeError):  # none written, or one cut short
        rows = []
    if part.returncode is None:
        rows.append(Row(name, f"killed at its {limit:.0f} s limit after {len(rows)} rows", "FAIL"))
    elif part.returncode < 0 or part.returncode != 0 and not any(row.status == "FAIL" for row in rows):
        # killed by a signal (a segfault, the OOM killer), or failed with no row saying so: not a goal
        print(part.stderr[-3000:], file=sys.stderr)
        code = part.returncode
        end = f"exit {code}" if code > 0 else f"killed by signal {-code}"
        after = f" after {len(rows)} rows" if rows else ""
        rows.append(Row(name, f"benchmarks/gpu_figures.py failed ({end}){after}", "FAIL"))
    return rows


TRAINER_BATCHES = [32, 256]
"""The Trainer part's batches: GPT-1's 32, then 256 sentences (about 4,000 real tokens of SST-2, a
size a GPU runs near its speed), each with a limit of its own (`LIMITS["vs_trainer"]`)."""


def trainer_rows(part: Part, figures: Path, limit: float, goal: bool, batch: int = 32) -> list[Row]:
    """bench_vs_trainer.py's rows at `batch` and, with `goal`, the goal checked: the default
    Trainer's wall time over ours, at dev accuracy within a point of its."""
    name = f"SST-2 end to end, batch {batch}"
    if part.returncode is None:
        return [Row(f"{name}, `gpt-ft fit` vs the Trainer", f"killed at its {limit:.0f} s limit", "FAIL")]
    if part.returncode != 0 or not figures.exists():
        print(part.stdout[-3000:], part.stderr[-3000:], file=sys.stderr)
        failed = f"benchmarks/bench_vs_trainer.py failed (exit {part.returncode})"
        return [Row(f"{name}, `gpt-ft fit` vs the Trainer", failed, "FAIL")]
    runs = {r["contender"]: r for r in json.loads(figures.read_text())}
    rows = []
    for contender, r in runs.items():
        rate = f"{r['tokens_per_s']:,.0f} real tokens/s in steady state" if r["tokens_per_s"] else "no rate"
        result = f"{r['seconds']:.0f} s, dev accuracy {r['accuracy']:.4f}, {rate}"
        rows.append(Row(f"{name}, {contender}", result))
    ours, theirs = runs["ours"], runs["Trainer"]
    ratio, gap = theirs["seconds"] / ours["seconds"], abs(theirs["accuracy"] - ours["accuracy"])
    result = f"{ratio:.2f}x, dev accuracy {ours['accuracy']:.4f} against {theirs['accuracy']:.4f}"
    status = verdict(ratio >= 2 and gap <= 0.01) if goal else ""
    return [*rows, Row(f"{name}, the Trainer's wall time / ours", result, status)]


TRAINER_RESERVE = LIMITS["vs_trainer"] * len(TRAINER_BATCHES)


def vs_trainer(args, env: dict[str, str], tmp: Path, left) -> list[Row]:
    """The third part: bench_vs_trainer.py on all of SST-2 at each of `TRAINER_BATCHES`, within the
    part's time (--quick: 512 sentences, 2 layers x 128). `left()`: the budget's seconds left."""
    shape = ["--layers=2", "--width=128"] if args.quick else ["--layers=30"]  # SmolLM2-135M's: 30 x 576
    weights = [f"--init-from={args.init_from}"]
    if not args.init_from:
        weights = [f"--tokenizer={args.tokenizer}", "--shapes=llama", *shape]
    rows = []
    for i, batch in enumerate(TRAINER_BATCHES):  # the later batches' limits kept for them
        later = LIMITS["vs_trainer"] * (len(TRAINER_BATCHES) - 1 - i)
        limit, name = min(LIMITS["vs_trainer"], left() - later), f"SST-2 end to end, batch {batch}"
        if limit < 5:
            rows.append(Row(name, f"not run: the {args.budget:.0f} s budget is spent", "FAIL"))
            continue
        started = f"[{args.budget - left():4.0f} s]"
        print(f"{started} {name}, `gpt-ft fit` vs the Trainer ...", file=sys.stderr, flush=True)
        figures = tmp / f"vs_trainer_{batch}.json"
        cmd = [sys.executable, "benchmarks/bench_vs_trainer.py", f"--glue={args.glue}", "--tasks=SST-2",
               f"--train-size={512 if args.quick else 67349}", f"--device={args.device}",
               f"--batch-size={batch}", "--contenders", "ours", "Trainer", "Trainer, group_by_length",
               *weights, f"--out={tmp / f'vs_trainer_{batch}'}", f"--json={figures}"]  # fmt: skip
        rows += trainer_rows(run_part(cmd, limit, env), figures, limit, args.device == "cuda", batch)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="fewer runs and steps in the figures")
    p.add_argument("--skip-tests", action="store_true", help="no CUDA tests")
    p.add_argument("--skip-figures", action="store_true", help="no figures (with --glue: the Trainer's part)")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole checklist (default 480; "
                   "1080 with --glue)")  # fmt: skip
    p.add_argument("--glue", type=existing, help="GLUE's folder (SST-2/ in it): adds fit against the Trainer")
    p.add_argument("--init-from", help="with --glue: the weights both start from (a .gguf, a folder)")
    p.add_argument(
        "--tokenizer", help="with --glue: a tokenizer folder, for random weights of SmolLM2's shape"
    )
    report_argument(p, "gpu_check")
    args, figure_args = p.parse_known_args()
    if args.glue and not (args.init_from or args.tokenizer):
        p.error("--glue needs --init-from (pretrained weights) or --tokenizer (random ones)")
    if args.device == "cuda" and not torch.cuda.is_available():  # every CUDA test would skip, and pass
        p.error(f"--device cuda: torch {torch.__version__} sees no CUDA device; use --device cpu")
    args.budget = args.budget or 480 + (TRAINER_RESERVE if args.glue else 0)
    before_trainer = not (args.skip_figures and (args.skip_tests or args.device == "cpu"))
    if args.glue and before_trainer and args.budget < TRAINER_RESERVE + 60:
        p.error(
            f"--budget {args.budget:.0f}: the Trainer's part (--glue) keeps {TRAINER_RESERVE} s of it, which "
            "leaves the tests and figures under a minute; give more, or --skip-tests --skip-figures"
        )
    start = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - start)  # noqa: E731
    report = Checklist("gpt_ft GPU checklist", path=args.report, started=start)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the running part's group killed (run_part)
    try:
        run_checklist(args, figure_args, report, left)
    except SystemExit:
        report.add(Row("checklist", f"stopped by SIGTERM after {time.perf_counter() - start:.0f} s", "FAIL"))
        raise
    except KeyboardInterrupt:
        report.add(Row("checklist", f"stopped by Ctrl-C after {time.perf_counter() - start:.0f} s", "FAIL"))
        raise
    except Exception as exc:  # the checklist's own fault: the rows so far, and where it stopped
        report.add(Row("checklist", f"stopped by {type(exc).__name__}: {exc}", "FAIL"))
        raise
    finally:
        minutes = (time.perf_counter() - start) / 60
        verdict_text = f"{report.failed} failing" if report.failed else "all checks pass"
        report.note = (
            f"{time.strftime('%Y-%m-%d %H:%M')}, device {args.device}, {minutes:.1f} minutes; {verdict_text}."
        )
        report.write(args.report)
    print(report.markdown(), end="")
    print(f"report written to {args.report}", file=sys.stderr)
    return 1 if report.failed else 0


class Checklist(Report):
    """The report, written again after every row (a killed checklist leaves the rows it has)."""

    def __init__(self, title: str, *, path: Path, started: float) -> None:
        super().__init__(title)
        self.path, self.started = path, started

    def add(self, row: Row) -> None:
        super().add(row)
        self.note = f"in progress: {time.perf_counter() - self.started:.0f} s"
        self.write(self.path)


def cuda_test_paths() -> list[str]:
    """tests/'s files and folders, `TEST_PATHS` first and the quickstart's file last (pytest runs
    them in the order given)."""
    rest = sorted(
        f"tests/{p.name}"
        for p in (ROOT / "tests").iterdir()
        if p.name.startswith("test_") and p.suffix == ".py" or (p / "__init__.py").is_file()
    )
    last = ["tests/test_configs.py"]
    return TEST_PATHS + [p for p in rest if p not in TEST_PATHS + last] + last


def run_checklist(args, figure_args: list[str], report: Report, left) -> None:
    """The parts in order (module docstring), each row added to `report` as it comes."""
    start = report.started
    reserved = TRAINER_RESERVE if args.glue else 0  # the Trainer part's, kept from the parts before it
    tests = args.device == "cuda" and not args.skip_tests
    missed = floors_missed(also=["accelerate"] * bool(args.glue) + ["pytest"] * tests)
    report.add(Row("dependencies", "; ".join(missed) or "every floor met", "FAIL" if missed else ""))
    cache = Path(tempfile.gettempdir()) / "gpt_ft_inductor_cache"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(cache))}
    if args.device == "cpu" or args.skip_tests:
        report.add(Row("CUDA tests", "need a GPU" if args.device == "cpu" else "--skip-tests", "skip"))
    else:
        limit = min(LIMITS["tests"], left() - reserved)
        if limit < 5:
            report.add(Row("CUDA tests", f"not run: the {args.budget:.0f} s budget is spent", "FAIL"))
        else:
            print(
                f"[{time.perf_counter() - start:4.0f} s] pytest -k cuda tests ...",
                file=sys.stderr,
                flush=True,
            )
            cmd = [sys.executable, "-m", "pytest", "-v", "-rfEs", "--tb=short", "-k", "cuda", "-p",
                   "no:cacheprovider", "--continue-on-collection-errors", *cuda_test_paths()]  # fmt: skip
            part = run_part(cmd, limit, env)  # (an unimportable module stops no test)
            log = Path(args.report).with_suffix(".tests.log")  # each test's outcome, each failure's cause
            log.write_text(part.stdout + part.stderr, encoding="utf-8")
            report.add(tests_row(part, limit))
    parts = [] if args.skip_figures else [[name] for name in FIGURES] if args.device == "cuda" else [FIGURES]
    if args.skip_figures:
        report.add(Row("GPU figures", "--skip-figures", "skip"))
    with tempfile.TemporaryDirectory() as tmp:
        for names in parts:
            name, out = "+".join(names) if len(names) == 1 else "GPU figures", Path(tmp) / f"{names[0]}.md"
            limit = (
                min(LIMITS.get(name, 60), left() - reserved) if args.device == "cuda" else left() - reserved
            )
            if limit < 5:
                report.add(Row(name, f"not run: the {args.budget:.0f} s budget is spent", "FAIL"))
                continue
            print(f"[{time.perf_counter() - start:4.0f} s] {name} ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, "benchmarks/gpu_figures.py", f"--device={args.device}", f"--report={out}",
                   "--only", *names, *(["--quick"] if args.quick else []), *figure_args]  # fmt: skip
            try:
                part = run_part(cmd, limit, env)
            except (SystemExit, KeyboardInterrupt):  # stopped: the rows this part finished, kept
                for row in figures_rows(name, Part(0, 0.0, "", ""), out, limit):
                    report.add(row)
                report.add(Row(name, "stopped with the checklist", "FAIL"))
                raise
            for row in figures_rows(name, part, out, limit):
                report.add(row)
        for row in vs_trainer(args, env, Path(tmp), left) if args.glue else []:
            report.add(row)


if __name__ == "__main__":
    sys.exit(main())
