"""FSDP for GPTs: every transformer block is its own shard unit.

Lightning's FSDPStrategy takes the wrap policy as a set of module classes, which a YAML config
cannot spell; `BlockFSDP` fixes it to `Block` and keeps the rest of FSDPStrategy's arguments.
The token embedding (tied to the LM head), the position embedding and the task head stay in the
root unit, so the tie holds.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import FSDPStrategy

from gpt_ft.model import Block


class BlockFSDP(FSDPStrategy):
    """FSDPStrategy wrapping each `Block`, optionally with activation checkpointing per block."""

    strategy_name = "block_fsdp"

    def __init__(
        self,
        *,
        activation_checkpointing: bool = False,
        sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"] = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        cpu_offload: bool = False,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            activation_checkpointing: Recompute each block's activations in the backward pass
                (less memory, about a third more compute).
            sharding_strategy: FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2), NO_SHARD (DDP-like),
                or HYBRID_SHARD (full sharding within a node, replicas across nodes).
            state_dict_type: "full": checkpoints are one file, as on one device; "sharded": one
                file per rank (faster for large models).
            cpu_offload: Keep parameters and gradients on the CPU between uses.
        """
        super().__init__(
            auto_wrap_policy={Block},
            activation_checkpointing_policy={Block} if activation_checkpointing else None,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            cpu_offload=cpu_offload,
            **kwargs,
        )


def clip_gradients(module: LightningModule, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
    """`configure_gradient_clipping` of the module: Lightning's clipping, but under FSDP, whose
    precision plugin refuses to clip by norm, the wrapped model's own `clip_grad_norm_` (the norm
    over every rank's shards, as Lightning advises)."""
    strategy = module.trainer.strategy
    if gradient_clip_val and isinstance(strategy, FSDPStrategy) and gradient_clip_algorithm in (None, "norm"):
        strategy.model.clip_grad_norm_(gradient_clip_val)
    else:
        module.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


def check_rendezvous(trainer: Trainer) -> Trainer:
    """`trainer`, unless it is one node of several that no launcher (torchrun, SLURM, ...) and no
    MASTER_ADDR/MASTER_PORT tell where node 0 listens: Lightning would pick a free port of its own
    and wait for the other nodes forever, saying nothing after "Initializing distributed"."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    unset = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if trainer.num_nodes > 1 and type(environment) is LightningEnvironment and unset:
        raise ValueError(
            f"--trainer.num_nodes {trainer.num_nodes}: nothing tells the nodes where node 0 listens "
            f"({' and '.join(unset)} unset), so each would wait for the others forever: start every node "
            "under torchrun or SLURM, or set MASTER_ADDR, MASTER_PORT and NODE_RANK on each "
            "(configs/trainer/ddp.yaml)."
        )
    return trainer


def check_devices(devices, *, on_cpu: bool, strategy: object = None) -> None:
    """`--trainer.devices` as Lightning reads it, checked where Lightning would raise a TypeError of
    its own: on the CPU a count of processes or 'auto'; on GPUs also -1 (every one) or indices. And
    no FSDP on the CPU (every rank's traceback, from Lightning)."""
    if on_cpu and "fsdp" in str(strategy).lower():
        raise ValueError("--trainer.strategy: FSDP shards a model over GPUs; on the CPU use ddp.")
    if re.search(r"spawn|fork|notebook", str(strategy)):  # (their aliases, start_method): they pickle the CLI
        raise ValueError(f"--trainer.strategy {strategy}: gpt-ft starts its processes as ddp does; use ddp.")
    text = str(devices).strip()
    if text == "auto" or re.fullmatch(r"[1-9]\d*", text):
        return
    if on_cpu:
        raise ValueError(
            f"--trainer.devices {devices}: on the CPU, give a count of processes (1, 2, ...) or 'auto'."
        )
    if isinstance(devices, list) or re.fullmatch(r"-1|\d+(\s*,\s*\d+)*,?", text):
        return
    raise ValueError(
        f"--trainer.devices {devices!r}: give a count (1, 2, ...), -1 for every device, 'auto', "
        "or device indices such as '0,1'."
    )


def run_plugins(given: Any) -> list:
    """A run's Trainer plugins: those given (`--trainer.plugins`), with `AtomicCheckpointIO` unless
    one saves checkpoints already, and under SLURM (not torchrun inside a SLURM job: its ranks are
    torchrun's) SLURM's environment without Lightning's requeue: it saved an hpc_ckpt mid-window on
    SIGUSR1, which any later run in the folder resumed from without a word; SIGTERM saves
    `last.ckpt` at a step's end (docs/gpus.md)."""
    from gpt_ft.training.checkpointing import AtomicCheckpointIO

    given = [] if given is None else given if isinstance(given, list) else [given]  # (a cluster's, ...)
    ours = [] if any(isinstance(p, CheckpointIO) for p in given) else [AtomicCheckpointIO()]
    cluster = any(isinstance(p, ClusterEnvironment) for p in given)
    if SLURMEnvironment.detect() and not TorchElasticEnvironment.detect() and not cluster:
        ours.append(SLURMEnvironment(auto_requeue=False))
    return [*given, *ours]
