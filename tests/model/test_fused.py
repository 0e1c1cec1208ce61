"""The fused elementwise work (`gpt_ft.model.fused`): with fusion forced on tiny models and traced
through AOTAutograd (the `aot_eager` backend: TorchInductor's graphs, forward and backward, run
by eager ops, so no C++ compiler is needed), training equals the eager ops to fp32 rounding;
queries, keys and values come out as the eager path hands them to the flash kernel; and fusion
stays off where it does not pay."""

from __future__ import annotations

import pytest
import torch

from gpt_ft.data.batches import collate, collate_packed
from gpt_ft.model import attention, fused, rope
from gpt_ft.model.config import GPTConfig
from gpt_ft.model.norms import RMSNorm
from tests.training.test_packing import assert_same, examples, module_for, run


@pytest.fixture
def forced(monkeypatch):
    """Fusion on every tensor, traced by AOTAutograd without a C++ compiler."""
    monkeypatch.setattr(fused, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fused, "BACKEND", "aot_eager")
    monkeypatch.setattr(fused, "_compiled", {})
    torch.compiler.reset()  # each test's graphs its own
    yield
    torch.compiler.reset()


@pytest.mark.parametrize(
    "shape, family",
    [("steps", "llama-micro"), ("pair", "gemma3-micro"), ("single", "neox-micro"), ("pair", "olmo2-micro")],
)
def test_training_fused_equals_the_eager_ops(tokenizer_dir, monkeypatch, forced, shape, family):
    """Losses, outputs and every gradient to 1e-5 of the eager ops, on rows laid flat (Llama's
    grouped key/value heads, GPT-NeoX's rotary positions on part of each head: the attention's inputs
    fused too; OLMo 2's RMSNorm weighed in fp32 and its q/k norms over all heads, which leave the
    attention's inputs eager) and on the dense mask (Gemma 3's offset RMSNorm, GELU's gated MLP); the
    fused functions did run."""
    module, _, specials = module_for(tokenizer_dir, shape, family)
    rows = examples(module.task, shape, specials, vocab=module.gpt.config.vocab_size - 5, n=12)
    module.train()
    batch = collate_packed(rows, specials.pad)
    flat = family != "gemma3-micro"
    monkeypatch.setattr(attention, "FORCE_KERNEL", "sequences" if flat else None)
    monkeypatch.setattr(fused, "ENABLED", False)
    expected = run(module, batch)
    monkeypatch.setattr(fused, "ENABLED", True)
    calls, real = [], fused.compiled
    monkeypatch.setattr(fused, "compiled", lambda key, fn: calls.append(key) or real(key, fn))
    assert_same(expected, run(module, batch), collate(rows, specials.pad).choice_mask)
    config = module.gpt.config  # (GPT-NeoX's LayerNorm and plain MLP: neither)
    assert ("rms_norm" in calls) == (config.norm != "layernorm")
    assert (f"swiglu-{config.activation}" in calls) == config.gated_mlp
    assert ("split_heads" in calls) == (flat and not config.qk_norm)


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_the_fused_attention_inputs_are_the_eager_ones(rotary_dim):
    """`split_heads` on c_attn's output (bf16, as under autocast): queries and keys rotated in fp32
    then cast (the first 4 features of each head alone, GPT-NeoX's way, the rest as they are), grouped
    key/value heads as they are: exactly the eager path's."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_head=6, n_kv_head=2, n_embd=48, positions="rope", vocab_size=10,
                       rotary_dim=rotary_dim)  # fmt: skip
    nh, nkv, hs, T = 6, 2, 8, 5
    qkv = torch.randn(1, T, (nh + 2 * nkv) * hs).bfloat16()
    cos, sin = rope.cos_sin(config, torch.arange(T), torch.float32)
    q, k, v = fused.split_heads(qkv, (nh, nkv, hs), cos, sin, torch.bfloat16)
    eq, ek, ev = (t.view(1, T, -1, hs).transpose(1, 2) for t in qkv.split([nh * hs, nkv * hs, nkv * hs], 2))
    eq0 = eq
    eq, ek = rope.rotate(eq, cos, sin).bfloat16(), rope.rotate(ek, cos, sin).bfloat16()
    assert torch.equal(q, eq) and q.is_contiguous() and q.dtype == torch.bfloat16
    assert torch.equal(k, ek) and torch.equal(v, ev) and k.shape[1] == nkv
    turned = cos.shape[-1]
    assert turned == (rotary_dim or hs) and torch.equal(q[..., turned:], eq0[..., turned:].bfloat16())
    assert k.is_contiguous() and v.is_contiguous()


def test_a_norm_feeding_a_matmul_hands_over_autocasts_dtype(forced):
    """Under bf16 autocast a block's ln_1 returns bf16 (what its matmul would cast to), equal to the
    eager output cast; a norm whose output goes elsewhere keeps the eager dtype."""
    torch.manual_seed(0)
    norm = RMSNorm(16, 1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(3, 16, requires_grad=True)
    eager = norm(x).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept = norm(x)
        norm.feeds_matmul = True
        handed = norm(x)
    assert kept.dtype == torch.float32 and handed.dtype == torch.bfloat16
    torch.testing.assert_close(kept.detach(), eager, rtol=0, atol=1e-6)
    assert torch.equal(handed.detach(), eager.bfloat16())


def test_fusion_is_off_where_it_does_not_pay(monkeypatch):
    """Small tensors, inference, another device, fusion switched off, no C++ compiler."""
    big = torch.zeros(fused.MIN_ELEMENTS)
    assert fused.wanted(big) == fused.has_compiler()
    assert not fused.wanted(torch.zeros(fused.MIN_ELEMENTS - 1))
    with torch.no_grad():
        assert not fused.wanted(big)
    assert not fused.wanted(torch.zeros(fused.MIN_ELEMENTS, device="meta"))
    monkeypatch.setattr(fused, "ENABLED", False)
    assert not fused.wanted(big)
    monkeypatch.setattr(fused, "ENABLED", True)
    monkeypatch.setattr(fused, "has_compiler", lambda: False)
    assert not fused.wanted(big)


def test_each_fused_function_compiles_once_for_every_batch_shape(tokenizer_dir, monkeypatch, forced):
    """Rows laid flat (a batch of one row), whole rows, batches of other sizes: one graph each for
    a batch of one row and for more (dynamic sizes, except a size of 1, which compiles its own)."""
    graphs = []

    def counting(graph, inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(fused, "BACKEND", counting)
    module, _, specials = module_for(tokenizer_dir, "steps", "llama-micro")
    module.train()
    for n, kernel in [(12, "sequences"), (7, "sequences"), (12, "dense"), (5, "dense")]:
        monkeypatch.setattr(attention, "FORCE_KERNEL", kernel)
        rows = examples(module.task, "steps", specials, vocab=module.gpt.config.vocab_size - 5, n=n)
        module.losses(collate_packed(rows, specials.pad))[0].backward()
    assert len(graphs) == 5  # rms_norm and swiglu flat and dense, split_heads (flat rows only)


def test_the_compiler_checked_is_the_one_torchinductor_takes(monkeypatch):
    """`$CXX` where set (a missing one crashed the first large step: TorchInductor takes no other),
    else g++; a clang++ on the PATH does not stand in for either."""
    import shutil

    on_path = {"clang++"}
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}" if name in on_path else None)
    for cxx, found in [("/nonexistent/g++", False), ("clang++", True), ("", False), (None, False)]:
        if cxx is None:
            monkeypatch.delenv("CXX", raising=False)
        else:
            monkeypatch.setenv("CXX", cxx)
        fused.has_compiler.cache_clear()
        assert fused.has_compiler() is found, cxx
    on_path.add("g++")
    fused.has_compiler.cache_clear()
    assert fused.has_compiler()
    fused.has_compiler.cache_clear()  # the machine's own, for the tests after
