import pytest
import torch

from gpt_ft import GPT, GPTConfig
from tests.helpers import TINY, cuda, tiny_gpt


@pytest.mark.parametrize("preset", ["gpt1", "gpt2"])
def test_presets_have_the_parameter_count_of_transformers(preset):
    from transformers import GPT2Config, GPT2LMHeadModel, OpenAIGPTConfig, OpenAIGPTLMHeadModel

    hf_config = OpenAIGPTConfig() if preset == "gpt1" else GPT2Config()
    config = GPTConfig.from_name(preset)
    with torch.device("meta"):
        ours = GPT(config)
        theirs = (OpenAIGPTLMHeadModel if preset == "gpt1" else GPT2LMHeadModel)(hf_config)
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    assert ours.num_parameters() == {"gpt1": 116_534_784, "gpt2": 124_439_808}[preset]


def test_init_is_normal_0_02():
    gpt = GPT(GPTConfig(vocab_size=4000, n_positions=256, n_embd=128, n_layer=1, n_head=4))
    for p in (gpt.wte.weight, gpt.wpe.weight, gpt.h[0].attn.c_attn.weight, gpt.h[0].mlp.c_proj.weight):
        assert abs(p.mean().item()) < 2e-3
        assert p.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.all(gpt.h[0].attn.c_attn.bias == 0)
    assert torch.all(gpt.h[0].ln_1.weight == 1) and torch.all(gpt.h[0].ln_1.bias == 0)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_causality(pre_ln):
    gpt = tiny_gpt(pre_ln=pre_ln)
    ids = torch.randint(0, TINY["vocab_size"], (2, 40))
    changed = ids.clone()
    t = 17
    changed[:, t + 1 :] = torch.randint(0, TINY["vocab_size"], (2, 40 - t - 1))
    with torch.no_grad():
        a, b = gpt(ids), gpt(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


def test_left_padding_gives_finite_states():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 10))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10])
    with torch.no_grad():
        assert torch.isfinite(gpt(ids, mask)).all()


def test_dropout_is_active_in_training_only():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 10))
    with torch.no_grad():
        assert torch.equal(gpt(ids), gpt(ids))
        gpt.train()
        assert not torch.equal(gpt(ids), gpt(ids))


def test_resize_token_embeddings_keeps_rows_and_inits_new_ones():
    config = GPTConfig(vocab_size=10, n_positions=8, n_embd=512, n_layer=1, n_head=8)
    gpt = GPT(config)
    old = gpt.wte.weight.detach().clone()
    gpt.resize_token_embeddings(13)  # the new rows come out of the padding: the table keeps its 64 rows
    assert gpt.wte.weight.shape == (64, 512) and gpt.config.vocab_size == 13
    assert torch.equal(gpt.wte.weight[:10], old[:10])
    assert (
        config.vocab_size == 10
    )  # the caller's config unchanged (a second GPT(config) is the first's shape)
    assert gpt.wte.weight[10:13].std().item() == pytest.approx(0.02, rel=0.1)
    assert not gpt.wte.weight[13:].any()
    assert gpt.lm_logits(gpt(torch.tensor([[12]]))).shape == (1, 1, 13)
    assert gpt.wte.weight.requires_grad
    kept = gpt.wte.weight.detach().clone()
    gpt.resize_token_embeddings(70)  # past the padding: the table grows to the next multiple of 64
    assert gpt.wte.weight.shape == (128, 512) and torch.equal(gpt.wte.weight[:13], kept[:13])
    with pytest.raises(ValueError, match="can only grow"):
        gpt.resize_token_embeddings(5)


