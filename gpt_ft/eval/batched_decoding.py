"""Prompts continued in batches: the shortest together, padded on the left, each written up to its
first end-of-text token (`gpt-ft generate --input`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpt_ft.model.gpt import GPT


def until_eos(new: list[int], eos: list[int]) -> list[int]:
    """New tokens up to the first end-of-text token (a row that ended is padded with it)."""
    return new[: next((i for i, t in enumerate(new) if t in eos), len(new))]


def continue_prompts(
    gpt: GPT, prompts: list[list[int]], batch_size: int, max_new_tokens: int, decode: dict, progress=iter
) -> list[list[int]]:
    """Each prompt's new tokens, up to its first end-of-text token: `batch_size` prompts at a time,
    the shortest together (`by_length`), padded on the left (`left_padded`). A batch adds at most
    what the context its longest prompt leaves; a prompt that would have more room alone, cut by
    that before it ended, is decoded again alone (under beam search, any such prompt: the beam that
    wins depends on the length limit even where it ends early). `decode`: `GPT.generate`'s options."""
    device, new = next(gpt.parameters()).device, [[] for _ in prompts]
    eos, context = decode.get("eos_token_id") or [], gpt.config.n_positions
    for batch in progress(by_length(prompts, batch_size)):
        ids, mask = left_padded([prompts[i] for i in batch])
        width = ids.shape[1]
        room = min(max_new_tokens, context - width)  # what the longest prompt leaves
        out = gpt.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=room, **decode)
        for row, i in enumerate(batch):
            new[i] = until_eos(out[row, width:].tolist(), eos)
            alone = min(max_new_tokens, context - len(prompts[i]))
            beams = decode.get("num_beams", 1) > 1
            if room < alone and (beams or len(new[i]) == room):  # cut by the batch's room: decoded alone
                one = gpt.generate(torch.tensor([prompts[i]], device=device), max_new_tokens=alone, **decode)
                new[i] = until_eos(one[0, len(prompts[i]) :].tolist(), eos)
    return new


def by_length(prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """The prompts' indices in batches of `batch_size`, the shortest first: the least padding."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def left_padded(prompts: list[list[int]]) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask) of `prompts` padded on the left to the longest (padding id 0)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p, dtype=torch.long), 1
    return ids, mask
