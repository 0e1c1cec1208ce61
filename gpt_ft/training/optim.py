"""AdamW with weight decay on matrices only (GPT-1 §4.1), Muon for the blocks' matrices as an
option, and the learning-rate schedules."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal, get_args

import torch
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn

from gpt_ft.errors import FileProblem
from gpt_ft.workarounds.kernels import decline_step_unscaling


def adamw(
    parameters: Iterable[nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    fused: bool = False,
    built: Mapping[int, int] | None = None,
) -> torch.optim.AdamW:
    """AdamW decaying weight matrices only: not biases or LayerNorm gains (GPT-1: 0.01). `built`:
    each parameter's number of dimensions as built, by `id`, where a strategy has since flattened
    it (FSDP shards each parameter as a 1-D view of the same object)."""
    decay, no_decay = [], []
    for p in parameters:
        if p.requires_grad:
            (decay if (built or {}).get(id(p), p.ndim) >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)
    # The fused kernel offers to unscale fp16 gradients inside its step, and Lightning then refuses
    # to clip them under mixed precision. Declined, the GradScaler unscales them before clipping, as
    # for any optimizer (bf16-mixed has no scaler at all).
    decline_step_unscaling(optimizer)
    return optimizer


def fused_adamw(device: torch.device) -> bool:
    """Whether to run AdamW's fused kernel on `device`: on CUDA and on the CPU. One pass over each
    tensor instead of a chain of temporaries: at the smollm2-135m shape on 2 CPU cores a step of
    the optimizer takes 0.06 s instead of 0.36 s."""
    return device.type in ("cuda", "cpu")


def schedule_steps(module) -> tuple[int, float]:
    """The optimizer steps a module's schedule spans and its warmup's: the Trainer's estimate, which
    is infinite when only `max_time` bounds the run (a schedule that needs the length then says
    what to give), and `warmup_steps` or `warmup_fraction` of it."""
    estimated, schedule = module.trainer.estimated_stepping_batches, module.schedule
    reads_length = schedule != "constant" or (module.warmup_steps is None and module.warmup_fraction > 0)
    if not math.isfinite(estimated) and reads_length:
        timed = any(isinstance(c, Timer) for c in module.trainer.callbacks)
        bound = "--trainer.max_time alone gives" if timed else "--trainer.max_epochs -1 gives"
        needs = (  # a constant schedule reads the length for its warmup by fraction alone
            f"--model.schedule {schedule} spans the run's steps"
            if schedule != "constant"
            else f"--model.warmup_fraction {module.warmup_fraction:g} is a fraction of the run's steps"
        )
        remedy = (
            "--model.schedule constant with --model.warmup_steps"
            if schedule != "constant"
            else "--model.warmup_steps N (0: none)"
        )
        raise ValueError(
            f"{needs}, and {bound} no number of them: add --trainer.max_steps or a finite "
            f"--trainer.max_epochs (a time limit still stops it first), or use {remedy}."
        )
    total = max(1, int(estimated)) if math.isfinite(estimated) else 1
    # A fraction's warmup is not rounded to whole steps, as OpenAI's GPT-1 code (`warmup_linear`): a
    # run of 234 steps warms up over 0.468 of a step, its first at rate 0 (rounded: none, the first
    # step at the full rate).
    warmup = module.warmup_steps if module.warmup_steps is not None else module.warmup_fraction * total
    if (
        warmup > total - 1 and math.isfinite(estimated) and estimated >= 1
    ):  # (last rate: (total - 1) / warmup)
        than = "longer than" if warmup > total else "as long as" if warmup == total else "nearly as long as"
        given = (
            f"--model.warmup_steps {warmup}"
            if module.warmup_steps is not None
            else f"--model.warmup_fraction {module.warmup_fraction:g} ({warmup:g} step{'s' * (warmup != 1)})"
        )
        rank_zero_warn(f"{given} is {than} the run's {total} optimizer step{'s' * (total != 1)}: the "
                       f"learning rate never reaches --model.lr ({module.optim['lr']:g})")  # fmt: skip
    return total, warmup


class Schedule(torch.optim.lr_scheduler.LambdaLR):
    """The learning-rate schedule (`lr_lambda`) over `total` optimizer steps. Resumed with another
    length (`--trainer.max_epochs` or `max_steps` changed) or shape (`--model.schedule`, the warmup),
    its learning rates follow the new schedule from the restored step on, the first step included
    (the optimizer's restored rates are the old schedule's), and it says so. So do a new peak
    learning rate and new optimizer settings (weight decay, betas, eps, momentum): the run's, not
    the checkpoint's (Lightning restores the optimizer, then the schedule)."""

    def __init__(
        self, optimizer, schedule: str, warmup: float, total: int, fraction: float | None = None
    ) -> None:
        self.total, self.shape, self.fraction, self.saved = total, [schedule, warmup], fraction, None
        self.settings = [{k: g[k] for k in SETTINGS if k in g} for g in optimizer.param_groups]
        super().__init__(optimizer, lr_lambda(schedule, warmup, total))

    def load_state_dict(self, state_dict: dict) -> None:
        total, shape, base_lrs, configured = self.total, self.shape, list(self.base_lrs), self.settings
        fraction = self.fraction
        super().load_state_dict(state_dict)  # (its attributes: the checkpoint's)
        # (a checkpoint from before the shape was kept: none) Said by `respan`, once the length is known.
        self.saved = state_dict.get("total", total), state_dict.get("shape", shape)
        changed = {
            f"lr {new:g} (the checkpoint's {old:g})"
            for new, old in zip(base_lrs, self.base_lrs)
            if new != old
        }
        for group, settings in zip(self.optimizer.param_groups, configured):
            changed |= {
                f"{k} {v} (the checkpoint's {group[k]})"
                for k, v in settings.items()
                if _differ(group.get(k), v)
            }
            group.update(settings)
        if changed:
            rank_zero_info(f"resumed with other optimizer settings than the checkpoint's, which apply from "
                           f"step {self.last_epoch}: {', '.join(sorted(changed))}")  # fmt: skip
        self.total, self.shape, self.base_lrs, self.settings = total, shape, base_lrs, configured
        self.fraction = fraction
        for group, base, factor in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
            group["initial_lr"], group["lr"] = base, base * factor(self.last_epoch)

    def respan(self, trainer) -> None:
        """A resumed run's schedule over the steps its loop will make (`steps_left`), said where
        that is not the checkpoint's length: the Trainer's estimate counts every epoch in this run's
        steps, where the restored ones may have been of another batch size or accumulation (a
        schedule that ended before the run did left its last epochs at rate 0)."""
        left = steps_left(trainer)
        total = self.total if left is None else trainer.global_step + left
        total = min(total, trainer.max_steps) if trainer.max_steps not in (None, -1) else total
        shape = [self.shape[0], self.fraction * total if self.fraction is not None else self.shape[1]]
        if (total, shape) != (self.total, self.shape):  # (a warmup by fraction: of the new length)
            self.total, self.shape = total, shape
            self.lr_lambdas = [lr_lambda(*shape, total) for _ in self.optimizer.param_groups]
            for group, base, factor in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
                group["lr"] = base * factor(self.last_epoch)
            self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        if self.saved is None:
            return
        (saved_total, saved), step, self.saved = self.saved, self.last_epoch, None
        if saved != shape:
            now, then = f"{shape[0]} after {shape[1]:g}", f"{saved[0]} after {saved[1]:g}"
            rank_zero_info(
                f"the schedule is now {now} warmup steps, the checkpoint's {then}, from step {step} on"
            )
        if saved_total != total:
            rank_zero_info(f"the schedule now spans {total} steps, the checkpoint's {saved_total}: "
                           f"learning rates follow the new one from step {step}")  # fmt: skip


