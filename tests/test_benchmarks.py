"""The GPU checklist keeps working between GPU loans: on the CPU, quick, every row that makes sense
there runs and passes (in a process of its own, in the background)."""

import re
import sys

import pytest

from tests.background import Command


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
    rows = dict(re.findall(r"^\| (.+?) \| .+? \| (\w*) \|$", report, re.M))
    assert "FAIL" not in rows.values()
    assert rows["CUDA tests"] == "skip"
    for check in [
        "logits vs transformers, GPT-1 (OpenAIGPTLMHeadModel), fp32",
        "logits vs transformers, GPT-2 (GPT2LMHeadModel), fp32",
        "bf16-mixed loss vs fp32",
        "shared-context multiple choice = plain layout (fp32 logits)",
        "`gpt-ft fit` logged throughput",
    ]:
        assert rows[check] == "pass", check
    assert any(check.startswith("`gpt-ft fit` quickstart") and v == "pass" for check, v in rows.items())
    assert any(check.startswith("greedy generation") and v == "pass" for check, v in rows.items())
    kernels = {
        check: line for check, line in re.findall(r"^\| (attention, [^|]+) \| ([^|]+) \|", report, re.M)
    }
    assert len(kernels) == 6
    # Evaluation of right-padded batches runs SDPA mask-free: the CPU's flash kernel.
    assert "evaluation: flash (CPU)" in kernels["attention, right-padded fine-tuning batch"]
