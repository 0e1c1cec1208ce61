"""DDP on CPU (gloo, 2 processes) through the CLI: same weights and exact metrics as one process."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt_ft.adapters import LocalFiles, TextPair
from gpt_ft.data.samplers import LengthGroupedSampler
from gpt_ft.data.task_data import TaskDataModule
from gpt_ft.model import GPT, Block, GPTConfig
from gpt_ft.training.strategies import BlockFSDP

ROOT = Path(__file__).resolve().parents[1]
NO_DROPOUT = "embd_pdrop: 0.0, attn_pdrop: 0.0, resid_pdrop: 0.0"
MICRO = f"{{n_positions: 64, n_embd: 32, n_layer: 2, n_head: 2, {NO_DROPOUT}}}"
WORDS = "the cat sat on a mat two dogs run in park he is happy now she bakes brownies".split()
CARD = """class_path: gpt_ft.adapters.TextPair
init_args:
  name: pair
  premise: sentence1
  hypothesis: sentence2
  labels: [entailment, not_entailment]
  local: {splits: {train: train.tsv, validation: dev.tsv, test: test.tsv}, columns: {index: idx}}
"""


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(2 + i % 9))  # 2 to 10 words


def write_task(root: Path) -> Path:
    # 16 training examples (2 steps of 8 per epoch); 7 validation and 5 test examples, which
    # 2 ranks cannot split evenly.
    for split, n in (("train", 16), ("dev", 7), ("test", 5)):
        rows = [
            [str(i), sentence(i), sentence(i + 3), ["entailment", "not_entailment"][i % 3 % 2]]
            for i in range(n)
        ]
        header = ["index", "sentence1", "sentence2", "label"]
        if split == "test":
            header, rows = header[:-1], [r[:-1] for r in rows]
        (root / f"{split}.tsv").write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    card = root / "pair.yaml"
    card.write_text(CARD)
    return card


def gpt_ft(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "gpt_ft", *args], capture_output=True, text=True, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def ddp_args(devices: int) -> list[str]:
    if devices == 1:
        return ["--trainer.accelerator=cpu", "--trainer.devices=1"]
    return ["--trainer.accelerator=cpu", f"--trainer.devices={devices}", "--trainer.strategy=ddp"]


def run_dir(root: Path) -> Path:
    versions = list((root / "runs" / "lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0"]  # one logger: only rank 0 writes
    return versions[0]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def validation_rows(run: Path) -> list[dict[str, float]]:
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("validation/loss")]
    return [{k: float(v) for k, v in r.items() if k.startswith("validation/") and v} for r in rows]


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= atol, f"max abs difference {worst}"


def test_finetuning_on_two_processes_equals_one_with_the_double_batch(tmp_path, tokenizer_dir):
    card = write_task(tmp_path)
    runs = {}
    for devices, batch in ((2, 4), (1, 8)):
        root = tmp_path / f"x{devices}"
        common = [
            f"--data.task={card}",
            f"--data.tokenizer={tokenizer_dir}",
            f"--data.data_dir={tmp_path}",
            "--data.eval_batch_size=2",  # 5 test examples: 2 batches on rank 0, 1 on rank 1
            "--data.max_length=32",
            "--model.preset=gpt-micro",
            f"--model.overrides={MICRO}",
            "--model.classifier_dropout=0.0",
            f"--model.predictions_dir={root / 'pred'}",
            f"--trainer.logger.init_args.save_dir={root / 'runs'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            *ddp_args(devices),
        ]
        fit = [
            "--config",
            str(ROOT / "configs/finetune/gpt1.yaml"),
            f"--data.batch_size={batch}",
            "--data.shuffle=false",
            "--model.lr=1e-3",
            "--trainer.max_epochs=3",
        ]
        gpt_ft("fit", *fit, *common, cwd=tmp_path)
        run = run_dir(root)
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert ckpt["global_step"] == 6
        gpt_ft("predict", *common, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}", cwd=tmp_path)
        runs[devices] = run, (root / "pred" / "pair-test.tsv").read_text()
    (two, predictions2), (one, predictions1) = runs[2], runs[1]
    assert_same_weights(weights(two), weights(one))
    # Validation on 7 examples: rank 1's repeated example is dropped, so every figure is the same.
    rows2, rows1 = validation_rows(two), validation_rows(one)
    assert len(rows1) == 3 and rows2[0].keys() == rows1[0].keys() >= {
        "validation/loss",
        "validation/accuracy",
    }
    for a, b in zip(rows2, rows1):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)
    # One predictions file with every test example once, in order, as from one process.
    assert predictions2 == predictions1 and len(predictions1.splitlines()) == 6


def test_pretraining_on_two_processes_equals_one_with_the_double_batch(tmp_path, tokenizer_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(sentence(i + j) for j in range(20)) for i in range(12)) + "\n")
    tokens = tmp_path / "tokens"
    gpt_ft("prepare", str(corpus), "--tokenizer", tokenizer_dir, "--out_dir", str(tokens),
           "--validation_fraction", "0.3", "--split_on", "blank_line", cwd=tmp_path)  # fmt: skip
    n_validation = json.loads((tokens / "meta.json").read_text())["tokens"]["validation"]
    # An odd number of validation blocks, so that one rank repeats one.
    block = next(b for b in range(16, 8, -1) if (n_validation - 1) // b % 2)
    runs = {}
    for devices, batch, compile in ((2, 2, "aot_eager"), (1, 4, "false")):
        root = tmp_path / f"x{devices}"
        gpt_ft(
            "fit",
            "--config",
            str(ROOT / "configs/pretrain/cpu.yaml"),
            f"--data.token_dir={tokens}",
            f"--data.block_size={block}",
            f"--data.batch_size={batch}",
            "--data.eval_batch_size=2",
            "--data.shuffle=false",
            "--model.preset=gpt-micro",
            f"--model.overrides={MICRO}",
            f"--model.compile={compile}",  # the compiled model must train exactly like the eager one
            "--model.warmup_steps=1",
            "--trainer.max_steps=4",
            "--trainer.val_check_interval=2",
            f"--trainer.logger.init_args.save_dir={root / 'runs'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            *ddp_args(devices),
            cwd=tmp_path,
        )
        runs[devices] = run_dir(root)
    assert_same_weights(weights(runs[2]), weights(runs[1]))
    rows2, rows1 = validation_rows(runs[2]), validation_rows(runs[1])
    assert len(rows1) == 2 and set(rows1[0]) == {"validation/loss", "validation/perplexity"}
    for a, b in zip(rows2, rows1):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-5)


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


def test_length_grouping_cuts_padding(tmp_path, tokenizer_dir):
    write_task(tmp_path)
    task = TextPair(
        name="pair",
        premise="sentence1",
        hypothesis="sentence2",
        labels=["entailment", "not_entailment"],
        local=LocalFiles(splits={"train": "train.tsv", "validation": "dev.tsv"}, columns={"index": "idx"}),
    )

    def padded_share(length_grouped: bool) -> float:
        data = TaskDataModule(
            task, tokenizer_dir, data_dir=str(tmp_path), batch_size=4, length_grouped=length_grouped
        )
        data.setup("fit")
        real = total = 0
        for batch in data.train_dataloader():
            real += int(batch.attention_mask.sum())
            total += batch.attention_mask.numel()
        return 1 - real / total

    plain, grouped = padded_share(False), padded_share(True)
    assert grouped < plain / 2, (plain, grouped)


def test_fsdp_wraps_every_block():
    strategy = BlockFSDP(activation_checkpointing=True, sharding_strategy="SHARD_GRAD_OP")
    gpt = GPT(GPTConfig.from_name("gpt-micro"))
    policy = strategy.kwargs["auto_wrap_policy"]
    wrapped = [m for m in gpt.modules() if type(m) in policy._module_classes]
    assert len(wrapped) == gpt.config.n_layer and all(isinstance(m, Block) for m in wrapped)
    assert strategy._activation_checkpointing_kwargs and strategy.sharding_strategy.name == "SHARD_GRAD_OP"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP needs 2 CUDA devices")
def test_fsdp_finetuning_on_two_gpus(tmp_path, tokenizer_dir):
    card = write_task(tmp_path)
    gpt_ft(
        "fit",
        "--config",
        str(ROOT / "configs/trainer/fsdp.yaml"),
        f"--data.task={card}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={tmp_path}",
        "--model.preset=gpt-micro",
        "--trainer.devices=2",
        "--trainer.max_epochs=1",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        cwd=tmp_path,
    )
    assert (run_dir(tmp_path) / "checkpoints" / "last.ckpt").exists()
