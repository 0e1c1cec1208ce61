"""Packed batches (examples end to end in rows, no padding between them) give the padded batch's
losses, gradients and predictions, for every input shape and model family; attention never crosses
from one example into another."""

from __future__ import annotations

import math

import pytest
import torch

from gpt_ft.adapters import (
    MultiLabel,
    MultipleChoice,
    Preference,
    Ranking,
    Reranker,
    Similarity,
    SingleText,
    Steps,
    TextPair,
)
from gpt_ft.data.batches import collate, collate_packed, collate_shared
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.model import attention, decoding
from gpt_ft.training.module import GPTModule
from tests.helpers import FAMILY_MICRO, HostReads

NO_DROPOUT = {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}
FAMILIES = {**FAMILY_MICRO, "gpt1-micro": ("gpt-micro", {}), "gpt2-micro": ("gpt-micro", {"pre_ln": True})}

SHAPES = {
    "single": lambda: SingleText(name="single", labels=["no", "yes"]),
    "pair": lambda: TextPair(name="pair", labels=["a", "b", "c"]),
    "similarity": lambda: Similarity(name="similarity", regression=True, score_range=(0.0, 5.0)),
    "choice": lambda: MultipleChoice(name="choice", context=["story"], choices="endings", num_choices=4),
    "multi-label": lambda: MultiLabel(name="labels", labels=["x", "y", "z"]),
    "preference": lambda: Preference(name="preference", margin="margin", center_rewards=0.01),
    "rerank": lambda: Reranker(name="rerank", num_negatives=3),
    "steps": lambda: Steps(name="steps", max_steps=6),
    "ranking": lambda: Ranking(name="ranking", loss="plackett_luce", max_replies=4, center_rewards=0.01),
}
TEXTS = {"single": 1, "pair": 2, "similarity": 2, "multi-label": 1}


def examples(task, shape: str, specials, vocab: int, n: int = 7, seed: int = 0) -> list[dict]:
    """`n` labelled examples of random tokens: texts of 0-18 tokens, contexts of 1-30, 1-4 choices;
    preference pairs with prompts of 0-30 tokens, replies of 0-9 and margins of 0-1; solutions of
    1-6 steps of 0-8 tokens, labelled right, wrong, half right or not at all (one at least)."""
    g = torch.Generator().manual_seed(seed)
    randint = lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=g))  # noqa: E731
    tokens = lambda k: torch.randint(0, vocab, (k,), generator=g).tolist()  # noqa: E731
    rows = []
    for i in range(n):
        if shape == "ranking":  # scores of 0-2 (ties), some unranked
            texts = [tokens(randint(0, 30)), *(tokens(randint(0, 9)) for _ in range(randint(2, 4)))]
            label = {
                "scores": [[0, 1, 2, None][randint(0, 3)] for _ in texts[1:]],
                "prompt": "",
                "replies": ["x"] * (len(texts) - 1),  # the tokens are `texts`
            }
            label["scores"][0] = 2  # at least one ranked
        elif shape in ("choice", "rerank"):
            texts = [tokens(randint(1, 30)), *(tokens(randint(0, 9)) for _ in range(randint(1, 4)))]
            label = randint(0, len(texts) - 2) if shape == "choice" else 0
        elif shape == "steps":
            texts = [tokens(randint(0, 20)), *(tokens(randint(0, 8)) for _ in range(randint(1, 6)))]
            label = [[True, False, 0.5, None][randint(0, 3)] for _ in texts[1:]]
            if all(v is None for v in label):  # a solution with no labelled step is unlabelled
                label[-1] = False
        elif shape == "preference":
            texts = [tokens(randint(0, 30)), tokens(randint(0, 9)), tokens(randint(0, 9))]
            label = randint(0, 2) / 2
        else:
            texts = [tokens(randint(0, 18)) for _ in range(TEXTS[shape])]
            label = {"single": randint(0, 1), "pair": randint(0, 2), "similarity": randint(0, 50) / 10}.get(
                shape, [randint(0, 1) for _ in range(3)]
            )
        row = label if shape == "ranking" else {"label": label, "margin": label}
        enc = task.encode(row, texts, specials, max_length=40)
        rows.append({**enc.fields(), "label": enc.label, "index": i})
    return rows


