import pytest
import torch

from gpt_ft import GPT, GPTConfig
from gpt_ft.model.cache import StaticKVCache
from tests.helpers import TINY, cuda, tiny_gpt


def test_kv_cache_prefill_in_chunks_equals_full_forward():
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 30))
    cache = gpt.new_kv_cache(2)
    with torch.no_grad():
        full = gpt(ids)
        chunks = [
            gpt(ids[:, :12], kv_cache=cache),
            gpt(ids[:, 12:13], kv_cache=cache),
            gpt(ids[:, 13:], kv_cache=cache),
        ]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", ["gpt-micro", "llama-micro"])
def test_new_tokens_over_a_cache_run_under_bf16_autocast(preset):
    """Several new tokens over cached keys take SDPA's lower-right causal bias, which checks the
    dtypes before autocast casts them: rotary q and k are fp32 there, a cache keeps fp32 keys. A
    shared context's choices (packing off, bf16-mixed) crashed on it."""
    from gpt_ft.model import SharedPrefix

    gpt = GPT(GPTConfig.from_name(preset, pre_ln=True)).eval()
    context, answers = torch.randint(0, 100, (2, 9)), torch.randint(0, 100, (4, 5))
    with torch.no_grad():
        full = gpt(torch.cat([context.repeat_interleave(2, dim=0), answers], dim=1))[:, 9:]
        for cache in (SharedPrefix(), gpt.new_kv_cache(4)):
            with torch.autocast("cpu", torch.bfloat16):
                if isinstance(cache, SharedPrefix):
                    gpt(context, kv_cache=cache)
                    cache = cache.continued(2)
                else:
                    gpt(context.repeat_interleave(2, dim=0), kv_cache=cache)
                out = gpt(answers, position_ids=(9 + torch.arange(5)).expand(4, 5), kv_cache=cache)
            torch.testing.assert_close(out.float(), full, rtol=0, atol=0.05)


def test_keys_that_do_not_fit_a_cache_are_one_sentence():
    gpt = tiny_gpt()
    for static in (False, True):
        cache = gpt.new_kv_cache(1, max_len=5, static=static)
        with torch.no_grad():
            gpt(torch.ones(1, 4, dtype=torch.long), kv_cache=cache)
            if not static:  # (a static cache's length is on the device: not read back to check)
                with pytest.raises(
                    ValueError, match=r"^The KV cache holds 5 positions; 4 are cached and 3 more"
                ):
                    gpt(torch.ones(1, 3, dtype=torch.long), kv_cache=cache)
            with pytest.raises(
                ValueError, match=r"^The KV cache was made for a batch of 1, not 2: make one with"
            ):
                gpt(torch.ones(2, 1, dtype=torch.long), kv_cache=cache)
    assert GPT(GPTConfig.from_name("llama-micro", n_layer=0)).config.n_layer == 0  # no blocks to scale


def test_static_cache_prefill_and_steps_equal_the_full_forward():
    """Every slot attended to, the unwritten ones masked: the states of the full forward pass, and
    the position advanced on the device."""
    gpt = tiny_gpt()
    ids = torch.randint(0, TINY["vocab_size"], (2, 30))
    cache = gpt.new_kv_cache(2, 40, static=True)
    assert isinstance(cache, StaticKVCache) and cache.k.shape[3] == 40
    with torch.no_grad():
        full = gpt(ids)
        steps = [gpt(ids[:, :12], kv_cache=cache)] + [
            gpt(ids[:, t : t + 1], kv_cache=cache) for t in range(12, 30)
        ]
    assert cache.length == 30 and cache.position.device == ids.device
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    assert not cache.k[:, :, :, 30:].any()  # nothing written past the tokens
    with (
        torch.no_grad(),
        pytest.raises(ValueError, match=r"^The KV cache holds 40 positions; 30 are cached and 11"),
    ):
        gpt(ids[:, :11], kv_cache=cache)
    assert cache.length == 30


