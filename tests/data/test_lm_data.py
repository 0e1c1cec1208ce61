import json
import pickle
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from gpt_ft.data.lm_data import LMDataModule, TokenBlocks
from gpt_ft.data.prepare import prepare
from tests.helpers import trainer_on, write_corpus


def test_sampler_ranks_read_disjoint_blocks_covering_the_epoch(tmp_path):
    path = tmp_path / "t.bin"
    np.arange(8 * 10 + 1, dtype=np.uint16).tofile(path)
    blocks = TokenBlocks(path, "uint16", block_size=8)
    assert len(blocks) == 10
    i, tokens = blocks[3]
    assert i == 3 and tokens.tolist() == list(range(24, 33))  # block_size + 1 tokens: inputs and targets
    for epoch in (0, 1):
        seen = []
        for rank in (0, 1):
            sampler = DistributedSampler(
                blocks, num_replicas=2, rank=rank, shuffle=True, seed=0, drop_last=True
            )
            sampler.set_epoch(epoch)
            seen.append(list(sampler))
        assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(10))
    orders = []
    for epoch in (0, 1):
        sampler = DistributedSampler(blocks, num_replicas=1, rank=0, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders[0] != orders[1]  # a fresh permutation every epoch


def test_a_token_file_shorter_than_one_block(tmp_path, tokenizer_dir):
    corpus = write_corpus(tmp_path, n_files=1, lines=10)
    assert prepare(
        out_dir=tmp_path / "tokens",
        tokenizer=tokenizer_dir,
        inputs=[str(corpus)],
        validation_fraction=0,
        progress=False,
    )
    n = json.loads((tmp_path / "tokens" / "meta.json").read_text())["tokens"]["train"]
    with pytest.raises(ValueError, match="fewer than one block"):
        LMDataModule(str(tmp_path / "tokens"), block_size=n)
    data = LMDataModule(str(tmp_path / "tokens"), block_size=n - 1, batch_size=4)
    assert len(data.blocks["train"]) == 1 and "validation" not in data.blocks
    assert data.tokenizer_path == str(tmp_path / "tokens" / "tokenizer") and data.val_dataloader() == []
    (batch,) = list(data.train_dataloader())
    assert batch.input_ids.shape == (1, 1, n - 1) and batch.index.tolist() == [0]
    data.trainer = trainer_on("cuda")  # a GPU's loaders page-lock their batches
    assert data.train_dataloader().pin_memory
    # A worker started afresh (spawn; forkserver, Python 3.14's default) takes its dataset pickled:
    # the file's name, not a copy of the file the main process has open.
    blocks = data.blocks["train"]
    assert blocks[0][1].tolist() == pickle.loads(pickle.dumps(blocks))[0][1].tolist()
    assert blocks._tokens is not None and pickle.loads(pickle.dumps(blocks))._tokens is None


def test_a_validation_split_too_short_for_a_block_is_left_out_and_said(tmp_path, tokenizer_dir, capsys):
    corpus = write_corpus(tmp_path, n_files=1, lines=10)
    meta = prepare(
        out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, inputs=[str(corpus)], validation_fraction=0.001
    )  # one piece: none drawn for validation
    assert meta["tokens"]["validation"] == 0
    assert "note: no piece of the corpus went to the validation split" in capsys.readouterr().err
    tokens = tmp_path / "tokens"
    with warnings.catch_warnings():  # not yet: `validate` says it once, as its error
        warnings.simplefilter("error")
        data = LMDataModule(str(tokens), block_size=8)
    with pytest.warns(UserWarning, match="the validation split holds 0 tokens, fewer than one block of"):
        assert "validation" not in data.blocks and data.val_dataloader() == []  # fit trains on
    data.trainer = SimpleNamespace(
        state=SimpleNamespace(fn="validate", status="running"), lightning_module=None
    )
    with pytest.raises(ValueError, match=r"holds 0 tokens, .* = 9: there is nothing to validate \(prepare"):
        data.val_dataloader()  # gpt-ft validate scored nothing and exited 0
    # A validation split of 5 tokens: too short for blocks of 8, long enough for blocks of 4.
    np.array([1, 2, 3, 4, 5], dtype=meta["dtype"]).tofile(tokens / "validation.bin")
    meta["tokens"]["validation"] = 5
    (tokens / "meta.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match=r"holds 5 tokens, fewer than one block of block_size \+ 1 = 9"):
        assert LMDataModule(str(tokens), block_size=8).val_dataloader() == []
    assert len(LMDataModule(str(tokens), block_size=4).blocks["validation"]) == 1


def test_the_block_order_follows_the_runs_seed_unless_given_one(tmp_path, tokenizer_dir, monkeypatch):
    """No `seed`: the run's (--seed_everything, kept by Lightning in PL_GLOBAL_SEED), as a task's
    data module takes it; a seed given wins."""
    corpus = write_corpus(tmp_path, n_files=1, lines=60)
    prepare(out_dir=tmp_path / "tokens", tokenizer=tokenizer_dir, inputs=[str(corpus)], progress=False)

    def order(**seed) -> list[int]:
        data = LMDataModule(str(tmp_path / "tokens"), block_size=4, batch_size=2, **seed)
        return [i for batch in data.train_dataloader() for i in batch.index.tolist()]

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    seed_0 = order()
    monkeypatch.setenv("PL_GLOBAL_SEED", "5")
    assert order() == order(seed=5) != seed_0 and sorted(seed_0) == sorted(order())
    assert order(seed=0) == seed_0


def test_a_language_models_counts_are_checked_as_a_tasks_are(tmp_path):
    """eval_batch_size 0 was taken (validating at batch_size), -3 refused by PyTorch after the weights
    loaded; num_workers -1 after the run folder was made."""
    counts = [("eval_batch_size", 0, ">= 1, got 0"), ("eval_batch_size", -3, ">= 1, got -3"),
              ("num_workers", -1, ">= 0, got -1"), ("batch_size", 0, ">= 1, got 0")]  # fmt: skip
    for option, value, said in counts:
        with pytest.raises(ValueError, match=rf"^{option} must be {said}\.$"):
            LMDataModule(token_dir=str(tmp_path), **{option: value})  # (before the folder is read)
