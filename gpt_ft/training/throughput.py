"""Training throughput in the logs: tokens/s, the share of padding and, on GPUs, model FLOPs
utilisation (MFU).

Tokens are the batch's real ones, padding never counted (a task batch's `real_tokens`, counted on
the host when it was collated); `perf/padding` is the share of computed positions that held
padding. Counts come from host metadata and time from the host clock over a window of steps, so
logging never forces a device sync. FLOPs per token follow nanoGPT's estimate
(6N + 12·L·H·Q·T, N the parameters less the position embeddings, and less the LM head where the
step computes no LM logits: lm_coef 0 with a task head); the peak is the GPU's dense
bf16 tensor-core figure. Lightning's own table gives some GPUs (H100 NVL, H200) their sparse
figures; ours is dense, and `peak_tflops` overrides it.
"""

from __future__ import annotations

import re
import time

import torch
from lightning.pytorch.callbacks import Callback, ModelSummary
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from gpt_ft.data.batches import SharedContextBatch
from gpt_ft.workarounds.trainer import summary_table

# Dense (not 2:4 sparse) bf16 tensor-core peaks in TFLOP/s, from NVIDIA's datasheets; longest
# names first so that "H100 NVL" is not read as "H100".
DENSE_BF16_TFLOPS = {
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H200 NVL": 835.0,
    "H200": 989.0,
    "GH200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
}


def dense_peak_tflops(device_name: str) -> float | None:
    """The peak of the GPU named, matched by whole words ("NVIDIA H100 80GB HBM3"; an "RTX A1000" is
    no A100); None for one not in the table."""
    for key, value in DENSE_BF16_TFLOPS.items():
        if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w])", device_name):
            return value
    return None


def flops_per_token(config, n_params: float, seq_len: int) -> float:
    """nanoGPT's estimate: 6N for the matmuls with parameters, 12·L·H·Q·T for attention, where a
    sliding-window layer's T is at most its window."""
    spans = (min(seq_len, config.sliding_window or seq_len) if config.is_sliding(i) else seq_len
             for i in range(config.n_layer))  # fmt: skip
    return 6 * n_params + 12 * config.n_head * config.head_dim * sum(spans)


def head_parameters(gpt) -> float:
    """The LM head's part of `counted_parameters`: a step that computes no LM logits (a reward
    model's, an embedding's: lm_coef 0) does not run it."""
    head = gpt.lm_head if gpt.lm_head is not None else gpt.wte
    left, n = gpt.config.vocab_size, 0.0
    for p in head.parameters():  # its rows in order (LoRA's: frozen, new, unused), those past V never run
        rows, left = min(len(p), left), left - min(len(p), left)
        n += rows * p[:1].numel() * (1 if p.requires_grad else 2 / 3)
    return n


def counted_parameters(gpt) -> float:
    """N of the estimate: the parameters a token's matmuls use, nanoGPT's convention (not the
    position embeddings, nor the token embedding where the head has a matrix of its own: lookups);
    a frozen one (LoRA's base) counts 2/3, its weights taking no gradient (4 FLOPs of 6)."""
    c, untied = gpt.config, gpt.lm_head is not None
    lookups = [m for m in (gpt.wpe, gpt.wte if untied else None) if m is not None]
    skipped = {id(p) for m in lookups for p in m.parameters()}
    frozen = sum(p.numel() for name, p in gpt.named_parameters()  # (the rows past V: out of the total)
                 if not (p.requires_grad or id(p) in skipped or name.endswith("unused_rows")))  # fmt: skip
    positions = gpt.wpe.weight.numel() if gpt.wpe is not None else 0
    return gpt.num_parameters() - positions - (c.vocab_size * c.n_embd if untied else 0) - frozen / 3


