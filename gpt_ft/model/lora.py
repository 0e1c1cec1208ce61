"""Low-rank adapters (LoRA, Hu et al. 2021) for fine-tuning a large model on little memory.

`add_lora(gpt, lora, new_tokens_from=n)` freezes the model and gives each chosen linear layer of
the blocks a trainable update `(alpha / rank) * B A` (A: rank x in, B: out x rank, B zero at
first, so the model starts exactly as loaded). The token embedding (and an untied LM head) keep
their first `n` rows frozen and train the rows after them: the special tokens fine-tuning adds
(GPT-1 §3.3). The task head is outside the GPT and trains in full. `merge_lora(gpt)` folds every
update back into plain layers: the same model, no adapters, as fast as the original.

With `LoRA(quantize="nf4")` the frozen weights of the adapted layers are kept in 4-bit NormalFloat
with double quantization (QLoRA, Dettmers et al. 2023), through torchao's `NF4Tensor`: about an
eighth of their fp32 memory, a quarter of bf16's. The layer computes with the weight dequantized
on the fly; merging dequantizes it and adds the update, so a merged model is plain again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpt_ft.workarounds.kernels import torchao_import_quiet

TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
QUANTIZE = ("nf4",)
# QLoRA §3: an absmax constant per block of 64 weights, and those constants in 8 bits per block of
# 256 (double quantization); a matrix whose count of blocks 256 does not divide takes second blocks
# of their greatest common divisor (SmolLM2-135M's 960 x 576 c_attn: 64).
NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256
NO_TORCHAO = 'lora.quantize nf4 needs torchao: pip install "gpt_ft[quantize]".'


@dataclass
class LoRA:
    """Which layers get adapters and their shape.

    Args:
        rank: Rank r of each update B A.
        alpha: The update is scaled by alpha / rank.
        dropout: Dropout on the adapters' input.
        targets: Layers of every block that get an adapter: attn.c_attn (q, k, v), attn.c_proj,
            mlp.c_fc, mlp.c_proj.
        checkpoint: What checkpoints hold: the trained weights only, beside the base weights' name
            (small files that resume), or the whole merged model (a plain checkpoint, for use elsewhere).
        quantize: Keep the frozen base weights of the adapted layers in 4-bit NF4 (QLoRA, Dettmers
            et al. 2023): an eighth of their fp32 memory; needs torchao (pip install "gpt_ft[quantize]").
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    checkpoint: Literal["adapters", "merged"] = "adapters"
    quantize: Literal["nf4"] | None = None

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora.rank must be a positive integer, got {self.rank}.")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"lora.alpha must be a finite number > 0, got {self.alpha}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}.")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"lora.targets {unknown or '[]'} not allowed; choose among {list(TARGETS)}.")
        if twice := sorted({t for t in self.targets if self.targets.count(t) > 1}):
            raise ValueError(f"lora.targets names {twice} more than once; name each layer once.")
        if self.checkpoint not in ("adapters", "merged"):
            raise ValueError(f"lora.checkpoint={self.checkpoint!r}; allowed: 'adapters', 'merged'.")
        if self.quantize not in (None, *QUANTIZE):
            raise ValueError(f"lora.quantize={self.quantize!r}; allowed: 'nf4', or null for none.")
        if self.quantize is not None:
            torchao_to_nf4()  # a missing package is named now, before any weights load


def torchao_to_nf4():
    """torchao's `to_nf4`, or one sentence naming the package to install."""
    quantization = import_torchao()
    if quantization is None:
        raise ValueError(NO_TORCHAO)
    return quantization.to_nf4


def import_torchao():
    """`torchao.quantization`, imported without the warnings torchao logs about parts NF4 does not
    use (its CUDA kernels, which fail to load under a CPU-only torch; an enum registered with
    torch's pytree); None where torchao is not installed. Once imported, later imports (transformers
    makes one) are silent too."""
    try:
        with torchao_import_quiet():
            import torchao.quantization
    except ImportError:
        return None
    return torchao.quantization


def to_nf4(weight: Tensor) -> Tensor:
    """`weight` (out x in) as torchao's `NF4Tensor`: 4-bit codes, block constants in 8 bits."""
    blocks, remainder = divmod(weight.numel(), NF4_BLOCK)
    if remainder:
        raise ValueError(
            f"lora.quantize nf4 quantizes blocks of {NF4_BLOCK} weights; a matrix of shape "
            f"{tuple(weight.shape)} has {weight.numel()}, not a multiple."
        )
    return torchao_to_nf4()(weight.detach().contiguous(), NF4_BLOCK, math.gcd(NF4_SCALER_BLOCK, blocks))


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update: base(x) + s * B(A(dropout(x))).

    With `quantize="nf4"` the base layer's weight is an `NF4Tensor`; `F.linear` on it runs torchao's
    `linear_nf4`, which keeps the 4-bit weight for the backward pass and dequantizes it there."""

    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        alpha: float,
        dropout: float,
        *,
        quantize: Literal["nf4"] | None = None,
    ) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        kwargs = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kwargs))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **kwargs))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's init, as the paper's code
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(dropout)
        self.quantize = quantize
        if quantize is not None:
            base.weight = nn.Parameter(to_nf4(base.weight), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling

    def base_weight(self) -> Tensor:
        """The frozen weight as a plain tensor: a 4-bit one dequantized to the model's dtype."""
        weight = self.base.weight
        return weight.get_original_weight().to(weight.dtype) if self.quantize else weight

    def merged(self) -> nn.Linear:
        with torch.no_grad():
            update = (self.lora_B @ self.lora_A) * self.scaling
            if self.quantize:
                self.base.weight = nn.Parameter(self.base_weight() + update)
            else:
                self.base.weight += update
        return self.base.requires_grad_(True)


