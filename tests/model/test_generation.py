import math
import re

import pytest
import torch

from gpt_ft import GPT, GPTConfig
from gpt_ft.model.beams import beam_search
from gpt_ft.model.generation import _filter_logits
from tests.helpers import FAMILIES, TINY, tiny_gpt, tiny_hf


@pytest.mark.parametrize("pre_ln", [False, True])
def test_greedy_50_tokens_identical_with_and_without_cache(pre_ln):
    gpt = tiny_gpt(pre_ln=pre_ln)
    prompt = torch.randint(0, TINY["vocab_size"], (3, 7))
    cached = gpt.generate(prompt, max_new_tokens=50)
    uncached = gpt.generate(prompt, max_new_tokens=50, use_cache=False)
    assert cached.shape == (3, 57)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :7], prompt)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_and_beam_search_equal_transformers_generate(family):
    hf = tiny_hf(family)
    gpt = GPT.from_hf(hf).eval()
    prompt = torch.randint(1, TINY["vocab_size"], (1, 6))
    ours = gpt.generate(prompt, max_new_tokens=30)
    theirs = hf.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)
    ours = gpt.generate(prompt, max_new_tokens=12, num_beams=4, length_penalty=0.0)
    theirs = hf.generate(
        prompt,
        max_new_tokens=12,
        min_new_tokens=12,
        num_beams=4,
        length_penalty=0.0,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("family", FAMILIES)
def test_suppressed_tokens_are_never_produced_as_transformers_suppresses_them(family):
    """`suppress_tokens` (gpt-ft generate's framing tokens), greedy and beam search alike."""
    hf = tiny_hf(family)
    gpt = GPT.from_hf(hf).eval()
    prompt = torch.randint(1, TINY["vocab_size"], (1, 6))
    free = gpt.generate(prompt, max_new_tokens=20)[0, 6:]
    suppress = sorted(set(free.tolist()))[:2]  # tokens it would produce
    suppress += [TINY["vocab_size"], 10**6]  # no token of the model's: none to suppress (transformers')
    ours = gpt.generate(prompt, max_new_tokens=20, suppress_tokens=suppress)
    assert not set(ours[0, 6:].tolist()) & set(suppress)
    same = dict(min_new_tokens=20, do_sample=False, pad_token_id=0, suppress_tokens=suppress)
    assert torch.equal(ours, hf.generate(prompt, max_new_tokens=20, **same))
    ours = gpt.generate(prompt, max_new_tokens=8, num_beams=3, length_penalty=0.0, suppress_tokens=suppress)
    theirs = hf.generate(
        prompt, max_new_tokens=8, num_beams=3, length_penalty=0.0, **{**same, "min_new_tokens": 8}
    )
    assert torch.equal(ours, theirs) and not set(ours[0, 6:].tolist()) & set(suppress)


def test_stop_token_ends_generation_and_pads():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5))
    free = gpt.generate(prompt, max_new_tokens=20)
    eos = int(free[0, 8])  # the 4th generated token of row 0 becomes the stop token
    out = gpt.generate(prompt, max_new_tokens=20, eos_token_id=eos)
    first = (free[0, 5:] == eos).nonzero()[0].item()
    assert torch.equal(out[0, : 5 + first + 1], free[0, : 5 + first + 1])
    assert torch.all(out[0, 5 + first :] == eos)
    for row in range(2):  # stopped rows are padded with eos; generation ends once all rows stopped
        hit = (out[row, 5:] == eos).nonzero()
        if len(hit):
            assert torch.all(out[row, 5 + hit[0].item() :] == eos)
    assert out.shape[1] <= 25


def test_a_model_in_training_mode_decodes_without_dropout_and_stays_in_its_mode():
    """A model put in training mode (`from_pretrained` and `from_hf` give it in eval mode, as
    transformers does): decoding switches dropout off, then back on."""
    gpt = GPT.from_hf(tiny_hf("gpt2", resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5))
    assert not gpt.training
    gpt.train()
    prompt = torch.randint(1, TINY["vocab_size"], (2, 6))
    expected = {beams: gpt.eval().generate(prompt, max_new_tokens=10, num_beams=beams) for beams in (1, 3)}
    gpt.train()
    for beams in (1, 3):
        assert torch.equal(gpt.generate(prompt, max_new_tokens=10, num_beams=beams), expected[beams])
        assert gpt.training
    assert torch.equal(torch.stack(list(gpt.stream(prompt, max_new_tokens=10)), 1), expected[1][:, 6:])
    assert gpt.training