def test_a_static_cache_makes_its_masks_additive_once_a_step_for_every_layer(monkeypatch):
    """SDPA would turn a boolean mask into an additive one in each layer (two kernels a layer of a
    decode step's CUDA graph); the cache makes it once a step, in the dtype SDPA computes in (bf16
    under autocast, rotary models' fp32 queries too), and the outputs are bit for bit those of the
    boolean masks."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Wheres(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func.overloadpacket.__name__ == "where"
            return func(*args, **(kwargs or {}))

    made, bias = [], StaticKVCache.bias
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))

    def llama(n_layer: int) -> GPT:
        return GPT(GPTConfig.from_name("llama-micro", vocab_size=TINY["vocab_size"], n_layer=n_layer))

    for n_layer, build in ((2, tiny_gpt), (5, tiny_gpt), (3, llama)):  # rotary: fp32 queries under autocast
        gpt, outs = build(n_layer=n_layer).eval(), []
        for additive in (True, False):
            spy = lambda self, mask, dtype: made.append(bias(self, mask, dtype)) or made[-1]  # noqa: E731
            monkeypatch.setattr(StaticKVCache, "bias", spy if additive else lambda self, mask, dtype: mask)
            for autocast in (False, True):
                cache = gpt.new_kv_cache(2, 16, static=True)
                with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                    gpt(ids[:, :8], kv_cache=cache)
                    made.clear()
                    with Wheres() as wheres:
                        outs.append(gpt(ids[:, 8:], kv_cache=cache))
                assert wheres.count == (1 if additive else n_layer)
                if additive:  # every layer took the one mask made for the step, in the queries' dtype
                    assert len(made) == n_layer and all(b is made[0] for b in made)
                    assert made[0].dtype == (torch.bfloat16 if autocast else torch.float32)
                    assert made[0].shape == (2, 1, 1, 16) and made[0][:, :, :, 9:].eq(float("-inf")).all()
                    assert made[0][:, :, :, :9].eq(0).all()
        monkeypatch.undo()
        assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    allowed, kinds = torch.tensor([True, False]), [torch.bfloat16, torch.float16]
    assert [cache.bias(allowed, kind).dtype for kind in kinds] == kinds


@pytest.mark.parametrize("family", ["mistral", "gemma3_text", "qwen3"])
def test_static_cache_slides_its_windows_as_transformers_does(family):
    """Llama-family blocks (rotary positions from the device's position, grouped key/value heads,
    Gemma 3's per-layer windows of 8 over 20 tokens) equal transformers' logits."""
    from tests.weights.test_hf_llama import VOCAB, WINDOW, tiny_llama

    hf = tiny_llama(family, **(WINDOW if family == "mistral" else {}))
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, VOCAB, (2, 20))
    cache = gpt.new_kv_cache(batch_size=2, static=True)
    with torch.no_grad():
        steps = [gpt.lm_logits(gpt(ids[:, :5], kv_cache=cache))]
        steps += [gpt.lm_logits(gpt(ids[:, t : t + 1], kv_cache=cache)) for t in range(5, 20)]
        torch.testing.assert_close(torch.cat(steps, dim=1), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("sample", [False, True])
def test_generation_on_a_static_cache_gives_the_same_tokens(sample):
    gpt = tiny_gpt(pre_ln=True)
    prompt = torch.randint(0, TINY["vocab_size"], (3, 7))
    kwargs = dict(max_new_tokens=40, do_sample=sample, top_k=20)
    dynamic = gpt.generate(prompt, **kwargs, generator=torch.Generator().manual_seed(0))
    static = gpt.generate(prompt, **kwargs, static_cache=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(static, dynamic) and static.shape == (3, 47)
    with torch.autocast("cpu", torch.bfloat16):  # bf16 keys and values into the fp32 caches
        dynamic = gpt.generate(prompt, **kwargs, generator=torch.Generator().manual_seed(0))
        static = gpt.generate(prompt, **kwargs, static_cache=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(static, dynamic)
    with pytest.raises(ValueError, match="use static_cache=False with num_beams > 1"):
        gpt.generate(prompt, max_new_tokens=4, num_beams=2, static_cache=True)
    with pytest.raises(ValueError, match="static_cache='graph': give True, False or 'compiled'."):
        gpt.generate(prompt, max_new_tokens=4, static_cache="graph")
    with pytest.raises(
        ValueError, match=r"^attention_mask of shape \(3, 41\) does not fit the KV cache \(3 rows"
    ):
        gpt(
            prompt,
            torch.ones(3, 41),
            position_ids=torch.arange(7),
            kv_cache=gpt.new_kv_cache(3, 40, static=True),
        )


@cuda
@pytest.mark.parametrize("preset", ["gpt-mini", "llama-mini"])
def test_cuda_decoding_replays_a_cuda_graph_with_the_eager_caches_tokens(preset, monkeypatch):
    """Greedy and sampled, 100 tokens: the graph is captured once and replayed for the rest, and
    kept for the next call of the same shapes (a compiled step, autocast or another batch size
    capture their own)."""
    from gpt_ft.model import generation

    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name(preset, vocab_size=512, n_positions=128)).cuda().eval()
    prompt = torch.randint(0, 512, (1, 9), device="cuda")
    captured = []
    real = generation.decode_graph
    monkeypatch.setattr(generation, "decode_graph", lambda *a, **k: captured.append(1) or real(*a, **k))
    for sample in (False, True):
        kwargs = dict(max_new_tokens=100, do_sample=sample, top_p=0.9)
        eager = gpt.generate(prompt, **kwargs, generator=torch.Generator("cuda").manual_seed(0))
        graphed = gpt.generate(
            prompt, **kwargs, static_cache=True, generator=torch.Generator("cuda").manual_seed(0)
        )
        assert torch.equal(graphed, eager)
    assert len(captured) == 1
    compiled = gpt.generate(prompt, max_new_tokens=100, static_cache="compiled")  # inductor's fused kernels
    assert torch.equal(compiled, gpt.generate(prompt, max_new_tokens=100))
    assert len(captured) == 2
    with torch.autocast("cuda", dtype=torch.bfloat16):  # captured with autocast's cast cache off
        mixed = gpt.generate(prompt, max_new_tokens=100)
        assert torch.equal(gpt.generate(prompt, max_new_tokens=100, static_cache=True), mixed)
    assert len(captured) == 3
    # prompts of 9 and 4 tokens padded on the left: the graph reads the padding the cache keeps
    short = torch.randint(0, 512, (1, 4), device="cuda")
    padded = torch.cat([prompt, torch.cat([torch.zeros_like(prompt[:, :5]), short], dim=1)])
    mask = torch.ones_like(padded)
    mask[1, :5] = 0
    eager = gpt.generate(padded, attention_mask=mask, max_new_tokens=50)
    for _ in range(2):
        assert torch.equal(
            gpt.generate(padded, attention_mask=mask, max_new_tokens=50, static_cache=True), eager
        )
    assert len(captured) == 4
    assert torch.equal(eager[1, 9:29], gpt.generate(short, max_new_tokens=20)[0, 4:])  # as if alone


@cuda
@pytest.mark.parametrize("scaling", ["longrope", "yarn"])
def test_cuda_decoding_with_scaled_rotary_positions_replays_its_graph(scaling):
    """LongRoPE (Phi-4-mini's, crossing its original context of 16 while decoding) and YaRN: their
    frequency tables come from no host copy inside the captured step; the graph's tokens are the
    eager cache's, plain and compiled."""
    from tests.helpers import PHI4_MICRO

    yarn = dict(rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16))
    torch.manual_seed(0)
    config = GPTConfig.from_name(
        "llama-micro", vocab_size=512, **(PHI4_MICRO if scaling == "longrope" else yarn)
    )
    gpt = GPT(config).cuda().eval()
    prompt = torch.randint(0, 512, (1, 9), device="cuda")
    eager = gpt.generate(prompt, max_new_tokens=40)
    for kind in (True, "compiled"):
        assert torch.equal(gpt.generate(prompt, max_new_tokens=40, static_cache=kind), eager), kind


@cuda
@pytest.mark.parametrize("static_cache", [False, True])
def test_cuda_decoding_with_stop_tokens_never_waits_for_the_gpu(static_cache, monkeypatch):
    """After the first token, no synchronising call while the stream decodes: whether every row has
    stopped is read a step late, from pinned memory (`HostFlag`); the tokens those of a stream that
    reads it at once."""
    from gpt_ft.model import generation

    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-mini", vocab_size=512, n_positions=128)).cuda().eval()
    prompt = torch.randint(0, 512, (2, 9), device="cuda")
    free = gpt.generate(prompt, max_new_tokens=40, static_cache=static_cache)
    stops = [int(free[0, 20]), int(free[1, 30])]  # both rows stop before the end
    kwargs = dict(max_new_tokens=40, eos_token_id=stops, static_cache=static_cache)
    stream = gpt.stream(prompt, **kwargs)
    tokens = [next(stream)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens += list(stream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.setattr(generation, "runs_ahead", lambda device: False)
    at_once = list(gpt.stream(prompt, **kwargs))
    assert len(tokens) == len(at_once) < 40 and all(map(torch.equal, tokens, at_once))


def test_a_static_cache_is_kept_for_the_next_call_and_never_shared_by_two_streams():
    """The model's last decoder (cache and, on CUDA, graph) is taken again by a call of the same
    batch size, length bucket and weights, emptied: the tokens of a fresh cache each time, padded
    prompts after unpadded ones too. A second stream at once gets its own; new weights, another
    batch size or inference mode a new one."""
    from gpt_ft.model.graphs import KEPT, release

    torch.manual_seed(0)  # weights large enough that every key counts (small ones repeat a token)
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=128, n_positions=64, initializer_range=0.2))
    gpt.eval()
    prompts = [torch.randint(1, 128, (2, n)) for n in (7, 9)]
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    calls = [dict(input_ids=p, max_new_tokens=30) for p in prompts]
    calls.append(dict(input_ids=prompts[1], attention_mask=mask, max_new_tokens=30))
    for kwargs in calls * 2:
        assert torch.equal(gpt.generate(**kwargs, static_cache=True), gpt.generate(**kwargs))
    kept = KEPT[gpt]
    first = gpt.stream(prompts[0], max_new_tokens=30, static_cache=True)
    second = gpt.stream(prompts[0], max_new_tokens=30, static_cache=True)
    both = [(next(first), next(second)) for _ in range(30)]
    expected = gpt.generate(prompts[0], max_new_tokens=30)[:, 7:]
    for tokens in zip(*both):
        assert torch.equal(torch.stack(tokens, 1), expected)
    assert kept.busy and list(first) == list(second) == []  # the stream ended: its cache is free
    assert KEPT[gpt] is kept and not kept.busy
    gpt.generate(prompts[0], max_new_tokens=30, static_cache=True)
    assert KEPT[gpt] is kept
    with torch.inference_mode():
        gpt.generate(prompts[0], max_new_tokens=30, static_cache=True)
    assert KEPT[gpt] is not kept and KEPT[gpt].cache.k.is_inference()
    gpt.double()
    doubled = gpt.generate(prompts[0], max_new_tokens=30, static_cache=True)
    assert torch.equal(doubled, gpt.generate(prompts[0], max_new_tokens=30))
    assert KEPT[gpt].cache.k.dtype == torch.float64
    gpt.generate(prompts[0][:1], max_new_tokens=30, static_cache=True)
    assert KEPT[gpt].cache.k.shape[1] == 1
    release(gpt)
    assert gpt not in KEPT


def test_the_compiled_decode_step_compiles_for_more_shapes_than_torch_compiles_default(monkeypatch):
    """A process decoding at 10 cache lengths compiles the step 10 times: torch.compile's default
    limit of 8 a function would run the last two eager (here: fail, as the limit is asked to). A
    step of one operator stands in for the model's (traced, not compiled)."""
    from gpt_ft.model import graphs

    step = torch.compile(lambda model, tokens, cache: cache.sum() + tokens, dynamic=False, backend="eager")
    monkeypatch.setattr(graphs, "compiled_decode_logits", lambda: step)
    monkeypatch.setattr(torch.compiler.config, "fail_on_recompile_limit_hit", True)
    token = torch.zeros(1, 1)
    sums = [graphs.compiled_step(None, token, torch.ones(8 + n)) for n in range(10)]
    assert [int(x) for x in sums] == list(range(8, 18))


def test_the_decode_step_traces_as_one_graph_where_the_length_stays_on_the_device(monkeypatch):
    """An accelerator's static cache never reads its length back (a CPU's reads it to check the
    fit, for free), so `static_cache="compiled"` compiles the decode step as one graph: a break
    would run eager kernels between graphs, on every token. Traced by dynamo, not compiled."""
    from gpt_ft.model.graphs import decode_logits

    monkeypatch.setattr(StaticKVCache, "length", property(lambda self: 0))  # as on CUDA: not read
    for preset in ("gpt-micro", "llama-micro"):
        gpt = GPT(GPTConfig.from_name(preset, vocab_size=128, n_positions=64)).eval()
        cache = gpt.new_kv_cache(2, 32, static=True)
        with torch.no_grad():
            gpt(torch.randint(0, 128, (2, 5)), kv_cache=cache)
            traced = torch._dynamo.explain(decode_logits)(gpt, torch.zeros(2, 1, dtype=torch.long), cache)
        assert (traced.graph_count, traced.graph_break_count) == (1, 0), traced.break_reasons