def steps_left(trainer) -> int | None:
    """The optimizer steps a resumed run's loop makes from the restored step on: the rest of the
    resumed epoch (Lightning counts its batches done in this run's size, and the epoch ends where
    its examples do, or at that count of batches), then whole epochs; None where the loader's
    sampler is not the data modules' (which knows where the epoch stood) or the epochs are unbounded."""
    loader = trainer.train_dataloader
    sampler = getattr(loader, "sampler", None)
    if not hasattr(sampler, "epoch_batches") or trainer.max_epochs in (None, -1):
        return None
    k, batches, done = trainer.accumulate_grad_batches, trainer.num_training_batches, sampler.batches_done()
    end = min(done + len(sampler.epoch_batches(loader.batch_size)), batches) if done else batches
    resumed = sum((i + 1) % k == 0 or i == end - 1 for i in range(done, end))  # (Lightning's steps)
    return resumed + (trainer.max_epochs - trainer.current_epoch - 1) * math.ceil(batches / k)


def check_same_optimizer(checkpoint: dict, optimizer: str, where: str) -> None:
    """A run resumed with the other `--model.optimizer`, named: the saved state does not fit it."""
    state = (checkpoint.get("optimizer_states") or [None])[0]
    if isinstance(state, dict) and ("muon" in state) != (optimizer == "muon"):
        saved = "muon" if "muon" in state else "adamw"
        raise FileProblem(
            f"{where} was trained with --model.optimizer {saved}: resume with it, or start a run of "
            f"{optimizer} from its weights with --model.init_from."
        )


Optimizer = Literal["adamw", "muon"]
ScheduleName = Literal["linear", "cosine", "constant"]

SETTINGS = ("weight_decay", "betas", "eps", "momentum")
"""An optimizer group's settings a resumed run takes from its own configuration."""


def _differ(saved, configured) -> bool:
    """Whether a restored setting is not the configured one (betas come back as a list or a tuple)."""
    as_list = lambda v: list(v) if isinstance(v, (tuple, list)) else v  # noqa: E731
    return as_list(saved) != as_list(configured)


def lr_lambda(schedule: str, warmup: float, total: int) -> Callable[[int], float]:
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


BLOCK_MATRIX = re.compile(r"(^|\.)h\.\d+\.")  # a transformer block's parameter: gpt.h.3.attn.c_attn.weight


