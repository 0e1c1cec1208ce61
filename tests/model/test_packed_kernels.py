"""Packed rows on each kernel: the collator's offsets and FlexAttention's block mask equal the dense
mask position by position, and a whole model run on each kernel (FlexAttention in eager mode, the
variable-length kernel's contract played by a reference on the CPU; on a CPU, rows laid flat with
each sequence on its own flash calls) equals the padded batch. On CUDA the same runs go through the
real kernels, never the math fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt_ft.data.batches import collate, collate_packed
from gpt_ft.model import attention, kernels, sequences
from gpt_ft.model.attention import PackedRows, packed_mask, segment_offsets
from gpt_ft.model.sequences import flat_rows
from gpt_ft.workarounds.kernels import cpu_flash_forward
from tests.helpers import cuda
from tests.training.test_packing import assert_same, examples, module_for, run

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def mask_of_offsets(cu_seqlens: torch.Tensor, R: int, L: int) -> torch.Tensor:
    """The (R, L, L) mask that `varlen_attn` applies causally to segments at `cu_seqlens`."""
    flat = torch.arange(R * L)
    segment = torch.searchsorted(cu_seqlens[1:].long(), flat, right=True).view(R, L)
    index = torch.arange(L)
    return (segment[:, :, None] == segment[:, None, :]) & (index[None, :] <= index[:, None])


@pytest.mark.parametrize("shape", ["single", "pair", "similarity", "rerank", "multi-label"])
def test_the_collators_offsets_are_the_dense_mask_position_by_position(tokenizer_dir, shape):
    _, rows, specials = module_for(tokenizer_dir, shape, "gpt1-micro")
    batch = collate_packed(rows, specials.pad)
    R, L = batch.input_ids.shape
    assert batch.cu_seqlens.dtype == torch.int32 and int(batch.cu_seqlens[-1]) == R * L
    assert batch.max_seqlen == int(batch.cu_seqlens.diff().max())
    cu, longest = segment_offsets(batch.documents)  # the model's own, from `documents` alone
    assert torch.equal(cu, batch.cu_seqlens) and longest == batch.max_seqlen
    dense = packed_mask(batch.documents, None, batch.position_ids)[:, 0]
    assert torch.equal(mask_of_offsets(batch.cu_seqlens, R, L), dense)


def literal_rows(lengths: list[int]):
    rows = [{"input_ids": [list(range(1, n + 1))], "extract_index": [n - 1], "label": 0, "index": i}
            for i, n in enumerate(lengths)]  # fmt: skip
    return collate_packed(rows, 0)


def test_literal_offsets_of_packed_rows():
    """Units of 300, 200, 250, 100 and 40 tokens: rows of 300, the second with a 10-token tail."""
    batch = literal_rows([300, 200, 250, 100, 40])
    assert batch.documents.tolist() == [
        [0] * 300, [0] * 250 + [1] * 40 + [-1] * 10, [0] * 200 + [1] * 100
    ]  # fmt: skip
    assert batch.cu_seqlens.tolist() == [0, 300, 550, 590, 600, 800, 900] and batch.max_seqlen == 300


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("shape", ["choice", "preference", "pair"])
def test_the_block_mask_is_the_dense_mask_position_by_position(tokenizer_dir, shape, window):
    from torch.nn.attention.flex_attention import create_mask

    module, rows, specials = module_for(tokenizer_dir, shape, "gpt1-micro")
    delim = specials.delim if module.task.shares_context else None
    batch = collate_packed(rows, specials.pad, delim)
    assert (batch.branches is not None) == (shape != "pair")
    packed = PackedRows(batch.documents, batch.branches, batch.position_ids, window)
    R, L = batch.input_ids.shape
    block = create_mask(packed.block_mask().mask_mod, R, 1, L, L, device="cpu")
    assert torch.equal(block, packed.dense()) and packed.dense().any(-1).all()


def test_the_block_masks_rule_writes_nothing_in_place():
    """Compiled FlexAttention (always, on CUDA) lowers the mask rule as a pointwise subgraph, which
    refuses in-place ops (Inductor's "Buffers cannot be created while lowering a pointwise
    subgraph"); eager mode takes them, so the rule's calls are read here."""
    from torch.overrides import TorchFunctionMode

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    documents = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 0, 0]])
    branches = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 0, 1, 1, 2, 2]])
    packed = PackedRows(documents, branches, torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]), 2)
    rule, names, i = packed.block_mask().mask_mod, [], torch.tensor(1)
    with Calls():
        rule(i, i, i, i)
    in_place = [n for n in names if n.startswith("__i") or (n.endswith("_") and not n.endswith("__"))]
    assert "__and__" in names and not in_place and "__setitem__" not in names


