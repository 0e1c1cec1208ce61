"""Embeddings: InfoNCE and CoSENT on hand-computed cases, retrieval metrics by hand, the card's
texts and errors, a packed text's vector equal to the text alone in every family, and the loss of
two processes equal to one process with the whole batch."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from gpt_ft.adapters import Embedding, Reranker, TaskDataError
from gpt_ft.adapters.contrastive import NO_TEXT, cosent, info_nce, left_out, text_key
from gpt_ft.adapters.embedding import EmbeddingHead, retrieval_metrics
from gpt_ft.adapters.metrics import RETRIEVAL, ranked_metrics
from gpt_ft.data.batches import collate, collate_packed, gold
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from gpt_ft.errors import CardError
from gpt_ft.training.module import GPTModule
from tests.background import Command
from tests.helpers import FAMILY_MICRO, HostReads

FAMILIES = {**FAMILY_MICRO, "gpt1-micro": ("gpt-micro", {}), "gpt2-micro": ("gpt-micro", {"pre_ln": True})}
NO_DROPOUT = {"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0}


def distinct(n: int) -> Tensor:
    """Keys of `n` different texts (`text_key`'s shape: six bytes each)."""
    keys = torch.zeros(n, len(NO_TEXT))
    keys[:, 0], keys[:, 1] = torch.arange(n) % 256, torch.arange(n) // 256
    return keys


def label_rows(texts: Tensor, scores: Tensor | None = None) -> Tensor:
    """Embedding labels: each row's gold score (1 by default), then its texts' keys, texts (B, S, K)."""
    scores = torch.ones(len(texts)) if scores is None else scores
    return torch.cat([scores[:, None], texts.flatten(1).float()], dim=1)


def pairs(n: int) -> Tensor:
    """The keys of `n` rows' anchors and positives, every text different: (n, 2, K)."""
    return distinct(2 * n).view(n, 2, -1)


def test_a_negative_whose_text_reads_as_json_is_a_text():
    """A negative is a text or a list of texts: one that spells a JSON list (code, math) stays a text."""
    from gpt_ft.adapters.embedding import negative_texts

    assert negative_texts({"negatives": "[1, 2]"}, "negatives", 3) == ["[1, 2]"]  # a negative's text
    assert negative_texts({"negatives": "[]"}, "negatives", 3) == ["[]"]


def test_info_nce_on_a_hand_computed_case():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    candidates = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    # τ = 1: anchor 0's cosines are [1, 0.6], its positive the first: -log(e/(e + e^0.6)) = log(1 + e^-0.4);
    # anchor 1's are [0, 0.8], its positive the second: log(1 + e^-0.8).
    none = torch.zeros(2, 2, dtype=torch.bool)
    losses = info_nce(anchors, candidates, torch.tensor([0, 1]), none, temperature=1.0)
    assert losses.tolist() == pytest.approx(
        [math.log1p(math.exp(-0.4)), math.log1p(math.exp(-0.8))], abs=1e-6
    )
    # A candidate left out is out of the softmax: anchor 0 alone with its positive.
    one = info_nce(anchors[:1], candidates, torch.tensor([0]), torch.tensor([[False, True]]), temperature=1.0)
    assert one.item() == pytest.approx(0.0)


def test_info_nce_is_cross_entropy_over_the_similarity_matrix():
    g = torch.Generator().manual_seed(0)
    anchors = F.normalize(torch.randn(5, 8, generator=g), dim=-1)
    candidates = F.normalize(torch.randn(10, 8, generator=g), dim=-1)
    positive = torch.tensor([0, 2, 4, 6, 8])
    expected = F.cross_entropy(anchors @ candidates.T / 0.05, positive, reduction="none")
    none = torch.zeros(5, 10, dtype=torch.bool)
    torch.testing.assert_close(info_nce(anchors, candidates, positive, none), expected)


@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_symmetric_info_nce_divides_both_directions_by_the_cards_temperature(temperature):
    """The mean of anchor→positives and positive→anchors, each over the batch, at the card's τ."""
    torch.manual_seed(0)
    head = EmbeddingHead(8, temperature=temperature, symmetric=True, candidates=1, dropout=0.0).eval()
    outputs = F.normalize(torch.randn(4, 2, 8), dim=-1)
    anchors, positives, own = outputs[:, 0], outputs[:, 1], torch.arange(4)
    forward = F.cross_entropy(anchors @ positives.T / temperature, own, reduction="none")
    back = F.cross_entropy(positives @ anchors.T / temperature, own, reduction="none")
    torch.testing.assert_close(head.losses(outputs, label_rows(pairs(4))), (forward + back) / 2)


def test_info_nce_leaves_out_the_texts_that_match():
    """By hand, which candidates each softmax leaves out: every other copy of a positive of the
    row's anchor's text (another row may share the positive, or the anchor with another positive),
    and a text the row lacks; backward, every other anchor of the positive's text. Known by keys:
    their vectors may differ (dropout in a padded batch)."""
    a, b, p, q, n = distinct(5)
    none = torch.tensor(NO_TEXT, dtype=torch.float)
    texts = torch.stack(
        [
            torch.stack([a, p, n]),  # row 0
            torch.stack([a, q, none]),  # row 1: row 0's anchor with another positive; no hard negative
            torch.stack([b, p, q]),  # row 2: row 0's positive; row 1's positive as a hard negative
        ]
    )
    forward, backward = left_out(texts, torch.arange(3))
    # candidates: p n | q (none) | p q; a's positives are p and q, b's p alone
    assert forward.tolist() == [
        [False, False, True, True, True, True],
        [True, False, False, True, True, True],
        [True, False, False, True, False, False],
    ]
    # anchors a a b: p's anchors are a and b, q's a alone
    assert backward.tolist() == [[False, True, True], [True, False, False], [True, True, False]]
    assert left_out(texts, torch.tensor([2]))[0].tolist() == forward[2:].tolist()  # one process's rows
    # Two rows sharing a positive, symmetric: nothing left to push apart, each direction's loss 0.
    a0, a1 = (
        F.normalize(torch.tensor([1.0, 0.1, 0.0]), dim=0),
        F.normalize(torch.tensor([1.0, -0.1, 0.0]), dim=0),
    )
    P = torch.tensor([1.0, 0.0, 0.0])
    outputs = torch.stack([torch.stack([a0, P]), torch.stack([a1, P])])
    shared = pairs(2)
    shared[1, 1] = shared[0, 1]
    losses = EmbeddingHead(3, symmetric=True, candidates=1, dropout=0.0).losses(outputs, label_rows(shared))
    assert losses.tolist() == [0.0, 0.0]


def test_a_collapsed_model_keeps_every_other_text_a_negative():
    """Every text given one vector: the texts differ, so each anchor's softmax is over all N
    candidates tied, log N (a vector-equality rule took them for copies of the positive: loss 0)."""
    same = F.normalize(torch.ones(3, 2, 4), dim=-1)
    losses = EmbeddingHead(4, candidates=1, dropout=0.0).losses(same, label_rows(pairs(3)))
    torch.testing.assert_close(losses, torch.full((3,), math.log(3)))


@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_labels_under_half_precision_keep_their_texts_apart(precision, dtype, tokenizer_dir):
    """Under `bf16-true` and `16-true` Lightning casts a batch's floating-point tensors: label rows
    travel as bits, and even cast as floats the keys' bytes survive, so the loss and the retrieval
    metrics are float32's (keys as wider integers became inf in fp16 and merged in bf16)."""
    from lightning.pytorch.plugins.precision import HalfPrecision

    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Embedding(name="e", negatives="hard", metrics=["mrr@10", "recall@1"])
    g = torch.Generator().manual_seed(0)
    texts = (torch.randint(5, 300, (3, 6), generator=g).tolist() for _ in range(400))
    batch = collate([{**encoded(task, specials, t), "index": i} for i, t in enumerate(texts)], specials.pad)
    labels = gold(batch.labels)
    assert torch.equal(gold(HalfPrecision(precision).convert_input(batch).labels), labels)
    outputs = F.normalize(torch.randn(400, 3, 8, generator=g), dim=-1)
    head = EmbeddingHead(8, candidates=2, symmetric=True, dropout=0.0)
    cast = labels.to(dtype).float()
    torch.testing.assert_close(head.losses(outputs, cast), head.losses(outputs, labels), rtol=0, atol=0)
    metrics = task.output.metric_values(outputs[:, :2], labels, ["mrr@10", "recall@1"])
    assert task.output.metric_values(outputs[:, :2], cast, ["mrr@10", "recall@1"]) == metrics


def test_the_heads_dropout_gives_a_recurring_text_one_mask():
    from gpt_ft.adapters.embedding import EmbeddingHead

    torch.manual_seed(0)
    head = EmbeddingHead(16, dropout=0.5).train()
    extract = torch.randn(4, 3, 16)
    extract[2, 1] = extract[0, 0]  # one text twice in the batch: one state
    dropped = head.dropout_per_text(extract)
    assert torch.equal(dropped[2, 1], dropped[0, 0])
    assert not torch.equal(dropped[1, 0] == 0, dropped[0, 0] == 0)  # other texts: their own masks
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], extract[kept] * 2)  # inverted dropout: kept / (1 - p)
    assert 0.4 < kept.float().mean() < 0.6
    assert torch.equal(head.eval().dropout_per_text(extract), extract)


