"""bf16 on the CPU, where it pays.

`precision: bf16-mixed` runs the matrix products in bf16 under `torch.autocast("cpu")`. Whether
that is faster than fp32 depends on the processor: on CPUs whose bf16 instructions double the
fp32 rate (AVX-512 BF16 on AMD Zen 4, AMX on Intel Sapphire Rapids) a training step runs up to
several times faster; on CPUs without them bf16 is emulated, and on some with them oneDNN's bf16
kernels still lose to fp32. So on a CPU a bf16 precision is kept only where a short matmul probe
(about 0.1 s where bf16 is fast, up to about a second where it is slow) shows bf16 faster, and
otherwise falls back to 32-true with one line saying why.
`GPT_FT_CPU_BF16=always` keeps bf16 regardless (for example to test the bf16 path itself).
"""

from __future__ import annotations

import functools
import os
import statistics
import time

import torch

from gpt_ft.workarounds.kernels import mkldnn_bf16_supported

BF16 = ("bf16-mixed", "bf16-true", "bf16")
FORCE = "GPT_FT_CPU_BF16"


def cpu_has_bf16() -> bool:
    """Whether oneDNN has bf16 matrix instructions on this CPU (AVX-512 BF16 or AMX)."""
    return mkldnn_bf16_supported()


@functools.cache
def bf16_matmul_speedup(n: int = 1024, repeats: int = 5) -> float:
    """How many times faster an n x n x n matrix product runs in bf16 than in fp32 on this CPU
    (median of `repeats` interleaved timings, after a warm-up)."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    ratios = []
    for i in range(repeats + 1):
        times = []
        for a, b in ((a32, b32), (a16, b16)):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        if i:  # the first round warms oneDNN's kernels up
            ratios.append(times[0] / times[1])
    return statistics.median(ratios)


def cpu_precision(precision: str | int | None) -> tuple[str | int | None, str | None]:
    """The precision to train with on a CPU when `precision` was asked for, and the line that says
    why it changed (None when it did not). Transformer Engine's precisions are refused: they need an
    NVIDIA GPU (the answer was to install its package)."""
    if str(precision).startswith("transformer-engine"):
        raise ValueError(f"--trainer.precision {precision} needs an NVIDIA GPU (Transformer Engine); on a "
                         "CPU give 32-true or bf16-mixed.")  # fmt: skip
    if str(precision) in ("16-mixed", "16"):  # Lightning runs fp16-mixed as bf16-mixed on a CPU
        chosen, why = cpu_precision("bf16-mixed")
        return chosen, why.replace("bf16-mixed", f"{precision} (bf16-mixed on a CPU)", 1) if why else None
    if str(precision) not in BF16 or os.environ.get(FORCE) == "always":
        return precision, None
    if not cpu_has_bf16():
        why = "This CPU has no bf16 matrix instructions (AVX-512 BF16 or AMX)"
    else:
        speedup = bf16_matmul_speedup()
        if speedup >= 1.1:
            return precision, None
        why = f"On this CPU bf16 matrix products run at {speedup:.2f}x the speed of fp32"
    return "32-true", f"{why}: running in 32-true instead of {precision} ({FORCE}=always keeps bf16)."


def runs_on_cpu(accelerator: object) -> bool:
    """Whether a Trainer with this `accelerator` setting computes on the CPU."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    return name == "cpu" or "cpu" in name or (name == "auto" and not torch.cuda.is_available())


def warn_half_weights(precision: object) -> None:
    """Training 16-bit weights, said before the run: `16-true` is refused (AdamW's float16 second
    moments underflow to 0 for small gradients, whose weights then step by lr·m/eps and blow up);
    `bf16-true` loses every update below half a weight's spacing."""
    if str(precision) == "16-true":
        raise ValueError(
            "--trainer.precision 16-true keeps AdamW's moments in float16, where a small gradient's square "
            "underflows to 0 and its weight's step (lr * m / eps) blows up: train in bf16-mixed, 16-mixed "
            "or bf16-true."
        )
    if str(precision) == "bf16-true":
        from lightning.pytorch.utilities.rank_zero import rank_zero_warn  # (a training command's)

        rank_zero_warn(
            "--trainer.precision bf16-true trains 16-bit weights: an update below half their spacing "
            "(1/256 of a weight near 1) is lost, so small learning rates barely move them (the "
            "LayerNorm gains not at all); bf16-mixed keeps float32 weights."
        )
