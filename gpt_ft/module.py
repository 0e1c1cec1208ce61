"""GPTModule: the GPT with its tied LM head and a GPT-1 task head, as a LightningModule.

Fine-tuning loss (GPT-1 §3.2): L3 = L2 (task) + lm_coef * L1 (language modelling on the inputs).
With no task the module is a plain language model, which pretraining uses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn

from gpt_ft.adapters import TaskAdapter
from gpt_ft.checkpointing import safe_load
from gpt_ft.metrics import EvalMetrics
from gpt_ft.model import GPT, GPTConfig, SharedPrefix
from gpt_ft.task_data import IGNORE_INDEX

SPECIAL_TOKEN_ROOM = 8  # start, delim, extract and pad (GPT-1 §3.3), with room to spare


def checkpoint_tokenizer(path: str | Path) -> str | None:
    """The tokenizer of these weights: saved beside a gpt_ft checkpoint, or in a transformers dir."""
    path = Path(path).expanduser()
    if path.is_dir():
        has_tokenizer = any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")
        )
        return str(path) if has_tokenizer else None
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    recorded = safe_load(path).get("tokenizer")
    return str(path.parent / recorded) if recorded else None


def load_weights(path: str | Path) -> GPT:
    """A GPT from a checkpoint of this toolkit (.ckpt) or a local transformers directory."""
    path = Path(path).expanduser()
    if path.is_dir():
        return GPT.from_pretrained(path)
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    checkpoint = safe_load(path)
    config = checkpoint.get("gpt_config")
    if config is None:
        raise ValueError(f"{path} is not a gpt_ft checkpoint: it records no model config (gpt_config).")
    gpt = GPT(GPTConfig(**config))
    state = {k.removeprefix("gpt."): v for k, v in checkpoint["state_dict"].items() if k.startswith("gpt.")}
    gpt.load_state_dict(state)
    return gpt


class GPTModule(LightningModule):
    """A GPT with its tied LM head and, given a task, a linear head on the extract token's state."""

    def __init__(
        self,
        *,
        preset: str = "gpt1",
        overrides: dict[str, Any] | None = None,
        init_from: str | None = None,
        transfer_layers: int | None = None,
        vocab_size: int | None = None,
        tokenizer: str | None = None,
        task: TaskAdapter | None = None,
        lm_coef: float = 0.5,
        classifier_dropout: float = 0.1,
        lr: float = 6.25e-5,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        schedule: Literal["linear", "cosine", "constant"] = "linear",
        warmup_fraction: float = 0.002,
        warmup_steps: int | None = None,
        predictions_dir: str = "predictions",
        compile: bool | str = False,
    ) -> None:
        """
        Args:
            preset: Model shape when starting from scratch (gpt1, gpt2, gpt-mini, gpt-micro, ...).
            overrides: GPTConfig fields to change, e.g. {n_layer: 4, attn_pdrop: 0.0}.
            init_from: Start from these weights: a gpt_ft .ckpt or a local transformers directory.
            transfer_layers: Keep only the first k transformer blocks of init_from (and the
                embeddings); the others start fresh (GPT-1 §5, Fig. 2 left). None keeps all.
            vocab_size: Tokenizer size (linked from the data); the embedding grows to fit it.
            tokenizer: The data's tokenizer (linked); checkpoints save it beside them.
            task: The task card (linked from the data); None makes a plain language model.
            lm_coef: Weight of the auxiliary LM loss (GPT-1: 0.5; 0 turns it off).
            classifier_dropout: Dropout before the task head (GPT-1: 0.1).
            lr: Peak learning rate of AdamW (GPT-1 fine-tuning: 6.25e-5).
            weight_decay: Decoupled weight decay on weight matrices (not biases or LayerNorm gains).
            betas: AdamW betas.
            eps: AdamW epsilon.
            schedule: After warmup: linear to 0 (GPT-1 fine-tuning), cosine to 0 (pretraining), constant.
            warmup_fraction: Linear warmup over this fraction of all steps (GPT-1: 0.2%).
            warmup_steps: Linear warmup over this many steps instead (GPT-1 pretraining: 2000).
            predictions_dir: Where `predict` writes one submission file per test split.
            compile: torch.compile the GPT (True: the inductor backend; or a backend's name).
        """
        super().__init__()
        if lm_coef < 0:
            raise ValueError(f"lm_coef must be >= 0, got {lm_coef}.")
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}.")
        if not 0 <= warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}.")
        if init_from:
            self.gpt = load_weights(init_from)
            if overrides:  # only regularisation may change on loaded weights
                for key, value in overrides.items():
                    if key.endswith("pdrop"):
                        setattr(self.gpt.config, key, value)
                    elif getattr(self.gpt.config, key, None) != value:
                        raise ValueError(
                            f"overrides.{key} cannot change a loaded model (it has {key}="
                            f"{getattr(self.gpt.config, key, None)}); only dropouts can."
                        )
                self.gpt = _with_dropout(self.gpt)
            if transfer_layers is not None:
                self.gpt.reset_blocks(transfer_layers)
        else:
            if transfer_layers is not None:
                raise ValueError("transfer_layers needs pretrained weights: give --model.init_from.")
            self.gpt = GPT(
                GPTConfig.from_name(preset, **{**(overrides or {}), "vocab_size": vocab_size or 40478})
            )
        if init_from and vocab_size is not None:
            _check_tokenizer_fits(vocab_size, self.gpt.config.vocab_size, init_from)
        if vocab_size is not None and vocab_size > self.gpt.config.vocab_size:
            self.gpt.resize_token_embeddings(vocab_size)  # the special tokens the weights lack (GPT-1 §3.3)
        self.task = task
        self.lm_coef = lm_coef
        self.head_kind = task.head_kind if task else None
        if task is not None:
            self.classifier_dropout = nn.Dropout(classifier_dropout)
            self.head = nn.Linear(self.gpt.config.n_embd, task.num_labels)
            nn.init.normal_(self.head.weight, std=self.gpt.config.initializer_range)
            nn.init.zeros_(self.head.bias)
        splits = task.validation_splits + task.test_splits if task else ["validation", "test"]
        self.metrics = nn.ModuleDict({_key(split): EvalMetrics(task, lm_coef) for split in splits})
        self.optim = dict(lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps)
        self.schedule, self.warmup_fraction, self.warmup_steps = schedule, warmup_fraction, warmup_steps
        self.predictions_dir = predictions_dir
        self.compile_backend = ("inductor" if compile is True else compile) or None
        self._predictions: dict[str, list[tuple[Tensor, Tensor]]] = {}
        self.save_hyperparameters(ignore=["task"])

    def configure_model(self) -> None:
        # Called by the Trainer once the device and strategy are set, before the optimizer exists.
        if self.compile_backend and not getattr(self.gpt, "_compiled_call_impl", None):
            self.gpt.compile(backend=self.compile_backend)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The model's own shape, so that the weights load without the run's arguments.
        checkpoint["gpt_config"] = dict(vars(self.gpt.config))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of another shape is named in one sentence, not a page of size mismatches."""
        stored = checkpoint.get("gpt_config")
        where = getattr(self._trainer, "ckpt_path", None) or "The checkpoint"
        if stored is not None:
            shape = ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "pre_ln")
            differ = [k for k in shape if k in stored and stored[k] != getattr(self.gpt.config, k)]
            if differ:
                theirs = ", ".join(f"{k}={stored[k]}" for k in differ)
                ours = ", ".join(f"{k}={getattr(self.gpt.config, k)}" for k in differ)
                raise ValueError(
                    f"{where} holds a model with {theirs} but this run builds {ours}: give the same "
                    "--model.preset/--model.overrides, or start anew from it with --model.init_from."
                )
        head = checkpoint.get("state_dict", {}).get("head.weight")
        if head is not None and self.task is not None and head.shape[0] != self.head.weight.shape[0]:
            raise ValueError(
                f"{where} has a task head of {head.shape[0]} outputs but task {self.task.name!r} needs "
                f"{self.head.weight.shape[0]}: fine-tune it anew with --model.init_from."
            )

    def setup(self, stage: str) -> None:
        # Inputs longer than the model's context would fail only when the first long one comes.
        data = self.trainer.datamodule if self._trainer is not None else None
        length = getattr(data, "max_length", None) or getattr(data, "block_size", None)
        if length is not None and length > self.gpt.config.n_positions:
            name = "--data.max_length" if getattr(data, "max_length", None) else "--data.block_size"
            raise ValueError(
                f"{name} {length} is longer than the model's context of {self.gpt.config.n_positions} "
                f"tokens (n_positions); use at most {self.gpt.config.n_positions}."
            )

    # ---- forward ----

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor | None, Tensor, Tensor]:
        """Task logits (B, labels) or (B, S) for multiple choice, final hidden states and LM targets."""
        ids = batch["input_ids"]
        B, S, T = ids.shape
        # Right padding needs no mask: causal attention already keeps real tokens off later pads.
        mask = positions = None
        if batch.get("left_padded", False):
            mask = batch["attention_mask"].view(B * S, T)
            positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # real tokens start at position 0
        hidden = self.gpt(ids.view(B * S, T), mask, position_ids=positions)  # (B*S, T, C)
        if self.task is None:
            return None, hidden, batch["lm_targets"].view(B * S, T)
        rows = torch.arange(B * S, device=ids.device)
        extract = hidden[rows, batch["extract_index"].view(B * S)].view(B, S, -1)  # (B, S, C)
        extract = self.classifier_dropout(extract)
        if self.head_kind == "multiple_choice":
            logits = self.head(extract).squeeze(-1)  # (B, S): one score per choice
            logits = logits.masked_fill(~batch["choice_mask"], torch.finfo(logits.dtype).min)
        else:
            # Similarity (GPT-1 §3.3): the orders' extract states are added before the head (S = 2).
            logits = self.head(extract.sum(dim=1))  # (B, labels)
        return logits, hidden, batch["lm_targets"].view(B * S, T)

    def lm_terms(self, hidden: Tensor, targets: Tensor, sequences: int = 1) -> tuple[Tensor, Tensor]:
        """Per-example summed next-token cross-entropy and number of targets, (B,) each.

        `hidden` is (B*S, T, C) and `targets` (B*S, T) with -100 where there is nothing to predict,
        S = `sequences` per example; logits are computed for the positions with a target only.
        """
        sums, counts = self.row_lm_terms(hidden, targets)
        return sums.view(-1, sequences).sum(dim=1), counts.view(-1, sequences).sum(dim=1)

    def row_lm_terms(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Summed next-token cross-entropy and number of targets of each row, (rows,) each."""
        rows, T = targets.shape
        keep = targets != IGNORE_INDEX
        if self.task is None:  # pretraining blocks have no padding: no gather needed
            logits = self.gpt.lm_logits(hidden).flatten(0, 1).float()
            sums = F.cross_entropy(logits, targets.flatten(), reduction="none").view(rows, T).sum(dim=1)
        else:
            losses = F.cross_entropy(
                self.gpt.lm_logits(hidden[keep]).float(), targets[keep], reduction="none"
            )
            row_of = torch.arange(rows, device=hidden.device)[:, None].expand(rows, T)[keep]
            sums = torch.zeros(rows, device=hidden.device).index_add_(0, row_of, losses)
        return sums, keep.sum(dim=1)

    @property
    def num_sequences(self) -> int:
        return self.task.num_sequences if self.task is not None else 1

    def task_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Per-example task loss (B,): squared error for regression, cross-entropy otherwise."""
        if self.head_kind == "regression":
            return F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="none")
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def terms(self, batch: dict[str, Tensor], with_lm: bool = True) -> dict[str, Tensor]:
        """Per-example loss terms: lm_sum, lm_count, and with a task task_loss and logits."""
        if "context_ids" in batch:
            return self.shared_context_terms(batch, with_lm)
        logits, hidden, targets = self(batch)
        out = {}
        if with_lm and (self.task is None or self.lm_coef > 0):
            out["lm_sum"], out["lm_count"] = self.lm_terms(hidden, targets, batch["input_ids"].shape[1])
        if self.task is not None:
            out["logits"] = logits
            if "labels" in batch:
                out["task_loss"] = self.task_losses(logits, batch["labels"])
        return out

    def shared_context_terms(self, batch: dict[str, Tensor], with_lm: bool = True) -> dict[str, Tensor]:
        """`terms` of a multiple-choice batch from `collate_shared`: each `[start] context [delim]`
        runs once, each choice against its keys and values; the results equal the plain path's."""
        context, context_length, answers = batch["context_ids"], batch["context_length"], batch["answer_ids"]
        B, S, Ta = answers.shape
        Tc = context.shape[1]
        shared = SharedPrefix()
        hidden_context = self.gpt(context, kv_cache=shared)  # (B, Tc, C); right padding needs no mask
        shared.repeats = S
        device = answers.device
        # Each choice's positions go on from its own context's length (padding past the table: clamped).
        positions = context_length[:, None] + torch.arange(Ta, device=device)  # (B, Ta)
        positions = positions.clamp(max=self.gpt.config.n_positions - 1).repeat_interleave(S, dim=0)
        context_keys = torch.arange(Tc, device=device)[None] < context_length[:, None]  # (B, Tc)
        keys = torch.cat([context_keys.repeat_interleave(S, dim=0), context_keys.new_ones(B * S, Ta)], 1)
        hidden = self.gpt(answers.view(B * S, Ta), keys, position_ids=positions, kv_cache=shared)
        rows = torch.arange(B * S, device=device)
        extract = hidden[rows, batch["answer_extract"].view(B * S)].view(B, S, -1)  # (B, S, C)
        logits = self.head(self.classifier_dropout(extract)).squeeze(-1)  # (B, S)
        out = {"logits": logits.masked_fill(~batch["choice_mask"], torch.finfo(logits.dtype).min)}
        if "labels" in batch:
            out["task_loss"] = self.task_losses(out["logits"], batch["labels"])
        if with_lm and self.lm_coef > 0:
            # The plain path predicts the context's tokens once per choice: count them so.
            choices = batch["choice_mask"].sum(dim=1)
            context_sum, context_count = self.row_lm_terms(hidden_context, batch["context_targets"])
            answer_sum, answer_count = self.row_lm_terms(hidden, batch["answer_targets"].view(B * S, Ta))
            # The delim's state (shared) predicts each choice's first token.
            delim = hidden_context[torch.arange(B, device=device), context_length - 1]  # (B, C)
            logprobs = F.log_softmax(self.gpt.lm_logits(delim).float(), dim=-1)  # (B, V)
            targets = batch["delim_targets"]
            has = targets != IGNORE_INDEX
            delim_losses = -logprobs.gather(1, targets.clamp(min=0)) * has  # (B, S)
            out["lm_sum"] = context_sum * choices + answer_sum.view(B, S).sum(1) + delim_losses.sum(1)
            out["lm_count"] = context_count * choices + answer_count.view(B, S).sum(1) + has.sum(1)
        return out

    def losses(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss and its parts, normalised so that DDP's gradient average is exact.

        Each rank divides its sums by the mean count over ranks (examples for the task loss,
        target tokens for the LM loss): averaging the ranks' gradients then gives the gradient of
        the loss over the global batch, as one process with the whole batch would compute it.
        """
        terms = self.terms(batch)
        parts = {}
        if "lm_sum" in terms:
            parts["lm_loss"] = terms["lm_sum"].sum() / self._mean_over_ranks(terms["lm_count"].sum())
        if self.task is None:
            return parts["lm_loss"], parts
        examples = torch.tensor(float(len(terms["task_loss"])), device=terms["task_loss"].device)
        parts["task_loss"] = terms["task_loss"].sum() / self._mean_over_ranks(examples)
        loss = (
            parts["task_loss"] + self.lm_coef * parts["lm_loss"] if self.lm_coef > 0 else parts["task_loss"]
        )
        return loss, parts

    def _mean_over_ranks(self, value: Tensor) -> Tensor:
        """Mean of a scalar over the DDP ranks (itself in one process); no gradient flows through."""
        value = value.detach().float()
        trainer = self._trainer
        if trainer is None or trainer.world_size == 1 or not torch.distributed.is_initialized():
            return value
        total = value.clone()
        torch.distributed.all_reduce(total)
        return total / trainer.world_size

    # ---- steps ----

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, parts = self.losses(batch)
        if not self._finite_everywhere(loss):
            self._stop_on_nonfinite(loss)
        B = len(batch["index"])
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        for name, value in parts.items():
            self.log(f"train/{name}", value, batch_size=B)
        return loss

    def _finite_everywhere(self, loss: Tensor) -> bool:
        """Whether the loss is finite on every rank (one scalar read per step)."""
        finite = torch.isfinite(loss.detach()).float()
        trainer = self._trainer
        if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        return bool(finite)

    def _stop_on_nonfinite(self, loss: Tensor) -> None:
        """Keep the last good state (this step has not updated the weights yet), then stop."""
        trainer, kept = self.trainer, ""
        ckpt = trainer.checkpoint_callback
        if ckpt is not None and ckpt.dirpath:
            path = Path(ckpt.dirpath) / "last.ckpt"
            trainer.save_checkpoint(path, weights_only=False)
            kept = f"; the last good state (step {trainer.global_step}) is in {path}"
        raise FloatingPointError(
            f"The training loss became {float(loss)} at step {trainer.global_step} (epoch "
            f"{trainer.current_epoch}, batch {trainer.fit_loop.epoch_loop.batch_idx + 1}){kept}. "
            "Try a lower --model.lr, gradient clipping (--trainer.gradient_clip_val 1.0) or fp32."
        )

    def _evaluate(self, batch: dict[str, Tensor], split: str) -> None:
        terms = self.terms(batch)
        B = len(batch["index"])
        lm_sum = terms.get("lm_sum", torch.zeros(B, device=self.device))
        lm_count = terms.get("lm_count", torch.ones(B, device=self.device))
        extra = {}
        if self.task is not None:
            extra = dict(
                task_loss=terms["task_loss"],
                predictions=self.predictions_of(terms["logits"]),
                labels=batch["labels"],
            )
        self.metrics[_key(split)].update(batch["index"], lm_sum, lm_count, **extra)

    def _eval_splits(self, stage: str) -> list[str]:
        if self.task is None:
            return [stage]
        return self.task.validation_splits if stage == "validation" else self.task.test_splits

    def _reset_metrics(self, stage: str) -> None:
        for split in self._eval_splits(stage):
            self.metrics[_key(split)].reset()

    def _log_metrics(self, stage: str) -> None:
        """Every split's metrics, computed once over all ranks' examples, repeats dropped."""
        for split in self._eval_splits(stage):
            metric = self.metrics[_key(split)]
            if not metric.update_called:
                continue
            for name, value in metric.compute().items():
                self.log(f"{split}/{name}", value, prog_bar=name != "loss", sync_dist=False)
            metric.reset()

    def on_validation_epoch_start(self) -> None:
        self._reset_metrics("validation")

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("validation")

    def on_test_epoch_start(self) -> None:
        self._reset_metrics("test")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, self.task.validation_splits[dataloader_idx] if self.task else "validation")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, self.task.test_splits[dataloader_idx] if self.task else "test")

    def predictions_of(self, logits: Tensor) -> Tensor:
        """Class ids (or choice indices), or scores clipped to the task's range for regression."""
        if self.head_kind == "regression":
            scores = logits.squeeze(-1).float()
            if self.task.score_range is not None:
                scores = scores.clamp(*self.task.score_range)
            return scores
        return logits.argmax(dim=-1)

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        if self.task is None:
            raise ValueError("predict needs a task: give --data a task card.")
        predictions = self.predictions_of(self.terms(batch, with_lm=False)["logits"])
        split = self.task.test_splits[dataloader_idx]
        self._predictions.setdefault(split, []).append((batch["index"].cpu(), predictions.cpu()))
        return predictions

    def on_predict_epoch_end(self) -> None:
        for split in self.task.test_splits:  # every rank takes part in the gathers, in this order
            chunks = self._predictions.get(split, [])
            index = torch.cat([i for i, _ in chunks]) if chunks else torch.zeros(0, dtype=torch.long)
            dtype = torch.float if self.head_kind == "regression" else torch.long
            predictions = torch.cat([p for _, p in chunks]) if chunks else torch.zeros(0, dtype=dtype)
            index, predictions = self._gather(index), self._gather(predictions)
            if self.trainer.is_global_zero:
                write_predictions(self.task, split, index, predictions, Path(self.predictions_dir))
        self._predictions = {}

    def _gather(self, values: Tensor) -> Tensor:
        """All ranks' 1-D tensors (of any lengths) concatenated; the tensor itself in one process."""
        if self.trainer.world_size == 1 or not torch.distributed.is_initialized():
            return values
        from torchmetrics.utilities.distributed import gather_all_tensors

        return torch.cat([t.cpu() for t in gather_all_tensors(values.to(self.device))])

    # ---- optimisation ----

    def configure_optimizers(self):
        decay, no_decay = [], []
        for p in self.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 else no_decay).append(p)  # matrices only: not biases or LN gains
        groups = [
            {"params": decay, "weight_decay": self.optim["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        fused = self.device.type == "cuda"
        optimizer = torch.optim.AdamW(
            groups, lr=self.optim["lr"], betas=self.optim["betas"], eps=self.optim["eps"], fused=fused
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = self.warmup_steps if self.warmup_steps is not None else round(self.warmup_fraction * total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(self.schedule, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier of the peak learning rate at each step: linear warmup from 0, then the decay."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return factor


def write_predictions(
    task: TaskAdapter, split: str, index: Tensor, predictions: Tensor, out_dir: Path
) -> Path:
    """`index<TAB>prediction` rows, label names or scores, in the file the leaderboard expects."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / task.submission_files.get(split, f"{task.name}-{split}.tsv")
    order = torch.argsort(index)
    seen = set()
    lines = ["index\tprediction"]
    for i in order.tolist():
        row = int(index[i])
        if row in seen:  # a distributed sampler may repeat examples to even out ranks
            continue
        seen.add(row)
        value = predictions[i].item()
        if task.head_kind == "regression":
            text = f"{value:.3f}"
        else:
            text = task.submission_label(int(value))
        lines.append(f"{row}\t{text}")
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # atomic: a crash never leaves half a file
    return path


def _check_tokenizer_fits(vocab_size: int, weights_vocab: int, init_from: str) -> None:
    """The tokenizer may add the few special tokens the weights lack, nothing else."""
    if not weights_vocab <= vocab_size <= weights_vocab + SPECIAL_TOKEN_ROOM:
        raise ValueError(
            f"The tokenizer has {vocab_size} tokens but the weights in {init_from} have {weights_vocab}: "
            "they were not made for each other; use the tokenizer saved with the weights."
        )


def _key(split: str) -> str:
    return split.replace(".", "_")


def _with_dropout(gpt: GPT) -> GPT:
    """Apply the config's dropout rates to an existing model's modules."""
    c = gpt.config
    gpt.drop.p = c.embd_pdrop
    for block in gpt.h:
        block.attn.attn_pdrop = c.attn_pdrop
        block.attn.resid_dropout.p = c.resid_pdrop
        block.mlp.dropout.p = c.resid_pdrop
    return gpt