def test_the_heads_training_pass_reads_nothing_back_to_the_host():
    """Dropout per text and symmetric InfoNCE with a recurring text, forward and backward: nothing
    that would make a GPU wait for the host (`torch.unique` did, to learn its output's size)."""
    torch.manual_seed(0)
    head = EmbeddingHead(16, dimensions=8, dropout=0.5, symmetric=True, candidates=2).train()
    extract = torch.randn(4, 3, 16)
    extract[2, 1] = extract[0, 1]  # two anchors with one positive
    texts = distinct(12).view(4, 3, -1)
    texts[2, 1] = texts[0, 1]
    extract.requires_grad_(True)
    with HostReads() as reads:
        head.losses(head(extract), label_rows(texts)).sum().backward()
    assert reads.calls == [] and extract.grad is not None


def test_cosent_on_hand_computed_cases():
    # One ranked pair (gold 5 > 1): log(1 + exp(20 (cos_1 - cos_0))) = log(1 + e^-2) when right...
    assert cosent(torch.tensor([0.6, 0.5]), torch.tensor([5.0, 1.0])).item() == pytest.approx(
        math.log1p(math.exp(-2)), rel=1e-6
    )
    # ... and log(1 + e^2) when the cosines rank the pair the wrong way round.
    assert cosent(torch.tensor([0.6, 0.5]), torch.tensor([1.0, 5.0])).item() == pytest.approx(
        math.log1p(math.exp(2)), rel=1e-6
    )
    # Equal gold scores rank nothing: log(1 + 0) = 0.
    assert cosent(torch.tensor([0.9, 0.1]), torch.tensor([2.0, 2.0])).item() == 0.0
    # Three pairs, gold 3 > 2 > 1, cosines 0.5, 0.7, 0.1: the ranked (i, j) are (0,1), (0,2), (1,2).
    terms = [20 * (0.7 - 0.5), 20 * (0.1 - 0.5), 20 * (0.1 - 0.7)]
    expected = math.log(1 + sum(math.exp(t) for t in terms))
    assert cosent(torch.tensor([0.5, 0.7, 0.1]), torch.tensor([3.0, 2.0, 1.0])).item() == pytest.approx(
        expected, rel=1e-5
    )


