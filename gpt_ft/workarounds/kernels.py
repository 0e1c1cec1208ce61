"""torch: optimizers under a GradScaler, compiled modules, and the attention kernels' own ops."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer


def decline_step_unscaling(optimizer: Optimizer) -> None:
    """Have a GradScaler unscale `optimizer`'s gradients before its step, as for any optimizer, even
    where the step (a fused kernel) offers to unscale them itself.

    The flag is torch's contract between `GradScaler.step` and an optimizer
    (torch/amp/grad_scaler.py), with no public setter; Lightning reads it to refuse gradient clipping
    under 16-mixed (Lightning-AI/pytorch-lightning#15555, and #21435 for fused AdamW). If torch
    renames it, set the new name; if Lightning clips after unscaling such optimizers, drop this.
    """
    optimizer._step_supports_amp_scaling = False


def is_compiled(module: nn.Module) -> bool:
    """Whether `module.compile()` (torch.compile in place) has been called on `module`.

    `Module.compile` keeps the compiled call in `Module._compiled_call_impl`
    (torch/nn/modules/module.py) and says so nowhere public; pytorch/pytorch#103553 asked for such a
    flag. If the attribute goes, record it ourselves where `compile` is called.
    """
    return getattr(module, "_compiled_call_impl", None) is not None


def mkldnn_bf16_supported() -> bool:
    """Whether oneDNN has bf16 matrix instructions on this CPU (AVX-512 BF16 or AMX).

    torch has no public check for the CPU (`torch.cuda.is_bf16_supported` is for GPUs); its own
    inductor and tests call the private op `torch.ops.mkldnn._is_mkldnn_bf16_supported`, registered
    in aten/src/ATen/native/mkldnn/RegisterMkldnnOpContextClass.cpp. Where it is missing (renamed, or
    a build without oneDNN) the answer is False, and bf16 falls back to fp32: safe. Use a public
    check when torch adds one.
    """
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def torchao_import_loggers() -> list[logging.Logger]:
    """The loggers torchao's import writes to about parts no command uses: torchao's own (CUDA
    kernels a CPU-only torch cannot load) and that of torch's private pytree module, which warns
    that torchao registers Enum subclasses as pytree constants (pytorch/ao#4848; the fix, pytorch/ao#4849,
    is open). Once a torchao with the fix is the minimum, drop the pytree logger; if torch moves the
    module, follow its new name (the warning's log line names the file).
    """
    return [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]


@contextmanager
def torchao_import_quiet() -> Iterator[None]:
    """`torchao_import_loggers` at ERROR while the block runs: the first import of torchao, direct
    or through transformers, logs nothing of those parts (later imports log nothing either way)."""
    loggers = torchao_import_loggers()
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def import_transformers_models() -> None:
    """Import transformers' model base (`transformers.modeling_utils`) quietly: it imports torchao
    where that is installed (the quantize extra), whose import logs about CUDA kernels a CPU-only torch
    cannot load and enums registered with pytree (`torchao_import_loggers`). Called before the first
    transformers model is built or named: reading a GGUF file, `to_hf`, exports."""
    import sys

    if "transformers.modeling_utils" not in sys.modules:
        with torchao_import_quiet():
            import transformers.modeling_utils  # noqa: F401


def flash_varlen_forward(q, k, v, cu_seqlens, max_seqlen: int, dropout_p: float, scale, left: int):
    """FlashAttention-2's variable-length causal forward with attention dropout: (out, logsumexp,
    rng_state, unused). `torch.nn.attention.varlen.varlen_attn` hardcodes a rate of 0
    (pytorch/pytorch#179382; the pull request adding `dropout_p`, #179390, closed unmerged), so
    the aten op it wraps (`_flash_attention_forward`, as SDPA's flash path calls it) is called
    directly. When `varlen_attn` takes a rate, use it and drop this pair."""
    import torch

    out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, True, False,
        scale=scale, window_size_left=left, window_size_right=0,
    )  # fmt: skip
    return out, lse, rng, unused


def flash_varlen_backward(grad, q, k, v, out, lse, cu_seqlens, max_seqlen: int, dropout_p: float, rng, unused,
                          scale, left: int):  # fmt: skip
    """The backward of `flash_varlen_forward` (aten's `_flash_attention_backward`): (dq, dk, dv),
    the forward's dropout mask redrawn from its `rng` state."""
    import torch

    return torch.ops.aten._flash_attention_backward(
        grad, q, k, v, out, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, True, rng,
        unused, scale=scale, window_size_left=left, window_size_right=0,
    )  # fmt: skip


def cpu_flash_forward(q, k, v, scale):
    """SDPA's CPU flash kernel, causal, on queries (1, nh, n, hs) and keys/values (1, nkv, n, hs),
    nh a multiple of nkv: (out, logsumexp (1, nh, n), fp32 or fp64). SDPA returns no logsumexp and
    has no public backward, and running it under autograd on each sequence of a flat row costs a
    zeroed row-sized gradient per sequence (its slice's backward); so the aten op SDPA's CPU flash
    path calls (`_scaled_dot_product_flash_attention_for_cpu`) is called directly. Should it be
    renamed, follow what `scaled_dot_product_attention` calls on a CPU; if it goes, the dense mask
    remains (`PackedRows`)."""
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)


def cpu_flash_backward(grad, q, k, v, out, lse, scale):
    """The backward of `cpu_flash_forward` (aten's `..._for_cpu_backward`): (dq, dk, dv)."""
    import torch

    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return op(grad, q, k, v, out, lse, 0.0, True, scale=scale)