def forward(module, batch) -> tuple[dict, torch.Tensor, dict]:
    """`run`'s terms and loss without gradients (`assert_same` then compares no gradients)."""
    with torch.no_grad():
        terms = module.terms(batch)
        loss, _ = module.losses(batch)
    return terms, loss, {"": torch.zeros(())}


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), scale=None, enable_gqa=False,
                     is_causal=None):  # fmt: skip
    """`torch.nn.attention.varlen.varlen_attn`'s contract, one segment at a time through SDPA."""
    assert torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32 and max_q == max_k == int(cu_q.diff().max())
    assert q.ndim == 3 and (window_size[1] == 0 or is_causal)
    out = torch.empty_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        i = torch.arange(b - a)
        allowed = i[None, :] <= i[:, None]
        if window_size[0] >= 0:
            allowed &= i[:, None] - i[None, :] <= window_size[0]
        seg = [t[a:b].transpose(0, 1) for t in (q, k, v)]  # (heads, n, hs)
        y = F.scaled_dot_product_attention(*seg, attn_mask=allowed, scale=scale, enable_gqa=enable_gqa)
        out[a:b] = y.transpose(0, 1)
    return out


@pytest.mark.parametrize("kernel", ["varlen", "flex"])
@pytest.mark.parametrize(
    "shape, family",
    [
        ("pair", "gpt1-micro"),
        ("rerank", "llama-micro"),
        ("single", "gemma3-micro"),
        ("choice", "qwen3-micro"),
        ("pair", "neox-micro"),
        ("pair", "olmo2-micro"),
    ],  # noqa: E501
)
def test_packed_rows_on_each_kernel_equal_the_padded_batch(tokenizer_dir, monkeypatch, kernel, shape, family):
    """Losses, gradients and outputs to 1e-5 with no dense mask built: grouped key/value heads
    (Llama, Qwen3), Gemma 3's sliding window and query scale, shared contexts (flex only).
    FlexAttention has no backward on a CPU: there its forward pass is compared (eval mode)."""
    module, rows, specials = module_for(tokenizer_dir, shape, family)
    if kernel == "varlen" and module.task.shares_context:
        pytest.skip("shared contexts run on FlexAttention")
    module.train(kernel == "varlen")
    padded = collate(rows, specials.pad)
    packed = collate_packed(rows, specials.pad, specials.delim if module.task.shares_context else None)
    compare = run if kernel == "varlen" else forward
    expected = compare(module, padded)
    calls = []
    monkeypatch.setattr(attention, "FORCE_KERNEL", kernel)
    spy = lambda *a, **k: calls.append(k) or reference_varlen(*a, **k)  # noqa: E731
    monkeypatch.setattr(kernels, "varlen_attn", spy)
    monkeypatch.setattr(kernels, "VARLEN", {"window_size", "scale", "enable_gqa"})
    monkeypatch.setattr(PackedRows, "dense", lambda self: pytest.fail("a dense mask was built"))
    assert_same(expected, compare(module, packed), padded.choice_mask)
    n_layer = module.gpt.config.n_layer  # run() takes two forward passes: the terms, then the loss
    assert len(calls) == (2 * n_layer if kernel == "varlen" else 0)
    if kernel == "varlen" and family == "gemma3-micro":  # its local layers see 6 positions: 5 back
        assert {c["window_size"] for c in calls} == {(-1, 0), (5, 0)}


def assert_as_close_as_padded(bf16_packed, bf16_padded, fp32, choice_mask) -> None:
    """The packed bf16 logits are within twice the padded bf16 run's own error from fp32's (plus
    1e-3): compared at real choices where the logits are a choice's each, whole otherwise (a class
    per label)."""
    real = lambda t: t[choice_mask] if t.shape == choice_mask.shape else t  # noqa: E731
    expected = real(fp32[0]["logits"])
    err_padded = (real(bf16_padded[0]["logits"]).float() - expected).abs().max()
    err_packed = (real(bf16_packed[0]["logits"]).float() - expected).abs().max()
    assert err_packed <= 2 * err_padded + 1e-3, (float(err_packed), float(err_padded))


