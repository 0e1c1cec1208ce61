"""The GPU checklist in one command: the CUDA tests, then the GPU figures, as one Markdown report.

1. `pytest -k cuda tests`: logits equal transformers' (GPT-1 and GPT-2, fp32), the bf16-mixed loss
   stays near fp32's, every batch layout equals the plain one, cached generation equals uncached,
   pretraining and right-padded fine-tuning run a fused attention kernel (flash or cuDNN), `fit`
   logs tokens/s and MFU, the quickstart learns through configs/trainer/gpu.yaml (eager and compiled);
2. benchmarks/gpu_figures.py: tokens/s, MFU, attention kernels, `fit` vs a raw loop, generation,
   shared contexts, with the speed goals checked.

Exit status 1 when a test fails or a goal is missed. With `--device cpu` the tests are skipped and
the figures run on a small model (`--quick`: a tiny one, in about half a minute; the test suite runs it).

    python benchmarks/gpu_check.py                          # on a GPU, with the project installed
    python benchmarks/gpu_check.py --device cpu --quick     # on a CPU
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Report, Row, report_argument, verdict


def cuda_tests() -> Row:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-k", "cuda", "-p", "no:cacheprovider", "tests"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    summary = (out.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    if out.returncode != 0:
        print(out.stdout[-4000:], out.stderr[-2000:], file=sys.stderr)
    seconds = time.perf_counter() - start
    return Row(
        "CUDA tests (`pytest -k cuda tests`)", f"{summary} ({seconds:.0f} s)", verdict(out.returncode == 0)
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="fewer runs and steps in the figures")
    p.add_argument("--skip-tests", action="store_true", help="the figures only")
    report_argument(p, "gpu_check")
    args, figure_args = p.parse_known_args()
    start = time.perf_counter()
    report = Report("gpt_ft GPU checklist")
    if args.device == "cpu" or args.skip_tests:
        report.add(Row("CUDA tests", "need a GPU" if args.device == "cpu" else "--skip-tests", "skip"))
    else:
        print("running pytest -k cuda tests ...", file=sys.stderr, flush=True)
        report.add(cuda_tests())
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "gpu_figures.md"
        cmd = [sys.executable, "benchmarks/gpu_figures.py", f"--device={args.device}", f"--report={figures}"]
        cmd += ["--quick"] if args.quick else []
        # The figures' own report is their stdout; ours is printed below.
        code = subprocess.run(cmd + figure_args, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
        if figures.with_suffix(".json").exists():
            report.rows += Report.read(figures.with_suffix(".json")).rows
        else:
            report.add(Row("GPU figures", f"benchmarks/gpu_figures.py failed (exit {code})", "FAIL"))
    minutes = (time.perf_counter() - start) / 60
    verdict_text = f"{report.failed} failing" if report.failed else "all checks pass"
    report.note = (
        f"{time.strftime('%Y-%m-%d %H:%M')}, device {args.device}, {minutes:.1f} minutes; {verdict_text}."
    )
    report.write(args.report)
    print(report.markdown(), end="")
    print(f"report written to {args.report}", file=sys.stderr)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