def module_for(tokenizer_dir, shape: str, family: str):
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = SHAPES[shape]()
    preset, overrides = FAMILIES[family]
    torch.manual_seed(0)
    module = GPTModule(
        preset=preset,
        overrides={"n_positions": 64, **NO_DROPOUT, **overrides},
        vocab_size=len(tok),
        task=task,
        lm_coef=0.5,  # the LM terms compared too (a preference task's default is 0)
        classifier_dropout=0.0,
    )
    return module, examples(task, shape, specials, vocab=len(tok) - 5), specials


def run(module, batch) -> tuple[dict, torch.Tensor, dict]:
    """Terms, loss and gradients of one batch."""
    module.zero_grad()
    terms = module.terms(batch)
    loss, _ = module.losses(batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in terms.items()}, loss.detach(), grads


def assert_same(a, b, choice_mask) -> None:
    (terms_a, loss_a, grads_a), (terms_b, loss_b, grads_b) = a, b
    logits_a, logits_b = terms_a["logits"], terms_b["logits"]
    if logits_a.shape == choice_mask.shape:  # choices: masked ones carry the same floor
        assert torch.equal(logits_a[~choice_mask], logits_b[~choice_mask])
        logits_a, logits_b = logits_a[choice_mask], logits_b[choice_mask]
    torch.testing.assert_close(logits_b, logits_a, rtol=0, atol=1e-5)
    torch.testing.assert_close(terms_b["task_loss"], terms_a["task_loss"], rtol=0, atol=1e-5)
    assert torch.equal(terms_a["lm_count"], terms_b["lm_count"])
    torch.testing.assert_close(terms_b["lm_sum"], terms_a["lm_sum"], rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(loss_b, loss_a, rtol=0, atol=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        # 1e-5, and fp32's few ulps on a large gradient (InfoNCE at τ = 0.05 gives some of 20)
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-6, atol=1e-5, msg=name)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_packed_batch_equals_the_padded_one(tokenizer_dir, shape, family):
    """Losses (task and LM, per example), gradients and predictions to 1e-5. Multiple choice runs
    its shared context once, in the same row as its choices; Gemma 3's sliding window (6 tokens)
    counts positions within each example."""
    module, rows, specials = module_for(tokenizer_dir, shape, family)
    if family == "phi4-micro" and module.task.shares_context:
        pytest.skip("LongRoPE: a shared context's choices take its longest's factors, the padded batch's "
                    "each its own; equal unless they straddle (test_terms.py), as some do here")  # fmt: skip
    module.train()
    padded = collate(rows, specials.pad)
    delim = specials.delim if module.task.shares_context else None
    packed = collate_packed(rows, specials.pad, delim)
    if not module.task.shares_context:  # the same tokens (shared contexts: each once), in fewer positions
        assert packed.real_tokens == padded.real_tokens
    assert packed.input_ids.numel() <= padded.input_ids.numel()
    assert (packed.branches is not None) == module.task.shares_context
    assert_same(run(module, padded), run(module, packed), padded.choice_mask)
    module.eval()
    with torch.no_grad():
        outputs = [module(batch) for batch in (padded, packed)]
    probabilities = [module.head.probabilities(o) for o in outputs]
    torch.testing.assert_close(probabilities[1], probabilities[0], rtol=0, atol=1e-5, equal_nan=True)
    predictions = [module.head.predictions(o) for o in outputs]
    if shape in ("single", "pair", "choice"):  # one class: the same unless two were within 1e-4
        top2 = probabilities[0].topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 1e-4
        predictions = [p[clear] for p in predictions]
    # scores (a reranker's: NaN for a candidate the row has not); ids equal
    torch.testing.assert_close(predictions[1], predictions[0], rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("shape", ["rerank", "pair", "single"])
def test_a_sequence_that_recurs_in_a_batch_runs_once(tokenizer_dir, shape):
    """A document two queries share, and a whole example twice, are computed once: fewer tokens,
    every occurrence reading the same positions, and the padded batch's losses, LM terms (each
    occurrence counted) and gradients all the same."""
    module, rows, specials = module_for(tokenizer_dir, shape, "llama-micro")
    rows = [*rows, {**rows[0], "index": len(rows)}]  # example 0 again
    if shape == "rerank":  # example 1 and 2 share their last candidate with example 3
        for b in (1, 2):
            rows[b]["input_ids"] = [*rows[b]["input_ids"][:-1], rows[3]["input_ids"][-1]]
            rows[b]["extract_index"] = [*rows[b]["extract_index"][:-1], rows[3]["extract_index"][-1]]
    padded, packed = collate(rows, specials.pad), collate_packed(rows, specials.pad)
    every = [seq for row in rows for seq in row["input_ids"]]
    once = {tuple(seq): len(seq) for seq in every}
    assert packed.real_tokens == sum(once.values()) < padded.real_tokens == sum(map(len, every))
    assert int((packed.documents >= 0).sum()) == packed.real_tokens
    last = len(rows) - 1  # the repeated example reads the first one's extract positions
    assert packed.extract_index[last].tolist() == packed.extract_index[0].tolist()
    module.train()
    assert_same(run(module, padded), run(module, packed), padded.choice_mask)


def test_shared_contexts_pack_as_the_shared_context_batch_runs_them(tokenizer_dir):
    """Multiple choice: the packed rows hold each context once, and equal `collate_shared`'s batch."""
    module, rows, specials = module_for(tokenizer_dir, "choice", "llama-micro")
    shared = collate_shared(rows, specials.pad, specials.delim)
    packed = collate_packed(rows, specials.pad, specials.delim)
    contexts = int(shared.context_length.sum())
    answers = sum(
        len(answer)
        for row, n in zip(rows, shared.context_length.tolist())
        for answer in {tuple(seq[n:]) for seq in row["input_ids"]}
    )  # fmt: skip  (twice: once)
    assert packed.real_tokens == contexts + answers == int((packed.documents >= 0).sum())
    module.train()
    assert_same(run(module, shared), run(module, packed), shared.choice_mask)


@pytest.mark.parametrize("family", ["gpt1-micro", "llama-micro"])
def test_shared_contexts_under_activation_checkpointing(tokenizer_dir, family):
    """Blocks recomputed in the backward pass read the shared contexts' keys as they did forward:
    the same loss and gradients (the recomputed context pass had joined its keys onto themselves)."""
    module, rows, specials = module_for(tokenizer_dir, "choice", family)
    shared = collate_shared(rows, specials.pad, specials.delim)
    module.train()
    plain = run(module, shared)
    module.gpt.activation_checkpointing = True
    assert_same(plain, run(module, shared), shared.choice_mask)


def test_literal_layout_of_a_packed_batch():
    """Three single texts and a two-choice example: positions restart, the context is laid once,
    extract indices point into the flattened rows, the LM reads skip each sequence's last token."""
    S, D, E, P = 90, 91, 92, 0  # start, delim, extract, pad
    rows = [
        {"input_ids": [[S, 1, 2, 3, E]], "extract_index": [4], "label": 0, "index": 10},
        {"input_ids": [[S, 4, E]], "extract_index": [2], "label": 1, "index": 11},
        {
            "input_ids": [[S, 5, D, 6, E], [S, 5, D, 7, 8, E]],
            "extract_index": [4, 5],
            "label": 1,
            "index": 12,
        },
    ]
    batch = collate_packed(rows, P, D)
    # units: [S 5 D | 6 E | 7 8 E] (8 tokens), [S 1 2 3 E] (5), [S 4 E] (3): rows of 8
    assert batch.input_ids.tolist() == [[S, 5, D, 6, E, 7, 8, E], [S, 1, 2, 3, E, S, 4, E]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5], [0, 1, 2, 3, 4, 0, 1, 2]]
    assert batch.documents.tolist() == [[0] * 8, [0] * 5 + [1] * 3]
    assert batch.branches.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2], [0] * 8]
    assert batch.extract_index.tolist() == [[12, 0], [15, 0], [4, 7]]
    assert batch.choice_mask.tolist() == [[True, False], [True, False], [True, True]]
    reads = list(zip(batch.lm_positions.tolist(), batch.lm_targets.tolist(), batch.lm_examples.tolist(),
                     batch.lm_weights.tolist()))  # fmt: skip
    assert reads == [
        (0, 5, 2, 2), (1, D, 2, 2),  # the context, once per choice
        (2, 6, 2, 1), (3, E, 2, 1), (2, 7, 2, 1), (5, 8, 2, 1), (6, E, 2, 1),  # the delim, then each choice
        (8, 1, 0, 1), (9, 2, 0, 1), (10, 3, 0, 1), (11, E, 0, 1),
        (13, 4, 1, 1), (14, E, 1, 1),
    ]  # fmt: skip
    assert batch.real_tokens == 16 and batch.index.tolist() == [10, 11, 12]
    mask = attention.packed_mask(batch.documents, batch.branches, batch.position_ids)[:, 0]
    # the second choice's first token (position 5 of row 0) sees the context and itself, not choice 1
    assert mask[0, 5].tolist() == [True, True, True, False, False, True, False, False]
    assert mask[1, 6].tolist() == [False] * 5 + [True, True, False]  # row 1: its own example only