@pytest.mark.parametrize(
    "shape, family, kernel", [("pair", "gpt2-micro", "varlen"), ("choice", "llama-micro", "flex")]
)
def test_packed_rows_under_bf16_autocast_are_as_close_to_fp32_as_the_padded_batch(
    tokenizer_dir, monkeypatch, shape, family, kernel
):
    """The CUDA test's bf16 comparison on the CPU: the variable-length kernel's contract played by
    the reference (pairs: logits of a class each), FlexAttention eager in eval mode (choices)."""
    module, rows, specials = module_for(tokenizer_dir, shape, family)
    module.train(kernel == "varlen")
    compare = run if kernel == "varlen" else forward
    padded = collate(rows, specials.pad)
    packed = collate_packed(rows, specials.pad, specials.delim if module.task.shares_context else None)
    fp32 = compare(module, padded)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_padded = compare(module, padded)
        monkeypatch.setattr(attention, "FORCE_KERNEL", kernel)
        monkeypatch.setattr(kernels, "varlen_attn", reference_varlen)
        monkeypatch.setattr(kernels, "VARLEN", {"window_size", "scale", "enable_gqa"})
        bf16_packed = compare(module, packed)
    assert_as_close_as_padded(bf16_packed, bf16_padded, fp32, padded.choice_mask)


@pytest.mark.parametrize("kernel", ["varlen", "flex"])
def test_the_kernels_get_queries_keys_and_values_of_one_low_precision_dtype_under_autocast(
    tokenizer_dir, monkeypatch, kernel
):
    """Under bf16 autocast rotary positions leave queries and keys in fp32 (cos and sin are), and
    neither FlashAttention's variable-length kernel nor FlexAttention's backward takes mixed dtypes:
    they get all three in bf16, as SDPA casts its inputs (and as its padded batch attends)."""
    module, rows, specials = module_for(tokenizer_dir, "pair", "llama-micro")
    dtypes = []

    def spy(q, k, v, *args, **kwargs):
        dtypes.append((q.dtype, k.dtype, v.dtype))
        return torch.zeros_like(q)  # (N, heads, hs), the kernels' layout

    monkeypatch.setattr(attention, "FORCE_KERNEL", kernel)
    monkeypatch.setattr(kernels, "varlen_attn", spy)
    monkeypatch.setattr(kernels, "VARLEN", {"window_size", "scale", "enable_gqa"})
    monkeypatch.setattr(kernels, "flex", lambda device: lambda q, k, v, **kw: spy(q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        module.terms(collate_packed(rows, specials.pad))
    assert dtypes and set(dtypes) == {(torch.bfloat16,) * 3}


def test_rows_are_laid_flat_where_that_costs_less():
    """Rows of 300 (sequences of 300, 200, 250, 100, 40) cost 965.8 positions on the dense mask and
    1,259.9 laid flat (890 + 49.9 of attention + 5 · 64): they stay. Rows of 700 (sequences of 700,
    600, 500, 400 and 300; tails of 100 and 200) cost 3,278.5 dense and 3,149.6 flat: laid flat,
    the tails dropped, the sequences in order."""
    short = literal_rows([300, 200, 250, 100, 40])
    assert flat_rows(short.documents, short.cu_seqlens, short.position_ids) is None
    long = literal_rows([700, 600, 500, 400, 300])
    assert long.documents.shape == (4, 700)
    flat = flat_rows(long.documents, long.cu_seqlens, long.position_ids)
    assert flat.bounds == [(0, 700), (700, 1300), (1300, 1800), (1800, 2200), (2200, 2500)]
    assert flat.keep.tolist() == [*range(700), *range(700, 1300), *range(1400, 1900), *range(2100, 2800)]
    assert flat.positions.tolist() == [[*range(700), *range(600), *range(500), *range(400), *range(300)]]
    forced = flat_rows(short.documents, None, short.position_ids, force=True)  # offsets from documents
    assert forced.bounds == [(0, 300), (300, 550), (550, 590), (590, 790), (790, 890)]
    rows = forced.unflatten(torch.arange(890.0)[None, :, None])  # back in the rows, zero in the tail
    assert rows[..., 0].tolist() == [[*range(300)], [*range(300, 590), *[0] * 10], [*range(590, 890)]]


@pytest.mark.parametrize(
    "shape, family",
    [
        ("pair", "gpt1-micro"),
        ("similarity", "gpt2-micro"),
        ("rerank", "llama-micro"),
        ("steps", "qwen3-micro"),
        ("ranking", "llama-micro"),
        ("single", "neox-micro"),
        ("steps", "olmo2-micro"),
    ],
)
def test_packed_rows_laid_flat_equal_the_padded_batch(tokenizer_dir, monkeypatch, shape, family):
    """On a CPU, rows laid flat (the tails dropped, each sequence's attention on its own flash
    calls): losses, gradients and outputs to 1e-5 of the padded batch, with no dense mask built and
    one flash forward per sequence and layer. GPT-1's learned positions and post-LN, grouped
    key/value heads (Llama), Qwen3's per-head norms, OLMo 2's over all heads."""
    module, _, specials = module_for(tokenizer_dir, shape, family)
    rows = examples(module.task, shape, specials, vocab=module.gpt.config.vocab_size - 5, n=40)
    module.train()
    padded, packed = collate(rows, specials.pad), collate_packed(rows, specials.pad)
    assert (packed.documents < 0).any()  # some row has a tail to drop
    monkeypatch.setattr(sequences.fused, "ENABLED", False)  # fusion: test_fused.py (cold: 10-25 s)
    expected = run(module, padded)
    calls = []
    flash = lambda q, *rest: calls.append(q.shape[2]) or cpu_flash_forward(q, *rest)  # noqa: E731
    monkeypatch.setattr(sequences, "cpu_flash_forward", flash)
    monkeypatch.setattr(attention, "FORCE_KERNEL", "sequences")
    monkeypatch.setattr(PackedRows, "dense", lambda self: pytest.fail("a dense mask was built"))
    assert_same(expected, run(module, packed), padded.choice_mask)
    cu = packed.cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu, cu[1:]) if packed.documents.flatten()[a] >= 0]
    assert calls == 2 * module.gpt.config.n_layer * lengths  # run() takes two forward passes