def test_correlations_need_gold_scores():
    from gpt_ft.adapters import Embedding
    from gpt_ft.adapters.outputs import CardError

    Embedding(name="e", score="score", metrics=["spearman", "mrr@10"])
    with pytest.raises(CardError, match=r"unknown metric\(s\) \['spearman'\].*embedding without `score`"):
        Embedding(name="e", metrics=["spearman", "mrr@10"])


def test_retrieval_metrics_by_hand():
    # Query i scores document j by corpus[j][i]: q0 ranks its own document 1st (1.0 over 0, 0),
    # q1 2nd (0.5 under d0's 0.9), q2 3rd (0.1 under 0.5 and 0.4).
    queries = torch.eye(3)
    corpus = torch.tensor([[1.0, 0.9, 0.5], [0.0, 0.5, 0.4], [0.0, 0.0, 0.1]])
    got = retrieval_metrics(queries, corpus, pairs(3), ["mrr@10", "ndcg@10", "recall@1", "recall@10"])
    assert got["mrr@10"].item() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert got["ndcg@10"].item() == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(4)) / 3)
    assert got["recall@1"].item() == pytest.approx(1 / 3)
    assert got["recall@10"].item() == 1.0
    # A tie is a random order of the tied documents: q1 ties d0 with its own d1, 1st or 2nd.
    tied = retrieval_metrics(torch.eye(2), torch.tensor([[1.0, 0.5], [0.0, 0.5]]), pairs(2), ["mrr@10"])
    assert tied["mrr@10"].item() == pytest.approx((1 + (1 + 1 / 2) / 2) / 2)
    # ... as are scores a few last bits apart (a vector's last bits depend on its batch), either way.
    for d0 in (0.5 + 3e-8, 0.5 - 3e-8):
        near = retrieval_metrics(torch.eye(2), torch.tensor([[1.0, d0], [0.0, 0.5]]), pairs(2), ["mrr@10"])
        assert near["mrr@10"].item() == pytest.approx((1 + (1 + 1 / 2) / 2) / 2)
    # Two rows sharing a positive (d0 = d1): the other copy is no rival, so each query finds its own first.
    shared, texts = torch.tensor([[0.6, 0.8], [0.6, 0.8], [1.0, 0.0]]), pairs(3)
    texts[1, 1] = texts[0, 1]
    assert retrieval_metrics(shared, shared, texts, ["recall@1"])["recall@1"].item() == 1.0
    # ... which the texts' keys say, not their vectors: a model that gives three texts one vector
    # ties them all (each 1st, 2nd or 3rd); two of them one text: two documents, tied.
    same = torch.ones(3, 2) / math.sqrt(2)
    collapsed = retrieval_metrics(same, same, pairs(3), ["recall@1", "mrr@10"])
    assert collapsed["recall@1"].item() == pytest.approx(1 / 3)
    assert collapsed["mrr@10"].item() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert retrieval_metrics(same, same, texts, ["recall@1"])["recall@1"].item() == pytest.approx(1 / 2)
    # The corpus is of distinct documents: P, the positive of rows 0 and 2, is one rival to q1
    # (which prefers it to its own Q), not two: ranks 1, 2, 1.
    P, Q = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    queries = torch.tensor([[1.0, 0.0], [0.8, 0.6], [1.0, 0.0]])
    texts = pairs(3)
    texts[2, 1] = texts[0, 1]
    got = retrieval_metrics(queries, torch.stack([P, Q, P]), texts, ["mrr@10", "recall@1"])
    assert got["mrr@10"].item() == pytest.approx((1 + 1 / 2 + 1) / 3)
    # ... and a document several rows hold is one in a tie: q0 and q2 tie P with Q (1st or 2nd).
    tie = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    got = retrieval_metrics(tie, torch.stack([P, Q, P]), texts, ["mrr@10"])
    assert got["mrr@10"].item() == pytest.approx((0.75 + 1 + 0.75) / 3)
    # One query text with two positives (rows 0 and 1) is one query, both documents relevant (as MTEB
    # and sentence-transformers score it), read from its first row: P 1st, then Q tied with R.
    texts = pairs(3)
    texts[1, 0] = texts[0, 0]
    queries, R = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, -1.0]]), torch.tensor([0.0, -1.0])
    got = retrieval_metrics(queries, torch.stack([P, Q, R]), texts, list(RETRIEVAL))
    assert got["recall@1"].item() == pytest.approx((1 / 2 + 1) / 2)  # one of its two in the 1st place
    assert got["recall@10"].item() == 1.0 and got["mrr@10"].item() == 1.0
    dcg = 1 + (1 / math.log2(3) + 1 / math.log2(4)) / 2  # Q 2nd or 3rd
    assert got["ndcg@10"].item() == pytest.approx((dcg / (1 + 1 / math.log2(3)) + 1) / 2)
    # All three tied: its first relevant one is 1st with chance 2/3, 2nd with 1/3; q2's one of three.
    got = retrieval_metrics(torch.zeros(3, 2), torch.stack([P, Q, R]), texts, ["mrr@10"])
    assert got["mrr@10"].item() == pytest.approx((2 / 3 + 1 / 3 / 2 + (1 + 1 / 2 + 1 / 3) / 3) / 2)


def test_retrieval_in_blocks_of_queries_equals_all_at_once(monkeypatch):
    """Queries are ranked a block at a time (one 12,000 x 12,000 float64 tensor is 1.2 GB, and ranking
    makes several): the same figures."""
    import gpt_ft.adapters.metrics as metrics

    generator = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(40, 8, generator=generator), torch.randn(40, 8, generator=generator)
    texts = pairs(40)
    texts[5:10, 0] = texts[4, 0]  # a query with six positives
    texts[20:23, 1] = texts[19, 1]  # a document four rows share
    whole = retrieval_metrics(queries, corpus, texts, list(RETRIEVAL))
    monkeypatch.setattr(metrics, "QUERY_BLOCK", 7 * 37)  # 7 of the 35 distinct queries a block (37 documents)
    blocks, ranked = [], metrics.ranked_values
    monkeypatch.setattr(metrics, "ranked_values", lambda s, *a: blocks.append(len(s)) or ranked(s, *a))
    assert retrieval_metrics(queries, corpus, texts, list(RETRIEVAL)) == whole
    assert blocks == [7] * 5


