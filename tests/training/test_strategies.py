import pytest
import torch

from gpt_ft.model import GPT, Block, GPTConfig
from gpt_ft.training.strategies import BlockFSDP
from tests.helpers import ROOT, write_varied_pairs


def test_fsdp_wraps_every_block():
    strategy = BlockFSDP(activation_checkpointing=True, sharding_strategy="SHARD_GRAD_OP")
    gpt = GPT(GPTConfig.from_name("gpt-micro"))
    policy = strategy.kwargs["auto_wrap_policy"]
    wrapped = [m for m in gpt.modules() if type(m) in policy._module_classes]
    assert len(wrapped) == gpt.config.n_layer and all(isinstance(m, Block) for m in wrapped)
    assert strategy._activation_checkpointing_kwargs and strategy.sharding_strategy.name == "SHARD_GRAD_OP"


def test_under_fsdp_gradients_are_clipped_by_the_wrapped_models_own_norm():
    """FSDP's precision plugin refuses to clip by norm (the recipes clip at 1.0): the module asks the
    wrapped model, whose norm spans every rank's shards; elsewhere Lightning's clipping runs."""
    from types import SimpleNamespace

    from gpt_ft.adapters import SingleText
    from gpt_ft.training.module import GPTModule

    module = GPTModule(preset="gpt-micro", vocab_size=24, task=SingleText(name="t", labels=["a", "b"]))
    asked, optimizer = [], torch.optim.SGD(module.parameters())
    fsdp = BlockFSDP()
    fsdp.model = SimpleNamespace(clip_grad_norm_=lambda value: asked.append(("fsdp", value)))
    module.clip_gradients = lambda opt, value, algorithm: asked.append(("lightning", value, algorithm))
    for strategy in (fsdp, SimpleNamespace()):
        module._trainer = SimpleNamespace(strategy=strategy)
        module.configure_gradient_clipping(optimizer, 1.0, "norm")
    module.configure_gradient_clipping(optimizer, 0.5, "value")  # by value: not FSDP's to refuse
    assert asked == [("fsdp", 1.0), ("lightning", 1.0, "norm"), ("lightning", 0.5, "value")]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP needs 2 CUDA devices")
def test_fsdp_finetuning_on_two_gpus(tmp_path, tokenizer_dir):
    import subprocess
    import sys

    card = write_varied_pairs(tmp_path)
    args = [
        "fit",
        "--config",
        str(ROOT / "configs/trainer/fsdp.yaml"),
        f"--data.task={card}",
        f"--data.tokenizer={tokenizer_dir}",
        f"--data.data_dir={tmp_path}",
        "--model.preset=gpt-micro",
        "--trainer.devices=2",
        "--trainer.max_epochs=1",
        "--trainer.gradient_clip_val=1.0",  # the recipes'
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "gpt_ft", *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    versions = list((tmp_path / "runs" / "lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0"]  # one logger: only rank 0 writes
    assert (versions[0] / "checkpoints" / "last.ckpt").exists()


def test_nodes_told_where_node_0_listens_start(monkeypatch):
    from lightning.pytorch import Trainer

    from gpt_ft.training.strategies import check_rendezvous

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    trainer = Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", logger=False)
    assert check_rendezvous(trainer) is trainer
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match=r"^--trainer.num_nodes 2: .* \(MASTER_PORT unset\)"):
        check_rendezvous(trainer)
    one = Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", logger=False)
    assert check_rendezvous(one) is one  # one node: Lightning's own launch finds its processes