def test_rows_not_laid_flat_run_on_the_dense_mask_when_sequences_are_forced(tokenizer_dir, monkeypatch):
    """FORCE_KERNEL "sequences" on shared contexts (rows with branches, never laid flat): the dense
    mask, as without it (it ran FlexAttention, which has no backward on a CPU)."""
    module, rows, specials = module_for(tokenizer_dir, "rerank", "llama-micro")
    module.train()
    padded, packed = collate(rows, specials.pad), collate_packed(rows, specials.pad, specials.delim)
    expected = run(module, padded)
    monkeypatch.setattr(attention, "FORCE_KERNEL", "sequences")
    assert_same(expected, run(module, packed), padded.choice_mask)


def attention_grads(q, k, v, grad, bounds, attend):
    """The output and the gradients of q, k, v of `attend` over the sequences at `bounds`."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v)
    out.backward(grad.to(out.dtype))
    return [out, q.grad, k.grad, v.grad]


@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])
def test_the_scores_backward_is_as_close_to_fp64_as_flashs(monkeypatch, heads):
    """bf16 sequences of 5, 17 and 40 positions (grouped key/value heads or not), the two shorter
    on `scores_backward`, the longest on the flash kernel's backward: the gradients of q, k and v
    within 1.2x the flash backward's error against fp64 (in fact closer: dk and dv summed in fp32),
    at most 1%; the outputs are the flash forward's either way."""
    nh, nkv = heads
    bounds, N, hs = [(0, 5), (5, 22), (22, 62)], 62, 16
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, h, N, hs, generator=gen) for h in (nh, nkv, nkv, nh))
    q = q * 3  # peaked probabilities, as trained models' are

    def exact(q, k, v):
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        parts = [F.scaled_dot_product_attention(*(t[:, :, s:e] for t in (q, k, v)), is_causal=True)
                 for s, e in bounds]  # fmt: skip
        return torch.cat(parts, dim=2)

    bf16 = [t.bfloat16() for t in (q, k, v, grad)]
    reference = attention_grads(*(t.double() for t in bf16), bounds, exact)
    flat = lambda q, k, v: sequences.SequenceAttention.apply(q, k, v, bounds, None)  # noqa: E731
    monkeypatch.setattr(sequences.fused, "BACKEND", "aot_eager")  # no C++ compiler needed
    monkeypatch.setattr(sequences.fused, "_compiled", {})
    monkeypatch.setattr(sequences.fused, "has_compiler", lambda: True)
    monkeypatch.setattr(sequences, "bf16_units", lambda: True)
    monkeypatch.setattr(sequences, "SCORES_LONGEST", 20)
    scored, real = [], sequences.scores_backward
    spy = lambda q, *rest: scored.append(q.shape[2]) or real(q, *rest)  # noqa: E731
    monkeypatch.setattr(sequences, "scores_backward", spy)
    ours = attention_grads(*bf16, bounds, flat)
    assert scored == [5, 17]
    monkeypatch.setattr(sequences, "SCORES_LONGEST", 0)
    flash = attention_grads(*bf16, bounds, flat)
    assert scored == [5, 17]
    assert torch.equal(ours[0], flash[0])
    for s, e in bounds:
        for name, a, b, r in zip(["dq", "dk", "dv"], ours[1:], flash[1:], reference[1:]):
            error = lambda x: float((x[:, :, s:e].double() - r[:, :, s:e]).norm() / r[:, :, s:e].norm())  # noqa: E731
            assert error(a) <= max(1.2 * error(b), 1e-3) and error(a) < 1e-2, (name, s, e, error(a), error(b))


