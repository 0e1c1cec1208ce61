"""The GPU checklist in one command: correctness, attention kernels and speed, as a Markdown report.

Rows, each with pass / FAIL, a figure, or why it was skipped:
  environment (torch, CUDA, GPU, the dense bf16 peak MFU is measured against); the test suite's
  CUDA tests; GPT vs transformers logits (fp32, <= 1e-4, GPT-1 and GPT-2 layouts) and the
  bf16-mixed loss vs fp32; the SDPA kernel each batch kind runs (pretraining blocks, right- and
  left-padded fine-tuning batches, shared contexts, cached decoding) and its step time;
  training tokens/s and MFU of the preset (gpt1 at context 512) in bf16-mixed, eager and
  compiled, at two batch sizes, and transformers' OpenAIGPTLMHeadModel on the same step; a
  fine-tuning step (classification head + auxiliary LM loss) on padded batches; `gpt-ft fit` on
  the quickstart and on pretraining steps vs a raw PyTorch loop, with perf/mfu from its logs;
  cached generation; shared-context multiple choice vs the plain layout.

On a GPU the goals are checked: MFU >= 40% compiled, >= 2.5x transformers' step, `fit` within
3% of the raw loop, pretraining and right-padded fine-tuning on the flash kernel. With
`--device cpu --quick` the same rows run on a small model in about a minute (the test suite runs
it so that the script keeps working). Exit status 1 when a row fails.

    python benchmarks/gpu_check.py                          # on a GPU (sized for one 10-minute call)
    python benchmarks/gpu_check.py --device cpu --quick     # on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from argparse import Namespace
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from bench_model import hf_logits, make_step, ours_logits
from lightning.fabric.utilities.apply_func import move_data_to_device

from gpt_ft import GPT, GPTConfig
from gpt_ft.adapters import MultipleChoice, SingleText
from gpt_ft.data.batches import collate, collate_blocks, collate_shared
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.training.module import GPTModule
from gpt_ft.training.terms import batch_terms
from gpt_ft.training.throughput import counted_parameters, dense_peak_tflops, flops_per_token

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"mfu": 0.40, "vs_transformers": 2.5, "fit_overhead": 0.03}
BF16_LOSS_TOLERANCE = 0.01  # relative difference of the bf16-mixed loss from fp32's


@dataclass
class Row:
    check: str
    result: str
    status: str = ""  # "pass", "FAIL", "skip", or "" for a figure


@dataclass
class Setup:
    """What the rows run on: the preset's shape on a GPU, a small one on a CPU."""

    device: str
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


def make_setup(args) -> Setup:
    cuda = args.device == "cuda"
    if cuda:
        config = GPTConfig.from_name(args.preset)
        seq, batches = args.seq or config.n_positions, args.batch or ([16] if args.quick else [8, 16])
    else:  # a small shape, so that the CPU rows take seconds
        config = GPTConfig.from_name("gpt-mini", vocab_size=8192, n_positions=128)
        seq, batches = args.seq or 128, args.batch or [4]
    peak = args.peak_tflops or (dense_peak_tflops(torch.cuda.get_device_name()) if cuda else None)
    return Setup(
        device=args.device,
        config=config,
        seq=seq,
        batches=batches,
        runs=args.runs or (2 if args.quick else 3),
        compile=cuda and not args.no_compile,
        pretrain_steps=args.pretrain_steps or (30 if args.quick or not cuda else 120),
        gen_tokens=64 if args.quick else 256,
        autocast=torch.bfloat16 if cuda or args.bf16 else None,
        peak_tflops=peak,
    )


def synchronize(setup: Setup) -> None:
    if setup.cuda:
        torch.cuda.synchronize()


