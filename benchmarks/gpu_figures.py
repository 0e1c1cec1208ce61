"""The GPU figures, as a Markdown report (JSON beside it): the environment and the dense bf16 peak
MFU is measured against; the SDPA kernel per batch kind and shared contexts (bench_attention.py);
training tokens/s and MFU of the preset (gpt1 at context 512) in bf16-mixed, eager and compiled, at
two batch sizes, beside transformers' OpenAIGPTLMHeadModel on the same step (median of interleaved
runs, their range in brackets); where that step's time goes, and its speed on SmolLM2-135M's and
Qwen3-0.6B's shapes (gpu_profile.py); a fine-tuning step (head + auxiliary LM loss) on padded batches;
`gpt-ft fit` on the quickstart, and vs a raw loop (bench_overhead.py); cached vs uncached decoding.

On a GPU the speed goals are checked (exit 1 when one is missed): MFU >= 40% with the model and its
loss compiled as one graph (the model compiled alone is shown beside it), >= 2.5x
transformers' step (both eager), `fit` within 3% of the raw loop; correctness is the CUDA tests'
(gpu_check.py runs both). `--device cpu --quick` runs every row on a tiny model in a few minutes.

    python benchmarks/gpu_figures.py
    python benchmarks/gpu_figures.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import harness
import torch
from gpu_decoding import DECODE_GOAL, generation
from gpu_finetune import finetune_step
from gpu_profile import profile, shapes
from harness import Report, Row, gpt_ft, interleaved, last_value, lm_step, metrics_rows

from gpt_ft import GPT, GPTConfig
from gpt_ft.training.throughput import counted_parameters, dense_peak_tflops, flops_per_token

GOALS = {"mfu": 0.40, "vs_transformers": 2.5, "fit_overhead": 0.03, "decode_tokens_per_s": DECODE_GOAL}
ONE_GRAPH = "ours, compiled with its loss"
"""The training step whose MFU the goal is: the model, its LM head and cross-entropy as one graph."""


@dataclass
class Setup:
    """What the rows run on: the preset's shape on a GPU, a small one on a CPU."""

    device: str
    preset: str
    config: GPTConfig
    seq: int
    batches: list[int]
    runs: int
    compile: bool
    pretrain_steps: int
    gen_tokens: int
    autocast: torch.dtype | None
    peak_tflops: float | None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def amp(self):
        return torch.autocast(self.device, dtype=self.autocast or torch.float32, enabled=bool(self.autocast))

    def script(self, name: str, *args: str) -> None:
        """benchmarks/NAME's `main` in this process (a process of its own would spend seconds
        importing what we have), its output on our stderr (the report is our stdout)."""
        argv, sys.argv = sys.argv, [name, f"--device={self.device}", *args]
        try:
            with contextlib.redirect_stdout(sys.stderr):
                importlib.import_module(name.removesuffix(".py")).main()
        finally:
            sys.argv = argv


def make_setup(args) -> Setup:
    cuda = args.device == "cuda"
    if cuda:
        config = GPTConfig.from_name(preset := args.preset or "gpt1")
        seq, batches = args.seq or config.n_positions, args.batch or ([16] if args.quick else [8, 16])
    else:  # a small shape, so that the CPU rows take seconds (--quick: a tiny one, to check they run)
        preset = args.preset or ("gpt-micro" if args.quick else "gpt-mini")
        config = GPTConfig.from_name(preset, vocab_size=8192, n_positions=max(128, args.seq or 128))
        seq, batches = args.seq or 128, args.batch or [4]
    return Setup(
        device=args.device,
        preset=preset,
        config=config,
        seq=seq,
        batches=batches,
        runs=args.runs or (2 if args.quick else 3),
        compile=cuda and not args.no_compile,
        pretrain_steps=args.pretrain_steps or ([120, 30] if cuda else [30, 10])[args.quick],
        gen_tokens=64 if args.quick else 256,
        autocast=torch.bfloat16 if cuda or args.bf16 else None,
        peak_tflops=args.peak_tflops or (dense_peak_tflops(torch.cuda.get_device_name()) if cuda else None),
    )