def test_a_stop_token_given_as_a_tensor_or_numpy_integer_is_one_id():
    import numpy as np

    from gpt_ft.model.decoding import stop_ids

    assert stop_ids(torch.tensor(7)) == stop_ids(np.int64(7)) == stop_ids(7) == [7]
    assert stop_ids(torch.tensor([7, 9])) == stop_ids((7, 9)) == [7, 9] and stop_ids(None) == []
    with pytest.raises(
        ValueError, match=r"^eos_token_id is a token's id or a list of them, got the text '12'"
    ):
        stop_ids("12")  # (its characters were read as ids 1 and 2)


def test_several_stop_tokens_end_generation_at_any_and_pad_with_the_first():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5))
    free = gpt.generate(prompt, max_new_tokens=20)
    stops = [int(free[1, 7]), int(free[0, 9])]  # row 1 stops at its 3rd token, row 0 at its 5th
    out = gpt.generate(prompt, max_new_tokens=20, eos_token_id=stops)
    for row, at in ((0, 9), (1, 7)):
        first = next(i for i in range(5, 25) if int(free[row, i]) in stops)
        assert first <= at and torch.equal(out[row, : first + 1], free[row, : first + 1])
        assert torch.all(out[row, first + 1 :] == stops[0])
    beams = beam_search(
        gpt, prompt[:1], num_beams=1, max_new_tokens=20, eos_token_id=stops, length_penalty=0.0
    )
    assert torch.equal(beams, gpt.generate(prompt[:1], max_new_tokens=20, eos_token_id=stops))


def test_beam_search_with_one_beam_equals_greedy():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 4))
    greedy = gpt.generate(prompt, max_new_tokens=25)
    assert torch.equal(beam_search(gpt, prompt, num_beams=1, max_new_tokens=25), greedy)
    eos = int(greedy[0, 10])
    assert torch.equal(
        beam_search(gpt, prompt[:1], num_beams=1, max_new_tokens=25, eos_token_id=eos, length_penalty=0.0),
        gpt.generate(prompt[:1], max_new_tokens=25, eos_token_id=eos),
    )


def lookahead_model() -> GPT:
    """A 0-layer GPT whose next-token distribution is set by hand.

    With no blocks, logits = (wte[x] + wpe[pos]) @ wte.T. From the prompt [0]: p(A=1) = 0.6,
    p(B=2) = 0.4. After A (a tiny embedding) the next token is ~uniform; after B it is B again
    with p ~ 1. Greedy takes A (joint probability 0.6 * 0.25); beam search finds B, B (~0.4).
    """
    gpt = GPT(
        GPTConfig(
            vocab_size=4, n_positions=4, n_embd=4, n_layer=0, n_head=1, embd_pdrop=0.0, vocab_multiple=1
        )
    ).eval()
    scale = torch.tensor([1.0, 0.1, 3.0, 1.0])
    wanted = torch.tensor([-20.0, math.log(0.6), math.log(0.4), -20.0])  # logits at position 0 from token 0
    with torch.no_grad():
        gpt.wte.weight.copy_(torch.diag(scale))
        gpt.wpe.weight.zero_()
        # (wte[0] + wpe[0]) @ diag(scale) = wanted  =>  wpe[0] = wanted / scale - wte[0]
        gpt.wpe.weight[0] = wanted / scale - gpt.wte.weight[0]
    return gpt


def test_beam_search_finds_a_sequence_greedy_misses():
    gpt = lookahead_model()
    prompt = torch.tensor([[0]])
    probs = gpt.lm_logits(gpt(prompt))[0, -1].softmax(-1)
    torch.testing.assert_close(probs[1:3], torch.tensor([0.6, 0.4]), rtol=0, atol=1e-6)
    greedy = gpt.generate(prompt, max_new_tokens=2)
    beam = gpt.generate(prompt, max_new_tokens=2, num_beams=2)
    assert greedy[0, 1].item() == 1
    assert beam[0, 1:].tolist() == [2, 2]

    def joint(seq):
        logp = gpt.lm_logits(gpt(seq[:, :-1]))[0].log_softmax(-1)
        return logp[torch.arange(seq.shape[1] - 1), seq[0, 1:]].sum().item()

    assert joint(beam) > joint(greedy) + 0.5