def test_ranked_metrics_are_the_mean_over_the_orders_of_tied_scores():
    """Against a brute force: every order of the tied documents (those of one score) scored as
    sentence-transformers' `InformationRetrievalEvaluator` scores a ranked list, and averaged."""
    from itertools import permutations, product

    def scored(order: list[int], relevant: set[int]) -> dict[str, float]:
        found = [d in relevant for d in order]
        first = next(i for i, f in enumerate(found) if f)
        dcg = sum(1 / math.log2(i + 2) for i, f in enumerate(found[:10]) if f)
        return {
            "mrr@10": 1 / (first + 1) if first < 10 else 0.0,
            "ndcg@10": dcg / sum(1 / math.log2(i + 2) for i in range(min(len(relevant), 10))),
            "recall@1": sum(found[:1]) / len(relevant),
            "recall@10": sum(found[:10]) / len(relevant),
        }

    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        documents = int(torch.randint(2, 13, (), generator=generator))
        scores = torch.randint(0, 4, (documents,), generator=generator).double()
        relevant = torch.rand(documents, generator=generator) < 0.3
        relevant[int(torch.randint(0, documents, (), generator=generator))] = True
        groups = [
            [d for d in range(documents) if scores[d] == v]
            for v in sorted(set(scores.tolist()), reverse=True)
        ]
        if math.prod(math.factorial(len(g)) for g in groups) > 5000:
            continue
        orders = [sum(map(list, parts), []) for parts in product(*(permutations(g) for g in groups))]
        want = {
            name: sum(scored(o, set(relevant.nonzero().flatten().tolist()))[name] for o in orders)
            / len(orders)
            for name in RETRIEVAL
        }
        got = ranked_metrics(scores[None], relevant[None], list(RETRIEVAL))
        for name in RETRIEVAL:
            assert got[name].item() == pytest.approx(want[name], abs=1e-6), (name, scores, relevant)
    # A document the row has not is in no place; a NaN score (a model's NaN vector) scores NaN, as
    # does no row.
    scores, relevant = torch.tensor([[0.5, math.nan, 0.9]]), torch.tensor([[True, False, False]])
    present = torch.tensor([[True, False, True]])
    assert ranked_metrics(scores, relevant, ["mrr@10"], present)["mrr@10"].item() == 0.5
    assert math.isnan(ranked_metrics(scores, relevant, ["mrr@10"])["mrr@10"])
    no_rows = retrieval_metrics(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 2, 6), list(RETRIEVAL))
    assert all(math.isnan(v) for v in no_rows.values())
    # Scores 0.9e-6 apart, 11 of them over 9e-6: each ties its neighbours within 1e-6, not the whole
    # row through them (one block at chance, MRR 0.266); the relevant first ties the second alone.
    scores = torch.tensor([[0.5 + (10 - k) * 0.9e-6 for k in range(11)]], dtype=torch.float64)
    relevant = torch.arange(11)[None] == 0
    got = ranked_metrics(scores, relevant, ["mrr@10", "recall@1", "recall@10"])
    assert {k: v.item() for k, v in got.items()} == {"mrr@10": 0.75, "recall@1": 0.5, "recall@10": 1.0}


