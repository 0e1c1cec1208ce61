"""The chunked LM loss equals the plain one, `F.cross_entropy(gpt.lm_logits(hidden).float(), ...)`:
per-row sums and gradients wrt the hidden states and the head, with ignored targets, tied and
untied heads, padding rows, rows weighted differently, bf16 autocast and a frozen head; through
`row_lm_terms` (both of its branches) and the function itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt_ft import GPT, GPTConfig
from gpt_ft.data.batches import IGNORE_INDEX
from gpt_ft.model.lora import LoRA, add_lora
from gpt_ft.training.lm_loss import linear_cross_entropy, lm_losses
from gpt_ft.training.terms import row_lm_terms

ROWS, T = 2, 9


def micro_gpt(vocab_size: int = 37, vocab_multiple: int = 16, tie: bool = True) -> GPT:
    """A GPT whose head has padding rows (37 -> 48) unless `vocab_multiple` is 1."""
    torch.manual_seed(0)
    config = GPTConfig.from_name(
        "llama-micro", vocab_size=vocab_size, vocab_multiple=vocab_multiple, tie_embeddings=tie
    )
    return GPT(config)


def plain_row_terms(gpt: GPT, hidden, targets):
    """Per-row sums and counts through the full logits."""
    rows, T = targets.shape
    losses = F.cross_entropy(
        gpt.lm_logits(hidden).flatten(0, 1).float(), targets.flatten(), reduction="none"
    ).view(rows, T)
    return losses.sum(dim=1), (targets != IGNORE_INDEX).sum(dim=1)


def inputs(gpt: GPT, dtype=torch.float32):
    torch.manual_seed(1)
    hidden = torch.randn(ROWS, T, gpt.config.n_embd, dtype=dtype) * 3
    targets = torch.randint(0, gpt.config.vocab_size, (ROWS, T))
    targets[0, :3] = IGNORE_INDEX
    targets[1, -2:] = IGNORE_INDEX
    return hidden, targets


def sums_and_grads(gpt: GPT, terms, hidden, targets, weights, **kw):
    """Row sums, counts, and the gradients of (sums * weights).sum() wrt hidden and each head."""
    hidden = hidden.clone().requires_grad_()
    gpt.zero_grad(set_to_none=True)
    sums, counts = terms(gpt, hidden, targets, **kw)
    (sums * weights).sum().backward()
    heads = {n: p.grad.clone() for n, p in gpt.named_parameters() if p.grad is not None}
    return sums.detach(), counts, hidden.grad, heads


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("vocab_multiple", [16, 1], ids=["padding-rows", "no-padding"])
@pytest.mark.parametrize("padded", [True, False], ids=["gathered", "every-position"])
@pytest.mark.parametrize("weights", [[1.0, 1.0], [1.0, 3.0]], ids=["uniform", "weighted-rows"])
def test_row_lm_terms_equal_the_plain_path(tie, vocab_multiple, padded, weights):
    """Rows weighted differently take the backward's recompute of the head's gradient."""
    gpt = micro_gpt(vocab_multiple=vocab_multiple, tie=tie)
    hidden, targets = inputs(gpt)
    weights = torch.tensor(weights)
    ours = sums_and_grads(gpt, row_lm_terms, hidden, targets, weights, padded=padded)
    plain = sums_and_grads(gpt, plain_row_terms, hidden, targets, weights)
    assert torch.allclose(ours[0], plain[0], atol=1e-5, rtol=1e-6)
    assert ours[0].dtype == plain[0].dtype == torch.float32
    assert torch.equal(ours[1], plain[1])
    assert torch.allclose(ours[2], plain[2], atol=1e-5, rtol=0)
    assert ours[3].keys() == plain[3].keys() and ours[3]
    for name, grad in plain[3].items():
        assert ours[3][name].shape == grad.shape
        assert torch.allclose(ours[3][name], grad, atol=1e-5, rtol=0), name
        assert not ours[3][name][gpt.config.vocab_size :].any()  # padding rows: no gradient


def reference(hidden, weight, targets, vocab, grad):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    losses = F.cross_entropy(F.linear(hidden, weight[:vocab]).float(), targets, reduction="none")
    (losses * grad).sum().backward()
    return losses.detach(), hidden.grad, weight.grad


def chunked(hidden, weight, targets, vocab, grad, chunk):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    losses = linear_cross_entropy(hidden, weight, targets, vocab, chunk=chunk)
    (losses * grad).sum().backward()
    return losses.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
@pytest.mark.parametrize("grad", ["ones", "scalar", "per-token"])
def test_chunks_and_incoming_gradients(chunk, grad):
    """Any chunking (one token, uneven, one chunk for all) and any gradient per token: 1, one
    value for all (a mean), different values (the recompute); ignored tokens' own gradient is
    never used."""
    torch.manual_seed(2)
    N, C, rows, vocab = 23, 8, 40, 33
    hidden, weight = torch.randn(N, C) * 2, torch.randn(rows, C)
    targets = torch.randint(0, vocab, (N,))
    targets[[0, 5, 6, 22]] = IGNORE_INDEX
    g = {"ones": torch.ones(N), "scalar": torch.full((N,), 0.25), "per-token": torch.rand(N)}[grad]
    g = torch.where(targets == IGNORE_INDEX, 7.0, g)  # ignored: any value, no effect
    ours = chunked(hidden, weight, targets, vocab, g, chunk)
    plain = reference(hidden, weight, targets, vocab, g)
    for a, b in zip(ours, plain):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-6)
    assert not ours[0][targets == IGNORE_INDEX].any()


def test_large_losses_stay_exact():
    """A target far below the top logit: its probability underflows in fp32, its loss does not."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    weight = torch.tensor([[200.0, 0.0], [0.0, 0.0], [-50.0, 3.0]])
    targets = torch.tensor([2, 1])
    ours = linear_cross_entropy(hidden, weight, targets)
    plain = F.cross_entropy(F.linear(hidden, weight), targets, reduction="none")
    assert torch.allclose(ours, plain, rtol=1e-6, atol=0)
    assert ours[0] > 200


