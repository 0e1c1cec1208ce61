"""Multiple choice with the context computed once: logits, losses and gradients equal the plain
path's (each choice's whole sequence), with varied context and answer lengths, padding and rows
with fewer choices."""

from __future__ import annotations

import pytest
import torch

from gpt_ft.data.batches import collate, collate_shared
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.training.module import GPTModule
from tests.helpers import random_choice_examples

NO_DROPOUT = {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}


@pytest.mark.parametrize("lm_coef", [0.5, 0.0])
def test_shared_context_equals_the_plain_path(tokenizer_dir, lm_coef):
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    rows, task = random_choice_examples(specials, vocab=len(tok) - 5)
    torch.manual_seed(0)
    module = GPTModule(
        preset="gpt-micro",
        overrides={"n_positions": 64, **NO_DROPOUT},
        vocab_size=len(tok),
        task=task,
        lm_coef=lm_coef,
        classifier_dropout=0.0,
    )
    module.train()
    plain = collate(rows, specials.pad)
    shared = collate_shared(rows, specials.pad, specials.delim)
    assert shared is not None and shared.context_ids.shape[0] == len(rows)

    results = []
    for batch in (plain, shared):
        module.zero_grad()
        terms = module.terms(batch)
        loss, _ = module.losses(batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        results.append((terms, loss.detach(), grads))
    (a, loss_a, grads_a), (b, loss_b, grads_b) = results

    real = plain.choice_mask
    assert torch.equal(real, shared.choice_mask)
    assert torch.allclose(a["logits"][real], b["logits"][real], atol=1e-5, rtol=0)
    assert torch.equal(a["logits"][~real], b["logits"][~real])  # masked choices: the same floor
    assert torch.allclose(a["task_loss"], b["task_loss"], atol=1e-5, rtol=0)
    if lm_coef:
        assert torch.equal(a["lm_count"], b["lm_count"])
        assert torch.allclose(a["lm_sum"], b["lm_sum"], atol=1e-4, rtol=1e-6)
    assert torch.allclose(loss_a, loss_b, atol=1e-5, rtol=0)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-5, rtol=0), name
