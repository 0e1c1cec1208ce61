"""GPT-1's similarity classifier (§3.3) as a transformers model: the pair in both orders, the two
extract states added, then the score layer.

`gpt-ft export` ships this file inside the folder of a similarity task (MRPC, QQP, STS-B), where
transformers loads it with `trust_remote_code=True`:

    pipeline("text-classification", model=DIR, trust_remote_code=True)({"text": a, "text_pair": b})

It imports torch and transformers only, never gpt_ft. Its input is the pair as the exported
tokenizer frames it, `[start] a [delim] b [extract]`, padded on the right; the model builds
`[start] b [delim] a [extract]` from it (`swap_pair`), so a served model needs nothing but the
folder. One class per family, each with its family's config class (transformers checks that a
remote class's config class is the config's).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoModel,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Olmo3Config,
    OpenAIGPTConfig,
    Phi3Config,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
    SmolLM3Config,
)
from transformers.modeling_outputs import SequenceClassifierOutput


def swap_pair(input_ids: torch.Tensor, attention_mask: torch.Tensor, delim: int) -> torch.Tensor:
    """Each row `[start] a [delim] b [extract]` (then padding) as `[start] b [delim] a [extract]`
    (the same padding): one gather, at positions computed from the row's delimiter and length."""
    length = attention_mask.sum(dim=-1, keepdim=True)
    d = ((input_ids == delim) & attention_mask.bool()).int().argmax(dim=-1, keepdim=True)
    nb = length - 2 - d  # b's tokens: between the delimiter and the extract token
    p = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
    source = torch.where((p >= 1) & (p <= nb), p + d, p)  # b, then
    source = torch.where(p == nb + 1, d.expand_as(p), source)  # the delimiter, then
    source = torch.where((p >= nb + 2) & (p <= length - 2), p - nb - 1, source)  # a
    return input_ids.gather(-1, source)


def check_pairs(input_ids: torch.Tensor, attention_mask: torch.Tensor, delim: int) -> None:
    """Each row one pair, padded on the right (as the folder's tokenizer frames and pads it)."""
    mask = attention_mask.bool()
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("A similarity model reads rows padded on the right (the tokenizer's padding_side).")
    delims = ((input_ids == delim) & mask).sum(dim=-1)
    if bool((delims != 1).any()):
        row = int((delims != 1).nonzero()[0, 0])
        raise ValueError(
            f"Row {row} holds {int(delims[row])} delimiter tokens; a similarity model reads one pair of "
            "texts (text, text_pair), neither empty: transformers' tokenizer frames a pair whose second "
            "text is empty as a single text, and a text holding the delimiter token splits wrongly."
        )


def _tracing() -> bool:
    """Whether the forward is being traced or exported (ONNX): data-dependent checks are left out."""
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or exporting()


class SimilarityForSequenceClassification(PreTrainedModel):
    """The family's base model, run on both orders of the pair; the sum of the two extract states
    (the last token that is not padding) goes through `score`. Its config adds `delim_token_id`,
    `score_bias` and, for a score, `score_range` (served scores are clipped to it, as gpt_ft's are)."""

    base_model_prefix = "model"
    _supports_sdpa = True  # as the base models do, but for GPT-1's

    def __init__(self, config) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = AutoModel.from_config(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=config.score_bias)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs) -> SequenceClassifierOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if not _tracing():
            check_pairs(input_ids, attention_mask, self.config.delim_token_id)
        swapped = swap_pair(input_ids, attention_mask, self.config.delim_token_id)
        hidden = self.model(
            input_ids=torch.cat([input_ids, swapped]),
            attention_mask=torch.cat([attention_mask, attention_mask]),
        ).last_hidden_state
        n, rows = input_ids.shape[0], torch.arange(input_ids.shape[0], device=input_ids.device)
        last = attention_mask.sum(dim=-1) - 1
        logits = self.score(hidden[:n][rows, last] + hidden[n:][rows, last])
        score_range = getattr(self.config, "score_range", None)
        if score_range is not None and not self.training:  # a score is served clipped to its range
            logits = logits.clamp(*score_range)
        loss = None
        if labels is not None:
            if self.config.problem_type == "regression":
                loss = nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
            else:
                loss = nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class OpenAIGPTSimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = OpenAIGPTConfig
    _supports_sdpa = False


class GPT2SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = GPT2Config


class LlamaSimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = LlamaConfig


class Qwen2SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = Qwen2Config


class Qwen3SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = Qwen3Config


class MistralSimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = MistralConfig


class Phi3SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = Phi3Config


class Gemma3TextSimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = Gemma3TextConfig


class SmolLM3SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = SmolLM3Config


class GPTNeoXSimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = GPTNeoXConfig


class Olmo2SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = Olmo2Config


class Olmo3SimilarityForSequenceClassification(SimilarityForSequenceClassification):
    config_class = Olmo3Config


CLASSES = {cls.config_class.model_type: cls for cls in SimilarityForSequenceClassification.__subclasses__()}
"""The class of each family, by its config's `model_type`."""
