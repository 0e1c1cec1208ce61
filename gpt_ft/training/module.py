"""GPTModule: the GPT with its tied LM head and the task's head, as a LightningModule.

Fine-tuning loss (GPT-1 §3.2): L3 = L2 (task) + lm_coef * L1 (language modelling on the inputs).
With no task the module is a plain language model, which pretraining uses. The task's adapter
chooses the head (outputs, loss, predictions); this module is the same for every input shape.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal

import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor, nn

from gpt_ft.adapters import TaskAdapter
from gpt_ft.adapters.cards import as_task
from gpt_ft.data.batches import TokenBatch, gold
from gpt_ft.model.lora import LoRA
from gpt_ft.training.callbacks import StepValues
from gpt_ft.training.checkpointing import restore_class_weights
from gpt_ft.training.eval_metrics import EvalMetrics, Evaluation, split_key
from gpt_ft.training.nonfinite import NonfiniteWatch
from gpt_ft.training.optim import (
    MUON_UNDER_LORA,
    MuonAdamW,
    Optimizer,
    Schedule,
    ScheduleName,
    adamw,
    check_rates,
    check_same_optimizer,
    fused_adamw,
    schedule_steps,
)
from gpt_ft.training.predictions import NAMED, write_predictions
from gpt_ft.training.ranks import divisor_over_ranks, gather
from gpt_ft.training.saved import (
    build_gpt,
    check_fits,
    check_lora_resume,
    check_same_tokenizer,
    lora_checkpoint,
)
from gpt_ft.training.strategies import clip_gradients
from gpt_ft.training.terms import batch_terms, class_weights_of, combined_loss
from gpt_ft.weights.checkpoint import Checkpoint
from gpt_ft.workarounds.kernels import is_compiled


def new_token_ids(tokenizer: str | None, init_from: str | None = None) -> list[int] | None:
    """The ids of gpt_ft's special tokens (GPT-1's start, delim, extract, and its pad) the weights
    lack: those loading the tokenizer adds, or where its files hold some already (a checkpoint's
    saved tokenizer, a fine-tuned model written back), those the weights' own tokenizer lacks. The
    same for a run and for its checkpoint read again."""
    if tokenizer is None:
        return None
    from gpt_ft.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
    from gpt_ft.weights.pretrained import weights_tokenizer

    vocab, own = (
        load_tokenizer(tokenizer).get_vocab(),
        load_tokenizer(tokenizer, add_specials=False).get_vocab(),
    )
    if init_from and any(token in own for token in SPECIAL_TOKENS.values()):
        try:
            weights_own = weights_tokenizer(init_from)
        except (OSError, ValueError):  # weights that cannot be read: build_gpt says why
            weights_own = None
        own = load_tokenizer(weights_own, add_specials=False).get_vocab() if weights_own else own
    return sorted(vocab[token] for token in SPECIAL_TOKENS.values() if token in vocab and token not in own)


def attached_trainer(module: LightningModule) -> Trainer | None:
    """`module`'s Trainer, or None where it has none (`load_from_checkpoint`, a direct call):
    `LightningModule.trainer` raises there (Lightning-AI/pytorch-lightning#13638)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def accumulation_window(module: LightningModule, batch_idx: int) -> tuple[int, int, int] | None:
    """(micro-batches, examples, LM targets) of the gradient-accumulation window that holds training
    batch `batch_idx` on this rank, where the data module counts them (`window_counts`); None for
    one batch a step. Lightning divides each micro-batch's loss by the window's length; divided by
    the window's counts instead of its own, a window's gradient is that of one batch of all its
    examples (Lightning alone would average the micro-batches' own means)."""
    trainer = attached_trainer(module)
    if trainer is None or trainer.accumulate_grad_batches == 1:
        return None
    counts = getattr(trainer.datamodule, "window_counts", None)
    if counts is None:
        return None
    k = trainer.accumulate_grad_batches
    found = counts(
        batch_idx, k, trainer.num_training_batches, getattr(trainer.train_dataloader, "sampler", None)
    )
    return None if found is None else (k, *found)


def normalised(
    terms: dict[str, Tensor], world: int, window: tuple[int, int, int] | None, lm_coef: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss and its parts from a batch's terms, normalised so that DDP's gradient average is
    exact: each rank divides its sums by the mean count over ranks (examples for the task loss,
    target tokens for the LM loss), and averaging the ranks' gradients then gives the gradient of
    the loss over the global batch, as one process with the whole batch would compute it. With an
    accumulation `window`, the loss divides by the window's counts, per micro-batch; the parts (and
    `loss` among them), what is logged, stay the batch's own: their mean over the ranks is the
    global batch's mean, which the logs show (`StepValues`)."""
    device = next(iter(terms.values())).device
    sums, counts = {}, {}  # counts filled on the device (a host value would wait), in fp32 whatever
    if "lm_sum" in terms:  # the default dtype (bf16-true sets it: a count of 4,939 is not one there)
        sums["lm_loss"], counts["lm_loss"] = terms["lm_sum"].sum(), terms["lm_count"].sum()
    if "task_loss" in terms:
        sums["task_loss"] = terms["task_loss"].sum()
        counts["task_loss"] = torch.full(
            (), float(len(terms["task_loss"])), device=device, dtype=torch.float32
        )
    parts = {name: sums[name] / divisor_over_ranks(counts[name], world) for name in sums}
    loss = combined_loss(parts.get("task_loss"), parts.get("lm_loss"), lm_coef)
    if window is None:
        return loss, parts
    k, of_window = window[0], {"task_loss": window[1], "lm_loss": window[2]}
    full = {
        name: sums[name]
        / divisor_over_ranks(torch.full((), of_window[name] / k, device=device, dtype=torch.float32), world)
        for name in sums
    }
    return combined_loss(full.get("task_loss"), full.get("lm_loss"), lm_coef), {**parts, "loss": loss}


class GPTModule(Evaluation, LightningModule):
    """A GPT with its tied LM head and, given a task, the task's head on the extract token's state."""

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
        lm_coef: float | None = None,
        classifier_dropout: float | None = None,
        lr: float = 6.25e-5,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        optimizer: Optimizer = "adamw",
        schedule: ScheduleName = "linear",
        warmup_fraction: float = 0.002,
        warmup_steps: int | None = None,
        predictions_dir: str = "predictions",
        compile: bool | str = False,
        activation_checkpointing: bool = False,
        lora: LoRA | None = None,
        class_weights: Literal["balanced"] | list[float] | None = None,
        new_tokens: Literal["random", "copied", "mean"] | None = None,
    ) -> None:
        """
        Args:
            preset: Model shape when starting from scratch (gpt1, gpt2, gpt-mini, gpt-micro, ...).
            overrides: GPTConfig fields to change, e.g. {n_layer: 4, attn_pdrop: 0.0}.
            init_from: Start from these weights: a gpt_ft .ckpt, a transformers directory, a .gguf
                file or a hub id.
            transfer_layers: Keep only the first k transformer blocks of init_from (and the
                embeddings); the others start fresh (GPT-1 §5, Fig. 2 left). None keeps all.
            vocab_size: Tokenizer size (linked from the data); the embedding grows to fit it.
            tokenizer: The data's tokenizer (linked); checkpoints save it beside them.
            task: The task card (linked from the data; from Python, its file too); None makes a plain
                language model.
            lm_coef: Weight of the auxiliary LM loss (0 turns it off); None: the task's default,
                GPT-1's 0.5, or 0 for preference pairs (a reward model; see `Preference`).
            classifier_dropout: Dropout before the task head; None: the task's default, GPT-1's 0.1,
                or 0 for an embedding (its vector is the output, as sentence-transformers pools it).
            lr: Peak learning rate of AdamW (GPT-1 fine-tuning: 6.25e-5).
            weight_decay: Decoupled weight decay on weight matrices (not biases or LayerNorm gains).
            betas: AdamW betas.
            eps: AdamW epsilon.
            optimizer: adamw (GPT-1), or muon: Muon on the blocks' weight matrices and AdamW on the
                rest, at the same learning rate and weight decay (see `MuonAdamW`).
            schedule: After warmup: linear to 0 (GPT-1 fine-tuning), cosine to 0 (pretraining), constant.
            warmup_fraction: Linear warmup over this fraction of all steps (GPT-1: 0.2%).
            warmup_steps: Linear warmup over this many steps instead (GPT-1 pretraining: 2000).
            predictions_dir: Where `predict` writes one submission file per test split.
            compile: torch.compile the GPT (True: the inductor backend; or a backend's name).
            activation_checkpointing: Recompute each block's activations in the backward pass
                instead of keeping them: less memory, about a third more compute; any strategy.
            class_weights: Weigh each class in the task loss (an example's loss times its class's
                weight), against class imbalance: one weight per class in id order, or `balanced`
                (n / (classes x n_k) from the training labels); multi-label: each label's
                positives (BCE's pos_weight; `balanced`: negatives / positives).
            lora: Fine-tune low-rank adapters of init_from's frozen weights (plus the new special
                tokens' rows and the task head) instead of every weight; see `gpt_ft.model.lora`.
            new_tokens: How the framing tokens' new embedding rows start, with init_from: "random"
                (GPT-1 §3.3: N(0, initializer_range)) or "copied" from the tokenizer's own tokens in
                those roles (start: its beginning-of-text token, delim: its newline, extract: its
                end-of-text token), or "mean": the mean of the loaded rows. Default: "copied" for
                the Llama family's weights, "random" for GPT-1's and GPT-2's.
        """
        super().__init__()
        task = as_task(task)
        if lm_coef is None:
            lm_coef = task.output.default_lm_coef if task is not None else 0.5
        if classifier_dropout is None:
            classifier_dropout = task.output.default_dropout if task is not None else 0.1
        check_rates(lm_coef=lm_coef, lr=lr, warmup_fraction=warmup_fraction, warmup_steps=warmup_steps,
                    weight_decay=weight_decay, betas=betas, eps=eps, dropout=classifier_dropout,
                    optimizer=optimizer, schedule=schedule)  # fmt: skip
        if isinstance(lora, dict):  # as the checkpoint's hyperparameters hold it
            lora = LoRA(**lora)
        if optimizer == "muon" and lora is not None:  # before any weights load
            raise ValueError(MUON_UNDER_LORA)
        self.gpt = build_gpt(
            preset=preset,
            overrides=overrides,
            init_from=init_from,
            transfer_layers=transfer_layers,
            vocab_size=vocab_size,
            tokenizer=tokenizer,
            lora=lora,
            new_token_ids=new_token_ids(tokenizer, init_from) if init_from else None,
            new_tokens=new_tokens,
            lm_alone=task is None,
        )
        self.lora, self.init_from, self.task, self.lm_coef = lora, init_from, task, lm_coef
        self.temperature = 1.0  # gpt-ft calibrate's: divides the logits before probabilities
        config = self.gpt.config
        head = dict(dropout=classifier_dropout, init_std=config.initializer_range, bias=config.bias)
        self.head = task.head(config.n_embd, **head) if task is not None else None
        splits = task.validation_splits + task.test_splits if task else ["validation", "test"]
        self.metrics = nn.ModuleDict({split_key(split): EvalMetrics(task, lm_coef) for split in splits})
        self.nonfinite = NonfiniteWatch()
        self.class_weights = class_weights
        if class_weights is not None:  # (`balanced`: counted from the training labels at setup)
            self.set_class_weights(class_weights_of(task, class_weights))
        self.optim = dict(lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps)
        self.optimizer_name = optimizer
        self.schedule, self.warmup_fraction, self.warmup_steps = schedule, warmup_fraction, warmup_steps
        self.predictions_dir = predictions_dir
        self.compile_backend = compile_backend(compile)
        self.gpt.activation_checkpointing = activation_checkpointing
        self._predictions: dict[str, list[tuple[Tensor, Tensor]]] = {}
        self.step_values = StepValues()  # logs a training step's losses where something reads them
        self.save_hyperparameters(ignore=["task", "lora"])
        self.hparams["lora"] = asdict(lora) if lora is not None else None  # plain values: weights-only loads

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args: Any, **kwargs: Any):  # (`recorded.standalone`)
        from gpt_ft.training.recorded import standalone

        return super().load_from_checkpoint(checkpoint_path, *args, **standalone(checkpoint_path, kwargs))

    def configure_model(self) -> None:
        # Once the device and strategy are set, before the optimizer and FSDP's flattening (groups by shape).
        if self.compile_backend and not is_compiled(self.gpt):
            self.gpt.compile(backend=self.compile_backend)
        self.built_ndims = {id(p): p.ndim for p in self.parameters()}

    def setup(self, stage: str) -> None:
        if stage == "fit" and isinstance(self.class_weights, str):  # (`balanced`: a plain Trainer's too)
            self.set_class_weights(class_weights_of(self.task, "balanced", self.trainer))

    def set_class_weights(self, weights: Tensor | None) -> None:
        """The task loss's class weights (`class_weights_of`; None: none yet)."""
        if weights is not None:
            self.head.class_weights = weights.to(self.head.weight.device)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = Checkpoint(checkpoint)
        saved.gpt_config = vars(self.gpt.config)  # its shape: the weights load without the run's arguments
        if self.lora is not None:
            lora_checkpoint(saved, self.gpt, self.lora, self.init_from)
        saved.temperature = self.temperature
        if self.head is not None and self.head.class_weights is not None:
            saved.class_weights = self.head.class_weights.tolist()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of another shape is named in one sentence, not a page of size mismatches; a
        LoRA run's, which leaves out the frozen base weights, loads them as this module has them."""
        path = getattr(attached_trainer(self), "ckpt_path", None)
        loaded, config, where = Checkpoint(checkpoint, path), self.gpt.config, path or "The checkpoint"
        check_lora_resume(loaded, self.lora, where, self.gpt)
        loaded.state = {**self.state_dict(), **loaded.state} if self.lora is not None else loaded.state
        check_same_tokenizer(loaded, getattr(attached_trainer(self), "datamodule", None), where)
        fitting = getattr(getattr(attached_trainer(self), "state", None), "fn", None) == "fit"
        if fitting:  # its optimizer state is read: the other optimizer's does not fit
            check_same_optimizer(checkpoint, self.optimizer_name, where)
        self.temperature = 1.0 if fitting else loaded.temperature  # trained on, the weights leave T behind
        restore_class_weights(self.head, loaded.class_weights, fitting)  # (fitting on: the run's own)
        check_fits(loaded, config, self.head, self.task, where, self.init_from)

    # ---- forward and losses ----

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Scores back from the bits they crossed Lightning's precision cast in (`batches.gold`), so
        that every step and callback sees them as float32, whatever passed the loaders in."""
        labels = getattr(batch, "labels", None)
        return batch if labels is None or labels.dtype != torch.int32 else replace(batch, labels=gold(labels))

    def forward(self, batch: TokenBatch) -> Tensor:
        """The task head's outputs for a batch: (B, classes), (B, 1), (B, choices), (B, labels); no
        loss (an embedding's gathers every rank's rows, and predict's ranks have unequal batches)."""
        return self.terms(replace(batch, labels=None), with_lm=False)["logits"]

    def terms(self, batch: TokenBatch, with_lm: bool = True) -> dict[str, Tensor]:
        """Per-example terms: lm_sum and lm_count, and with a task logits and task_loss."""
        lm = with_lm and (self.head is None or self.lm_coef > 0)
        return batch_terms(self.gpt, self.head, batch, lm=lm)

    def losses(self, batch: TokenBatch, window: tuple[int, int, int] | None = None) -> tuple[Tensor, dict]:
        """The training loss and its parts (`normalised`; `window`: `accumulation_window`'s)."""
        trainer = attached_trainer(self)
        world = trainer.world_size if trainer is not None else 1
        return normalised(self.terms(batch), world, window, self.lm_coef)

    # ---- steps ----

    def training_step(self, batch: TokenBatch, batch_idx: int) -> Tensor:
        loss, parts = self.losses(batch, accumulation_window(self, batch_idx))
        self.nonfinite.check(self.trainer, loss, batch_idx, self.optimizers(use_pl_optimizer=False))
        self.step_values.step(self, attached_trainer(self), batch_idx, {"loss": loss, **parts}, len(batch))
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self.step_values.after_step(self)

    def on_train_end(self) -> None:
        self.nonfinite.poll(self.trainer)  # the last steps' flags

    def predict_step(self, batch: TokenBatch, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        if self.head is None:
            raise ValueError("predict needs a task: give --data a task card.")
        predictions = self.head.predictions(self(batch))
        self._predictions.setdefault(batch.split, []).append((batch.index.cpu(), predictions.cpu()))
        return predictions

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.trainer.received_sigterm:  # (Lightning's other stages' loops stop so; its predict's not)
            raise SIGTERMException

    def on_predict_epoch_end(self) -> None:
        # Every rank sees every split (the predict loaders' sampler pads), so the gathers line up.
        for split, chunks in sorted(self._predictions.items()):
            index = torch.cat([i for i, _ in chunks])
            predictions = torch.cat([p for _, p in chunks])
            world = self.trainer.world_size
            index, predictions = gather(index, world, self.device), gather(predictions, world, self.device)
            if self.trainer.is_global_zero:
                names = {n: getattr(self.trainer.datamodule, n, {}).get(split) for n in NAMED}
                out_dir = Path(self.predictions_dir).expanduser()
                written = write_predictions(self.task, split, index, predictions, out_dir, **names)
                print(f"predictions of split {split!r}: {written}", flush=True)
        self._predictions = {}

    # ---- optimisation ----

    configure_gradient_clipping = clip_gradients  # by FSDP's own norm under FSDP

    def on_train_start(self) -> None:
        schedule = self.lr_schedulers()
        if isinstance(schedule, Schedule) and self.trainer.ckpt_path is not None:  # (resumed)
            schedule.respan(self.trainer)

    def configure_optimizers(self):
        fused, built = fused_adamw(self.device), getattr(self, "built_ndims", None)
        if self.optimizer_name == "muon":
            optimizer = MuonAdamW(self.named_parameters(), **self.optim, fused=fused, built=built)
        else:
            optimizer = adamw(self.parameters(), **self.optim, fused=fused, built=built)
        total, warmup = schedule_steps(self)
        fraction = self.warmup_fraction if self.warmup_steps is None else None
        scheduler = Schedule(optimizer, self.schedule, warmup, total, fraction)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def compile_backend(compile: bool | str) -> str | None:
    """`--model.compile`'s backend: True is inductor's, False none; a name torch.compile does not
    know is refused here (it was a traceback once the run had started; `null` is read as a name)."""
    if isinstance(compile, str) and compile not in torch.compiler.list_backends(exclude_tags=()):
        usual = ", ".join(["eager", "aot_eager", *torch.compiler.list_backends()])
        raise ValueError(f"--model.compile {compile!r} is no torch.compile backend: give true (inductor), "
                         f"false, or a backend's name ({usual}).")  # fmt: skip
    return ("inductor" if compile is True else compile) or None