def test_a_card_frames_each_text_alone_with_its_prompt(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Embedding(name="e", negatives="hard", num_negatives=2, query_prompt="query: ")
    row = {"anchor": "a cat", "positive": "the cat", "hard": ["a dog", "the mat"]}
    texts = task.texts(row)
    assert texts == ["query: a cat", "the cat", "a dog", "the mat"]
    tokens = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    encoded = task.encode(row, tokens, specials, max_length=64)
    assert encoded.sequences == [[specials.start, *t, specials.extract] for t in tokens]
    assert encoded.extract_index == [len(t) + 1 for t in tokens]
    # the label: no score, a match (1); then which text each one is, `NO_TEXT` for a lacking negative
    keys = [text_key(ids) for ids in encoded.sequences]
    assert encoded.label == [1.0, *keys[0], *keys[1], *keys[2], *keys[3]]
    fewer = task.encode({}, tokens[:3], specials, max_length=64).label
    assert fewer == [1.0, *keys[0], *keys[1], *keys[2], *NO_TEXT] and task.output.label_text(fewer) == 1.0
    assert len(set(keys)) == 4 and all(len(key) == 6 and all(0 <= k < 256 for k in key) for key in keys)
    assert text_key(list(encoded.sequences[1])) == keys[1]  # the same tokens, the same key
    # an anchor or a positive lacking (a missing field reads as null), or empty (a table's empty cell)
    for lacking, said in [
        ({"anchor": None}, "has no value"),
        ({"positive": float("nan")}, "has no value"),
        ({"positive": ""}, "is empty"),
        ({"anchor": " \t"}, "is empty"),
    ]:
        (field,) = lacking
        with pytest.raises(TaskDataError, match=rf"^field '{field}' {said}: an embedding row needs its"):
            task.texts({**row, **lacking})
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # exact in any float type
        assert torch.tensor(encoded.label, dtype=dtype)[1:].long().tolist() == encoded.label[1:]
    assert task.num_sequences == 4 and task.output.default_metrics == (
        "mrr@10",
        "ndcg@10",
        "recall@1",
        "recall@10",
    )
    scored = Embedding(name="sts", anchor="sentence1", positive="sentence2", score="label")
    assert scored.loss == "cosent" and scored.output.default_metrics == ("spearman", "pearson")
    assert scored.output.example_label({"label": "3.5"}) == 3.5
    assert scored.output.example_label({}) is None  # a test row


@pytest.mark.parametrize(
    ("card", "message"),
    [
        (dict(loss="cosent"), "the cosent loss needs `score`"),
        (dict(labels=["a", "b"]), "an embedding task takes no `labels`"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(negatives=["n1", "n2"], num_negatives=3), "num_negatives=3 but 2 fields"),
        (dict(num_negatives=2), "num_negatives needs `negatives`, the field"),
        (dict(loss="CoSENT"), "loss is infonce or cosent, not 'CoSENT'"),  # from Python: no card type
        *[  # CoSENT scores each pair against its gold score: these were encoded, then left unread
            (dict(score="s", **extra), "the cosent loss takes no `negatives`, `symmetric` or `temperature`")
            for extra in (dict(negatives="n"), dict(symmetric=True), dict(temperature=0.01))
        ],
    ],
)
def test_a_card_that_cannot_work_is_one_sentence(card, message):
    with pytest.raises(CardError, match=message):
        Embedding(name="e", **card)


def test_an_empty_cell_among_the_negatives_is_none():
    """A table's empty cell reads as an empty text: no negative, as a null is, and NaN (pandas' and a
    JSON line's missing value); a value that is no text is named with its field."""
    fields = Embedding(name="e", negatives=["n1", "n2"])
    assert fields.texts({"anchor": "a", "positive": "b", "n1": "", "n2": "c"}) == ["a", "b", "c"]
    assert fields.texts({"anchor": "a", "positive": "b", "n1": float("nan"), "n2": None}) == ["a", "b"]
    listed = Embedding(name="e", negatives="hard", num_negatives=2)
    assert listed.texts({"anchor": "a", "positive": "b", "hard": ["", "c"]}) == ["a", "b", "c"]
    assert listed.texts({"anchor": "a", "positive": "b", "hard": float("nan")}) == ["a", "b"]
    with pytest.raises(TaskDataError, match=r"^field 'n2' holds a list \['y', 'z'\], not a text\.$"):
        fields.texts({"anchor": "a", "positive": "b", "n1": "x", "n2": ["y", "z"]})
    with pytest.raises(TaskDataError, match=r"^field 'hard' holds a list \['y'\], not a text\.$"):
        listed.texts({"anchor": "a", "positive": "b", "hard": ["x", ["y"]]})
    reranker = Reranker(name="r", num_negatives=2)
    assert reranker.texts({"query": "a", "positive": "b", "negatives": [float("nan"), "c"]}) == [
        "a",
        "b",
        "c",
    ]


def test_correlations_alone_make_no_retrieval_scores(monkeypatch):
    """An STS card scores Spearman on cosines: no Q x Q retrieval matrix (20 s and 4 GB at 12,000)."""
    from gpt_ft.adapters import embedding

    monkeypatch.setattr(embedding, "retrieval_metrics", lambda *a: pytest.fail("retrieval scores made"))
    task = Embedding(name="e", score="s")
    vectors = F.normalize(torch.randn(4, 2, 8), dim=-1)
    scores = torch.tensor([[0.5], [1.0], [2.0], [4.0]])
    labels = torch.cat([scores, torch.arange(4 * 2 * len(NO_TEXT)).view(4, -1)], 1)  # then the texts' keys
    values = task.output.metric_values(vectors, labels, ["spearman"])
    cosines = (vectors[:, 0] * vectors[:, 1]).sum(-1)
    assert float(values["spearman"]) == pytest.approx(float(torch.corrcoef(torch.stack(
        [cosines.argsort().argsort().float(), torch.arange(4.0)]))[0, 1]), abs=1e-6)  # fmt: skip


def test_too_many_negatives_in_a_row_are_named():
    task = Embedding(name="e", negatives="hard", num_negatives=1)
    with pytest.raises(TaskDataError, match=r"field 'hard' holds 2 negatives; the card allows 1"):
        task.texts({"anchor": "a", "positive": "b", "hard": ["c", "d"]})


def encoded(task, specials, texts: list[list[int]]) -> dict:
    """One example as the collators read it."""
    enc = task.encode({}, texts, specials, max_length=40)
    return {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": enc.label}


def embedding_examples(task, specials, vocab: int, n: int = 6, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        lengths = torch.randint(0, 15, (2 + i % 3,), generator=g).tolist()  # 0 to 2 negatives
        texts = [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths]
        rows.append({**encoded(task, specials, texts), "index": i})
    return rows


def test_each_pooling_frames_its_texts_literally():
    """extract: [start] text [extract] read at the extract token; last and mean: [start] text, read
    at (or ending at) its last token, an empty text at the start token. The export's template too."""
    S, D, E = 90, 91, 92
    specials = type("Specials", (), {"start": S, "delim": D, "extract": E})()
    for pooling, sequences, index in [
        ("extract", [[S, 5, 6, E], [S, E]], [3, 1]),
        ("last", [[S, 5, 6], [S]], [2, 0]),
        ("mean", [[S, 5, 6], [S]], [2, 0]),
    ]:
        task = Embedding(name="e", pooling=pooling)
        encoded = task.encode({}, [[5, 6], []], specials, max_length=8)
        assert (encoded.sequences, encoded.extract_index) == (sequences, index), pooling
        single = task.template(["<s>", "<d>", "<e>"])[0]
        assert single == ("<s> $A <e>" if pooling == "extract" else "<s> $A"), pooling
    with pytest.raises(CardError, match="pooling is one of"):
        Embedding(name="e", pooling="max")


def test_a_checkpoints_card_without_pooling_reads_as_the_extract_token():
    """Checkpoints written before `pooling` existed hold cards without it: GPT-1's extract token."""
    from gpt_ft.adapters.cards import card_from_value

    card = {"class_path": "gpt_ft.adapters.Embedding", "init_args": {"name": "old", "dimensions": 8}}
    task = card_from_value(card, "checkpoint")
    assert task.pooling == "extract" and not task.output.head(16, dropout=0.0, init_std=0.02).pools_mean
    card["init_args"]["pooling"] = "mean"
    assert card_from_value(card, "checkpoint").output.head(16, dropout=0.0, init_std=0.02).pools_mean


@pytest.mark.parametrize("pooling", ["extract", "last", "mean"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_texts_vector_is_its_pooled_state_packed_padded_or_alone(family, pooling, tokenizer_dir):
    """Each text's vector, from packed rows and from a padded batch, equals the one computed by hand
    from the text run alone: the state at the extract token or the last one, or the mean of the
    sequence's states, projected and normalised."""
    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Embedding(name="e", negatives="hard", num_negatives=2, dimensions=16, pooling=pooling)
    preset, overrides = FAMILIES[family]
    torch.manual_seed(0)
    module = GPTModule(
        preset=preset,
        overrides={"n_positions": 64, **NO_DROPOUT, **overrides},
        vocab_size=len(tok),
        task=task,
    ).eval()
    rows = embedding_examples(task, specials, vocab=len(tok) - 5)
    with torch.no_grad():
        packed = module(collate_packed(rows, specials.pad, None))  # (B, S, D)
        padded = module(collate(rows, specials.pad))
        torch.testing.assert_close(padded, packed, atol=1e-5, rtol=0)
        for b, row in enumerate(rows):
            for s, (seq, k) in enumerate(zip(row["input_ids"], row["extract_index"])):
                states = module.gpt(torch.tensor([seq]))[0]  # (T, C)
                state = states.mean(dim=0) if pooling == "mean" else states[k]
                assert pooling == "extract" or k == len(seq) - 1
                head = module.head
                vector = F.normalize(F.linear(state, head.weight, head.bias), dim=-1)
                torch.testing.assert_close(packed[b, s], vector, atol=1e-5, rtol=0)
            assert (packed[b, len(row["input_ids"]) :] == 0).all()  # the negatives it has not: zero


@pytest.mark.parametrize("packing", [True, False])
def test_validation_of_a_collapsed_model_scores_a_random_order(packing, tokenizer_dir):
    """A head that gives every text one vector: validation's retrieval metrics are a random order's
    of the split's distinct positives, and its loss InfoNCE's log N, not a perfect score (which
    taking equal vectors for one text gave); a positive two rows share stays one document."""
    from gpt_ft.training.eval_metrics import EvalMetrics

    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Embedding(name="e", dimensions=4, metrics=["recall@1", "mrr@10"])
    torch.manual_seed(0)
    module = GPTModule(preset="gpt-micro", overrides={"n_positions": 64}, vocab_size=len(tok), task=task)
    module.eval()
    with torch.no_grad():
        module.head.weight.zero_()
        module.head.bias.fill_(1.0)
    g = torch.Generator().manual_seed(0)
    texts = [[torch.randint(5, 200, (3 + i,), generator=g).tolist() for i in range(2)] for _ in range(6)]
    texts[5][1] = texts[4][1]  # rows 4 and 5 share their positive
    rows = [{**encoded(task, specials, t), "index": i} for i, t in enumerate(texts)]
    batch = collate_packed(rows, specials.pad, None) if packing else collate(rows, specials.pad)
    metric = EvalMetrics(task, lm_coef=0.0)
    with torch.no_grad():
        terms = module.terms(batch)
        no_lm = torch.zeros(6), torch.ones(6)  # an embedding task's LM term is off
        predictions = module.head.predictions(terms["logits"])
        metric.update(batch.index, *no_lm, terms["task_loss"], predictions, gold(batch.labels))
    got = metric.compute()
    # five documents, all tied: each query's own is any of the five places alike
    assert got["recall@1"].item() == pytest.approx(1 / 5)
    assert got["mrr@10"].item() == pytest.approx(sum(1 / k for k in range(1, 6)) / 5)
    # InfoNCE: each anchor over the six positives, all one cosine, less the other copy of its own (rows 4, 5)
    expected = (4 * math.log(6) + 2 * math.log(5)) / 6
    assert got["loss"].item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("family", ["gpt1-micro", "llama-micro"])
def test_mean_pooling_trains_packed_as_padded(family, tokenizer_dir):
    """The loss and every gradient of a packed batch equal the padded batch's under mean pooling."""
    from tests.training.test_packing import assert_same, run

    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Embedding(name="e", negatives="hard", num_negatives=2, pooling="mean")
    preset, overrides = FAMILIES[family]
    torch.manual_seed(0)
    module = GPTModule(preset=preset, overrides={"n_positions": 64, **NO_DROPOUT, **overrides},
                       vocab_size=len(tok), task=task, lm_coef=0.5).train()  # fmt: skip
    rows = embedding_examples(task, specials, vocab=len(tok) - 5)
    padded = collate(rows, specials.pad)
    assert_same(
        run(module, padded), run(module, collate_packed(rows, specials.pad, None)), padded.choice_mask
    )


def _two_process_loss(rank: int, path: str, anchors, candidates, result) -> None:
    import torch.distributed as dist

    from gpt_ft.adapters.embedding import EmbeddingHead

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    for loss in ("infonce", "cosent"):
        head = EmbeddingHead(8, dimensions=8, loss=loss, symmetric=True, candidates=2, dropout=0.0)
        head.load_state_dict(result["state"])
        half = slice(rank * 3, rank * 3 + 3)
        extract = torch.cat([anchors[half, None], candidates[half]], dim=1)  # (3, 3, 8)
        losses = head.losses(head(extract), LABELS[half])
        losses.mean().backward()  # each rank's mean; DDP averages the gradients
        grad = head.weight.grad.clone()
        dist.all_reduce(grad)
        mean = losses.mean().detach()
        dist.all_reduce(mean)
        if rank == 0:
            result[loss] = [(mean / 2).item(), (grad / 2).tolist()]
    dist.destroy_process_group()


SCORES = torch.tensor([4.0, 1.0, 2.5, 0.5, 3.0, 5.0])  # CoSENT's gold scores (InfoNCE reads none)
TEXTS = distinct(18).view(6, 3, -1)
TEXTS[4, 1] = TEXTS[0, 1]  # a positive of each process's rows is one text: InfoNCE knows the copy
LABELS = label_rows(TEXTS, SCORES)


def two_process_losses(out: str) -> None:
    """Each loss of one process with the whole batch, and of two with half each (their mean loss and
    averaged gradient, as DDP averages), written to `out` as JSON: run in a process of its own."""
    import json

    import torch.multiprocessing as mp

    from gpt_ft.adapters.embedding import EmbeddingHead

    g = torch.Generator().manual_seed(0)
    anchors, candidates = torch.randn(6, 8, generator=g), torch.randn(6, 2, 8, generator=g)
    extract = torch.cat([anchors[:, None], candidates], dim=1)
    results = {}
    with mp.Manager() as manager:
        shared = manager.dict()
        for loss in ("infonce", "cosent"):
            torch.manual_seed(1)
            head = EmbeddingHead(8, dimensions=8, loss=loss, symmetric=True, candidates=2, dropout=0.0)
            shared["state"] = head.state_dict()  # the same weights for both losses
            whole = head.losses(head(extract), LABELS).mean()
            whole.backward()
            results[loss] = {"one": [whole.item(), head.weight.grad.tolist()]}
        # forked: the children have this process's imports (spawned, each imported the toolkit anew)
        args = (f"{out}.rendezvous", anchors, candidates, shared)
        mp.start_processes(_two_process_loss, args=args, nprocs=2, start_method="fork")
        for loss in results:
            results[loss]["two"] = shared[loss]
    Path(out).write_text(json.dumps(results))


def start_two_processes(root):
    write = "from tests.adapters.test_embedding import two_process_losses; "
    write += f"two_process_losses({str(root / 'r.json')!r})"
    return [Command([sys.executable, "-c", write], preloaded=True)]


@pytest.mark.background(start=start_two_processes)
def test_two_processes_give_the_loss_and_gradient_of_one_with_the_whole_batch(background):
    import json

    assert background.runs[0].returncode == 0, background.runs[0].stderr[-3000:]
    results = json.loads((background.root / "r.json").read_text())
    assert set(results) == {"infonce", "cosent"}
    for loss, got in results.items():
        (one, grad_one), (two, grad_two) = got["one"], got["two"]
        assert two == pytest.approx(one, rel=1e-6, abs=1e-6), loss
        # fp32, summed in another order: equal to its rounding (cosines / 0.05 magnify it 20 times)
        torch.testing.assert_close(torch.tensor(grad_two), torch.tensor(grad_one), atol=1e-5, rtol=1e-4)


def test_a_reranker_frames_each_candidate_after_the_query_and_ranks_the_positive(tokenizer_dir):
    from gpt_ft.adapters import Reranker

    tok = load_tokenizer(tokenizer_dir)
    specials = special_token_ids(tok)
    task = Reranker(name="r", num_negatives=2)
    row = {"query": "a cat", "positive": "the cat sat", "negatives": ["a dog"]}
    assert task.texts(row) == ["a cat", "the cat sat", "a dog"]
    q, pos, neg = (tok(t, add_special_tokens=False)["input_ids"] for t in task.texts(row))
    encoded = task.encode(row, [q, pos, neg], specials, max_length=64)
    head = [specials.start, *q, specials.delim]
    assert encoded.sequences == [[*head, *pos, specials.extract], [*head, *neg, specials.extract]]
    assert encoded.label == 0 and task.shares_context and task.num_sequences == 3
    assert task.output.default_lm_coef == 0.0  # as sentence-transformers' CrossEncoder: no LM term
    # Rows ranking their positive 1st, 3rd (below two), and 2nd or 3rd (below one, tied with one: each
    # place half the time); NaN: no candidate.
    nan = float("nan")
    scores = torch.tensor([[2.0, 1.0, nan], [0.5, 1.0, 0.7], [0.3, 0.3, 0.4]])
    got = task.output.metric_values(scores, torch.zeros(3), ["mrr@10", "recall@1", "ndcg@10"])
    assert got["mrr@10"].item() == pytest.approx((1 + 1 / 3 + (1 / 2 + 1 / 3) / 2) / 3)
    assert got["recall@1"].item() == pytest.approx(1 / 3)
    ndcg = [1 / math.log2(r + 1) for r in (1, 2, 3)]
    assert got["ndcg@10"].item() == pytest.approx((ndcg[0] + ndcg[2] + (ndcg[1] + ndcg[2]) / 2) / 3)
    # A scorer that ties everything ranks at random: the mean over the 4 places, not the first.
    flat = task.output.metric_values(torch.zeros(5, 4), torch.zeros(5), ["mrr@10", "recall@1"])
    assert flat["mrr@10"].item() == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    assert flat["recall@1"].item() == pytest.approx(1 / 4)
    # A row without a negative has nothing to rank: left out, not a perfect score.
    alone = torch.cat([scores, torch.tensor([[0.1, nan, nan]])])
    assert task.output.metric_values(alone, torch.zeros(4), ["recall@1"]) == {"recall@1": got["recall@1"]}
    with pytest.warns(UserWarning, match=r"^Task 'r': no row scored has a negative to rank its positive"):
        nothing = task.output.metric_values(alone[3:], torch.zeros(1), ["recall@1"])  # said, not NaN alone
    assert nothing["recall@1"].isnan()
    assert task.output.format_prediction(scores[0], str) == "2 1"
    # The positive repeated as a negative, placed elsewhere in a packed row: a few last bits apart, a
    # tie (rank 1 or 2, half the time each) whatever the batch; a real difference still counts.
    near = torch.tensor([[0.008972378, 0.008972371], [0.008972371, 0.008972378], [0.5, 0.5001]])
    got = task.output.metric_values(near, torch.zeros(3), ["mrr@10"])
    assert got["mrr@10"].item() == pytest.approx((0.75 + 0.75 + 0.5) / 3)
    assert task.output.outcome(near[1], None)["label"] == 0
    needed = "a reranking row needs its query and its positive."  # (a missing field: null)
    for row, field in [
        ({"positive": None}, "positive has no value:"),
        ({"query": None}, "query has no value:"),
        ({"query": ""}, "query is empty:"),
        ({"positive": " "}, "positive is empty:"),
    ]:
        field, said = field.split(" ", 1)
        with pytest.raises(TaskDataError, match=rf"^field '{field}' {said} {needed}$"):
            task.texts({"query": "a", "positive": "b", "negatives": ["c"], **row})


def test_nli_records_become_triplets_as_sbert_and_simcse_build_them():
    from gpt_ft.adapters import NliTriplets

    task = NliTriplets(name="nli")
    records = [
        {"premise": "A man sings.", "hypothesis": "A person sings.", "label": 0},  # the hub's ids
        {"premise": "A man sings.", "hypothesis": "A woman sleeps.", "label": 2},
        {"premise": "A man sings.", "hypothesis": "A man sings loudly.", "label": 1},
        {
            "premise": "Two dogs run.",
            "hypothesis": "Animals move.",
            "label": "entailment",
        },  # the files' names
        {"premise": "A cat sits.", "hypothesis": "A cat runs.", "label": "contradiction"},  # no entailment
        {"premise": "Two dogs run.", "hypothesis": "Dogs are still.", "label": "-"},
    ]
    rows, named_by = task.regroup(records)
    assert rows == [
        {"anchor": "A man sings.", "positive": "A person sings.", "negatives": ["A woman sleeps."]},
        {"anchor": "Two dogs run.", "positive": "Animals move.", "negatives": []},
    ]
    assert named_by == [0, 3]  # each by its positive's record
    assert task.texts(rows[0]) == ["A man sings.", "A person sings.", "A woman sleeps."]
    assert task.text_fields() == ["premise", "hypothesis", "label"] and task.num_sequences == 3
    # One record to score (`Classifier`): its pair, labelled or not, whatever the label.
    for record in ({"premise": "A cat sits.", "hypothesis": "A cat runs."}, records[4]):
        assert task.to_predict(record) == {
            "anchor": "A cat sits.",
            "positive": "A cat runs.",
            "negatives": [],
        }
    with pytest.raises(TaskDataError, match=r"^field 'premise' holds a list \['a'\], not a text\.$"):
        task.to_predict({"premise": ["a"], "hypothesis": "b"})
    # A premise, or a hypothesis taken into a triplet, missing or empty: named (it trained as "").
    entailed = {"premise": "A man sings.", "label": "entailment"}
    for record, said in [
        ({**entailed, "hypothesis": None}, "field 'hypothesis' has no value"),
        ({**entailed, "hypothesis": ""}, "field 'hypothesis' is empty"),
        ({"premise": " ", "hypothesis": "b", "label": "neutral"}, "field 'premise' is empty"),
    ]:
        with pytest.raises(TaskDataError, match=rf"record 1: {said}: a triplet needs a premise"):
            task.regroup([record], where=lambda i: f"record {i + 1}")
    # A label none of the three, nor no gold label's: named (it dropped its premise's example).
    # An empty cell (a TSV's, a CSV's), NaN (pandas' missing value) and -1.0 (a float column) have none.
    none = ("-", -1, None, "", " ", float("nan"), -1.0, "neutral", 1, 1.0, "contradiction", 2.0)
    ok = [{**entailed, "hypothesis": "a", "label": v} for v in none]
    rows, _ = task.regroup(ok, where=lambda i: f"record {i + 1}")
    assert [r["positive"] for r in rows] == []  # no entailed hypothesis: no example
    rows, _ = task.regroup([{**entailed, "hypothesis": "b", "label": 0.0}, *ok])
    assert rows == [{"anchor": "A man sings.", "positive": "b", "negatives": ["a"]}]
    with pytest.raises(
        TaskDataError, match=r"^record 2: label 'entailmnet' in field 'label' is none of entail"
    ):
        task.regroup([ok[0], {**ok[0], "label": "entailmnet"}], where=lambda i: f"record {i + 1}")


def test_a_gold_score_of_minus_one_is_a_score_where_the_cards_range_holds_it():
    """Scores on a cosine's scale ([-1, 1]): `score_range` says -1 is one; without it, -1 marks an
    unlabelled row, as GLUE's STS-B test split has it on the hub."""
    from gpt_ft.errors import CardError

    cosines = Embedding(name="c", score="score", score_range=[-1, 1]).output
    assert [cosines.example_label({"score": v}) for v in (-1, "-1", -1.0, 0.5)] == [-1.0, -1.0, -1.0, 0.5]
    with pytest.raises(
        TaskDataError, match=r"^score 1\.5 in field 'score' is outside the card's score_range \[-1, 1\]\.$"
    ):
        cosines.example_label({"score": 1.5})
    stsb = Embedding(name="s", score="score").output
    assert [stsb.example_label({"score": v}) for v in (-1, "-1", 4.2)] == [None, None, 4.2]
    with pytest.raises(
        CardError,
        match=r"of the gold scores of `score`, low < high; got \[-1, 1\] on a card without `score`\.$",
    ):
        Embedding(name="u", score_range=[-1, 1])
    with pytest.raises(CardError, match=r"low < high; got \[1, -1\]\.$"):
        Embedding(name="r", score="score", score_range=[1, -1])