def test_sampling_filters():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    kept = lambda out: torch.isfinite(out[0]).tolist()  # noqa: E731
    assert kept(_filter_logits(logits, 1.0, 2, None)) == [True, True, False, False]
    assert kept(_filter_logits(logits, 1.0, None, 0.5)) == [True, False, False, False]
    assert kept(_filter_logits(logits, 1.0, None, 0.7)) == [True, True, False, False]
    assert kept(_filter_logits(logits, 1.0, None, 0.81)) == [True, True, True, False]
    # top-p keeps the tokens transformers keeps, where probabilities tie at the edge too
    from transformers.generation.logits_process import TopPLogitsWarper

    torch.manual_seed(0)
    cases = [(torch.tensor([[0.6, 0.2, 0.2]]).log(), 0.7), (torch.tensor([[0.25] * 4]).log(), 0.5)]
    cases += [(torch.randn(3, 50) * 3, float(torch.rand(()))) for _ in range(300)]
    for scores, p in cases:
        theirs = torch.isfinite(TopPLogitsWarper(p)(None, scores.clone()))
        assert torch.equal(torch.isfinite(_filter_logits(scores, 1.0, None, p)), theirs), (scores, p)
    # temperature: q ∝ p^(1/T)
    q = _filter_logits(logits, 0.5, None, None).softmax(-1)
    p2 = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 2
    torch.testing.assert_close(q[0], p2 / p2.sum())


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 4))
    greedy = gpt.generate(prompt, max_new_tokens=15)
    assert torch.equal(gpt.generate(prompt, max_new_tokens=15, do_sample=True, top_k=1), greedy)
    a = gpt.generate(prompt, max_new_tokens=15, do_sample=True, generator=torch.Generator().manual_seed(1))
    b = gpt.generate(prompt, max_new_tokens=15, do_sample=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert not torch.equal(a, greedy)


def test_stream_yields_the_generated_tokens():
    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (1, 4))
    streamed = torch.stack(list(gpt.stream(prompt, max_new_tokens=10)), dim=1)
    assert torch.equal(streamed, gpt.generate(prompt, max_new_tokens=10)[:, 4:])


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_with_stop_token_and_length_penalty_equals_transformers(family):
    hf = tiny_hf(family, vocab_size=8)  # a small vocabulary, so hypotheses do end in eos (id 0)
    gpt = GPT.from_hf(hf).eval()
    ended = 0
    for seed in range(6):
        torch.manual_seed(seed)
        prompt = torch.randint(1, 8, (1, 4))
        # a penalty above 1 favours long hypotheses: the search stops only once the best beam still
        # running cannot beat the finished ones; several stop tokens: as many candidates kept as
        # transformers keeps, so that num_beams beams go on
        for length_penalty, eos, beams in [
            (1.0, 0, 3),
            (0.5, 0, 3),
            (0.0, 0, 3),
            (2.0, 0, 4),
            (1.0, [0, 1, 2], 2),
            (1.0, [0, 1, 2, 3, 4, 5], 2),
        ]:
            ours = gpt.generate(
                prompt, max_new_tokens=15, num_beams=beams, length_penalty=length_penalty, eos_token_id=eos
            )
            theirs = hf.generate(
                prompt,
                max_new_tokens=15,
                num_beams=beams,
                length_penalty=length_penalty,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=eos,
            )
            assert torch.equal(ours, theirs), (seed, length_penalty, eos)
            ended += int((ours[0, 4:] == 0).any())
    assert ended >= 3


@pytest.mark.parametrize("family", FAMILIES)
def test_repetition_penalty_equals_transformers(family):
    """Greedy (cached and not), sampled and beam search with CTRL's penalty: transformers' tokens
    (it penalises beams' log-probabilities, so do we); the penalty changes what is generated."""
    hf = tiny_hf(family)
    hf.generation_config.eos_token_id = None  # no end: every row decodes 30 tokens, as ours do
    gpt = GPT.from_hf(hf).eval()
    prompt = torch.randint(1, TINY["vocab_size"], (2, 6))
    same = dict(do_sample=False, pad_token_id=0)
    for penalty in (1.5, 0.7):
        ours = gpt.generate(prompt, max_new_tokens=30, repetition_penalty=penalty)
        theirs = hf.generate(prompt, max_new_tokens=30, repetition_penalty=penalty, **same)
        assert torch.equal(ours, theirs), penalty
        assert torch.equal(
            gpt.generate(prompt, max_new_tokens=30, repetition_penalty=penalty, use_cache=False), ours
        )
        assert not torch.equal(ours, gpt.generate(prompt, max_new_tokens=30))
    ours = gpt.generate(
        prompt[:1], max_new_tokens=12, num_beams=3, length_penalty=0.0, repetition_penalty=1.5
    )
    theirs = hf.generate(
        prompt[:1],
        max_new_tokens=12,
        min_new_tokens=12,
        num_beams=3,
        length_penalty=0.0,
        repetition_penalty=1.5,
        **same,
    )
    assert torch.equal(ours, theirs)
    sampled = [
        gpt.generate(prompt, max_new_tokens=10, do_sample=True, top_k=1, repetition_penalty=1.5),
        gpt.generate(prompt, max_new_tokens=10, repetition_penalty=1.5),
    ]
    assert torch.equal(*sampled)  # top-k 1 samples the penalised argmax
    with pytest.raises(ValueError, match=r"^repetition_penalty must be > 0 \(1: none\), got 0.0\.$"):
        gpt.generate(prompt, max_new_tokens=2, repetition_penalty=0.0)