def test_which_rows_are_laid_flat(tokenizer_dir, monkeypatch):
    """Rows that cost less flat are laid flat on a CPU, except with shared contexts, attention
    dropout while training, a sliding window (Gemma 3) or another kernel forced."""
    long = literal_rows([700, 600, 500, 400, 300])
    gpt = module_for(tokenizer_dir, "pair", "llama-micro")[0].gpt.eval()
    flat = lambda model, branches=None: model._flat_rows(long.documents, branches, long.cu_seqlens,  # noqa: E731
                                                         long.position_ids)  # fmt: skip
    assert flat(gpt) is not None and flat(gpt, branches=torch.zeros_like(long.documents)) is None
    gpt.h[0].attn.attn_pdrop = 0.1
    assert flat(gpt) is not None and flat(gpt.train()) is None
    assert flat(module_for(tokenizer_dir, "pair", "gemma3-micro")[0].gpt.eval()) is None
    monkeypatch.setattr(attention, "FORCE_KERNEL", "dense")
    assert flat(gpt.eval()) is None


def test_long_rows_laid_flat_under_inference_mode_equal_the_dense_mask(tokenizer_dir, monkeypatch):
    """Rows of 700 laid flat by the model's own choice, as `Classifier` and evaluation run them
    (inference mode, Llama's grouped heads): the hidden states of real tokens to 1e-5 of the dense
    mask's; the tails' are zero."""
    long = literal_rows([700, 600, 500, 400, 300])
    gpt = module_for(tokenizer_dir, "pair", "llama-micro")[0].gpt.eval()
    ids = long.input_ids % gpt.config.vocab_size
    inputs = dict(position_ids=long.position_ids, documents=long.documents, cu_seqlens=long.cu_seqlens)
    with torch.inference_mode():
        flat = gpt(ids, **inputs)
        monkeypatch.setattr(attention, "FORCE_KERNEL", "dense")
        dense = gpt(ids, **inputs)
    real = long.documents >= 0
    torch.testing.assert_close(flat[real], dense[real], rtol=0, atol=1e-5)
    assert not flat[~real].any() and dense[~real].any()