def test_bf16_autocast_matches_the_plain_path():
    """Under autocast the logits are computed in bf16 (as `F.linear` would) and then in fp32."""
    torch.manual_seed(3)
    N, C, vocab = 50, 32, 300
    hidden, weight = torch.randn(N, C), torch.randn(vocab, C) * 0.2
    targets = torch.randint(0, vocab, (N,))
    targets[:4] = IGNORE_INDEX
    g = torch.rand(N)
    with torch.autocast("cpu", torch.bfloat16):
        ours = chunked(hidden, weight, targets, vocab, g, 16)
        plain = reference(hidden, weight, targets, vocab, g)
    assert ours[1].dtype == ours[2].dtype == torch.float32
    assert torch.allclose(ours[0], plain[0], atol=1e-5, rtol=1e-5)  # the same bf16 logits
    for a, b in zip(ours[1:], plain[1:]):
        assert torch.allclose(a, b, atol=0.02 * b.abs().max().item(), rtol=0)


def test_bf16_weights():
    """bf16 hidden states and head (16-true training): gradients come back in bf16."""
    torch.manual_seed(4)
    hidden, weight = torch.randn(20, 16, dtype=torch.bfloat16), torch.randn(64, 16, dtype=torch.bfloat16)
    targets = torch.randint(0, 50, (20,))
    g = torch.ones(20)
    ours, plain = chunked(hidden, weight, targets, 50, g, 8), reference(hidden, weight, targets, 50, g)
    assert ours[1].dtype == ours[2].dtype == torch.bfloat16
    assert torch.allclose(ours[0], plain[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(ours[1:], plain[1:]):
        assert torch.allclose(a.float(), b.float(), atol=0.02 * b.abs().max().item(), rtol=0)


def test_frozen_head_and_no_grad():
    """A head that trains not (no weight gradient computed), and evaluation under no_grad."""
    torch.manual_seed(5)
    hidden, weight = torch.randn(12, 8, requires_grad=True), torch.randn(20, 8)
    targets = torch.randint(0, 20, (12,))
    linear_cross_entropy(hidden, weight, targets, chunk=5).sum().backward()
    plain_hidden = hidden.detach().requires_grad_()
    F.cross_entropy(F.linear(plain_hidden, weight), targets, reduction="sum").backward()
    assert torch.allclose(hidden.grad, plain_hidden.grad, atol=1e-5, rtol=0)
    with torch.no_grad():
        losses = linear_cross_entropy(hidden, weight, targets, chunk=5)
    assert not losses.requires_grad
    expected = F.cross_entropy(F.linear(hidden.detach(), weight), targets, reduction="none")
    assert torch.allclose(losses, expected, atol=1e-5, rtol=1e-6)


def test_second_backward_recomputes():
    """With retain_graph, a second backward gives the same gradients as the first."""
    torch.manual_seed(6)
    hidden, weight = torch.randn(10, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    loss = linear_cross_entropy(hidden, weight, torch.randint(0, 16, (10,)), chunk=4).mean()
    first = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
    second = torch.autograd.grad(loss, (hidden, weight))
    for a, b in zip(first, second):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_lora_token_rows_take_the_plain_path():
    gpt = add_lora(micro_gpt(tie=False), LoRA(rank=2), new_tokens_from=30)
    hidden, targets = inputs(gpt)
    hidden = hidden.flatten(0, 1)
    losses = lm_losses(gpt, hidden, targets.flatten())
    plain = F.cross_entropy(gpt.lm_logits(hidden).float(), targets.flatten(), reduction="none")
    assert torch.allclose(losses, plain, atol=1e-6, rtol=0)


def test_no_tokens():
    hidden, weight = torch.zeros(0, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    losses = linear_cross_entropy(hidden, weight, torch.zeros(0, dtype=torch.long))
    losses.sum().backward()
    assert losses.shape == (0,) and not weight.grad.any() and hidden.grad.shape == (0, 8)
