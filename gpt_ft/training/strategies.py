"""FSDP for GPTs: every transformer block is its own shard unit.

Lightning's FSDPStrategy takes the wrap policy as a set of module classes, which a YAML config
cannot spell; `BlockFSDP` fixes it to `Block` and keeps the rest of FSDPStrategy's arguments.
The token embedding (tied to the LM head), the position embedding and the task head stay in the
root unit, so the tie holds.
"""

from __future__ import annotations

from typing import Any, Literal

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