MUON_UNDER_LORA = (
    "--model.optimizer muon trains the blocks' whole weight matrices, which --model.lora freezes (its "
    "rank-r factors are not Muon's case): train LoRA with --model.optimizer adamw."
)


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the transformer blocks' weight matrices, AdamW (as `adamw`) on everything else:
    embeddings and the tied LM head, the task head, biases, LayerNorm gains. One optimizer to
    Lightning: one step, one schedule, one state dict.

    Muon (Jordan et al. 2024; `torch.optim.Muon`) orthogonalises each matrix's momentum with a few
    Newton-Schulz iterations; it took the modded-nanogpt speedrun to GPT-2's loss on far fewer
    tokens. Its update is scaled to AdamW's RMS (`adjust_lr_fn="match_rms_adamw"`, the Moonlight
    recipe), so the learning rate and weight decay are AdamW's and one schedule drives both. A
    stacked matrix (c_attn's queries, keys and values; a gated c_fc's gate and up) is one matrix to
    it, where the reference recipes orthogonalise the parts apart.
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, nn.Parameter]],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        eps: float,
        fused: bool = False,
        built: Mapping[int, int] | None = None,
    ) -> None:
        named = [(name, p) for name, p in named_parameters if p.requires_grad]
        if any((built or {}).get(id(p), p.ndim) != p.ndim for _, p in named):
            raise ValueError(
                "--model.optimizer muon orthogonalises whole weight matrices, which FSDP has cut into "
                "flat shards: train with DDP (configs/trainer/ddp.yaml), or with AdamW."
            )
        matrices = [
            p for name, p in named if p.ndim == 2 and BLOCK_MATRIX.search(name) and "lora_" not in name
        ]
        if not matrices:
            if any("lora_" in name for name, _ in named):
                raise ValueError(MUON_UNDER_LORA)
            raise ValueError("optimizer muon found no transformer block weight matrices to train.")
        chosen = {id(p) for p in matrices}
        self.muon = torch.optim.Muon(
            matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"
        )
        self.adamw = adamw(
            [p for _, p in named if id(p) not in chosen],
            lr=lr,
            weight_decay=weight_decay,
            betas=betas,
            eps=eps,
            fused=fused,
        )
        super().__init__([p for _, p in named], {"lr": lr})
        self._share()

    def _share(self) -> None:
        """Expose the two optimizers' own groups and state (a schedule setting `lr` reaches both)."""
        self.param_groups = [*self.muon.param_groups, *self.adamw.param_groups]
        self.state = _States(self.muon.state, self.adamw.state)

    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self._share()  # loading replaces the optimizers' groups and state


class _States(Mapping):
    """The two optimizers' states read as one, without inserting into them: each is a defaultdict,
    so a ChainMap would give the first one an empty state for every parameter looked up."""

    def __init__(self, *states: Mapping) -> None:
        self.states = states

    def __getitem__(self, param):
        for state in self.states:
            if param in state:
                return state[param]
        raise KeyError(param)

    def __iter__(self) -> Iterator:
        for state in self.states:
            yield from state

    def __len__(self) -> int:
        return sum(len(state) for state in self.states)


def check_rates(
    *,
    lm_coef: float,
    lr: float,
    warmup_fraction: float,
    warmup_steps: int | None,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    dropout: float = 0.1,
    optimizer: str = "adamw",
    schedule: str = "linear",
) -> None:
    """The loss weight, learning rate, warmup, AdamW's settings, the head's dropout, the optimizer
    and the schedule a module is given, each in its range (AdamW checks only its own defaults: the
    groups carry the decay, and a negative one grows weights; a name the command line would refuse
    is refused from Python too, not read as the default)."""
    for name, value, known in (("optimizer", optimizer, Optimizer), ("schedule", schedule, ScheduleName)):
        if value not in get_args(known):
            raise ValueError(f"{name} must be one of {', '.join(get_args(known))}, got {value!r}.")
    finite = {"lm_coef": lm_coef, "lr": lr, "weight_decay": weight_decay, "eps": eps}
    given = {**finite, "warmup_fraction": warmup_fraction, "classifier_dropout": dropout}
    unread = (k for k, v in given.items() if isinstance(v, bool) or not isinstance(v, numbers.Real))
    if bad := next(unread, None):  # ("1e-3": YAML 1.1 reads a string; from Python, a TypeError later)
        raise ValueError(f"{bad} must be a number, got {given[bad]!r}.")
    if bad := next((name for name, value in finite.items() if not math.isfinite(value)), None):
        raise ValueError(f"{bad} must be a finite number, got {finite[bad]}.")  # NaN passes every `<`
    if lm_coef < 0:
        raise ValueError(f"lm_coef must be >= 0, got {lm_coef}.")
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}.")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {list(betas)}.")
    if eps <= 0:  # (0: a parameter with no gradient yet takes 0/0, NaN, at its first update)
        raise ValueError(f"eps must be > 0, got {eps}.")
    if not 0 <= dropout < 1:
        raise ValueError(f"classifier_dropout must be in [0, 1), got {dropout}.")
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}.")
    if warmup_steps is not None and warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
