"""The SDPA kernel each batch kind runs, and shared-context multiple choice vs the plain layout.

Batch kinds: pretraining blocks, right-padded fine-tuning batches, shared contexts of one
length and padded ones, cached decoding; for each, the kernel of a training step (forward and
backward) and its time, and the kernel of evaluation. Then a fine-tuning step on Story-Cloze-like
examples (contexts of about half the context, 4 endings of 8-24 tokens) in the plain layout (one
whole sequence per choice) and with each context computed once. On a GPU: the preset in
bf16-mixed; on a CPU a small model in fp32 (--bf16 for bf16-mixed). benchmarks/gpu_figures.py
runs this script and takes its rows from the JSON beside the report.

    python benchmarks/bench_attention.py
    python benchmarks/bench_attention.py --device cpu
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from harness import Report, Row, interleaved, report_argument, timed
from lightning.fabric.utilities.apply_func import move_data_to_device

from gpt_ft import GPTConfig
from gpt_ft.adapters import MultipleChoice
from gpt_ft.data.batches import collate, collate_blocks, collate_shared
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.training.module import GPTModule
from gpt_ft.training.terms import batch_terms


class Setup:
    """The model, context and precision of the rows; the vocabulary's last 4 ids are the specials."""

    def __init__(
        self, device: str, config: GPTConfig, seq: int, autocast: torch.dtype | None, preset: str = "gpt1"
    ) -> None:
        self.device, self.config, self.seq, self.autocast, self.preset = device, config, seq, autocast, preset
        v = config.vocab_size - 4
        self.specials = SpecialTokenIds(start=v, delim=v + 1, extract=v + 2, pad=v + 3, eos=None)

    def amp(self):
        return torch.autocast(self.device, dtype=self.autocast or torch.float32, enabled=bool(self.autocast))

    def module(self, task) -> GPTModule:
        torch.manual_seed(0)
        c = self.config  # the preset's model (its family, not only its shape), at this context
        overrides = {"n_positions": c.n_positions}
        module = GPTModule(
            preset=self.preset, overrides=overrides, vocab_size=c.vocab_size, task=task, lm_coef=0.5
        )
        return module.to(self.device)

    def choice_rows(self, n: int, one_length: bool, seed: int = 0) -> tuple[list[dict], MultipleChoice]:
        """Story-Cloze-like examples: contexts of about seq/2 tokens, 4 endings of 8-24 tokens."""
        task = MultipleChoice(name="mc", context=["story"], choices="endings", num_choices=4)
        g, vocab, rows = torch.Generator().manual_seed(seed), self.config.vocab_size - 4, []

        def tokens(n: int) -> list[int]:
            return torch.randint(0, vocab, (n,), generator=g).tolist()

        for i in range(n):
            half = self.seq // 2
            context = tokens(half if one_length else int(torch.randint(half // 2, half, (), generator=g)))
            endings = [tokens(int(torch.randint(8, 25, (), generator=g))) for _ in range(4)]
            enc = task.encode({"label": i % 4}, [context, *endings], self.specials, max_length=self.seq)
            rows.append(
                {
                    "input_ids": enc.sequences,
                    "extract_index": enc.extract_index,
                    "label": enc.label,
                    "index": i,
                }
            )
        return rows, task

    def step(self, module: GPTModule, batch, head=None, train: bool = True):
        """A training step's forward and backward (no optimizer), or an evaluation's forward."""

        def run() -> None:
            with torch.set_grad_enabled(train), self.amp():
                if head is False:  # the module's own losses
                    loss, _ = module.losses(batch)
                else:
                    terms = batch_terms(module.gpt, head, batch, lm=True)
                    loss = terms["lm_sum"].sum() + (terms["logits"].float().sum() if "logits" in terms else 0)
            if train:
                loss.backward()
                module.zero_grad(set_to_none=True)

        return run


KERNELS = {  # aten op -> kernel, most specific first
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_flash_attention": "flash",
    "_flash_attention_forward": "flash",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_efficient_attention_forward": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_attention_math": "math",
}


def kernels_of(fn: Callable[[], object]) -> str:
    """The SDPA kernels one call of `fn` runs, as the profiler sees their aten ops."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    found = []
    for event in prof.events():
        for op, kernel in KERNELS.items():
            if event.name == f"aten::{op}" and kernel not in found:
                found.append(kernel)
                break
    return " + ".join(found) or "none (blocked attention: the CPU's path in bf16 or with dropout)"


def attention_kernels(setup: Setup) -> list[Row]:
    B, pad, delim = (8 if setup.device == "cuda" else 2), setup.specials.pad, setup.specials.delim
    one_length, task = setup.choice_rows(B, one_length=True)
    varied, _ = setup.choice_rows(B, one_length=False, seed=1)
    module = setup.module(task).train()
    vocab = setup.config.vocab_size - 4
    blocks = collate_blocks([(i, torch.randint(0, vocab, (setup.seq + 1,))) for i in range(B)])
    kinds = {
        "pretraining blocks": (blocks, None),
        "right-padded fine-tuning batch": (collate(varied, pad), module.head),
        "shared contexts of one length": (collate_shared(one_length, pad, delim), module.head),
        "shared contexts, padded (masked)": (collate_shared(varied, pad, delim), module.head),
    }
    rows = []
    for kind, (batch, head) in kinds.items():
        batch = move_data_to_device(batch, setup.device)
        step = setup.step(module, batch, head)
        train, seconds = kernels_of(step), timed(step).median
        module.eval()
        evaluation = kernels_of(setup.step(module, batch, head, train=False))
        module.train()
        result = f"training: {train}, fwd+bwd {seconds * 1e3:.1f} ms; evaluation: {evaluation}"
        rows.append(Row(f"attention, {kind}", result))
    gpt = module.gpt.eval()
    cache = gpt.new_kv_cache(B, setup.seq)
    ids = torch.randint(0, vocab, (B, setup.seq // 2), device=setup.device)
    with torch.no_grad(), setup.amp():
        gpt(ids, kv_cache=cache)  # the cache holds half the context; each timed call adds one token
        kernel = kernels_of(
            lambda: (gpt(ids[:, :1], kv_cache=cache), setattr(cache, "length", cache.length - 1))
        )
    rows.append(Row("attention, cached decoding (1 token over the cache)", kernel))
    return rows


def shared_context(setup: Setup, runs: int) -> list[Row]:
    B, sp = (16 if setup.device == "cuda" else 4), setup.specials
    examples, task = setup.choice_rows(B, one_length=False, seed=2)
    module = setup.module(task).train()
    layouts = {
        "plain": move_data_to_device(collate(examples, sp.pad), setup.device),
        "shared": move_data_to_device(collate_shared(examples, sp.pad, sp.delim), setup.device),
    }
    t = interleaved(
        {name: setup.step(module, batch, head=False) for name, batch in layouts.items()}, runs=runs
    )
    plain, shared = t["plain"].median, t["shared"].median
    return [
        Row(
            f"shared-context multiple choice, {B} examples x 4 endings, fwd+bwd",
            f"plain {plain * 1e3:.1f} ms, shared {shared * 1e3:.1f} ms: {plain / shared:.2f}x",
        )
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--preset", default=None, help="the model (default: gpt1; on the CPU gpt-mini)")
    p.add_argument("--seq", type=int, default=None, help="context (default: the preset's; CPU 128)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs of the shared-context step")
    p.add_argument("--bf16", action="store_true", help="bf16-mixed on the CPU too (always on a GPU)")
    report_argument(p, "bench_attention")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device here: run on a GPU, or pass --device cpu")
    if args.device == "cuda":
        preset = args.preset or "gpt1"
        config = GPTConfig.from_name(preset, **({"n_positions": args.seq} if args.seq else {}))
        torch.backends.cuda.matmul.allow_tf32 = True
    else:  # a small shape, so that the CPU rows take seconds
        preset = args.preset or "gpt-mini"
        config = GPTConfig.from_name(preset, vocab_size=8192, n_positions=args.seq or 128)
    bf16 = args.device == "cuda" or args.bf16
    setup = Setup(args.device, config, config.n_positions, torch.bfloat16 if bf16 else None, preset)
    report = Report("Attention kernels and shared contexts")
    for row in attention_kernels(setup) + shared_context(setup, args.runs):
        report.add(row)
    report.write(args.report)
    print(report.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
