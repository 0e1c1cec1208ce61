import warnings

import pytest

from gpt_ft.adapters import LocalFiles, TextPair
from gpt_ft.data.samplers import EpochSampler, LengthGroupedSampler, ResumableTrainData
from gpt_ft.data.task_data import TaskDataModule
from tests.helpers import write_varied_pairs


def test_length_grouped_sampler_splits_equal_similar_length_batches_over_ranks():
    lengths = [(i * 37) % 103 for i in range(103)]  # all different
    batch, world = 4, 2
    samplers = [
        LengthGroupedSampler(lengths, batch, num_replicas=world, rank=r, seed=1, window=1000)
        for r in range(world)
    ]
    shares = [list(s) for s in samplers]
    assert [len(s) for s in shares] == [len(samplers[0])] * world == [52, 52]  # ceil(103 / 2) each
    assert set(shares[0]) | set(shares[1]) == set(range(103))  # every example, one repeated
    # One step's 8 examples (4 per rank) are 8 neighbours in length order; the steps come shuffled.
    steps = [
        sorted((lengths[i] for s in shares for i in s[k : k + batch]), reverse=True)
        for k in range(0, 52, batch)
    ]
    everything = sorted((lengths[i] for s in shares for i in s), reverse=True)
    neighbours = [everything[k : k + batch * world] for k in range(0, 104, batch * world)]
    assert sorted(steps) == sorted(neighbours) and steps != neighbours
    for s in samplers:
        s.set_epoch(1)
    assert [list(s) for s in samplers] != shares  # a new order every epoch
    ordered = LengthGroupedSampler(lengths, batch, shuffle=False, window=1000)
    assert [lengths[i] for i in ordered] == sorted(lengths, reverse=True)


def test_fewer_examples_than_half_the_ranks_still_give_every_rank_one():
    """3 examples over 8 ranks: each rank its len() (1), the examples repeated as often as needed."""
    shares = [list(LengthGroupedSampler([5, 6, 7], 1, num_replicas=8, rank=r, seed=0)) for r in range(8)]
    assert [len(share) for share in shares] == [1] * 8 and {i for s in shares for i in s} == {0, 1, 2}


def test_length_grouping_cuts_padding(tmp_path, tokenizer_dir):
    write_varied_pairs(tmp_path)
    task = TextPair(
        name="pair",
        premise="sentence1",
        hypothesis="sentence2",
        labels=["entailment", "not_entailment"],
        local=LocalFiles(splits={"train": "train.tsv", "validation": "dev.tsv"}, columns={"index": "idx"}),
    )

    def padded_share(length_grouped: bool, packing: bool = False) -> float:
        data = TaskDataModule(
            task,
            tokenizer_dir,
            data_dir=str(tmp_path),
            batch_size=4,
            length_grouped=length_grouped,
            packing=packing,
        )
        data.setup("fit")
        real = total = 0
        for batch in data.train_dataloader():
            if not packing:
                assert batch.real_tokens == int(batch.attention_mask.sum())
            real += batch.real_tokens
            total += batch.input_ids.numel()
        return 1 - real / total

    plain, grouped = padded_share(False), padded_share(True)
    assert grouped < plain / 2, (plain, grouped)
    packed = padded_share(False, packing=True)  # the default
    assert packed < plain / 2, (plain, packed)


def test_epoch_sampler_order_depends_on_seed_and_epoch_and_a_resumed_epoch_skips_ahead():
    def sampler() -> EpochSampler:
        return EpochSampler(range(10), num_replicas=1, rank=0, shuffle=True, seed=5)

    s = sampler()
    first = list(s)
    assert sorted(first) == list(range(10)) and list(s) == first and list(sampler()) == first
    s.skip(1, 4)  # a run resumed in epoch 1 after 4 samples
    whole = list(s.indices())  # epoch 1's, before any set_epoch: worker processes draw this early
    assert whole != first and sorted(whole) == list(range(10))
    assert list(s) == whole[4:]
    s.set_epoch(1)  # as Lightning then calls it
    assert list(s) == whole  # skipped once only
    s.skip(1, 0)
    assert list(s) == whole


def test_each_seed_draws_epoch_orders_of_its_own():
    """With DistributedSampler's seed + epoch, seed 0's second epoch was seed 1's first (and seed 0's
    third seed 2's first): runs over seeds 0, 1, 2 shared most of their data orders."""

    def orders(seed: int, cls=EpochSampler, **kwargs) -> list[list[int]]:
        s = cls(**kwargs, num_replicas=1, rank=0, seed=seed) if kwargs else cls(range(50), 1, 0, seed=seed)
        return [(s.set_epoch(epoch), list(s))[1] for epoch in range(4)]

    for kwargs in ({}, {"lengths": list(range(50)), "batch_size": 4, "window": 2}):
        cls = LengthGroupedSampler if kwargs else EpochSampler
        drawn = [order for seed in (0, 1, 2, 3) for order in orders(seed, cls, **kwargs)]
        assert len({tuple(order) for order in drawn}) == len(drawn)
        assert orders(0, cls, **kwargs)[1] != orders(1, cls, **kwargs)[0]


