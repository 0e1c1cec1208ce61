"""The GPU checklist's fine-tuning rows (benchmarks/gpu_figures.py): one step of the head and the
auxiliary LM loss on SST-2-like sentences, padded and packed, at GPT-1's batch and one sized for a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from harness import Row, timed
from lightning.fabric.utilities.apply_func import move_data_to_device

from gpt_ft.adapters import SingleText
from gpt_ft.data.batches import collate, collate_packed
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.training.module import GPTModule
from gpt_ft.training.optim import adamw

if TYPE_CHECKING:
    from gpu_figures import Setup


def finetune_step(setup: Setup, tmp: Path) -> Iterator[Row]:
    task = SingleText(name="sentiment", labels=["negative", "positive"])
    torch.manual_seed(0)
    c = setup.config
    shape = {"n_positions": c.n_positions, "n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head}
    module = GPTModule(overrides=shape, vocab_size=c.vocab_size, task=task, lm_coef=0.5).to(setup.device)
    hyper = dict(lr=1e-5, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    optimizer = adamw(module.parameters(), **hyper, fused=setup.cuda)
    v = c.vocab_size - 4  # start, delim, extract, pad: the vocabulary's last 4 ids
    specials = SpecialTokenIds(start=v, delim=v + 1, extract=v + 2, pad=v + 3, eos=None)
    sizes = [32, 256] if setup.cuda else [8]  # GPT-1's batch, and one sized for a GPU (~4k real tokens)
    g, examples = torch.Generator().manual_seed(0), []
    for i in range(max(sizes)):  # SST-2-like lengths: most short, a few long
        n = min(setup.seq - 2, int(np.random.default_rng(i).lognormal(np.log(setup.seq / 8), 0.6)))
        text = torch.randint(0, v, (max(1, n),), generator=g).tolist()
        enc = task.encode({"label": i % 2}, [text], specials, max_length=setup.seq)
        examples.append(
            {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": enc.label, "index": i}
        )
    kernel = "variable-length kernel" if setup.cuda else "dense mask"
    for B in sizes:
        rates = {}
        for name, collated in (("padded", collate), ("packed", collate_packed)):
            batch = move_data_to_device(collated(examples[:B], specials.pad), setup.device)

            def step(batch=batch) -> None:
                with setup.amp():
                    loss, _ = module.losses(batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            stats = timed(step, repeat=5)
            rates[name] = batch.real_tokens / stats.median
            padding = 1 - batch.real_tokens / batch.input_ids.numel()
            shape = tuple(batch.input_ids.shape)
            figure = f"{stats.rate(batch.real_tokens)} real tokens/s; padding {padding:.0%} of {shape}"
            yield Row(f"fine-tuning step (head + λ=0.5 LM loss), batch {B}, {name}", figure)
        ratio = f"{rates['packed'] / rates['padded']:.2f}x"
        yield Row(f"fine-tuning step, batch {B}, packed ({kernel}) / padded", ratio)


if __name__ == "__main__":  # a group of gpu_figures.py's rows, run there
    raise SystemExit(
        f"{__file__} holds rows of gpu_figures.py; run them with: "
        "python benchmarks/gpu_figures.py --only finetune_step"
    )