def test_bad_generation_arguments():
    gpt = tiny_gpt()
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        gpt.generate(torch.zeros(1, 60, dtype=torch.long), max_new_tokens=5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        gpt.generate(torch.zeros(1, 2, dtype=torch.long), max_new_tokens=2, do_sample=True, temperature=0)
    prompt = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"top_k must be >= 1, got 0\."):
        gpt.generate(prompt, max_new_tokens=2, do_sample=True, top_k=0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5\."):
        gpt.generate(prompt, max_new_tokens=2, do_sample=True, top_p=1.5)
    greedy = gpt.generate(prompt, max_new_tokens=2)  # greedy decoding reads no sampling option
    assert torch.equal(gpt.generate(prompt, max_new_tokens=2, temperature=0, top_k=0, top_p=1.5), greedy)
    with pytest.raises(ValueError, match=r"num_beams must be >= 1, got 0\."):
        gpt.generate(prompt, max_new_tokens=2, num_beams=0)
    with pytest.raises(ValueError, match="Beam search is deterministic"):
        gpt.generate(prompt, max_new_tokens=2, num_beams=2, do_sample=True)
    with pytest.raises(ValueError, match=r"input_ids must be a non-empty \(batch, length\) tensor"):
        gpt.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)
    for ids, said in ((prompt.float(), "torch.float32"), (prompt.to(torch.uint8), "torch.uint8")):
        with pytest.raises(
            ValueError, match=rf"^input_ids must hold integer token ids \(int64 or int32\), got {said}\.$"
        ):
            gpt.generate(ids, max_new_tokens=2)
    with pytest.raises(
        ValueError, match=r"^input_ids must be a non-empty \(batch, length\) tensor, got shape \(0, 2\)\.$"
    ):
        gpt.generate(torch.zeros(0, 2, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(
        ValueError, match=r"^input_ids must be a \(batch, length\) tensor of token ids, got a list\.$"
    ):
        gpt.generate([[1, 2]], max_new_tokens=2)
    # Python's raw errors before: a float count, a NaN temperature, a float stop id.
    for kwargs, said in (
        (dict(max_new_tokens=2.0), "max_new_tokens must be a whole number, got 2.0."),
        (dict(max_new_tokens=None), "max_new_tokens must be a whole number, got None."),
        (dict(num_beams=2.0), "num_beams must be a whole number, got 2.0."),
        (dict(do_sample=True, top_k=2.5), "top_k must be a whole number, got 2.5."),
        (dict(do_sample=True, temperature=float("nan")), "temperature must be > 0, got nan"),
        (dict(eos_token_id=5.0), "eos_token_id is a token's id or a list of them, got 5.0."),
        (
            dict(num_beams=2, length_penalty=float("nan")),
            "length_penalty must be a finite number (1: none), got nan.",
        ),
        (
            dict(num_beams=2, length_penalty=float("inf")),
            "length_penalty must be a finite number (1: none), got inf.",
        ),
    ):
        with pytest.raises(ValueError, match="^" + re.escape(said)):
            gpt.generate(prompt, **{"max_new_tokens": 2, **kwargs})
    # past the vocabulary: a padding row of the embedding (ids up to a multiple of 64), or an index error
    vocab = gpt.config.vocab_size
    assert gpt.wte.weight.shape[0] > vocab + 1
    for bad in (vocab, -1):
        with pytest.raises(
            ValueError, match=rf"^input_ids hold token id {bad}, outside the model's vocabulary"
        ):
            gpt.generate(torch.tensor([[1, bad]]), max_new_tokens=2)


def test_a_stop_id_outside_the_vocabulary_is_never_fed_to_the_model():
    """Finished rows were filled with the first stop id and read it at the next step: one the
    vocabulary lacks stopped greedy decoding and beam search with an IndexError once a row ended
    before another. No step gives such an id: the first the vocabulary holds fills the rows."""
    gpt = tiny_gpt()
    prompt = torch.randint(1, TINY["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(0))
    free = gpt.generate(prompt, max_new_tokens=10)
    stop = next(int(t) for t in free[0, 5:] if t not in free[1, 5:])  # row 0 ends, row 1 goes on
    alone = gpt.generate(prompt, max_new_tokens=10, eos_token_id=stop)
    assert torch.equal(gpt.generate(prompt, max_new_tokens=10, eos_token_id=[10_000, stop]), alone)
    assert torch.equal(
        gpt.generate(prompt, max_new_tokens=10, eos_token_id=[-1, stop], num_beams=2),
        gpt.generate(prompt, max_new_tokens=10, eos_token_id=stop, num_beams=2),
    )


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 20])
def test_decoding_that_queues_the_next_step_before_a_token_is_read_gives_the_same_tokens(
    max_new_tokens, monkeypatch
):
    """As on CUDA (`runs_ahead`): each token handed out once the next step is queued, the stop read
    a step late. The same tokens, the stream ending at the same token, with one stop token, two, or
    none; and each step's model call (one more at the end where every row stopped)."""
    from gpt_ft.model import generation

    gpt = tiny_gpt()
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5))
    free = gpt.generate(prompt, max_new_tokens=20)
    calls = []
    gpt.register_forward_hook(lambda *_: calls.append(1))
    for eos in (None, int(free[0, 8]), [int(free[1, 7]), int(free[0, 9])]):
        for cache in ({}, {"static_cache": True}, {"use_cache": False}):
            kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, **cache)
            calls.clear()
            expected = list(gpt.stream(prompt, **kwargs))
            steps = len(calls)
            monkeypatch.setattr(generation, "runs_ahead", lambda device: True)
            calls.clear()
            got = list(gpt.stream(prompt, **kwargs))
            assert len(got) == len(expected) and all(map(torch.equal, got, expected))
            ended = eos is not None and len(expected) < max_new_tokens
            assert len(calls) == steps + ended
            assert torch.equal(
                gpt.generate(prompt, **kwargs), torch.cat([prompt, *(t[:, None] for t in got)], 1)
            )
            monkeypatch.undo()


