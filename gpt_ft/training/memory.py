"""The process's memory for training: glibc's malloc made to keep what a step frees (`gpt-ft` does
this first, for every command)."""

from __future__ import annotations

import ctypes
import os
import sys

GLIBC_MALLOC_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory() -> None:
    """glibc's malloc keeps the memory a training step frees for the next step's tensors.

    By default glibc hands every block of 32 MiB or more (activations, gradients, scores) to the
    kernel with its own mmap, and gives freed memory at the heap's top back: each step then
    page-faults its tensors in afresh, zero-filled: about 7% of a CPU training step's time
    (SmolLM2-135M on PRMBench, bf16, 2 cores). Allocations under 1 GiB now come from the heap, which keeps up
    to 2 GiB free; the peak memory is the same. Not where the user set malloc's thresholds
    themselves (`GLIBC_MALLOC_SETTINGS`), nor off glibc (musl, macOS, Windows)."""
    if sys.platform != "linux" or any(name in os.environ for name in GLIBC_MALLOC_SETTINGS):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 1 << 30)
        mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)