def test_input_longer_than_the_context_errors():
    gpt = tiny_gpt()
    with pytest.raises(ValueError, match="Input of 65 tokens is longer than the model's context of 64"):
        gpt(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize("padded", [False, True])
def test_blocked_attention_equals_sdpa(padded):
    from gpt_ft.model.attention import blocked_causal_attention

    q, k, v = (torch.randn(2, 3, 300, 8) for _ in range(3))  # 300: the last block is partial
    mask = None
    if padded:
        keys = torch.ones(2, 300, dtype=torch.bool)
        keys[1, 200:] = False
        pos = torch.arange(300)
        mask = ((pos[None, :] <= pos[:, None]) & keys[:, None, None, :]) | (pos[None, :] == pos[:, None])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    expected = sdpa(q, k, v, attn_mask=mask, is_causal=mask is None)
    got = blocked_causal_attention(q, k, v, mask, dropout_p=0.0, block=128)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_blocked_attention_keeps_fp64_and_takes_empty_rows():
    from gpt_ft.model.attention import blocked_causal_attention

    q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(
        blocked_causal_attention(q, k, v, None, 0.0, block=16), expected, rtol=0, atol=1e-12
    )
    assert torch.autograd.gradcheck(lambda *x: blocked_causal_attention(*x, None, 0.0, block=16), (q, k, v))
    empty = torch.zeros(2, 0, dtype=torch.long)  # training (dropout: the blocked path) and bf16 at length 0
    assert GPT(GPTConfig.from_name("gpt-micro", vocab_size=50)).train()(empty).shape[:2] == (2, 0)
    assert GPT(GPTConfig.from_name("llama-micro", vocab_size=50)).bfloat16()(empty).shape[:2] == (2, 0)


@pytest.mark.parametrize("packed", [False, True])
def test_cpu_bf16_attention_runs_blocked_as_close_to_fp32_as_sdpa(monkeypatch, packed):
    """In bf16 on a CPU, attention takes blocked_causal_attention (SDPA's CPU flash kernel is 2-4x
    slower there, forward and backward); its outputs and gradients stay as close to fp32's as
    SDPA's own bf16 ones. fp32 keeps SDPA."""
    from gpt_ft.model import attention

    config = GPTConfig(vocab_size=64, n_positions=64, n_embd=64, n_layer=1, n_head=4, n_kv_head=2)
    torch.manual_seed(0)
    attn = attention.CausalSelfAttention(config).eval()  # no dropout
    x0 = torch.randn(3, 40, 64)
    mask = None
    if packed:  # three sequences in each row
        docs = torch.tensor([0] * 15 + [1] * 20 + [2] * 5).expand(3, 40)
        mask = attention.packed_mask(docs, None, torch.arange(40).expand(3, 40))
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        attention.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )

    def run(bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = attn(x, mask, mask is None, None, 0)
        (y.float() * torch.linspace(-1, 1, 64)).sum().backward()
        return y.float().detach(), x.grad

    reference = run(bf16=False)
    assert len(calls) == 1
    blocked = run(bf16=True)
    assert len(calls) == 1  # bf16: no SDPA call
    monkeypatch.setattr(attention, "low_precision", lambda x: False)
    through_sdpa = run(bf16=True)
    assert len(calls) == 2
    for ours, theirs, exact in zip(blocked, through_sdpa, reference):
        error, sdpa_error = (ours - exact).abs().max(), (theirs - exact).abs().max()
        assert 0 < error <= 2 * sdpa_error, (error, sdpa_error)


def test_cpu_bf16_attention_of_long_rows_runs_sdpa(monkeypatch):
    """Past BLOCKED_ROWS positions, bf16 attention on a CPU is SDPA's flash kernel, as fp32's is."""
    from gpt_ft.model import attention

    config = GPTConfig(vocab_size=64, n_positions=512, n_embd=64, n_layer=1, n_head=4, n_kv_head=2)
    torch.manual_seed(0)
    attn = attention.CausalSelfAttention(config).eval()
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        attention.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    for T, expected in ((attention.BLOCKED_ROWS, 0), (attention.BLOCKED_ROWS + 1, 1)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            attn(torch.randn(2, T, 64), None, True, None, 0)
        assert len(calls) == expected, T


def test_blocked_attention_dropout_is_unbiased():
    from gpt_ft.model.attention import blocked_causal_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 20, 4) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    samples = torch.stack([blocked_causal_attention(q, k, v, None, 0.3, block=8) for _ in range(4000)])
    assert not torch.allclose(samples[0], expected, atol=1e-3)  # dropout does change each sample
    torch.testing.assert_close(samples.mean(0), expected, rtol=0, atol=0.06)


def test_padded_embedding_rows_are_never_predicted_counted_or_exported():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=100, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    gpt = GPT(config).eval()
    assert config.padded_vocab_size == 128 and gpt.wte.weight.shape == (128, 32)
    unpadded = GPT(GPTConfig(**{**vars(config), "vocab_multiple": 1})).eval()
    assert unpadded.wte.weight.shape == (100, 32)
    assert gpt.num_parameters() == unpadded.num_parameters()  # padding rows are not parameters of the model
    ids = torch.randint(0, 100, (2, 8))
    logits = gpt.lm_logits(gpt(ids))
    assert logits.shape == (2, 8, 100)  # no logit for a padding id, so none is sampled or in the loss
    # Weights without padding (transformers', older checkpoints) load into the padded table, and back.
    unpadded.load_state_dict(gpt.state_dict())
    torch.testing.assert_close(unpadded.lm_logits(unpadded(ids)), logits)
    gpt.load_state_dict(unpadded.state_dict())
    torch.testing.assert_close(gpt.lm_logits(gpt(ids)), logits)
    hf = gpt.to_hf()
    assert hf.transformer.tokens_embed.weight.shape == (100, 32)
    torch.testing.assert_close(hf(ids).logits, logits)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_right_padding_without_a_mask_equals_the_masked_reference_at_real_positions(pre_ln):
    """Right-padded batches run mask-free (`is_causal`, the flash kernel's case): causal attention
    already keeps real tokens off the pads after them. Outputs at real positions, the loss over
    real targets and every gradient equal those of an explicit padding mask."""
    torch.manual_seed(0)
    gpt = tiny_gpt(pre_ln=pre_ln, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    lengths = torch.tensor([12, 7, 3])
    ids = torch.randint(0, TINY["vocab_size"], (3, 12))
    real = torch.arange(12)[None] < lengths[:, None]  # (B, T)
    ids = ids.masked_fill(~real, 0)  # pad id 0 after each sequence

    def run(mask):
        gpt.zero_grad()
        hidden = gpt(ids, mask)
        logits = gpt.lm_logits(hidden)
        targets = ids[:, 1:].masked_fill(~real[:, 1:], -100)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten())
        loss.backward()
        grads = {n: p.grad.clone() for n, p in gpt.named_parameters() if p.grad is not None}
        return hidden[real], loss.detach(), grads

    free, masked = run(None), run(real.long())
    torch.testing.assert_close(free[0], masked[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(free[1], masked[1], rtol=0, atol=1e-5)
    assert free[2].keys() == masked[2].keys() and len(free[2]) > 0
    for name in free[2]:
        torch.testing.assert_close(free[2][name], masked[2][name], rtol=0, atol=1e-5, msg=name)


@cuda
@pytest.mark.parametrize("pre_ln", [False, True])
def test_cuda_states_equal_the_cpu_and_bf16_stays_close(pre_ln, exact_fp32):
    torch.manual_seed(0)
    gpt = tiny_gpt(pre_ln=pre_ln).eval()
    ids = torch.randint(0, TINY["vocab_size"], (3, 40))
    with torch.no_grad():
        expected = gpt.lm_logits(gpt(ids))
        gpt.cuda()
        torch.testing.assert_close(gpt.lm_logits(gpt(ids.cuda())).cpu(), expected, rtol=0, atol=1e-4)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16 = gpt.lm_logits(gpt(ids.cuda())).float().cpu()
    assert (bf16 - expected).abs().max() < 0.1 * expected.abs().max()


@cuda
def test_cuda_cached_generation_equals_uncached():
    torch.manual_seed(0)
    gpt = tiny_gpt().cuda().eval()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5), device="cuda")
    cached = gpt.generate(prompt, max_new_tokens=20)
    assert torch.equal(cached, gpt.generate(prompt, max_new_tokens=20, use_cache=False))


@pytest.mark.parametrize("preset", ["gpt-micro", "llama-micro"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(preset):
    """Recomputing each block in the backward pass (dropout masks replayed) changes no number."""
    config = GPTConfig.from_name(
        preset, vocab_size=50, n_positions=16, embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1
    )
    torch.manual_seed(0)
    gpt = GPT(config).train()
    ids = torch.randint(0, 50, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[0, 12:] = 0  # a padded row too

    def loss_and_grads(recompute: bool):
        gpt.activation_checkpointing = recompute
        gpt.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout masks in both runs
        loss = gpt.lm_logits(gpt(ids, mask)).float().logsumexp(-1).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in gpt.named_parameters()}

    plain, recomputed = loss_and_grads(False), loss_and_grads(True)
    assert plain[0] == recomputed[0]
    for name, grad in plain[1].items():
        torch.testing.assert_close(recomputed[1][name], grad, rtol=0, atol=1e-6, msg=name)


def test_fit_with_activation_checkpointing(tmp_path, tokenizer_dir):
    from gpt_ft.cli import main
    from tests.helpers import common_args, make_task

    card = make_task("single", tmp_path)
    args = [*common_args(card, tokenizer_dir, tmp_path), "--trainer.max_epochs=1"]
    main(["fit", *args, "--model.activation_checkpointing=true"])
    ckpt = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"]["activation_checkpointing"] is True


def test_gemmas_scaled_embeddings_compile_as_one_graph():
    """Gemma multiplies its embeddings by sqrt(C) rounded to their dtype: a tensor on their device,
    so the forward pass compiles whole (read back as a Python number, it broke the graph)."""
    from tests.helpers import FAMILY_MICRO

    preset, overrides = FAMILY_MICRO["gemma3-micro"]
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name(preset, **overrides)).eval()
    assert gpt.config.scale_embeddings
    ids = torch.randint(0, gpt.config.vocab_size, (2, 8))
    graphs = []

    def counted(graph, inputs):  # a backend that runs each graph as it is, counting them
        graphs.append(graph)
        return graph.forward

    with torch.no_grad():
        eager = gpt(ids)
        compiled = torch.compile(gpt, backend=counted)(ids)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    assert len(graphs) == 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_layers_without_rotary_positions_see_no_positions(device):
    """`nope_layers` (SmolLM3's): a model none of whose layers turns its queries and keys gives the
    same states at any positions (here 3 apart), in fp32 and bf16 (the CPU's blocked attention), also
    with padding; one turning layer makes them differ."""
    torch.manual_seed(0)
    config = GPTConfig.from_name("llama-micro", vocab_size=50, nope_layers=[0, 1])
    gpt = GPT(config).to(device).eval()
    rotary = GPT(GPTConfig.from_name("llama-micro", vocab_size=50, nope_layers=[0])).to(device).eval()
    rotary.load_state_dict(gpt.state_dict())
    # positions 3 apart: rotary attention, which sees the distances between them, changes
    ids, spread = torch.randint(0, 50, (2, 12), device=device), torch.arange(0, 36, 3, device=device)
    mask = torch.ones_like(ids).index_fill_(1, torch.arange(3, device=device), 0)  # left padding
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                assert torch.equal(gpt(ids), gpt(ids, position_ids=spread))
                assert torch.equal(gpt(ids, mask)[:, 3:], gpt(ids, mask, position_ids=spread)[:, 3:])
        assert not torch.allclose(rotary(ids), rotary(ids, position_ids=spread), atol=1e-3)


def test_token_ids_of_another_shape_type_or_range_are_named_in_one_sentence():
    """Their values on the CPU only: on a GPU reading them would wait for the device at every step.
    (An id past the vocabulary read an untrained row of the padded table: 10 tokens, 64 rows.)"""
    gpt = GPT(GPTConfig(vocab_size=10, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    outside = r"^input_ids holds the token id {}, outside the model's vocabulary of 10 \(ids 0 to 9\)\.$"
    for ids, message in (
        (torch.tensor([[1, 10]]), outside.format(10)),
        (torch.tensor([[3, 70]], dtype=torch.int32), outside.format(70)),
        (torch.tensor([[-1, 2]]), outside.format(-1)),
        (torch.tensor([1, 2]), r"^input_ids must be a \(batch, length\) tensor, got shape \(2,\)\.$"),
        (torch.ones(1, 2, 2, dtype=torch.long), r"got shape \(1, 2, 2\)\.$"),
        (
            torch.tensor([[1.0, 2.0]]),
            r"^input_ids must hold integer token ids \(int64 or int32\), got torch\.float32\.$",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            gpt(ids)


def test_a_model_pickles():
    """GPT-1's activation was a lambda: no `torch.save(model)`, and no process started afresh."""
    import pickle

    from gpt_ft import GPT, GPTConfig

    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=50, n_layer=1))
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(pickle.loads(pickle.dumps(gpt)).eval()(ids), gpt.eval()(ids), rtol=0, atol=0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_partial_rotary_turns_the_first_features_of_each_head_alone(device):
    """`rotary_dim` (GPT-NeoX's): each query's and key's first 4 features turn as a 4-wide head's do,
    the other 12 pass as they are; a model of it runs in bf16 (on a CPU, the blocked attention) as
    close to fp32 as the same model rotating whole heads, with left padding."""
    from gpt_ft.model import rope
    from tests.helpers import NEOX_MICRO

    torch.manual_seed(0)
    config = GPTConfig.from_name("llama-micro", vocab_size=50, **NEOX_MICRO)
    x, positions = torch.randn(2, 4, 6, 16, device=device), torch.arange(3, 9, device=device)
    turned = rope.rotate(x, *rope.cos_sin(config, positions, torch.float32))
    narrow = GPTConfig(n_embd=16, n_head=4, n_layer=1, positions="rope", vocab_size=50)  # 4-wide heads
    assert torch.equal(turned[..., 4:], x[..., 4:])
    assert torch.equal(
        turned[..., :4], rope.rotate(x[..., :4], *rope.cos_sin(narrow, positions, torch.float32))
    )
    ids = torch.randint(0, 50, (2, 12), device=device)
    mask = torch.ones_like(ids).index_fill_(1, torch.arange(3, device=device), 0)
    errors = []
    for rotary_dim in (4, None):
        torch.manual_seed(1)
        gpt = GPT(
            GPTConfig.from_name("llama-micro", vocab_size=50, **{**NEOX_MICRO, "rotary_dim": rotary_dim})
        )
        gpt = gpt.to(device).eval()
        with torch.no_grad():
            exact = gpt(ids, mask)[:, 3:]
            with torch.autocast(device, dtype=torch.bfloat16):
                errors.append(float((gpt(ids, mask)[:, 3:].float() - exact).abs().max()))
    assert 0 < errors[0] < 4 * errors[1] and errors[1] < 0.1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_olmo_blocks_normalise_outputs_only_and_queries_and_keys_over_all_heads(device, exact_fp32):
    """OLMo's blocks (`input_norms` false, `qk_norm_span` "all_heads"): no ln_1 or ln_2, q/k norms as
    wide as all query heads and all key heads; left-padded rows in bf16 (on a CPU, the blocked
    attention) close to fp32 (on CUDA, fp32 as the CPU's), and the forward pass compiles whole."""
    from tests.helpers import OLMO2_MICRO

    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("llama-micro", vocab_size=50, **OLMO2_MICRO)).eval()
    block = gpt.h[0]
    assert block.ln_1 is None and block.ln_2 is None and block.post_attn_norm is not None
    assert (block.attn.q_norm.weight.shape, block.attn.k_norm.weight.shape) == (
        (64,),
        (32,),
    )  # 4, 2 heads of 16
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.ones_like(ids).index_fill_(1, torch.arange(3), 0)
    with torch.no_grad():
        exact = gpt(ids, mask)[:, 3:]
        gpt, ids, mask = gpt.to(device), ids.to(device), mask.to(device)
        torch.testing.assert_close(gpt(ids, mask)[:, 3:].cpu(), exact, rtol=0, atol=1e-5)
        with torch.autocast(device, dtype=torch.bfloat16):
            bf16 = gpt(ids, mask)[:, 3:].float().cpu()
        graphs = []
        compiled = torch.compile(gpt, backend=lambda graph, inputs: graphs.append(graph) or graph.forward)
        torch.testing.assert_close(compiled(ids, mask)[:, 3:].cpu(), exact, rtol=0, atol=1e-5)
    assert 0 < (bf16 - exact).abs().max() < 0.1 * exact.abs().max()
    assert len(graphs) == 1
