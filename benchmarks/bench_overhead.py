"""Lightning's overhead: `gpt-ft fit` vs a hand-written PyTorch loop doing the same training steps.

Both train the same model (same preset, seed and weights) on the same blocks of a `gpt-ft prepare`
folder in the same order, with the same AdamW groups and schedule; the loop calls the module's
own loss, so only the machinery around it differs. `gpt-ft fit` runs in this process with its
defaults (CSV logger, throughput callback, checkpointing at the end) and no validation; a
callback times its steps. Rounds run both, the one going first alternating between rounds; the
figure is the median time per step after the warm-up steps.

    python benchmarks/bench_overhead.py --tokens runs/shakespeare --preset gpt-mini --block 256 --batch 8
    python benchmarks/bench_overhead.py --tokens DIR --preset gpt1 --block 512 --batch 16 \
        --device cuda --precision bf16-mixed --compile
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import Callback

from gpt_ft.cli import main as gpt_ft
from gpt_ft.data.lm_data import LMDataModule
from gpt_ft.training.module import GPTModule
from gpt_ft.training.optim import adamw, lr_lambda

ROOT = Path(__file__).resolve().parents[1]
TIMES: list[float] = []  # seconds per step of the last timed `gpt-ft fit`


class StepTimer(Callback):
    """Times the optimizer steps after `warmup` of them (the module attribute TIMES gets the result)."""

    def __init__(self, warmup: int = 5) -> None:
        self.warmup, self.start = warmup, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            synchronize(pl_module.device.type)
            self.start, self.first = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        synchronize(pl_module.device.type)
        TIMES.append((time.perf_counter() - self.start) / (trainer.global_step - self.first))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def raw_loop(args, overrides: dict) -> float:
    """Seconds per step of a plain PyTorch loop over the same data, model and optimizer."""
    torch.manual_seed(0)
    data = LMDataModule(args.tokens, block_size=args.block, batch_size=args.batch)
    model = GPTModule(
        preset=args.preset, overrides=overrides, vocab_size=data.vocab_size, lr=args.lr, compile=args.compile
    )
    model.to(args.device).train()
    model.configure_model()  # compiles the GPT when asked, as the Trainer would
    optimizer = adamw(
        model.parameters(),
        lr=args.lr,
        weight_decay=0.01,
        betas=(0.9, 0.999),
        eps=1e-8,
        fused=args.device == "cuda",
    )
    total = args.warmup + args.steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", 1, total))
    loader = data.train_dataloader()
    loader.sampler.set_epoch(0)
    bf16 = args.precision == "bf16-mixed"
    start = None
    for step, batch in enumerate(loader):
        if step == args.warmup:
            synchronize(args.device)
            start = time.perf_counter()
        if step == total:
            break
        batch = move_data_to_device(batch, args.device)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = model.losses(batch)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(args.device)
    return (time.perf_counter() - start) / args.steps


def lightning_fit(args, overrides: str, out: Path) -> float:
    gpt_ft(
        [
            "fit",
            "--data.class_path=gpt_ft.data.lm_data.LMDataModule",
            f"--data.token_dir={args.tokens}",
            f"--data.block_size={args.block}",
            f"--data.batch_size={args.batch}",
            "--seed_everything=0",
            f"--model.preset={args.preset}",
            f"--model.overrides={overrides}",
            f"--model.lr={args.lr}",
            "--model.schedule=cosine",
            "--model.warmup_steps=1",
            f"--trainer.max_steps={args.warmup + args.steps}",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
            "--trainer.devices=1",
            f"--trainer.precision={args.precision}",
            f"--model.compile={str(bool(args.compile)).lower()}",
            f"--trainer.logger.init_args.save_dir={out}",
            f"--trainer.log_every_n_steps={getattr(args, 'log_every', 50)}",
            "--trainer.callbacks+=gpt_ft.training.throughput.Throughput",
            f"--trainer.callbacks.every_n_steps={getattr(args, 'log_every', 50)}",
            "--trainer.callbacks+=bench_overhead.StepTimer",
            f"--trainer.callbacks.warmup={args.warmup}",
        ]
    )
    import bench_overhead  # the module the CLI imported the callback from

    return bench_overhead.TIMES[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", required=True, help="a `gpt-ft prepare` output folder")
    parser.add_argument("--preset", default="gpt-mini")
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--compile", action="store_true", help="torch.compile the GPT in both")
    args = parser.parse_args()
    overrides = {"n_positions": args.block, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "resid_pdrop": 0.1}
    overrides_text = "{" + ", ".join(f"{k}: {v}" for k, v in overrides.items()) + "}"
    print(f"{args.preset}, batch {args.batch} x {args.block} tokens, {torch.get_num_threads()} threads")
    print(f"{'round':>5} {'loop s/step':>12} {'fit s/step':>11} {'fit/loop':>9}")
    loop_times, fit_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # Alternate which goes first, so warm caches and allocator state favour neither.
            runs = [
                lambda: loop_times.append(raw_loop(args, overrides)),
                lambda: fit_times.append(lightning_fit(args, overrides_text, Path(tmp) / str(r))),
            ]
            for run in runs if r % 2 == 0 else runs[::-1]:
                run()
            loop, fit = loop_times[-1], fit_times[-1]
            print(f"{r:>5} {loop:>12.4f} {fit:>11.4f} {fit / loop:>9.3f}")
    loop, fit = statistics.median(loop_times), statistics.median(fit_times)
    overhead = 100 * (fit / loop - 1)
    print(f"median s/step: loop {loop:.4f}, gpt-ft fit {fit:.4f}; fit is {overhead:+.1f}% vs the loop")


if __name__ == "__main__":
    main()
