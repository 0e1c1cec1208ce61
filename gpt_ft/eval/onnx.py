"""An exported transformers model as an ONNX graph (`gpt-ft export --format onnx`)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_onnx(model, tokenizer, path: Path) -> None:
    """`model` through torch.onnx's exporter, batch and length (and choices) dynamic: inputs
    `input_ids` and `attention_mask` (a classifier's padded on either side), output `logits`
    (multiple choice: `input_ids` of (batch, choices, length) and `mc_token_ids`, output `mc_logits`)."""
    import warnings

    choices = hasattr(model, "multiple_choice_head")
    pairs = tokenizer(["a b c d", "a"], ["e", "f g"], padding=True, return_tensors="pt")
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    if choices:
        wrapper = _ChoiceScores(model)
        ids = pairs["input_ids"][None]  # (1 example, 2 choices, length)
        inputs = (ids, pairs["attention_mask"].sum(dim=1)[None] - 1)
        names, output = ["input_ids", "mc_token_ids"], "mc_logits"
        k = torch.export.Dim("choices")
        shapes = {"input_ids": {0: batch, 1: k, 2: length}, "mc_token_ids": {0: batch, 1: k}}
    else:
        wrapper, inputs = _Logits(model), (pairs["input_ids"], pairs["attention_mask"])
        names, output = ["input_ids", "attention_mask"], "logits"
        shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    # One file where protobuf allows it (2 GB); a larger model's weights go beside it, in model.onnx.data.
    external = sum(t.numel() * t.element_size() for t in model.state_dict().values()) >= 1.5 * 2**30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on its own internals
        torch.onnx.export(
            wrapper, inputs, str(path), dynamo=True, input_names=names, output_names=[output],
            dynamic_shapes=shapes, verbose=False, external_data=external,
        )  # fmt: skip


class _Logits(torch.nn.Module):
    """A classifier's logits, its positions numbered from the attention mask: transformers numbers
    GPT-1's and GPT-2's learned positions from the row's first column, padding included, so a batch
    padded on the left (a serving stack's choice) read shifted positions (rotary ones are relative:
    the same logits either way)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits


class _ChoiceScores(_Logits):
    def forward(self, input_ids, mc_token_ids):
        return self.model(input_ids=input_ids, mc_token_ids=mc_token_ids).mc_logits
