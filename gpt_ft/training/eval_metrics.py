"""Evaluation that is exact under DDP: per-example terms gathered by example index, repeats dropped.

A distributed sampler evens out ranks by repeating a few examples; averaging per-rank means
would count them twice and weigh ranks, not examples. `EvalMetrics` instead keeps, for each
example seen, its index, its LM loss sum and token count, its task loss, prediction and label;
at compute time torchmetrics gathers them from every rank, the first occurrence of each index is
kept, and the loss and the task's benchmark metrics (GLUE: MCC for CoLA, F1 for MRPC/QQP, ...)
are computed once over the whole split, as one process would.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from gpt_ft.adapters import TaskAdapter
from gpt_ft.data.batches import TokenBatch
from gpt_ft.training.reports import write_report
from gpt_ft.training.terms import combined_loss


def first_occurrences(index: Tensor) -> Tensor:
    """Boolean mask keeping the first occurrence of every value of `index` (1-D)."""
    _, inverse = torch.unique(index, return_inverse=True)
    positions = torch.arange(index.numel(), device=index.device)
    first = torch.full((int(inverse.max()) + 1,), index.numel(), device=index.device, dtype=torch.long)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    keep = torch.zeros(index.numel(), dtype=torch.bool, device=index.device)
    keep[first] = True
    return keep


class EvalMetrics(Metric):
    """Loss (and perplexity for a language model) plus a task's metrics over one evaluation split.

    `update` takes per-example tensors: `index` (B,), `lm_sum` and `lm_count` (B,) (the example's
    summed next-token loss and its number of targets) and, with a task, `task_loss`,
    `predictions` and `labels` (B,). The loss is the task's mean loss plus `lm_coef` times the
    token-weighted LM loss, as in training; with an LM term, each term as well (`task_loss`, `lm_loss`).
    """

    full_state_update = False

    def __init__(self, task: TaskAdapter | None = None, lm_coef: float = 0.5) -> None:
        super().__init__()
        self.task, self.lm_coef = task, lm_coef
        names = ["index", "lm_sum", "lm_count"]
        if task is not None:
            names += ["task_loss", "predictions", "labels", "probabilities"]
        for name in names:
            self.add_state(name, default=[], dist_reduce_fx="cat")
        self.chooses = False
        """Choose the task's decision values (`TaskOutput.choose`) on these examples: they become
        `decided`, and are logged."""
        self.decided: dict[str, float] = {}

    def update(
        self,
        index: Tensor,
        lm_sum: Tensor,
        lm_count: Tensor,
        task_loss: Tensor | None = None,
        predictions: Tensor | None = None,
        labels: Tensor | None = None,
        probabilities: Tensor | None = None,
    ) -> None:
        self.index.append(index.detach().long())
        self.lm_sum.append(lm_sum.detach().double())
        self.lm_count.append(lm_count.detach().double())
        if self.task is not None:
            self.task_loss.append(task_loss.detach().double())
            self.predictions.append(predictions.detach())
            self.labels.append(labels.detach())
            if probabilities is not None:
                self.probabilities.append(probabilities.detach().float())

    def _cat(self, name: str) -> Tensor:
        state = getattr(self, name)
        return torch.cat(state) if isinstance(state, list) else state

    def examples(self) -> tuple[Tensor, Tensor]:
        """The split's predictions and labels, each example once, over every rank (for a per-class
        report): as the last `compute` saw them (torchmetrics gathers the ranks' states only inside
        it, then puts this rank's back)."""
        return self.computed_examples

    def compute(self) -> dict[str, Tensor]:
        cat = self._cat
        keep = first_occurrences(cat("index"))
        out = {}
        lm_loss = cat("lm_sum")[keep].sum() / cat("lm_count")[keep].sum().clamp(min=1)
        if self.task is None:
            return {"loss": lm_loss.float(), "perplexity": torch.exp(lm_loss).float()}
        task_loss = cat("task_loss")[keep].mean()
        out["loss"] = combined_loss(task_loss, lm_loss, self.lm_coef).float()
        if self.lm_coef:  # the objective's two terms apart: an auxiliary LM weight's runs compared
            out.update(task_loss=task_loss.float(), lm_loss=lm_loss.float())
        predictions, labels = cat("predictions")[keep], cat("labels")[keep]
        self.computed_examples = predictions, labels
        for name, value in self.task.metric_values(predictions, labels).items():
            out[name] = value.float()
        self.decided = self.task.output.choose(predictions, labels) if self.chooses else {}
        out.update({name: torch.tensor(value) for name, value in self.decided.items()})
        probabilities = cat("probabilities") if len(self.probabilities) else None
        if probabilities is not None and len(probabilities) == len(keep):  # given with every batch
            for name, value in self.task.output.calibration(probabilities[keep], labels).items():
                out[name] = value.float()
        return out


class Evaluation:
    """The evaluation steps of `GPTModule`: each batch's per-example terms into its split's
    `EvalMetrics`; at the epoch's end every split's metrics logged and, for `validate` and `test`,
    its per-class report written beside the logs (`reports.py`)."""

    def validation_step(self, batch: TokenBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "validation")

    def test_step(self, batch: TokenBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: TokenBatch, stage: str) -> None:
        terms = self.terms(batch)
        B = len(batch)
        extra = {}
        if self.head is not None:
            logits = terms["logits"]
            extra = dict(
                task_loss=terms["task_loss"],
                predictions=self.head.predictions(logits),
                labels=batch.labels,  # float32 scores: the module's on_after_batch_transfer
                probabilities=self.head.probabilities(logits / self.temperature),
            )
        lm_sum = terms.get("lm_sum", torch.zeros(B, device=self.device))
        lm_count = terms.get("lm_count", torch.ones(B, device=self.device))
        split = getattr(batch, "split", "") or stage
        self.metrics[split_key(split)].update(batch.index, lm_sum, lm_count, **extra)

    def _eval_splits(self, stage: str) -> list[str]:
        if self.task is None:
            return [stage]
        return self.task.validation_splits if stage == "validation" else self.task.test_splits

    def _log_metrics(self, stage: str) -> None:
        """Every split's metrics, computed once over all ranks' examples, repeats dropped."""
        first = self._eval_splits(stage)[0]
        for split in self._eval_splits(stage):
            metric = self.metrics[split_key(split)]
            # (computing gathers over the ranks: skipped by all or by none, as any one saw a batch)
            if not self.trainer.strategy.reduce_boolean_decision(metric.update_called, all=False):
                continue
            # During fit, the first validation split chooses what a head decides by (a threshold).
            fitting = self.trainer.state.fn == "fit" and not self.trainer.sanity_checking
            metric.chooses = self.task is not None and split == first and fitting
            for name, value in metric.compute().items():
                shown = not name.endswith("loss")  # (the losses: in the logs and the printed line)
                self.log(f"{split}/{name}", value, prog_bar=shown, sync_dist=False)
            for name, value in metric.decided.items():
                setattr(self.head, name, value)
            if self.task is not None and self.trainer.state.fn in ("validate", "test"):
                predictions, labels = metric.examples()
                log_dir = self.trainer.log_dir  # on every rank: Lightning broadcasts it
                if self.trainer.is_global_zero and log_dir:
                    write_report(self.task, split, predictions, labels, Path(log_dir) / "reports")
            metric.reset()

    def on_validation_epoch_start(self) -> None:
        for split in self._eval_splits("validation"):
            self.metrics[split_key(split)].reset()

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("validation")

    def on_test_epoch_start(self) -> None:
        for split in self._eval_splits("test"):
            self.metrics[split_key(split)].reset()

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")


def split_key(split: str) -> str:
    """A split's name as a key of `nn.ModuleDict`, which takes no dots, nor a name of a Module's own
    attributes (a validation split named `train`)."""
    key = split.replace(".", "_")
    return f"{key}_" if hasattr(nn.Module, key) or not key else key
