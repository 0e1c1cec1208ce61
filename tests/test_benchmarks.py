"""The GPU checklist keeps working on machines without a GPU: on the CPU, quick, the CUDA tests are
skipped and every figure row runs (in a process of its own, in the background)."""

import json
import re
import sys

import pytest

from tests.background import Command

RATE = r"[\d,]+ \([\d,]+-[\d,]+\)"  # median tokens/s (slowest-fastest run)
KINDS = [
    "pretraining blocks",
    "right-padded fine-tuning batch",
    "left-padded batch (rotated to right padding)",
    "shared contexts of one length",
    "shared contexts, padded (masked)",
]
# The rows of `--device cpu --quick` (gpt-mini at context 128, batch 4), in order, and their results.
ROWS = {
    "CUDA tests": r"need a GPU",
    "environment": r"CPU \(.+\); torch .+, CUDA None, lightning .+, transformers .+, \d+ threads",
    "model": r"4 layers x 256 wide, 4 heads, vocab 8192, context 128; fp32",
    # Evaluation runs SDPA mask-free or with a boolean mask: the CPU's flash kernel either way.
    **{
        f"attention, {kind}": r"training: .+, fwd\+bwd [\d.]+ ms; evaluation: flash \(CPU\)" for kind in KINDS
    },
    "attention, cached decoding (1 token over the cache)": r"flash \(CPU\)",
    "shared-context multiple choice, 4 examples x 4 endings, fwd+bwd": (
        r"plain [\d.]+ ms, shared [\d.]+ ms: [\d.]+x"
    ),
    "training step, ours, batch 4 x 128": f"{RATE} tokens/s",
    "training step, transformers, batch 4 x 128": f"{RATE} tokens/s",
    "training step, ours / transformers, batch 4": r"[\d.]+x",
    "fine-tuning step (head + λ=0.5 LM loss), batch 8": (
        rf"{RATE} real tokens/s; padding \d+% of \(8, 1, \d+\)"
    ),
    "`gpt-ft fit` quickstart, 6 steps on the CPU": r"\d+ s, validation accuracy 0\.\d{3}",
    "`gpt-ft fit` vs raw loop, 30 pretraining steps of 4 x 128": (
        r"fit [\d,]+ tokens/s, loop [\d,]+: fit [+-][\d.]+%"
    ),
    "`gpt-ft fit` logged throughput": r"perf/tokens_per_s [\d,]+",
    "greedy generation, 64 tokens after 16": (
        f"cached {RATE} tokens/s, uncached {RATE}; identical tokens: True"
    ),
}


def start_gpu_check(root):
    report = root / "gpu_check.md"
    return [
        Command(
            [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--report", str(report)]
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