class TokenRows(nn.Module):
    """A token matrix (embedding or untied LM head) whose first `frozen` rows are fixed and whose
    other rows, up to the vocabulary's size, train: two parameters, so that the optimizer holds
    state for the new rows only and no gradient of the frozen rows is ever computed. The rows past
    the vocabulary (a released table's unused ones, or padding) are kept, frozen, as they were."""

    def __init__(self, weight: Tensor, frozen: int, vocab: int) -> None:
        super().__init__()
        if not 0 < frozen <= vocab <= weight.shape[0]:
            raise ValueError(
                f"TokenRows needs 0 < frozen <= vocab <= rows, got {frozen}, {vocab}, {weight.shape[0]}."
            )
        self.frozen = frozen
        self.frozen_rows = nn.Parameter(weight[:frozen].detach(), requires_grad=False)
        self.new_rows = nn.Parameter(weight[frozen:vocab].detach().clone())
        self.unused_rows = nn.Parameter(weight[vocab:].detach(), requires_grad=False)

    def forward(self, ids: Tensor) -> Tensor:
        """Embeddings of `ids`."""
        old = F.embedding(ids.clamp(max=self.frozen - 1), self.frozen_rows)
        if not len(self.new_rows):
            return old
        new = F.embedding((ids - self.frozen).clamp(0, len(self.new_rows) - 1), self.new_rows)
        return torch.where((ids >= self.frozen)[..., None], new, old)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden @ [frozen; new].T: a logit for each row of the vocabulary."""
        return torch.cat([F.linear(hidden, self.frozen_rows), F.linear(hidden, self.new_rows)], dim=-1)

    @property
    def weight(self) -> Tensor:
        """The whole matrix, the rows past the vocabulary included."""
        return torch.cat([self.frozen_rows, self.new_rows, self.unused_rows])


def add_lora(gpt: nn.Module, lora: LoRA, *, new_tokens_from: int) -> nn.Module:
    """Freeze `gpt`, add adapters to `lora.targets` of every block (their frozen weights in 4 bits
    with `lora.quantize`), and train the token rows from `new_tokens_from` on (the special tokens
    the loaded weights lack). In place; returns `gpt`. Adapters are added once: a model that has
    them (merge them first: `merge_lora`) is refused, untouched."""
    if any(isinstance(m, (LoRALinear, TokenRows)) for m in gpt.modules()):
        raise ValueError(
            "The model has LoRA adapters already: merge them first (merge_lora), then add others."
        )
    vocab = gpt.config.vocab_size  # the token rows first: they check their bounds, nothing changed yet
    rows = [
        TokenRows(head.weight, new_tokens_from, vocab) for head in (gpt.wte, gpt.lm_head) if head is not None
    ]
    gpt.requires_grad_(False)
    for block in gpt.h:
        for target in lora.targets:
            parent, name = target.split(".")
            module = getattr(getattr(block, parent), name)
            adapted = LoRALinear(module, lora.rank, lora.alpha, lora.dropout, quantize=lora.quantize)
            setattr(getattr(block, parent), name, adapted)
    gpt.wte, *head = rows
    if head:
        gpt.lm_head = head[0]
    return gpt


def merge_lora(gpt: nn.Module) -> nn.Module:
    """Fold every adapter into its layer (a 4-bit weight dequantized first) and the token rows into
    plain matrices: a plain GPT with the same outputs, every parameter trainable again. In place;
    returns `gpt`."""
    for block in gpt.h:
        for parent in (block.attn, block.mlp):
            for name, module in list(parent.named_children()):
                if isinstance(module, LoRALinear):
                    setattr(parent, name, module.merged())
    for name, cls in (("wte", nn.Embedding), ("lm_head", nn.Linear)):
        rows = getattr(gpt, name)
        if isinstance(rows, TokenRows):
            weight = rows.weight.detach()
            with torch.device("meta"):  # no init of a matrix about to be replaced
                plain = cls(*weight.shape) if cls is nn.Embedding else cls(*weight.shape[::-1], bias=False)
            plain.weight = nn.Parameter(weight.clone())
            setattr(gpt, name, plain)
    return gpt.requires_grad_(True)


def merged_state_dict(gpt: nn.Module) -> dict[str, Tensor]:
    """The state dict `merge_lora(gpt)` would have, computed without changing `gpt`."""
    out = {}
    for key, value in gpt.state_dict().items():
        for suffix in (".lora_A", ".lora_B", ".frozen_rows", ".new_rows", ".unused_rows"):
            if key.endswith(suffix):
                break
        else:
            out[key.replace(".base.", ".")] = value
    for name, module in gpt.named_modules():
        if isinstance(module, LoRALinear):
            update = (module.lora_B @ module.lora_A) * module.scaling
            out[f"{name}.weight"] = (module.base_weight() + update).detach()
        elif isinstance(module, TokenRows):
            out[f"{name}.weight"] = module.weight.detach()
    return out