def timed(setup: Setup, fn: Callable[[], object], repeat: int = 3) -> float:
    """Median seconds of `fn` over `repeat` calls, after one untimed call."""
    fn()
    times = []
    for _ in range(repeat):
        synchronize(setup)
        start = time.perf_counter()
        fn()
        synchronize(setup)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def exact_fp32():
    """Plain fp32 matmuls (no TF32) for the equality checks."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


# ---- rows ----


def environment(setup: Setup) -> Iterator[Row]:
    import lightning
    import transformers

    where = (
        torch.cuda.get_device_name() if setup.cuda else f"CPU ({platform.processor() or platform.machine()})"
    )
    yield Row(
        "environment",
        f"{where}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"lightning {lightning.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads",
    )
    c = setup.config
    shape = (
        f"{c.n_layer} layers x {c.n_embd} wide, {c.n_head} heads, vocab {c.vocab_size}, context {setup.seq}"
    )
    yield Row("model", f"{shape}; {'bf16-mixed' if setup.autocast else 'fp32'}")
    if setup.cuda:
        peak = f"{setup.peak_tflops:.0f} TFLOP/s" if setup.peak_tflops else "unknown: pass --peak-tflops"
        yield Row("dense bf16 peak (MFU's denominator)", peak)


def cuda_tests(setup: Setup) -> Iterator[Row]:
    if not setup.cuda:
        yield Row("CUDA tests", "need a GPU", "skip")
        return
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-k", "cuda", "-p", "no:cacheprovider", "tests"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    summary = (out.stdout.strip().splitlines() or ["no output"])[-1].strip("= ")
    if out.returncode != 0:
        print(out.stdout[-4000:], out.stderr[-2000:], file=sys.stderr)
    yield Row(
        "CUDA tests (`pytest -k cuda tests`)",
        f"{summary} ({time.perf_counter() - start:.0f} s)",
        verdict(out.returncode == 0),
    )


def logits_vs_transformers(setup: Setup) -> Iterator[Row]:
    for name, pre_ln in (("GPT-1 (OpenAIGPTLMHeadModel)", False), ("GPT-2 (GPT2LMHeadModel)", True)):
        torch.manual_seed(0)
        gpt = GPT(GPTConfig(**{**vars(setup.config), "pre_ln": pre_ln})).to(setup.device).eval()
        hf = gpt.to_hf().to(setup.device).eval()
        ids = torch.randint(0, setup.config.vocab_size, (2, setup.seq), device=setup.device)
        with torch.no_grad(), exact_fp32():
            diff = (gpt.lm_logits(gpt(ids)) - hf(ids).logits).abs().max().item()
        yield Row(
            f"logits vs transformers, {name}, fp32",
            f"max abs diff {diff:.1e} (<= 1e-4)",
            verdict(diff <= 1e-4),
        )
        if not pre_ln:
            targets = torch.roll(ids, -1, dims=1)
            with torch.no_grad():
                with exact_fp32():
                    fp32 = F.cross_entropy(gpt.lm_logits(gpt(ids)).flatten(0, 1), targets.flatten()).item()
                with torch.autocast(setup.device, dtype=torch.bfloat16):
                    bf16 = F.cross_entropy(
                        gpt.lm_logits(gpt(ids)).flatten(0, 1).float(), targets.flatten()
                    ).item()
            rel = abs(bf16 - fp32) / fp32
            yield Row(
                "bf16-mixed loss vs fp32",
                f"{bf16:.4f} vs {fp32:.4f}: {rel:.2%} (<= {BF16_LOSS_TOLERANCE:.0%})",
                verdict(rel <= BF16_LOSS_TOLERANCE),
            )
        del gpt, hf


SPECIALS_OFFSET = 4  # start, delim, extract, pad take the vocabulary's last 4 ids


def specials(setup: Setup) -> SpecialTokenIds:
    v = setup.config.vocab_size - SPECIALS_OFFSET
    return SpecialTokenIds(start=v, delim=v + 1, extract=v + 2, pad=v + 3, eos=None)


def choice_rows(setup: Setup, n: int, one_length: bool, seed: int = 0) -> tuple[list[dict], MultipleChoice]:
    """Story-Cloze-like examples: contexts of about seq/2 tokens, 4 endings of 8-24 tokens."""
    task = MultipleChoice(name="mc", context=["story"], choices="endings", num_choices=4)
    g = torch.Generator().manual_seed(seed)
    vocab = setup.config.vocab_size - SPECIALS_OFFSET
    rows = []
    for i in range(n):
        n_context = (
            setup.seq // 2
            if one_length
            else int(torch.randint(setup.seq // 4, setup.seq // 2, (), generator=g))
        )
        context = torch.randint(0, vocab, (n_context,), generator=g).tolist()
        endings = [
            torch.randint(0, vocab, (int(torch.randint(8, 25, (), generator=g)),), generator=g).tolist()
            for _ in range(4)
        ]
        enc = task.encode({"label": i % 4}, [context, *endings], specials(setup), max_length=setup.seq)
        rows.append(
            {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": enc.label, "index": i}
        )
    return rows, task


def task_module(setup: Setup, task, lm_coef: float = 0.5) -> GPTModule:
    torch.manual_seed(0)
    overrides = {
        "n_positions": setup.config.n_positions,
        "n_layer": setup.config.n_layer,
        "n_embd": setup.config.n_embd,
        "n_head": setup.config.n_head,
    }
    module = GPTModule(overrides=overrides, vocab_size=setup.config.vocab_size, task=task, lm_coef=lm_coef)
    return module.to(setup.device)


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
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    found = []
    for event in prof.events():
        for op, kernel in KERNELS.items():
            if event.name == f"aten::{op}" and kernel not in found:
                found.append(kernel)
                break
    return " + ".join(found) or "none (blocked attention: the CPU's dropout path)"


def attention_kernels(setup: Setup) -> Iterator[Row]:
    B = 8 if setup.cuda else 2
    one_length, task = choice_rows(setup, B, one_length=True)
    varied, _ = choice_rows(setup, B, one_length=False, seed=1)
    module = task_module(setup, task)
    module.train()
    pad, delim = specials(setup).pad, specials(setup).delim
    blocks = collate_blocks(
        [(i, torch.randint(0, setup.config.vocab_size - 4, (setup.seq + 1,))) for i in range(B)]
    )
    kinds = {
        "pretraining blocks": (blocks, None),
        "right-padded fine-tuning batch": (collate(varied, pad), module.head),
        "left-padded batch (rotated to right padding)": (
            collate(varied, pad, padding_side="left"),
            module.head,
        ),
        "shared contexts of one length": (collate_shared(one_length, pad, delim), module.head),
        "shared contexts, padded (masked)": (collate_shared(varied, pad, delim), module.head),
    }
    must_flash = {"pretraining blocks", "right-padded fine-tuning batch"}
    for kind, (batch, head) in kinds.items():
        batch = move_data_to_device(batch, setup.device)

        def step(batch=batch, head=head) -> None:
            with setup.amp():
                terms = batch_terms(module.gpt, head, batch, lm=True)
                loss = terms["lm_sum"].sum() + (terms["logits"].float().sum() if "logits" in terms else 0)
            loss.backward()
            module.zero_grad(set_to_none=True)

        def evaluate(batch=batch, head=head) -> None:
            with torch.no_grad(), setup.amp():
                batch_terms(module.gpt, head, batch, lm=True)

        train = kernels_of(step)
        seconds = timed(setup, step)
        module.eval()
        evaluation = kernels_of(evaluate)
        module.train()
        status = verdict(train.startswith("flash")) if setup.cuda and kind in must_flash else ""
        yield Row(
            f"attention, {kind}",
            f"training: {train}, fwd+bwd {seconds * 1e3:.1f} ms; evaluation: {evaluation}",
            status,
        )
    gpt = module.gpt.eval()
    cache = gpt.new_kv_cache(B, setup.seq)
    ids = torch.randint(0, setup.config.vocab_size - 4, (B, setup.seq // 2), device=setup.device)
    with torch.no_grad(), setup.amp():
        gpt(ids, kv_cache=cache)
        one = ids[:, :1]
        kernel = kernels_of(lambda: (gpt(one, kv_cache=cache), setattr(cache, "length", cache.length - 1)))
    yield Row("attention, cached decoding (1 token over the cache)", kernel)


def build_models(setup: Setup) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    ours = GPT(copy.deepcopy(setup.config)).to(setup.device).train()
    models = {"ours": ours, "transformers": ours.to_hf().to(setup.device).train()}
    if setup.compile:
        compiled = copy.deepcopy(ours)
        compiled.compile(dynamic=False)  # one static graph per batch size
        models["ours, compiled"] = compiled
    return models


def training_throughput(setup: Setup) -> Iterator[Row]:
    models = build_models(setup)
    n_params = counted_parameters(models["ours"])
    fpt = flops_per_token(setup.config, n_params, setup.seq)
    fused = setup.cuda
    for batch in setup.batches:
        ids = torch.randint(0, setup.config.vocab_size, (batch, setup.seq + 1), device=setup.device)
        steps = {
            name: make_step(
                m,
                hf_logits if name == "transformers" else ours_logits,
                torch.optim.AdamW(m.parameters(), lr=1e-5, fused=fused),
                ids,
                setup.autocast,
            )
            for name, m in models.items()
        }
        for step in steps.values():
            for _ in range(3 if setup.compile else 1):  # compiling happens here
                step()
        rates: dict[str, list[float]] = {name: [] for name in steps}
        for run in range(setup.runs):
            for name in steps if run % 2 == 0 else list(steps)[::-1]:  # interleaved, alternating order
                rates[name].append(
                    batch * setup.seq / timed(setup, steps[name], repeat=2 if setup.cuda else 1)
                )
        tok = {name: statistics.median(r) for name, r in rates.items()}
        for name, rate in tok.items():
            figure = f"{rate:,.0f} tokens/s"
            status = ""
            if setup.peak_tflops:
                mfu = rate * fpt / (setup.peak_tflops * 1e12)
                figure += f", MFU {mfu:.1%}"
                if name == "ours, compiled":
                    status = verdict(mfu >= GOALS["mfu"])
            yield Row(f"training step, {name}, batch {batch} x {setup.seq}", figure, status)
        best = max(rate for name, rate in tok.items() if name != "transformers")
        ratio = best / tok["transformers"]
        yield Row(
            f"training step, ours / transformers, batch {batch}",
            f"{ratio:.2f}x",
            verdict(ratio >= GOALS["vs_transformers"]) if setup.cuda else "",
        )


def finetune_step(setup: Setup) -> Iterator[Row]:
    task = SingleText(name="sentiment", labels=["negative", "positive"])
    module = task_module(setup, task).train()
    from gpt_ft.training.optim import adamw

    optimizer = adamw(
        module.parameters(), lr=1e-5, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8, fused=setup.cuda
    )
    g = torch.Generator().manual_seed(0)
    sp, vocab = specials(setup), setup.config.vocab_size - SPECIALS_OFFSET
    B = 32 if setup.cuda else 8
    examples = []
    for i in range(B):  # SST-2-like lengths: most short, a few long
        n = min(setup.seq - 2, int(np.random.default_rng(i).lognormal(np.log(setup.seq / 8), 0.6)))
        text = torch.randint(0, vocab, (max(1, n),), generator=g).tolist()
        enc = task.encode({"label": i % 2}, [text], sp, max_length=setup.seq)
        examples.append(
            {"input_ids": enc.sequences, "extract_index": enc.extract_index, "label": enc.label, "index": i}
        )
    batch = move_data_to_device(collate(examples, sp.pad), setup.device)
    real = int(batch.attention_mask.sum())

    def step() -> None:
        with setup.amp():
            loss, _ = module.losses(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = timed(setup, step, repeat=5)
    padding = 1 - real / batch.input_ids.numel()
    yield Row(
        f"fine-tuning step (head + λ=0.5 LM loss), batch {B}",
        f"{real / seconds:,.0f} real tokens/s; padding {padding:.0%} of {tuple(batch.input_ids.shape)}",
    )


def metrics_rows(log_dir: Path) -> list[dict[str, str]]:
    files = sorted(log_dir.rglob("metrics.csv"))
    if not files:
        return []
    with open(files[-1]) as f:
        return list(csv.DictReader(f))


def last_value(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key)]
    return values[-1] if values else None


def run_gpt_ft(args: list[str], log: Path) -> tuple[int, float]:
    start = time.perf_counter()
    with open(log, "w") as sink:
        rc = subprocess.run(
            [sys.executable, "-m", "gpt_ft", *args], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT
        ).returncode
    return rc, time.perf_counter() - start


def fit_quickstart(setup: Setup, tmp: Path) -> Iterator[Row]:
    args = [
        "fit",
        "--config",
        "configs/quickstart.yaml",
        f"--trainer.default_root_dir={tmp / 'quickstart'}",
        "--trainer.enable_progress_bar=false",
    ]
    if setup.cuda:
        args[3:3] = ["--config", "configs/trainer/gpu.yaml"]
    else:
        args += ["--trainer.max_epochs=1", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2"]
    rc, seconds = run_gpt_ft(args, tmp / "quickstart.log")
    if rc != 0:
        print((tmp / "quickstart.log").read_text()[-3000:], file=sys.stderr)
        yield Row("`gpt-ft fit` quickstart", f"exit {rc}", "FAIL")
        return
    rows = metrics_rows(tmp / "quickstart")
    accuracy = last_value(rows, "validation/accuracy")
    if accuracy is None:
        yield Row("`gpt-ft fit` quickstart", "no validation/accuracy in its metrics.csv", "FAIL")
        return
    how = "through configs/trainer/gpu.yaml" if setup.cuda else "6 steps on the CPU"
    yield Row(
        f"`gpt-ft fit` quickstart, {how}",
        f"{seconds:.0f} s, validation accuracy {accuracy:.3f}",
        verdict(accuracy >= 0.9 or not setup.cuda),
    )


def synthetic_tokens(setup: Setup, folder: Path) -> Path:
    """A `gpt-ft prepare`-shaped folder of random tokens (the model's vocabulary)."""
    from gpt_ft.data.prepare import META, SPLIT_FILES, token_dtype

    dtype = token_dtype(setup.config.vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    counts = {
        "train": (setup.pretrain_steps + 20) * max(setup.batches) * setup.seq + 1,
        "validation": 4 * setup.seq + 1,
    }
    for split, n in counts.items():
        rng.integers(0, setup.config.vocab_size, n, dtype=np.int64).astype(dtype).tofile(
            folder / SPLIT_FILES[split]
        )
    meta = {
        "dtype": dtype,
        "vocab_size": setup.config.vocab_size,
        "eos_token_id": None,
        "tokens": counts,
        "documents": 1,
        "tokenizer": "tokenizer",
        "sources": ["random"],
        "seconds": 0,
    }
    (folder / META).write_text(json.dumps(meta))
    # Checkpoints keep the data's tokenizer beside them: any small one will do for random tokens.
    shutil.copytree(ROOT / "examples" / "quickstart" / "tokenizer", folder / "tokenizer", dirs_exist_ok=True)
    return folder


def fit_vs_loop(setup: Setup, tmp: Path) -> Iterator[Row]:
    import bench_overhead

    c = setup.config
    args = Namespace(
        tokens=str(synthetic_tokens(setup, tmp / "tokens")),
        preset="gpt1" if setup.cuda else "gpt-mini",
        block=setup.seq,
        batch=max(setup.batches),
        lr=1e-4,
        warmup=10,
        steps=setup.pretrain_steps,
        device=setup.device,
        precision="bf16-mixed" if setup.autocast else "32-true",
        compile=setup.compile,
        log_every=max(1, setup.pretrain_steps // 2),
    )
    overrides = {"n_positions": c.n_positions, "n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head}
    text = "{" + ", ".join(f"{k}: {v}" for k, v in overrides.items()) + "}"
    loop_times, fit_times = [], []
    rounds = 2 if setup.cuda and not setup.compile else 1  # compiling twice more would cost minutes
    for r in range(rounds):
        runs = [
            lambda: loop_times.append(bench_overhead.raw_loop(args, overrides)),
            lambda: fit_times.append(bench_overhead.lightning_fit(args, text, tmp / f"fit{r}")),
        ]
        for run in runs if r % 2 == 0 else runs[::-1]:
            with contextlib.redirect_stdout(sys.stderr):
                run()
    loop, fit = statistics.median(loop_times), statistics.median(fit_times)
    overhead = fit / loop - 1
    logged = metrics_rows(tmp / "fit0")
    mfu, tps = last_value(logged, "perf/mfu"), last_value(logged, "perf/tokens_per_s")
    tokens = args.batch * args.block
    yield Row(
        f"`gpt-ft fit` vs raw loop, {setup.pretrain_steps} pretraining steps of {args.batch} x {args.block}",
        f"fit {tokens / fit:,.0f} tokens/s, loop {tokens / loop:,.0f}: fit {overhead:+.1%}",
        verdict(overhead <= GOALS["fit_overhead"]) if setup.cuda else "",
    )
    logged_text = f"perf/tokens_per_s {tps:,.0f}" if tps else "no perf/tokens_per_s logged"
    if setup.cuda:
        logged_text += f", perf/mfu {mfu:.1%}" if mfu else ", no perf/mfu logged"
    yield Row(
        "`gpt-ft fit` logged throughput",
        logged_text,
        verdict(tps is not None and (mfu is not None or not setup.cuda)),
    )


def generation(setup: Setup) -> Iterator[Row]:
    torch.manual_seed(0)
    gpt = GPT(copy.deepcopy(setup.config)).to(setup.device).eval()
    prompt = torch.randint(0, setup.config.vocab_size, (1, 16), device=setup.device)
    n = min(setup.gen_tokens, setup.seq - 16)
    out, seconds = {}, {}
    for use_cache in (True, False):

        def run(use_cache=use_cache):
            out[use_cache] = gpt.generate(prompt, max_new_tokens=n, use_cache=use_cache)

        seconds[use_cache] = timed(setup, run, repeat=1)
    same = torch.equal(out[True], out[False])
    yield Row(
        f"greedy generation, {n} tokens after 16",
        f"cached {n / seconds[True]:,.0f} tokens/s, uncached "
        f"{n / seconds[False]:,.0f}; identical tokens: {same}",
        verdict(same),
    )


def shared_context(setup: Setup) -> Iterator[Row]:
    B = 16 if setup.cuda else 4
    rows, task = choice_rows(setup, B, one_length=False, seed=2)
    module = task_module(setup, task)
    module.train()
    for p in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
        setattr(module.gpt.config, p, 0.0)
    module.eval()  # no dropout, so that both layouts compute the same thing
    sp = specials(setup)
    plain = move_data_to_device(collate(rows, sp.pad), setup.device)
    shared = move_data_to_device(collate_shared(rows, sp.pad, sp.delim), setup.device)
    with torch.no_grad(), exact_fp32():
        a = module.terms(plain)
        b = module.terms(shared)
    diff = (a["logits"] - b["logits"]).abs().max().item()
    yield Row(
        "shared-context multiple choice = plain layout (fp32 logits)",
        f"max abs diff {diff:.1e} (<= 1e-4)",
        verdict(diff <= 1e-4),
    )

    def step(batch) -> None:
        with setup.amp():
            loss, _ = module.losses(batch)
        loss.backward()
        module.zero_grad(set_to_none=True)

    module.train()
    t_plain, t_shared = timed(setup, lambda: step(plain)), timed(setup, lambda: step(shared))
    yield Row(
        f"shared-context multiple choice, {B} examples x 4 endings, fwd+bwd",
        f"plain {t_plain * 1e3:.1f} ms, shared {t_shared * 1e3:.1f} ms: {t_plain / t_shared:.2f}x",
    )


# ---- the report ----


def report(setup: Setup, rows: list[Row], seconds: float) -> str:
    failed = sum(r.status == "FAIL" for r in rows)
    lines = [
        "# gpt_ft GPU checklist",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}, device {setup.device}, {seconds / 60:.1f} minutes; "
        f"{'all checks pass' if not failed else f'{failed} failing'}.",
        "",
        "| check | result | |",
        "|---|---|---|",
    ]
    lines += [f"| {r.check} | {r.result} | {r.status} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="fewer runs and steps")
    parser.add_argument("--preset", default="gpt1", help="the GPU rows' model (the CPU uses a small one)")
    parser.add_argument(
        "--seq", type=int, default=None, help="context of the speed rows (default: the preset's)"
    )
    parser.add_argument("--batch", type=int, nargs="+", default=None, help="batch sizes (GPU default: 8 16)")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--pretrain-steps", type=int, default=None, help="timed steps of fit vs the loop")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled rows")
    parser.add_argument("--bf16", action="store_true", help="bf16-mixed on the CPU too (always on a GPU)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU")
    parser.add_argument("--only", nargs="+", default=None, help="run only these rows (function names)")
    parser.add_argument("--report", default=None, help="Markdown file (default: $OUT/gpu_check.md or runs/)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run on a GPU, or pass --device cpu --quick")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    setup = make_setup(args)
    checks: list[Callable] = [
        environment,
        cuda_tests,
        logits_vs_transformers,
        attention_kernels,
        training_throughput,
        finetune_step,
        fit_quickstart,
        fit_vs_loop,
        generation,
        shared_context,
    ]
    if args.only:
        unknown = set(args.only) - {c.__name__ for c in checks}
        if unknown:
            parser.error(f"unknown rows {sorted(unknown)}; choose from {[c.__name__ for c in checks]}")
        checks = [c for c in checks if c.__name__ in args.only]
    rows: list[Row] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPU_CHECK_TMP")) as tmp:
        for check in checks:
            print(f"[{time.perf_counter() - start:5.0f} s] {check.__name__} ...", file=sys.stderr, flush=True)
            needs_tmp = check in (fit_quickstart, fit_vs_loop)
            try:
                for row in check(setup, Path(tmp)) if needs_tmp else check(setup):
                    rows.append(row)
                    print(f"    {row.check}: {row.result} {row.status}", file=sys.stderr, flush=True)
            except (Exception, SystemExit) as error:  # one broken row must not hide the others
                traceback.print_exc()
                rows.append(
                    Row(check.__name__, f"error: {type(error).__name__}: {error}".replace("|", "/"), "FAIL")
                )
            if setup.cuda:
                torch.cuda.empty_cache()
    text = report(setup, rows, time.perf_counter() - start)
    out = Path(
        args.report or (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "runs") / "gpu_check.md"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"report written to {out}", file=sys.stderr)
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