def leaked(tokenizer_dir, family: str) -> float:
    """How far one example's outputs move when the other examples of its rows change."""
    module, _, specials = module_for(tokenizer_dir, "pair", family)
    g = torch.Generator().manual_seed(1)

    def pair(a: int, b: int, index: int) -> dict:
        texts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (a, b)]
        enc = module.task.encode({"label": 0}, texts, specials, max_length=40)
        return {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": 0, "index": index}

    subject = pair(5, 5, 0)  # 13 tokens: it shares a row of 39 with the 19 or 23 of the second
    module.eval()
    outputs = []
    with torch.no_grad():
        for others in ([pair(18, 18, 1), pair(8, 8, 2)], [pair(18, 18, 1), pair(10, 10, 2)]):
            batch = collate_packed([subject, *others], specials.pad)
            row = int(batch.extract_index[0, 0]) // batch.input_ids.shape[1]
            assert batch.documents[row].max() > 0  # it shares its row with another example
            outputs.append(module(batch)[0])
    return float((outputs[0] - outputs[1]).abs().max())


@pytest.mark.parametrize("family", ["gpt1-micro", "llama-micro"])
def test_attention_stays_inside_each_example(tokenizer_dir, family, monkeypatch):
    """Changing every other example leaves one example's outputs as they were; with the mask
    broken (plain causal over the whole row) they move, so this test sees a leak."""
    assert leaked(tokenizer_dir, family) < 1e-6  # the head's outputs: about 1e-3 at this size
    dense = attention.packed_mask
    whole_row = lambda documents, branches, positions, window=None: dense(  # noqa: E731
        torch.zeros_like(documents), None, positions, window
    )
    monkeypatch.setattr(attention, "packed_mask", whole_row)
    assert leaked(tokenizer_dir, family) > 1e-4


def test_a_short_context_before_many_long_continuations_is_laid_once_per_sequence(tokenizer_dir):
    """Sharing an empty prompt (`[start] [delim]`) among three 62-token replies would cost more
    attention than it saves (`sharing_pays`): the sequences pack apart, each a unit, and still equal
    the padded batch."""
    from gpt_ft.data.packing import sharing_pays

    S, D, E = 1, 2, 3
    long = [[S, D, *range(10, 71), E], [S, D, *range(20, 81), E], [S, D, *range(30, 91), E]]
    assert not sharing_pays(long, 2) and sharing_pays([[S, *range(10, 40), D, 5, E]] * 2, 32)
    module, _, specials = module_for(tokenizer_dir, "ranking", "llama-micro")
    rows = [
        {"input_ids": long, "extract_index": [63, 63, 63], "label": [2.0, 0.0, 1.0, math.nan], "index": 0}
    ]
    packed = collate_packed(rows, specials.pad, specials.delim)
    assert packed.branches is None and packed.real_tokens == 3 * 64
    module.train()
    assert_same(run(module, collate(rows, specials.pad)), run(module, packed), packed.choice_mask)


def test_compiled_packed_batches_of_new_shapes_reuse_one_dynamic_graph(tokenizer_dir):
    """`--model.compile` on packed batches, whose rows and lengths change every step: a static graph
    for the first shape and one dynamic graph for every later one (on a CPU the blocked attention's
    loop over query blocks, which would fix the length, stays out of the graph), with the eager
    model's losses (bf16: the compiled graph runs SDPA where eager runs the blocked matmuls)."""
    from torch._dynamo.utils import counters

    module, _, specials = module_for(tokenizer_dir, "single", "llama-micro")
    task, vocab = module.task, module.gpt.config.vocab_size - 8
    batches = [collate_packed(examples(task, "single", specials, vocab, n=5 + s, seed=s), specials.pad)
               for s in range(5)]  # fmt: skip
    assert len({tuple(b.input_ids.shape) for b in batches}) == 5
    module.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = [module.losses(b)[0].float() for b in batches]
        torch._dynamo.reset()
        counters.clear()
        module.gpt.compile(backend="eager")
        try:
            compiled = [module.losses(b)[0].float() for b in batches]
        finally:
            torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] == 2
    for a, b in zip(compiled, eager):
        assert a.item() == pytest.approx(b.item(), rel=2e-2)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_training_pass_reads_nothing_back_to_the_host(tokenizer_dir, monkeypatch, shape):
    """Each shape's loss and backward pass, on packed rows, padded rows and (multiple choice) shared
    contexts, makes none of the calls that would hold a GPU's host (`tests.helpers.HostReads`): the
    target positions and the padded contexts come from the collator. (Rows laid flat, a CPU's path
    alone, read their offsets back: the dense mask stands in for the GPU's kernels here.)"""
    monkeypatch.setattr(attention, "FORCE_KERNEL", "dense")
    monkeypatch.setattr(decoding, "VALUES_CHECKED_ON", frozenset())  # a CPU's check of the ids alone
    module, _, specials = module_for(tokenizer_dir, shape, "llama-micro")
    rows = examples(module.task, shape, specials, vocab=module.gpt.config.vocab_size - 5, n=6)
    batches = {"packed": collate_packed(rows, specials.pad), "padded": collate(rows, specials.pad)}
    if shape == "choice":
        batches["shared"] = collate_shared(rows, specials.pad, specials.delim)
        assert batches["shared"].padded_contexts
    module.train()
    for kind, batch in batches.items():
        with HostReads() as reads:
            loss, _ = module.losses(batch)
            loss.backward()
        assert reads.calls == [], kind


@pytest.mark.parametrize("shape", ["preference", "choice"])
def test_an_answer_given_twice_runs_once_and_scores_a_tie(tokenizer_dir, shape):
    """Chosen = rejected (two identical endings): laid out twice, the two copies' scores differed by a
    few ulps and a documented tie counted as a win. Once, they are equal; losses as padded."""
    module, rows, specials = module_for(tokenizer_dir, shape, "gpt1-micro")
    module.eval()
    twice = dict(rows[0])
    first = twice["input_ids"][0]
    twice["input_ids"] = [first, list(first), *twice["input_ids"][2:]]
    reads = twice["extract_index"]
    twice["extract_index"] = [reads[0], reads[0], *reads[2:]]
    rows = [twice, *rows[1:]]
    packed = collate_packed(rows, specials.pad, specials.delim)
    assert packed.extract_index[0, 0] == packed.extract_index[0, 1]
    padded = collate(rows, specials.pad)
    assert_same(run(module, padded), run(module, packed), padded.choice_mask)
    with torch.no_grad():
        scores = module(packed)[0]
    assert scores[0] == scores[1]