@pytest.mark.parametrize(
    "settings",
    [{}, {"num_beams": 2}, {"repetition_penalty": 1.3}, {"repetition_penalty": 1.3, "num_beams": 2}],
    ids=["greedy", "beams", "penalty", "beams-penalty"],
)
def test_int32_prompts_decode_as_int64_ones(settings):
    """Token ids of any integer type (a NumPy int32 array's): the same tokens, as int64, whatever
    the search (the repetition penalty's count of seen tokens took the ids' type)."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**TINY)).eval()
    prompt = torch.randint(1, TINY["vocab_size"], (2, 5))
    expected = gpt.generate(prompt, max_new_tokens=5, **settings)
    got = gpt.generate(prompt.int(), max_new_tokens=5, **settings)
    assert got.dtype == torch.long and torch.equal(got, expected)


def test_readers_of_one_model_at_once_leave_it_in_eval_mode_until_the_last_leaves():
    """Two threads scoring one model mid-training: the first to finish put its dropout back on while
    the other still read it (a Classifier served from threads); the last one out puts it back."""
    from gpt_ft.model.decoding import eval_mode

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
    model[0].eval()  # (a module's own mode is kept too)
    first, second = eval_mode(model), eval_mode(model)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not any(m.training for m in model.modules())  # the second reader still scores
    second.__exit__(None, None, None)
    assert [m.training for m in model.modules()] == [True, False, True]
    # an entry left open (a stream abandoned after a break), the model trained again: a later reader
    # still reads in eval mode (it read in train mode, dropout on, where the first kept the modes)
    abandoned, later = eval_mode(model), eval_mode(model)
    abandoned.__enter__()
    model.train()
    later.__enter__()
    assert not any(m.training for m in model.modules())
    later.__exit__(None, None, None)
    abandoned.__exit__(None, None, None)  # (its generator collected)
    assert [m.training for m in model.modules()] == [True, False, True]  # (as the first reader found them)
