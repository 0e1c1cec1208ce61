"""Multiple choice with the context computed once: logits, losses and gradients equal the plain
path's (each choice's whole sequence), with varied context and answer lengths, padding and rows
with fewer choices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias

from gpt_ft.data.batches import collate, collate_blocks, collate_shared
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.training.module import GPTModule
from gpt_ft.training.terms import batch_terms
from tests.helpers import FAMILY_MICRO, cuda, random_choice_examples

NO_DROPOUT = {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}


@pytest.mark.parametrize(
    ("lm_coef", "context_length", "preset"),
    [(0.5, None, "gpt-micro"), (0.0, None, "gpt-micro"), (0.5, 12, "gpt-micro"), (0.5, None, "llama-micro"),
     (0.5, 12, "llama-micro"), (0.5, None, "qwen3-micro"), (0.5, None, "gemma3-micro"),
     (0.5, 12, "gemma3-micro"), (0.5, 12, "smollm3-micro"), (0.5, 12, "neox-micro"),
     (0.5, None, "phi4-micro")],
    ids=["lm", "no-lm", "one-length", "llama-lm", "llama-one-length", "qwen3-lm", "gemma3-lm",
         "gemma3-one-length", "smollm3-one-length", "neox-one-length", "phi4-longrope-lm"],
)  # fmt: skip
def test_shared_context_equals_the_plain_path(tokenizer_dir, lm_coef, context_length, preset):
    """Contexts of one length take the mask-free path (causal aligned to the lower right). With
    rotary positions (llama-micro) the answers' positions continue from their context's length;
    Gemma 3's sliding window (6 tokens) counts positions, not the padded prefix's indices. LongRoPE
    (phi4-micro, original context 20): questions of 7 to 45 tokens, each choice with its own factors
    in the plain layout, each question's context and choices with its longest's in the shared one
    (no question here has choices on both sides of 20)."""
    module, rows, specials = choice_module(
        tokenizer_dir, lm_coef=lm_coef, context_length=context_length, preset=preset
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


def test_longrope_factors_are_each_questions_own(tokenizer_dir):
    """phi4-micro (LongRoPE, original context 20): questions of 7 to 45 tokens in one batch, plain and
    shared, give each question's logits alone; before, the longest turned all to the long factors."""
    module, rows, specials = choice_module(tokenizer_dir, preset="phi4-micro")
    module.eval()
    with torch.no_grad():
        for layout in (collate, lambda r, pad: collate_shared(r, pad, specials.delim)):
            together = module.terms(layout(rows, specials.pad))["logits"]
            for i in range(len(rows)):
                batch = layout(rows[i : i + 1], specials.pad)
                alone, real = module.terms(batch)["logits"][0], batch.choice_mask[0]
                torch.testing.assert_close(together[i, : len(real)][real], alone[real], rtol=0, atol=1e-5)


def choice_module(
    tokenizer_dir, lm_coef: float = 0.5, context_length: int | None = None, preset: str = "gpt-micro"
):
    """A micro GPTModule without dropout for random multiple-choice rows, the rows and the specials."""
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    rows, task = random_choice_examples(specials, vocab=len(tok) - 5, context_length=context_length)
    torch.manual_seed(0)
    preset, family = FAMILY_MICRO.get(preset, (preset, {}))
    module = GPTModule(
        preset=preset,
        overrides={"n_positions": 64, **NO_DROPOUT, **family},
        vocab_size=len(tok),
        task=task,
        lm_coef=lm_coef,
        classifier_dropout=0.0,
    )
    return module, rows, specials


def padded_module(tokenizer_dir, preset: str = "gpt-micro"):
    module, rows, specials = choice_module(tokenizer_dir, preset=preset)
    return module, collate(rows, specials.pad)


def attention_calls(monkeypatch) -> list[str]:
    """Records how each scaled_dot_product_attention call is masked: 'causal', 'none',
    'lower-right' (a CausalBias) or 'mask' (a materialised mask, which rules out flash)."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        if isinstance(attn_mask, CausalBias):
            calls.append("lower-right")
        else:
            calls.append("mask" if attn_mask is not None else "causal" if is_causal else "none")
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def test_every_batch_kind_but_padded_shared_contexts_runs_without_a_mask(tokenizer_dir, monkeypatch):
    module, right = padded_module(tokenizer_dir)
    module.eval()
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    n_layer = module.gpt.config.n_layer

    def kinds(batch, head=module.head) -> set[str]:
        calls = attention_calls(monkeypatch)
        with torch.no_grad():
            batch_terms(module.gpt, head, batch, lm=True)
        monkeypatch.undo()
        assert len(calls) % n_layer == 0 and calls
        return set(calls)

    blocks = collate_blocks([(i, torch.randint(0, 100, (33,))) for i in range(2)])
    assert kinds(blocks, head=None) == {"causal"}
    assert kinds(right) == {"causal"}
    rows, _ = random_choice_examples(specials, vocab=len(tok) - 5, context_length=9)
    assert kinds(collate_shared(rows, specials.pad, specials.delim)) == {"causal", "lower-right"}
    rows, _ = random_choice_examples(specials, vocab=len(tok) - 5)
    assert kinds(collate_shared(rows, specials.pad, specials.delim)) == {"causal", "mask"}


@cuda
def test_cuda_every_batch_layout_equals_the_plain_one(tokenizer_dir, exact_fp32):
    """On the GPU (fp32, no TF32): shared-context batches equal the plain layout."""
    module, right = padded_module(tokenizer_dir)
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    rows, _ = random_choice_examples(specials, vocab=len(tok) - 5)
    shared = collate_shared(rows, specials.pad, specials.delim)
    module.cuda().eval()
    with torch.no_grad():
        logits = [module.terms(b.__class__(**{k: v.cuda() if torch.is_tensor(v) else v
                                              for k, v in vars(b).items()}))["logits"].cpu()
                  for b in (right, shared)]  # fmt: skip
    real = right.choice_mask
    for other in logits[1:]:
        torch.testing.assert_close(other[real], logits[0][real], rtol=0, atol=1e-5)