def batch_tokens(batch) -> tuple[int, int, int]:
    """A batch's real tokens, the positions the model computes for them (padding included) and the
    longest span a token attends over, all from host metadata."""
    if isinstance(batch, SharedContextBatch):  # contexts once, then the choices
        ids, answers = batch.context_ids, batch.answer_ids
        return batch.real_tokens, ids.numel() + answers.numel(), ids.shape[-1] + answers.shape[-1]
    ids = batch.input_ids
    # Pretraining blocks have no padding; a packed row's token attends within its example only.
    span = getattr(batch, "max_seqlen", 0) or ids.shape[-1]
    return getattr(batch, "real_tokens", 0) or ids.numel(), ids.numel(), span


class Throughput(Callback):
    """Logs perf/tokens_per_s (real tokens, all devices: rank 0's times the processes, read without a
    collective, so ranks whose batches hold other counts make it an estimate), perf/padding and perf/mfu every
    `every_n_steps` optimizer steps, each window at the optimizer step that closes it (on the
    loggers' step axis, as the training loss of that step). The clock stops from a validation's
    start to the next training batch: evaluation, and the checkpoints saved after it, are not
    training time (`SaveLast`'s saves every N steps still are)."""

    def __init__(self, every_n_steps: int = 50, peak_tflops: float | None = None) -> None:
        self.every_n_steps, self.peak_tflops = every_n_steps, peak_tflops
        self._start: float | None = None
        self._tokens = 0
        self._positions = 0
        self._flops = 0.0
        self._last_step = 0
        self._n_params = 0
        self._paused: float | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Before the strategy wraps the model: FSDP leaves each rank the parameters of its shard.
        self._n_params = counted_parameters(pl_module.gpt)
        if getattr(pl_module, "head", None) is not None and not getattr(pl_module, "lm_coef", 0.5) > 0:
            self._n_params -= head_parameters(pl_module.gpt)  # no LM logits: the head never runs

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None:
            self._start, self._last_step = time.perf_counter(), trainer.global_step
        elif self._paused is not None:
            self._start += time.perf_counter() - self._paused
        self._paused = None

    def on_validation_start(self, trainer, pl_module) -> None:
        if self._start is not None and self._paused is None:
            self._paused = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        tokens, positions, span = batch_tokens(batch)
        self._tokens += tokens
        self._positions += positions
        self._flops += tokens * flops_per_token(pl_module.gpt.config, self._n_params, span)
        if trainer.global_step - self._last_step < self.every_n_steps:
            return
        seconds = time.perf_counter() - self._start
        metrics = {
            "perf/tokens_per_s": self._tokens * trainer.world_size / seconds,
            "perf/padding": 1 - self._tokens / self._positions if self._positions else 0.0,
        }
        device = batch.index.device
        if device.type == "cuda":
            peak = self.peak_tflops or dense_peak_tflops(torch.cuda.get_device_name(device))
            if peak:
                metrics["perf/mfu"] = self._flops / seconds / (peak * 1e12)
        # Every window reaches the loggers, whatever the trainer's log_every_n_steps (which would
        # keep only the windows ending on its multiples); self.log feeds the metrics line.
        for name, value in metrics.items():
            pl_module.log(name, value, logger=False, rank_zero_only=True)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                # the step's own loss's, and its epoch, as Lightning's rows have it
                logger.log_metrics({**metrics, "epoch": trainer.current_epoch}, step=trainer.global_step - 1)
        self._start, self._tokens, self._positions, self._flops = time.perf_counter(), 0, 0, 0.0
        self._last_step = trainer.global_step


class ParameterSummary(ModelSummary):
    """Lightning's model summary without its FLOPs, which it counts only for a module with an
    `example_input_array` (a task's batches are not one tensor): a column of zeros would mislead.
    Tokens/s and MFU are logged instead (`Throughput`)."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **kwargs) -> None:  # fmt: skip
        columns = [(name, values) for name, values in summary_data if name != "FLOPs" or total_flops]
        table = summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
        )
        if not total_flops:
            table = table.rsplit("\n", 1)[0]  # the "0 Total Flops" line
        rank_zero_info("\n" + table)