def environment(setup: Setup, tmp: Path) -> Iterator[Row]:
    import lightning
    import transformers

    where = (
        torch.cuda.get_device_name() if setup.cuda else f"CPU ({platform.processor() or platform.machine()})"
    )
    versions = f"torch {torch.__version__}, CUDA {torch.version.cuda}, lightning {lightning.__version__}"
    threads = f"transformers {transformers.__version__}, {torch.get_num_threads()} threads"
    yield Row("environment", f"{where}; {versions}, {threads}")
    c = setup.config
    shape = f"{c.n_layer} layers x {c.n_embd} wide, {c.n_head} heads, vocab {c.vocab_size}"
    yield Row("model", f"{shape}, context {setup.seq}; {'bf16-mixed' if setup.autocast else 'fp32'}")
    if setup.cuda:
        unknown = "unknown for this GPU, so the MFU goal is not checked: pass --peak-tflops"  # not a pass
        peak = f"{setup.peak_tflops:.0f} TFLOP/s" if setup.peak_tflops else unknown
        yield Row("dense bf16 peak (MFU's denominator)", peak, "" if setup.peak_tflops else "FAIL")


def attention(setup: Setup, tmp: Path) -> Iterator[Row]:
    """benchmarks/bench_attention.py's rows: the kernel per batch kind, shared contexts."""
    report = tmp / "attention.md"
    bf16 = ["--bf16"] if setup.autocast else []
    setup.script(
        "bench_attention.py", f"--preset={setup.preset}", f"--seq={setup.seq}", f"--report={report}", *bf16
    )
    yield from Report.read(report.with_suffix(".json")).rows


def training_throughput(setup: Setup, tmp: Path) -> Iterator[Row]:
    torch.manual_seed(0)
    ours = GPT(copy.deepcopy(setup.config)).to(setup.device).train()
    models = {"ours": ours, "transformers": ours.to_hf().to(setup.device).train()}
    losses = {}
    if setup.compile:
        models["ours, compiled"] = copy.deepcopy(ours)
        models["ours, compiled"].compile(dynamic=False)  # one static graph per batch size
        # the head's matmul and the cross-entropy in the same graph as the blocks
        models[ONE_GRAPH] = copy.deepcopy(ours)
        losses[ONE_GRAPH] = torch.compile(harness.logits_loss(hf=False), dynamic=False)
    fpt = flops_per_token(setup.config, counted_parameters(ours), setup.seq)
    for batch in setup.batches:
        ids = torch.randint(0, setup.config.vocab_size, (batch, setup.seq + 1), device=setup.device)
        steps = {}
        for name, m in models.items():
            optimizer = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=setup.cuda)
            hf = name == "transformers"
            steps[name] = lm_step(m, optimizer, ids, setup.autocast, hf=hf, loss_fn=losses.get(name))
        number, warmup = (2 if setup.cuda else 1), (3 if setup.compile else 1)  # compiling is in the warm-up
        stats = interleaved(steps, runs=setup.runs, number=number, warmup=warmup)
        tokens = batch * setup.seq
        for name, s in stats.items():
            figure, status = f"{s.rate(tokens)} tokens/s", ""
            if setup.peak_tflops:
                mfu = tokens / s.median * fpt / (setup.peak_tflops * 1e12)
                figure += f", MFU {mfu:.1%}"
                status = harness.verdict(mfu >= GOALS["mfu"]) if name == ONE_GRAPH else ""
            yield Row(f"training step, {name}, batch {batch} x {setup.seq}", figure, status)
        ratio = stats["transformers"].median / stats["ours"].median  # like for like: both eager, the goal's
        status = harness.verdict(ratio >= GOALS["vs_transformers"]) if setup.cuda else ""
        yield Row(f"training step, ours / transformers, both eager, batch {batch}", f"{ratio:.2f}x", status)
        if setup.cuda and setup.peak_tflops and not setup.compile:  # the goal is the compiled step's
            yield Row(f"training step, {ONE_GRAPH}, batch {batch}", "not measured (--no-compile)", "FAIL")
        if compiled := [s.median for n, s in stats.items() if n.startswith("ours, compiled")]:  # beside it
            yield Row(f"training step, ours compiled / transformers eager, batch {batch}",
                      f"{stats['transformers'].median / min(compiled):.2f}x")  # fmt: skip