def test_resumable_train_data_hands_its_position_to_the_sampler_once():
    data = ResumableTrainData()
    assert data.state_dict() == {}  # no trainer: nothing to save
    data.load_state_dict({})
    sampler = EpochSampler(range(12), num_replicas=1, rank=0, shuffle=False)
    assert list(data._resumed(sampler, batch_size=3)) == list(range(12))
    data.load_state_dict({"epoch": 0, "batches": 2})
    assert list(data._resumed(sampler, batch_size=3)) == list(range(6, 12))  # 2 batches of 3 skipped
    assert list(data._resumed(sampler, batch_size=3)) == list(range(12))
    data.load_state_dict({"epoch": 0, "batches": 2, "batch_size": 4})  # resumed with batches of 3
    # the 8 trained on skipped; Lightning counts 2 steps done of the new size: said (it passed unsaid)
    with pytest.warns(UserWarning, match=r"Lightning counts that epoch's 2 batches done in the new size, so"):
        assert list(data._resumed(sampler, batch_size=3)) == list(range(8, 12))
    grouped = LengthGroupedSampler([3] * 12, 3, shuffle=False)
    data.load_state_dict({"epoch": 0, "batches": 2, "batch_size": 4})
    with pytest.warns(
        UserWarning,
        match="stopped 2 batches of 4 examples into epoch 0 and this run's batches hold 3: .*another order",
    ):
        assert list(data._resumed(grouped, batch_size=3)) == list(grouped.indices())[8:]
    # A checkpoint from before each seed drew its own orders (it records no seed): said, where the seed
    # is not 0 (whose orders are unchanged); it resumed in the new order unsaid.
    data.seed = 3
    data.load_state_dict({"epoch": 0, "batches": 2, "batch_size": 3})
    old = r"^The checkpoint is from before each seed drew epoch orders of its own \(it records no seed\): "
    with pytest.warns(UserWarning, match=old + "with seed 3, the rest of epoch 0 follows"):
        data._resumed(EpochSampler(range(12), num_replicas=1, rank=0), batch_size=3)
    # Resumed mid-epoch with another seed: that epoch's rest is another order's (it passed unsaid).
    data.seed = 8
    data.load_state_dict({"epoch": 0, "batches": 2, "batch_size": 3, "seed": 7})
    said = r"^The checkpoint stopped 2 batches into epoch 0 of seed 7's order, and this run orders its data "
    said += r"by seed 8: .* --seed_everything 7 \(or --data.seed 7\) resumes it exactly.$"
    with pytest.warns(UserWarning, match=said):
        data._resumed(EpochSampler(range(12), num_replicas=1, rank=0), batch_size=3)
    # Resumed mid-epoch with --data.shuffle or --data.length_grouped changed (it passed unsaid).
    data.load_state_dict({"epoch": 0, "batches": 2, "batch_size": 3, "seed": 8, "order": "shuffled"})
    said = (
        r"^The checkpoint stopped 2 batches into epoch 0, its data shuffled, and this run takes it in order, "
    )
    said += "in length-grouped batches: the rest of that epoch trains some examples a second time"
    with pytest.warns(UserWarning, match=said):
        data._resumed(grouped, batch_size=3)
    assert data._order == "in order, in length-grouped batches"
    data.load_state_dict({"epoch": 0, "batches": 2, "batch_size": 3, "seed": 8, "order": "in order"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same order: nothing to say
        data._resumed(EpochSampler(range(12), num_replicas=1, rank=0, shuffle=False), batch_size=3)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize(("then", "now"), [(2, 1), (1, 2), (2, 3), (3, 2)])
def test_an_epoch_resumed_on_another_number_of_processes_trains_each_example_it_had_not_once(
    grouped, then, now
):
    """A checkpoint of `then` processes, 5 steps of 12 examples into an epoch of 100, resumed on
    `now` at the same 12 examples a step: each rank skipped its own first 5 batches of the new
    dealing, training again examples the epoch had trained and never those it had not."""

    def ranks(world: int) -> list:
        if grouped:
            lengths = [(7 * i) % 23 for i in range(100)]
            return [
                LengthGroupedSampler(lengths, 12 // world, num_replicas=world, rank=r, seed=4)
                for r in range(world)
            ]
        return [
            EpochSampler(range(100), num_replicas=world, rank=r, shuffle=True, seed=4) for r in range(world)
        ]

    trained = []
    for sampler in ranks(then):
        sampler.set_epoch(1)
        trained += list(sampler.indices())[: 5 * (12 // then)]
    rest = []
    for sampler in ranks(now):
        data = ResumableTrainData()
        data.load_state_dict({"epoch": 1, "batches": 5, "batch_size": 12 // then, "world": then})
        rest += list(data._resumed(sampler, batch_size=12 // now))
    assert len(set(trained)) == len(trained) == 60 and not set(trained) & set(rest)
    assert set(trained) | set(rest) == set(range(100))  # (the last step's shares evened out)


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_epoch_order_dealt_out_is_distributed_samplers(drop_last):
    """One order (`order`, dealt by `dealt`) serves a plain epoch and a resumed one alike."""
    from torch.utils.data import DistributedSampler

    for n, world in ((10, 3), (16, 4), (7, 2), (33, 8), (5, 1)):
        for rank in range(world):
            # (at seed 0, whose orders are DistributedSampler's: `epoch_generator`)
            ours = EpochSampler(range(n), num_replicas=world, rank=rank, seed=0, drop_last=drop_last)
            theirs = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=0, drop_last=drop_last)
            ours.set_epoch(2), theirs.set_epoch(2)
            assert list(ours.indices()) == list(theirs) and len(ours) == len(list(theirs))
