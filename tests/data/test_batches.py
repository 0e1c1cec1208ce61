import dataclasses

import torch

from gpt_ft.data.batches import IGNORE_INDEX, collate, collate_blocks, collate_packed, collate_shared
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from tests.helpers import random_choice_examples

START, DELIM, EXTRACT, PAD = 100, 101, 102, 103


def test_collate_right_padding_hand_checked():
    examples = [
        {"input_ids": [[START, 5, 6, EXTRACT]], "extract_index": [3], "label": 1, "index": 7},
        {"input_ids": [[START, 7, EXTRACT]], "extract_index": [2], "label": 0, "index": 9},
    ]
    batch = collate(examples, PAD)
    X = IGNORE_INDEX
    assert batch.input_ids.tolist() == [[[START, 5, 6, EXTRACT]], [[START, 7, EXTRACT, PAD]]]
    assert batch.attention_mask.tolist() == [[[1, 1, 1, 1]], [[1, 1, 1, 0]]]
    assert batch.lm_targets.tolist() == [[[5, 6, EXTRACT, X]], [[7, EXTRACT, X, X]]]
    assert batch.extract_index.tolist() == [[3], [2]]
    assert batch.labels.tolist() == [1, 0] and batch.labels.dtype == torch.long
    assert batch.index.tolist() == [7, 9]
    assert batch.choice_mask.tolist() == [[True], [True]]


def test_collate_multiple_choice_with_a_missing_choice():
    examples = [
        {
            "input_ids": [[START, 1, EXTRACT], [START, 2, EXTRACT], [START, 3, EXTRACT]],
            "extract_index": [2, 2, 2],
            "label": 2,
            "index": 0,
        },
        {
            "input_ids": [[START, 4, EXTRACT], [START, 5, 6, EXTRACT]],
            "extract_index": [2, 3],
            "label": 0,
            "index": 1,
        },
    ]
    batch = collate(examples, PAD)
    assert batch.input_ids.shape == (2, 3, 4)
    assert batch.choice_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.input_ids[1, 2].tolist() == [PAD] * 4
    assert batch.lm_targets[1, 2].tolist() == [IGNORE_INDEX] * 4
    assert batch.extract_index.tolist() == [[2, 2, 2], [2, 3, 0]]


def test_collate_without_labels_has_no_labels_key():
    batch = collate([{"input_ids": [[START, EXTRACT]], "extract_index": [1], "label": None, "index": 0}], PAD)
    assert batch.labels is None


def test_choices_that_do_not_share_their_context_fall_back_to_the_plain_layout(tokenizer_dir):
    specials = special_token_ids(load_tokenizer(tokenizer_dir))
    rows, _ = random_choice_examples(specials, vocab=300, n=2)
    rows[1]["input_ids"].append([specials.start, 5, specials.delim, 7, specials.extract])  # another context
    assert collate_shared(rows, specials.pad, specials.delim) is None


def test_collate_shared_hand_checked():
    examples = [
        {
            "input_ids": [[START, 1, DELIM, 7, EXTRACT], [START, 1, DELIM, 8, 9, EXTRACT]],
            "extract_index": [4, 5],
            "label": 1,
            "index": 3,
        },
        {"input_ids": [[START, 2, 3, DELIM, 5, EXTRACT]], "extract_index": [5], "label": 0, "index": 4},
    ]
    batch = collate_shared(examples, PAD, DELIM, split="validation")
    X = IGNORE_INDEX
    assert batch.context_ids.tolist() == [[START, 1, DELIM, PAD], [START, 2, 3, DELIM]]
    assert batch.context_length.tolist() == [3, 4]
    assert batch.context_targets.tolist() == [[1, DELIM, X, X], [2, 3, DELIM, X]]
    assert batch.answer_ids.tolist() == [[[7, EXTRACT, PAD], [8, 9, EXTRACT]], [[5, EXTRACT, PAD], [PAD] * 3]]
    assert batch.answer_targets.tolist() == [[[EXTRACT, X, X], [9, EXTRACT, X]], [[EXTRACT, X, X], [X] * 3]]
    assert batch.delim_targets.tolist() == [[7, 8], [5, X]]
    assert batch.answer_extract.tolist() == [[1, 2], [1, 0]]
    assert batch.choice_mask.tolist() == [[True, True], [True, False]]
    assert batch.labels.tolist() == [1, 0] and batch.index.tolist() == [3, 4] and len(batch) == 2
    assert batch.split == "validation"


