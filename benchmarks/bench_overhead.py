"""Lightning's overhead: `gpt-ft fit` vs a hand-written PyTorch loop doing the same training steps.

Both train the same model (same preset, seed and weights) on the same blocks of a `gpt-ft prepare`
folder (or random tokens) in the same order, with the same AdamW groups and schedule; the loop
calls the module's own loss, so only the machinery around it differs. `gpt-ft fit` runs in this
process with its defaults (CSV logger, throughput callback, checkpointing at the end) and no
validation; a callback times its steps. Rounds run both, the one going first alternating between
rounds; the figure is the median time per step after the warm-up steps, beside what `fit` logged
as perf/tokens_per_s and perf/mfu. --json writes the figures for benchmarks/gpu_figures.py.

    python benchmarks/bench_overhead.py --tokens runs/shakespeare --preset gpt-mini --block 256 --batch 8
    python benchmarks/bench_overhead.py --preset gpt1 --block 512 --batch 16 \\
        --device cuda --precision bf16-mixed --compile
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from harness import device, last_value, metrics_rows, random_tokens, synchronize
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import Callback
from paths import existing

from gpt_ft.cli import main as gpt_ft_main
from gpt_ft.data.lm_data import LMDataModule
from gpt_ft.training.module import GPTModule
from gpt_ft.training.optim import adamw, fused_adamw, lr_lambda


class StepTimer(Callback):
    """Writes the seconds per optimizer step after `warmup` steps to the file `out`."""

    def __init__(self, out: str, warmup: int = 5) -> None:
        self.out, self.warmup, self.start, self.first = out, warmup, None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            synchronize(pl_module.device.type)
            self.start, self.first = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        synchronize(pl_module.device.type)
        seconds = (time.perf_counter() - self.start) / (trainer.global_step - self.first)
        Path(self.out).write_text(json.dumps(seconds))


@dataclass
class PretrainSteps:
    """The steps both `gpt-ft fit` and the raw loop take: a model on a `gpt-ft prepare` folder."""

    tokens: str
    preset: str
    overrides: dict
    block: int
    batch: int
    lr: float
    warmup: int  # untimed steps first
    steps: int  # timed steps
    device: str = "cpu"
    precision: str = "32-true"
    compile: bool = False
    log_every: int = 50

    def raw_loop(self) -> float:
        """Seconds per step of a plain PyTorch loop over the same data, model and optimizer."""
        torch.manual_seed(0)
        data = LMDataModule(self.tokens, block_size=self.block, batch_size=self.batch)
        model = GPTModule(
            preset=self.preset,
            overrides=self.overrides,
            vocab_size=data.vocab_size,
            lr=self.lr,
            compile=self.compile,
        )
        model.to(self.device).train()
        model.configure_model()  # compiles the GPT when asked, as the Trainer would
        optimizer = adamw(
            model.parameters(),
            lr=self.lr,
            weight_decay=0.01,
            betas=(0.9, 0.999),
            eps=1e-8,
            fused=fused_adamw(torch.device(self.device)),  # fit's own choice: fused on a CPU too
        )
        total = self.warmup + self.steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", 1, total))
        loader = data.train_dataloader()
        loader.pin_memory = self.device == "cuda"  # as fit's loader on a GPU (no trainer here to ask)
        loader.sampler.set_epoch(0)
        start = None
        for step, batch in enumerate(loader):
            if step == self.warmup:
                synchronize(self.device)
                start = time.perf_counter()
            if step == total:
                break
            batch = move_data_to_device(batch, self.device)
            with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed"):
                loss, _ = model.losses(batch)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        synchronize(self.device)
        return (time.perf_counter() - start) / self.steps

    def fit(self, out: Path) -> float:
        """Seconds per step of `gpt-ft fit` (in this process) with its defaults: CSV logger, the
        throughput callback, a checkpoint at the end, no validation. Logs go to `out`."""
        overrides = "{" + ", ".join(f"{k}: {v}" for k, v in self.overrides.items()) + "}"
        out.mkdir(parents=True, exist_ok=True)
        timing = out / "seconds_per_step.json"
        gpt_ft_main(
            [
                "fit",
                "--data.class_path=gpt_ft.data.lm_data.LMDataModule",
                f"--data.token_dir={self.tokens}",
                f"--data.block_size={self.block}",
                f"--data.batch_size={self.batch}",
                "--seed_everything=0",
                f"--model.preset={self.preset}",
                f"--model.overrides={overrides}",
                f"--model.lr={self.lr}",
                "--model.schedule=cosine",
                "--model.warmup_steps=1",
                f"--trainer.max_steps={self.warmup + self.steps}",
                "--trainer.limit_val_batches=0",
                "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false",
                f"--trainer.accelerator={'gpu' if self.device == 'cuda' else 'cpu'}",
                "--trainer.devices=1",
                f"--trainer.precision={self.precision}",
                f"--model.compile={str(self.compile).lower()}",
                f"--trainer.logger.init_args.save_dir={out}",
                f"--trainer.log_every_n_steps={self.log_every}",
                "--trainer.callbacks+=gpt_ft.training.throughput.Throughput",
                f"--trainer.callbacks.every_n_steps={self.log_every}",
                "--trainer.callbacks+=bench_overhead.StepTimer",
                f"--trainer.callbacks.out={timing}",
                f"--trainer.callbacks.warmup={self.warmup}",
            ]
        )
        return json.loads(timing.read_text())

    def rounds(self, rounds: int, out: Path) -> tuple[list[float], list[float]]:
        """Seconds per step of the loop and of `fit`, each once a round, who goes first alternating
        so that warm caches and allocator state favour neither."""
        loop, fit = [], []
        for r in range(rounds):
            runs = [lambda: loop.append(self.raw_loop()), lambda: fit.append(self.fit(out / f"fit{r}"))]
            for run in runs if r % 2 == 0 else runs[::-1]:
                run()
        return loop, fit


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=existing, default=None, help="a `gpt-ft prepare` output folder (default: random)"
    )
    parser.add_argument("--vocab-size", type=int, default=8192, help="of the random tokens")
    parser.add_argument("--preset", default="gpt-mini")
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], type=device)
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--compile", action="store_true", help="torch.compile the GPT in both")
    parser.add_argument("--log-every", type=int, default=50, help="steps between `fit`'s perf/* logs")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    print(f"{args.preset}, batch {args.batch} x {args.block} tokens, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        train = (args.warmup + args.steps + 20) * args.batch * args.block + 1
        random = args.tokens is None
        tokens = (
            random_tokens(Path(tmp) / "tokens", args.vocab_size, train, 4 * args.block + 1)
            if random
            else args.tokens
        )
        steps = PretrainSteps(
            tokens=str(tokens),
            preset=args.preset,
            overrides={"n_positions": args.block, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "resid_pdrop": 0.1},
            block=args.block,
            batch=args.batch,
            lr=args.lr,
            warmup=args.warmup,
            steps=args.steps,
            device=args.device,
            precision=args.precision,
            compile=args.compile,
            log_every=args.log_every,
        )
        loop_times, fit_times = steps.rounds(args.rounds, Path(tmp))
        logged = metrics_rows(Path(tmp) / "fit0")
    print(f"{'round':>5} {'loop s/step':>12} {'fit s/step':>11} {'fit/loop':>9}")
    for r, (loop, fit) in enumerate(zip(loop_times, fit_times)):
        print(f"{r:>5} {loop:>12.4f} {fit:>11.4f} {fit / loop:>9.3f}")
    loop, fit = statistics.median(loop_times), statistics.median(fit_times)
    overhead = 100 * (fit / loop - 1)
    print(f"median s/step: loop {loop:.4f}, gpt-ft fit {fit:.4f}; fit is {overhead:+.1f}% vs the loop")
    tps, mfu = last_value(logged, "perf/tokens_per_s"), last_value(logged, "perf/mfu")
    print(f"logged by fit: perf/tokens_per_s {tps}, perf/mfu {mfu}")
    if args.json:
        figures = {"loop_s": loop, "fit_s": fit, "tokens_per_step": args.batch * args.block,
                   "perf/tokens_per_s": tps, "perf/mfu": mfu}  # fmt: skip
        args.json.write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