def test_attention_dropout_goes_to_flashs_own_forward_and_backward(tokenizer_dir, monkeypatch):
    """Under attention dropout packed rows run `FlashVarlenDropout`: the rate, offsets, window and
    scale reach the flash forward, its saved tensors the backward. Played on the CPU by the reference
    without dropout, the run equals the padded batch's without attention dropout."""
    module, rows, specials = module_for(tokenizer_dir, "pair", "gemma3-micro")
    module.train()
    padded, packed = collate(rows, specials.pad), collate_packed(rows, specials.pad)
    expected = run(module, padded)
    seen = []

    def forward(
        q, k, v, cu_q, cu_k, max_q, max_k, p, causal, debug, *, scale, window_size_left, window_size_right
    ):
        seen.append((p, causal, window_size_left, window_size_right))
        out = reference_varlen(
            q, k, v, cu_q, cu_k, max_q, max_k, window_size=(window_size_left, 0), scale=scale
        )
        return out, torch.zeros(()), torch.zeros(2), torch.zeros(()), torch.zeros(())

    def backward(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, p, causal, rng, unused, *, scale,
                 window_size_left, window_size_right):  # fmt: skip
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in (q, k, v)]
            y = reference_varlen(
                *inputs, cu_q, cu_k, max_q, max_k, window_size=(window_size_left, 0), scale=scale
            )
            return torch.autograd.grad(y, inputs, grad)

    monkeypatch.setattr(attention, "FORCE_KERNEL", "varlen")
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", forward)  # what the workarounds call
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_backward", backward)
    for block in module.gpt.h:
        block.attn.attn_pdrop = 0.1
    assert_same(expected, run(module, packed), padded.choice_mask)
    assert set(seen) == {(0.1, True, -1, 0), (0.1, True, 5, 0)}  # Gemma 3: full and sliding layers


def test_the_kernel_each_batch_takes():
    """The dense mask on a CPU; on CUDA the variable-length kernel for bf16 rows of whole sequences
    (with or without attention dropout), FlexAttention for shared contexts and fp32 without
    attention dropout, and the dense mask for them with it."""
    documents = torch.zeros(1, 4, dtype=torch.long)
    plain, shared = PackedRows(documents, None, documents), PackedRows(documents, documents, documents)
    q = torch.zeros(1, 2, 4, 8)
    assert plain.kernel(q, 0.0) == shared.kernel(q, 0.0) == "dense"
    fake_cuda = type("Q", (), {"device": torch.device("cuda"), "dtype": torch.bfloat16, "shape": q.shape})()
    kernels.load()
    varlen = kernels.varlen_attn is not None
    assert plain.kernel(fake_cuda, 0.0) == ("varlen" if varlen else "flex")
    assert plain.kernel(fake_cuda, 0.1) == ("varlen" if varlen else "dense")  # flash draws the dropout
    assert shared.kernel(fake_cuda, 0.0) == "flex" and shared.kernel(fake_cuda, 0.1) == "dense"
    fake_cuda.dtype = torch.float32
    assert plain.kernel(fake_cuda, 0.0) == "flex" and plain.kernel(fake_cuda, 0.1) == "dense"


def test_a_forced_kernel_that_cannot_run_shared_contexts_says_so(monkeypatch):
    """The variable-length kernel has no branches: forced onto shared contexts, choices would see
    each other and a test comparing with the padded batch could pass on the wrong kernel."""
    monkeypatch.setattr(attention, "FORCE_KERNEL", "varlen")
    documents = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="FORCE_KERNEL 'varlen' cannot run shared contexts"):
        PackedRows(documents, documents, documents).kernel(torch.zeros(1, 2, 4, 8), 0.0)