def test_collate_blocks_shifts_the_targets_by_one():
    batch = collate_blocks([(0, torch.tensor([1, 2, 3, 4])), (5, torch.tensor([5, 6, 7, 8]))])
    assert batch.input_ids.tolist() == [[[1, 2, 3]], [[5, 6, 7]]]
    assert batch.lm_targets.tolist() == [[[2, 3, 4]], [[6, 7, 8]]]
    assert batch.index.tolist() == [0, 5] and len(batch) == 2


def test_every_batch_kind_pins_each_of_its_tensors_and_keeps_the_rest(tokenizer_dir, monkeypatch):
    """What a loader with `pin_memory=True` calls on each batch (a CPU build cannot page-lock
    memory: a recorded copy stands in for the pinned tensor)."""
    pinned = []

    def pin(tensor):
        pinned.append(tensor.clone())
        return pinned[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    specials = special_token_ids(load_tokenizer(tokenizer_dir))
    rows, _ = random_choice_examples(specials, vocab=300, n=4)
    blocks = [(i, torch.arange(i, i + 9)) for i in range(3)]
    batches = [
        collate(rows, specials.pad),
        collate_shared(rows, specials.pad, specials.delim),
        collate_packed(rows, specials.pad, specials.delim),
        collate_blocks(blocks),
    ]
    for batch in batches:
        pinned.clear()
        out = batch.pin_memory()
        assert type(out) is type(batch)
        tensors = 0
        for field in dataclasses.fields(batch):
            before, after = getattr(batch, field.name), getattr(out, field.name)
            if isinstance(before, torch.Tensor):
                tensors += 1
                assert any(after is p for p in pinned) and torch.equal(after, before), field.name
            else:
                assert after == before, field.name
        assert tensors == len(pinned) >= 3


def test_rows_are_laid_as_the_search_over_every_row_length_lays_them():
    """`pack_rows` against the plain search: first fit, longest first, at every row length R rows
    need (R = 1, 2, ...), the cheapest kept (on a tie the longer rows). A batch offering more than
    `MOST_TRIED` lengths tries that many, evenly spread, and costs within 1% of the search."""
    import random

    from gpt_ft.data.packing import MOST_TRIED, ROW_TOKENS, pack_rows, row_cost, row_lengths

    def searched(lengths):
        order, best = sorted(range(len(lengths)), key=lambda i: -lengths[i]), None
        longest, total = max(lengths), sum(lengths)
        for R in range(1, -(-total // longest) + 1):
            L = max(longest, -(-total // R))
            if L > max(longest, ROW_TOKENS):
                continue
            rows = []
            for i in order:
                row = next((r for r in rows if r[0] + lengths[i] <= L), None)
                if row is None:
                    rows.append(row := [0, []])
                row[1].append((row[0], i))
                row[0] += lengths[i]
            if best is None or len(rows) * row_cost(L) < best[0]:
                best = (len(rows) * row_cost(L), L, rows)
        return best

    r, spread = random.Random(0), 0
    for _ in range(200):
        most = r.choice([5, 20, 60, 300])
        lengths = [r.randint(1, most) for _ in range(r.randint(1, 120))]
        cost, L, rows = searched(lengths)
        got_L, got = pack_rows(list(range(len(lengths))), lengths)
        laid = sorted(i for _, row in got for _, i in row)
        assert laid == list(range(len(lengths))) and all(used <= got_L for used, _ in got)
        assert all(o == sum(lengths[j] for _, j in row[:k]) for _, row in got for k, (o, _) in enumerate(row))
        if len(row_lengths(max(lengths), sum(lengths))) < MOST_TRIED:
            assert (got_L, got) == (L, rows)
        else:
            spread += 1
            assert len(got) * row_cost(got_L) <= 1.01 * cost
    assert spread > 10
    tried = row_lengths(20, 3 * 512 * 12)  # 512 triplets of 12-token texts: 237 lengths on offer
    assert len(tried) == MOST_TRIED and tried[::23] == [256, 20]