def fit_quickstart(setup: Setup, tmp: Path) -> Iterator[Row]:
    args = ["fit", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp / 'quickstart'}"]
    if setup.cuda:
        args += ["--config", "configs/trainer/gpu.yaml"]
    else:
        args += ["--trainer.max_epochs=1", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2"]
    run = gpt_ft(*args, "--trainer.enable_progress_bar=false", log=tmp / "quickstart.log", echo=False)
    accuracy = last_value(metrics_rows(tmp / "quickstart"), "validation/accuracy")
    how = "through configs/trainer/gpu.yaml" if setup.cuda else "6 steps on the CPU"
    yield Row(f"`gpt-ft fit` quickstart, {how}", f"{run.seconds:.0f} s, validation accuracy {accuracy:.3f}")


def fit_vs_loop(setup: Setup, tmp: Path) -> Iterator[Row]:
    """benchmarks/bench_overhead.py's figures, with what `fit` logged."""
    batch, steps, figures = max(setup.batches), setup.pretrain_steps, tmp / "overhead.json"
    rounds = 2 if setup.cuda and not setup.compile else 1  # compiling twice more would cost minutes
    setup.script(
        "bench_overhead.py", f"--preset={setup.preset}", f"--vocab-size={setup.config.vocab_size}",
        f"--block={setup.seq}", f"--batch={batch}", "--lr=1e-4", f"--steps={steps}", f"--rounds={rounds}",
        f"--warmup={min(10, max(3, steps // 3))}",  # untimed steps
        f"--precision={'bf16-mixed' if setup.autocast else '32-true'}", f"--log-every={max(1, steps // 2)}",
        f"--json={figures}", *(["--compile"] if setup.compile else []),
    )  # fmt: skip
    f = json.loads(figures.read_text())
    tokens, overhead = f["tokens_per_step"], f["fit_s"] / f["loop_s"] - 1
    yield Row(
        f"`gpt-ft fit` vs raw loop, {steps} pretraining steps of {batch} x {setup.seq}",
        f"fit {tokens / f['fit_s']:,.0f} tokens/s, loop {tokens / f['loop_s']:,.0f}: fit {overhead:+.1%}",
        harness.verdict(overhead <= GOALS["fit_overhead"]) if setup.cuda else "",
    )
    tps, mfu = f["perf/tokens_per_s"], f["perf/mfu"]
    logged = f"perf/tokens_per_s {tps:,.0f}" if tps else "no perf/tokens_per_s logged"
    if setup.cuda:
        logged += f", perf/mfu {mfu:.1%}" if mfu else ", no perf/mfu logged"
    yield Row("`gpt-ft fit` logged throughput", logged)


ROWS = [environment, training_throughput, fit_vs_loop, generation, finetune_step, profile, shapes, attention,
        fit_quickstart]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="fewer runs and steps")
    p.add_argument("--preset", help="the model (default gpt1; on the CPU gpt-mini, --quick gpt-micro)")
    p.add_argument("--seq", type=int, default=None, help="context of the speed rows (default: the preset's)")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="batch sizes (GPU default: 8 16)")
    p.add_argument("--runs", type=int, default=None, help="interleaved timing runs (default 3; quick 2)")
    p.add_argument("--pretrain-steps", type=int, default=None, help="timed steps of fit vs the loop")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled rows")
    p.add_argument("--bf16", action="store_true", help="bf16-mixed on the CPU too (always on a GPU)")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU")
    p.add_argument("--only", nargs="+", choices=[r.__name__ for r in ROWS], help="run only these rows")
    harness.report_argument(p, "gpu_figures")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device here: run on a GPU, or pass --device cpu --quick")
    torch.backends.cuda.matmul.allow_tf32 = args.device == "cuda"  # TF32 matmuls on a GPU
    setup, start = make_setup(args), time.perf_counter()
    report = Report("gpt_ft GPU figures")
    with tempfile.TemporaryDirectory() as tmp:
        for rows in [r for r in ROWS if not args.only or r.__name__ in args.only]:
            print(f"[{time.perf_counter() - start:5.0f} s] {rows.__name__} ...", file=sys.stderr, flush=True)
            try:
                for row in rows(setup, Path(tmp)):
                    report.add(row)
                    report.write(args.report)  # a part killed later keeps the rows it finished
            except (Exception, SystemExit) as error:  # one broken row must not hide the others
                traceback.print_exc()
                message = f"error: {type(error).__name__}: {error}".replace("|", "/")
                report.add(Row(rows.__name__, message, "FAIL"))
            if setup.cuda:
                torch.cuda.empty_cache()
    minutes = (time.perf_counter() - start) / 60
    report.note = f"{time.strftime('%Y-%m-%d %H:%M')}, device {setup.device}, {minutes:.1f} minutes."
    report.write(args.report)
    print(report.markdown())
    print(f"report written to {args.report}", file=sys.stderr)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