@cuda
@pytest.mark.parametrize(
    "shape, family",
    [("pair", "llama-micro"), ("pair", "gpt2-micro"), ("choice", "llama-micro"), ("rerank", "llama-micro")],
)
def test_cuda_packed_rows_run_varlen_or_flex_and_equal_the_padded_batch(
    tokenizer_dir, shape, family, monkeypatch, exact_fp32
):
    """fp32 (FlexAttention): logits and gradients to 1e-5 of the padded batch; bf16 (varlen for
    whole sequences): within twice the padded run's own bf16-vs-fp32 error. The profile shows the
    variable-length kernel, or compiled FlexAttention was called (Inductor names its kernel as it
    will), and no dense SDPA call. Pairs run on Llama's grouped key/value heads and on GPT-2's
    one key/value head a query head."""
    from torch.profiler import ProfilerActivity, profile

    flexed, flex = [], kernels.flex
    monkeypatch.setattr(kernels, "flex", lambda device: flexed.append(device.type) or flex(device))
    module, rows, specials = module_for(tokenizer_dir, shape, family)
    module.cuda().train()
    shares = module.task.shares_context
    padded = collate(rows, specials.pad)
    packed = collate_packed(rows, specials.pad, specials.delim if shares else None)
    on = lambda b: b.__class__(**{k: v.cuda() if torch.is_tensor(v) else v for k, v in vars(b).items()})  # noqa: E731
    padded, packed = on(padded), on(packed)
    assert_same(run(module, padded), run(module, packed), padded.choice_mask.cuda())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        flexed.clear()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            bf16_packed = run(module, packed)
        bf16_padded = run(module, padded)
    fp32 = run(module, padded)
    ops = {e.name for e in prof.events()}
    assert not any("scaled_dot_product" in o for o in ops), sorted(o for o in ops if "attention" in o)
    if shares:
        assert flexed and set(flexed) == {"cuda"}, flexed
    else:
        assert not flexed and any("varlen" in o for o in ops), sorted(ops)[:50]
    assert_as_close_as_padded(bf16_packed, bf16_padded, fp32, padded.choice_mask)


@cuda
def test_cuda_flash_varlen_dropout_equals_varlen_attn_without_dropout_and_is_unbiased_with_it():
    """`FlashVarlenDropout` at rate 0: `varlen_attn`'s outputs and gradients; at 0.1: the same draw
    for the same seed (the backward replays the forward's mask), and the mean of 300 draws within
    0.02 of the output without dropout."""
    from gpt_ft.model.kernels import FlashVarlenDropout

    kernels.load()
    varlen_attn = kernels.varlen_attn
    if varlen_attn is None:
        pytest.skip("torch.nn.attention.varlen needs torch >= 2.9")
    torch.manual_seed(0)
    lengths = [37, 5, 90, 1, 64]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(sum(lengths), 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))  # fmt: skip
    grad = torch.randn(sum(lengths), 4, 64, device="cuda", dtype=torch.bfloat16)

    def run(fn):
        out = fn()
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad))

    causal = {"window_size": (-1, 0)} if "window_size" in kernels.VARLEN else {"is_causal": True}
    reference = run(lambda: varlen_attn(q, k, v, cu, cu, 90, 90, **causal))
    for got, want in zip(run(lambda: FlashVarlenDropout.apply(q, k, v, cu, 90, 0.0, None, -1)), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-2)
    draws = []
    for seed in (1, 1, *range(2, 300)):
        torch.manual_seed(seed)
        draws.append(run(lambda: FlashVarlenDropout.apply(q, k, v, cu, 90, 0.1, None, -1)))
    assert all(torch.equal(a, b) for a, b in zip(draws[0], draws[1]))
    assert not torch.equal(draws[0][0], draws[2][0])
    mean = torch.stack([d[0].float() for d in draws[1:]]).mean(0)
    assert (mean - reference[0].float()).abs().mean() < 0.02


@cuda
def test_cuda_varlen_on_grouped_key_value_heads_equals_the_heads_repeated():
    """Packed rows of Llama's grouped heads (4 query heads on 2 key/value heads) on the variable-length
    kernel, bf16: outputs and gradients those of the key/value heads repeated for each query head,
    where the kernel takes them as they are (`enable_gqa`) or not."""
    kernels.load()
    if kernels.varlen_attn is None:
        pytest.skip("torch.nn.attention.varlen needs torch >= 2.9")
    torch.manual_seed(0)
    documents = torch.tensor([[0] * 37 + [1] * 27, [0] * 50 + [-1] * 14], device="cuda")
    positions = torch.cat([torch.arange(37), torch.arange(27), torch.arange(50), torch.arange(14)]).view(
        2, 64
    )
    rows = PackedRows(documents, None, positions.cuda())
    q = torch.randn(2, 4, 64, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.randn(2, 2, 64, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)
    )
    grad = torch.randn(2, 4, 64, 16, device="cuda", dtype=torch.bfloat16)

    def run(k_heads, v_heads):
        out = rows.attend("varlen", q, k_heads, v_heads, None)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad))

    grouped = run(k, v)
    repeated = run(k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    for got, want, name in zip(grouped, repeated, ("out", "dq", "dk", "dv")):
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-2, msg=name)
