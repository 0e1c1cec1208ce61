"""Next-token cross-entropy through the LM head, a chunk of tokens at a time.

The plain loss, `F.cross_entropy(gpt.lm_logits(hidden).float(), targets)`, materialises three
(tokens, vocab) fp32 tensors per step: the logits, their log-softmax and its gradient (at
SmolLM2-135M's vocabulary, 512 tokens make each 100 MB). On a CPU each is a fresh allocation whose
pages fault in and whose passes run at memory speed, not cache speed. `linear_cross_entropy` runs
the same three matmuls (logits, gradient wrt the hidden states, gradient wrt the head) chunk by
chunk through one reused buffer, and computes both gradients during the forward pass while each
chunk's probabilities are at hand.

Those gradients are for a gradient of 1 per token. The backward scales the hidden states' by each
token's incoming gradient, exact for any; the head's, a sum over the tokens, by one factor for all
when every token with a target has the same incoming gradient, as under a mean over the batch's
tokens (the training loss) or any multiple of it. Any other gradient (rows weighted differently)
is exact too: the backward then recomputes each chunk's probabilities from the saved log-sum-exp
for the head's gradient, two more matmuls.

The FLOPs are the plain path's, so the gain is the memory traffic alone: with 2 CPU threads the
loss's forward and backward take 500 ms instead of 580 at SmolLM2-135M's shape (512 tokens) and
1.9 s instead of 2.2 at GPT-1's (2,048 tokens). In whole training steps the plain path's fresh
allocations also cost time elsewhere and vary from step to step: 4-11% of a step saved at the
first shape, up to 13% at the second, and ~100 MB less peak memory at the first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from gpt_ft.data.batches import IGNORE_INDEX
from gpt_ft.workarounds.kernels import is_compiled

CHUNK_BYTES = 2**27  # a chunk's fp32 logits: 128 MiB (682 tokens at a 49,152-token vocabulary)


def lm_losses(gpt, hidden: Tensor, targets: Tensor) -> Tensor:
    """Per-token next-token cross-entropy (N,) in fp32 of hidden states (N, C) against `targets`
    (N,), 0 where a target is -100: `F.cross_entropy(gpt.lm_logits(hidden).float(), targets)`.

    LoRA's TokenRows (frozen rows and trained ones, two matrices) take the plain path, and so do
    GPUs, whose fused kernels and memory bandwidth leave the chunks little to win. There, when the
    model is compiled, the head's matmul and the cross-entropy are compiled too: one graph that
    never writes the (N, vocab) logits out in fp32."""
    head = gpt.wte if gpt.lm_head is None else gpt.lm_head
    if hasattr(head, "logits") or hidden.device.type != "cpu":
        plain = compiled_plain_losses() if is_compiled(gpt) and hidden.device.type == "cuda" else plain_losses
        return plain(gpt, hidden, targets)
    return linear_cross_entropy(hidden, head.weight, targets, gpt.lm_rows or gpt.config.vocab_size)


def plain_losses(gpt, hidden: Tensor, targets: Tensor) -> Tensor:
    logits = gpt.lm_logits(hidden)  # (a language model alone: the text's tokens' rows, `GPT.lm_rows`)
    return F.cross_entropy(
        (logits[..., : gpt.lm_rows] if gpt.lm_rows else logits).float(), targets, reduction="none"
    )


_compiled_plain = None


def compiled_plain_losses():
    """`plain_losses` compiled once per process (dynamic in the number of tokens)."""
    global _compiled_plain
    if _compiled_plain is None:
        _compiled_plain = torch.compile(plain_losses, dynamic=True)
    return _compiled_plain


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, vocab: int | None = None, *, chunk: int | None = None
) -> Tensor:
    """`F.cross_entropy(F.linear(hidden, weight[:vocab]).float(), targets, reduction="none")`
    without the (N, vocab) tensors: per-token losses (N,) in fp32, 0 where a target is -100.

    The logits are computed in the dtype `F.linear` would use (autocast's, under autocast) and
    converted to fp32, as the plain path does; the rows of `weight` past `vocab` (padding) get no
    logit and a zero gradient. `chunk` tokens at a time (by default as many as fit CHUNK_BYTES:
    larger chunks run the matmuls faster, up to the point where the buffer no longer pays)."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and hidden.dtype != torch.float64:
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
    grad = torch.is_grad_enabled()
    needs = (grad and hidden.requires_grad, grad and weight.requires_grad)
    vocab = weight.shape[0] if vocab is None else vocab
    chunk = chunk or max(1, CHUNK_BYTES // (4 * vocab))
    return ChunkedLinearCrossEntropy.apply(hidden, weight, targets, vocab, chunk, dtype, *needs)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The function behind `linear_cross_entropy` (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab, chunk, dtype, needs_hidden, needs_weight):
        with torch.autocast(hidden.device.type, enabled=False):
            head = _Head(hidden, weight, targets, vocab, chunk, dtype)
            losses, lse, grad_hidden, grad_weight = head.forward(needs_hidden, needs_weight)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.setup = (vocab, chunk, dtype)
        ctx.unit_grads = grad_hidden, grad_weight
        return losses

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_losses):
        hidden, weight, targets, lse = ctx.saved_tensors
        needs_hidden, needs_weight = ctx.needs_input_grad[:2]
        unit_hidden, unit_weight = ctx.unit_grads
        ctx.unit_grads = None, None  # a second backward (retain_graph) recomputes
        keep = targets != IGNORE_INDEX
        grad_losses = torch.where(keep, grad_losses, 0.0)
        grad_hidden = grad_weight = None
        if needs_hidden and unit_hidden is not None:  # each token's own factor: exact for any gradient
            grad_hidden = unit_hidden.mul_(grad_losses[:, None]).to(hidden.dtype)
        if needs_weight and unit_weight is not None:  # a sum over tokens: one factor for all, or none
            scale = _common_value(grad_losses, keep)
            grad_weight = None if scale is None else unit_weight.mul_(scale).to(weight.dtype)
        missing = (needs_hidden and grad_hidden is None, needs_weight and grad_weight is None)
        if any(missing):
            with torch.autocast(hidden.device.type, enabled=False):
                head = _Head(hidden, weight, targets, *ctx.setup)
                again = head.backward(grad_losses, lse, *missing)
            grad_hidden = again[0] if missing[0] else grad_hidden
            grad_weight = again[1] if missing[1] else grad_weight
        return grad_hidden, grad_weight, None, None, None, None, None, None


def _common_value(values: Tensor, keep: Tensor) -> Tensor | None:
    """The value every kept entry of `values` has (a 0-dim tensor; 0 where none is kept), or None
    where they differ. One look at the values from the host: on a GPU, one synchronization."""
    if not values.numel():
        return values.new_zeros(())
    kept_max = torch.where(keep, values, -torch.inf).max()
    kept_min = torch.where(keep, values, torch.inf).min()
    anything = keep.any()
    if not bool((kept_max == kept_min) | ~anything):
        return None
    return torch.where(anything, kept_max, 0.0)


class _Head:
    """The chunked passes over one (hidden, weight, targets)."""

    def __init__(self, hidden: Tensor, weight: Tensor, targets: Tensor, vocab: int, chunk: int, dtype):
        self.hidden, self.weight, self.targets, self.vocab, self.dtype = hidden, weight, targets, vocab, dtype
        self.h = hidden.to(dtype)
        self.w = weight[:vocab].to(dtype)
        N = hidden.shape[0]
        self.spans = [(s, min(s + chunk, N)) for s in range(0, N, chunk)]
        rows = min(chunk, N)
        self.buffer = torch.empty(rows, vocab, device=hidden.device, dtype=torch.float32)
        self.cast = None if dtype == torch.float32 else torch.empty_like(self.buffer, dtype=dtype)
        # Products summed over chunks: in fp32 at least, then in the weight's dtype.
        self.accumulate = torch.promote_types(dtype, torch.float32)

    def logits(self, s: int, e: int) -> Tensor:
        """The fp32 logits of tokens s:e, in the buffer."""
        z = self.buffer[: e - s]
        if self.cast is None:
            return torch.mm(self.h[s:e], self.w.T, out=z)
        return z.copy_(torch.mm(self.h[s:e], self.w.T, out=self.cast[: e - s]))

    def operand(self, p: Tensor) -> Tensor:
        """`p` in the matmuls' dtype."""
        return p if self.cast is None else self.cast[: len(p)].copy_(p)

    def forward(self, needs_hidden: bool, needs_weight: bool):
        """Losses (N,) and log-sum-exps (N,), fp32; and for a gradient of 1 per kept token the
        gradients wrt hidden (in fp32 at least) and weight (in `accumulate`), those asked for."""
        N = len(self.targets)
        device = self.hidden.device
        losses = torch.empty(N, device=device, dtype=torch.float32)
        lse = torch.empty_like(losses)
        grad_hidden = (
            torch.empty(self.h.shape, device=device, dtype=self.accumulate) if needs_hidden else None
        )
        grad_weight = self._weight_grad() if needs_weight else None
        for i, (s, e) in enumerate(self.spans):
            keep, target = self._targets(s, e)
            z = self.logits(s, e)
            picked = z.gather(1, target[:, None]).squeeze(1)
            top = z.amax(dim=1, keepdim=True)
            p = z.sub_(top).exp_()  # the softmax, in place: exp(z - top) / sum
            total = p.sum(dim=1, keepdim=True)  # >= 1 (the top entry's exp is 1): never underflows
            p.div_(total)
            lse[s:e] = (top + total.log()).squeeze(1)
            losses[s:e] = torch.where(keep, lse[s:e] - picked, 0.0)
            if needs_hidden or needs_weight:
                self._gradients(p, keep, target, s, e, grad_hidden, grad_weight, first=i == 0)
        return losses, lse, grad_hidden, grad_weight

    def backward(self, grad_losses: Tensor, lse: Tensor, needs_hidden: bool, needs_weight: bool):
        """Gradients wrt hidden and weight for any gradient per token, recomputing the softmax."""
        grad_hidden = torch.empty_like(self.hidden, dtype=self.accumulate) if needs_hidden else None
        grad_weight = self._weight_grad() if needs_weight else None
        for i, (s, e) in enumerate(self.spans):
            _, target = self._targets(s, e)
            p = self.logits(s, e).sub_(lse[s:e, None]).exp_()
            scale = grad_losses[s:e].float()
            self._gradients(p, scale, target, s, e, grad_hidden, grad_weight, first=i == 0)
        return (
            grad_hidden.to(self.hidden.dtype) if needs_hidden else None,
            grad_weight.to(self.weight.dtype) if needs_weight else None,
        )

    def _targets(self, s: int, e: int) -> tuple[Tensor, Tensor]:
        t = self.targets[s:e]
        keep = t != IGNORE_INDEX
        return keep, torch.where(keep, t, 0)

    def _weight_grad(self) -> Tensor:
        """The weight's gradient: padding rows zero, the others written by the first chunk."""
        new = torch.empty if self.spans else torch.zeros
        grad = new(self.weight.shape, device=self.weight.device, dtype=self.accumulate)
        grad[self.vocab :].zero_()
        return grad

    def _gradients(self, p, scale, target, s, e, grad_hidden, grad_weight, *, first: bool) -> None:
        """Adds (p - onehot(target)) * scale, tokens s:e, to the gradients: the softmax's gradient,
        `scale` per token (a boolean mask of the kept tokens, or the incoming gradient)."""
        p.scatter_add_(1, target[:, None], p.new_full((e - s, 1), -1.0))
        p = self.operand(p)
        scale = scale.to(self.accumulate)[:, None]
        if grad_hidden is not None:
            torch.mul(torch.mm(p, self.w), scale, out=grad_hidden[s:e])
        if grad_weight is not None:
            h = self.h[s:e] * scale.to(self.dtype)
            into = grad_weight[: self.vocab]
            if p.dtype == self.accumulate:
                torch.mm(p.T, h, out=into) if first else into.addmm_(p.T, h)
            else:
                into.copy_(torch.mm(p.T, h)) if first else into.add_(torch.mm(p.T, h))
