"""GPT-1's ablation, on a CPU or a GPU: does generative pretraining help fine-tuning?

1. trains a byte-level BPE on the books (or takes --tokenizer), 2. `gpt-ft prepare`s them, 3.
pretrains a GPT on --tokens of them (stopped after --minutes of training at the latest), 4.
fine-tunes the same shape on SST-2, RTE, STS-B and Story Cloze (benchmarks/bench_finetune.py) from
the pretrained checkpoint and from scratch, per seed; 5. prints the table beside the paper's figures
(--report: as Markdown, with a chart). Scales: --device cpu (configs/pretrain/cpu.yaml, gpt-mini at
context 256), --device cuda (configs/pretrain/gpt1.yaml + configs/trainer/gpu.yaml, gpt1 at context
512 on 200M tokens), --tiny (2 layers on a slice of the data: minutes on a CPU); flags override. Each
pretrains GPT-1's post-LN blocks (not cpu.yaml's pre_ln); --shape "pre_ln: true" for GPT-2's layout.

The same command again goes on: tokenizer, tokens and finished fine-tuning runs are kept, pretraining
resumes from its last.ckpt as `gpt-ft fit --ckpt_path last` does, `--trainer.max_time` counting every
run's training (raise --minutes to train longer); arguments after `--` go to every fine-tuning fit.

    python benchmarks/bench_ablation.py --device cpu --minutes 45 $DATA  # --books --glue --storycloze
    python benchmarks/bench_ablation.py --device cuda --compile --report runs/ablation-cuda/report.md $DATA
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from harness import ROOT, bar_chart, device, gpt_ft
from paths import existing

from gpt_ft.training.checkpointing import find_last_checkpoint

DROPOUT = "embd_pdrop: {p}, attn_pdrop: {p}, resid_pdrop: {p}"
TASKS = ["SST-2", "RTE", "STS-B", "StoryCloze"]
SCALES = {  # the defaults of each scale; None in argparse takes them from here
    "cpu": dict(config="configs/pretrain/cpu.yaml", vocab_size=8192, preset="gpt-mini", shape="", context=256,
                batch_size=16, tokens=1600 * 16 * 256, minutes=45.0, pretrain_lr=6e-4, pretrain_dropout=0.0,
                val_every=250, finetune_lr=[2.5e-4, 1e-3], epochs_for=["SST-2=1"], steps_for=["SST-2=600"]),
    "cuda": dict(config="configs/pretrain/gpt1.yaml", vocab_size=8192, preset="gpt1", shape="", context=512,
                 batch_size=64, tokens=200_000_000, minutes=600.0, pretrain_lr=2.5e-4, pretrain_dropout=0.1,
                 val_every=1000, finetune_lr=[6.25e-5, 2.5e-4], epochs_for=[], steps_for=[]),
    "tiny": dict(config="configs/pretrain/cpu.yaml", vocab_size=1024, preset="gpt-mini",
                 shape="n_layer: 2, n_embd: 64, n_head: 2", context=64, batch_size=8, tokens=1500 * 8 * 64,
                 minutes=30.0, pretrain_lr=1e-3, pretrain_dropout=0.0, val_every=250,
                 finetune_lr=[2.5e-4, 1e-3], epochs_for=[f"{t}=1" for t in TASKS],
                 steps_for=[f"{t}=6" for t in TASKS]),
}  # fmt: skip
TINY_BOOKS, TINY_BOOK_CHARS, TINY_ROWS = 3, 100_000, 200  # --tiny: the slice of the data
PAPER = {  # Radford et al. 2018: Tables 2-4 (the full model, test sets) and Table 5 (w/o pre-training)
    "GPT-1 paper: pretrained": {"SST-2": 91.3, "RTE": 56.0, "STS-B": 82.0, "StoryCloze": 86.5},
    "GPT-1 paper: no pretraining": {"SST-2": 84.0, "RTE": 53.8, "STS-B": 30.9},
}
CPU_SCALE = {  # the CPU scale's figures (pre-LN gpt-mini pretrained 55 min on the books, 3 seeds' means)
    "CPU scale: pretrained": {"SST-2": 76.2, "RTE": 53.9, "STS-B": 19.1, "StoryCloze": 68.2},
    "CPU scale: from scratch": {"SST-2": 76.6, "RTE": 52.9, "STS-B": 18.0, "StoryCloze": 67.1},
}


def tiny_data(args, out: Path) -> None:
    """--tiny: the first books and GLUE rows, copied into the --out folder."""
    books, glue = out / "tiny-books", out / "tiny-glue"
    if not books.exists():
        if not (files := sorted(Path(args.books).glob("*.txt"))[:TINY_BOOKS]):
            raise SystemExit(f"{args.books} holds no .txt books.")
        for f in files:
            books.mkdir(exist_ok=True)
            (books / f.name).write_text(f.read_text(encoding="utf-8")[:TINY_BOOK_CHARS], encoding="utf-8")
    if not glue.exists():
        for card in ("SST-2", "RTE", "STS-B"):
            (glue / card).mkdir(parents=True)
            for split in ("train", "dev", "test"):
                with open(Path(args.glue) / card / f"{split}.tsv", encoding="utf-8") as f:
                    head = [line for _, line in zip(range(TINY_ROWS + 1), f)]
                (glue / card / f"{split}.tsv").write_text("".join(head), encoding="utf-8")
    args.books, args.glue = str(books), str(glue)


def trainer_args(args) -> list[str]:
    return ["--config=configs/trainer/gpu.yaml"] if args.device == "cuda" else ["--trainer.accelerator=cpu"]


def pretrain(args, out: Path, tokens: Path, steps: int) -> None:
    """`gpt-ft fit` of the books, resumed from its last.ckpt when there is one."""
    last = find_last_checkpoint(out / "pretrain" / "lightning_logs")
    if last and torch.load(last, map_location="cpu", mmap=True, weights_only=True)["global_step"] >= steps:
        print(f"pretraining: done ({steps} steps), {last}")
        return
    model = f"n_positions: {args.context}, {DROPOUT.format(p=args.pretrain_dropout)}"
    model += f", {args.shape}" if args.shape else ""
    t = int(args.minutes * 60)
    fit = [
        f"--config={args.config}",
        *trainer_args(args),
        f"--data.token_dir={tokens}",
        f"--data.block_size={args.context}",
        f"--data.batch_size={args.batch_size}",
        "--trainer.accumulate_grad_batches=1",  # --batch-size is the whole step (gpt1.yaml: 8 x 8)
        f"--model.preset={args.preset}",
        f"--model.overrides={{{model}}}",
        f"--model.lr={args.pretrain_lr}",
        f"--model.optimizer={args.pretrain_optimizer}",
        f"--model.warmup_steps={args.warmup_steps or max(1, steps // 10)}",
        f"--model.compile={str(args.compile).lower()}",
        f"--trainer.max_steps={steps}",
        "--trainer.max_epochs=-1",
        f"--trainer.max_time={t // 86400:02d}:{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}",
        f"--trainer.val_check_interval={args.val_every}",
        "--trainer.limit_val_batches=50",
        f"--trainer.logger.init_args.save_dir={out / 'pretrain'}",
        "--trainer.enable_progress_bar=false",
        "--ckpt_path=last",
    ]
    printed = gpt_ft("fit", *fit, log=out / "pretrain.log").output
    with open(out / "pretrain.out", "a") as f:  # every run's output: the perplexities
        f.write(printed)


def finetune_rows(args, checkpoint: Path) -> dict[str, list[str]]:
    """benchmarks/bench_finetune.py's arguments for the two rows: from the pretrained checkpoint
    (dropout 0.1) and from scratch (the same shape)."""
    common = [
        f"--glue={args.glue}",
        f"--storycloze={args.storycloze}",
        f"--tokenizer={args.tokenizer}",
        f"--max-length={args.context}",
        "--trainer.precision=bf16-mixed",  # where the CPU multiplies bf16 faster; else fp32, said once
        *["--tasks", *args.tasks],
        *["--epochs-for", *args.epochs_for],
        *["--steps-for", *args.steps_for],
    ]
    shape = f", {args.shape}" if args.shape else ""
    pretrained = [f"--init-from={checkpoint}", f"--overrides={{{DROPOUT.format(p=0.1)}}}"]
    scratch = [f"--preset={args.preset}", f"--overrides={{n_positions: {args.context}{shape}}}"]
    return {
        "pretrained": [*common, *pretrained, f"--lr={args.finetune_lr[0]}"],
        "from scratch": [*common, *scratch, f"--lr={args.finetune_lr[1]}"],
    }


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def summary(results: dict[str, dict[str, list[float]]], runs: list[dict], note: str, others: dict) -> str:
    """Markdown: best validation score per task (mean ± std over seeds), the gain of pretraining,
    the figures to set ours beside, and each run's epochs and times."""
    tasks = list(next(iter(results.values())))
    lines = ["| row | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for name, by_task in results.items():
        lines.append(f"| {name} | " + " | ".join(mean_std(by_task[t]) for t in tasks) + " |")
    if "pretrained" in results and "from scratch" in results:
        gains = [statistics.fmean(results["pretrained"][t]) - statistics.fmean(results["from scratch"][t])
                 for t in tasks]  # fmt: skip
        lines.append("| gain of pretraining | " + " | ".join(f"{g:+.1f}" for g in gains) + " |")
    for name, by_task in others.items():
        cells = [f"{by_task[t]:.1f}" if t in by_task else "" for t in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", note, "", "| run | seed | task | epochs | s/epoch | last | best |", "|---" * 7 + "|"]
    for r in runs:
        cells = [r["row"], r["seed"], r["task"], r["epochs"], f"{r['seconds_per_epoch']:.0f}",
                 f"{100 * r['last']:.1f}", f"{100 * r['best']:.1f}"]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    argv = sys.argv[1:]
    fit_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", type=device)
    p.add_argument("--tiny", action="store_true", help="a tiny model on a slice of the data (on the CPU)")
    p.add_argument("--books", type=existing, required=True, help="folder of .txt books to pretrain on")
    p.add_argument("--glue", type=existing, required=True, help="folder holding SST-2, RTE, STS-B")
    p.add_argument("--storycloze", type=existing, required=True, help="the Story Cloze 2016 folder")
    p.add_argument("--tokenizer", default=None, help="a tokenizer folder; default: train one on the books")
    p.add_argument("--out", default=None, help="everything the run writes (default runs/ablation-SCALE)")
    g = p.add_argument_group("pretraining (defaults: the scale's, see SCALES)")
    g.add_argument("--config", help="the pretraining config")
    g.add_argument("--vocab-size", type=int, help="of the tokenizer trained on the books")
    g.add_argument("--preset", help="GPT preset of both rows")
    g.add_argument("--shape", help="GPTConfig changes of both rows, e.g. 'pre_ln: true' or 'n_layer: 6'")
    g.add_argument("--context", type=int, help="model context = pretraining block")
    g.add_argument("--batch-size", type=int, help="pretraining sequences per step")
    g.add_argument("--tokens", type=int, help="pretraining tokens, made max_steps (the cosine's length)")
    g.add_argument("--minutes", type=float, help="pretraining's training-time limit, over every resumed run")
    g.add_argument("--pretrain-lr", type=float, help="peak rate, cosine to 0")
    g.add_argument("--pretrain-optimizer", choices=["adamw", "muon"], default="adamw", help="of pretraining")
    g.add_argument("--pretrain-dropout", type=float, help="dropout while pretraining")
    g.add_argument("--warmup-steps", type=int, default=None, help="pretraining warmup (default 10%%)")
    g.add_argument("--val-every", type=int, help="validate (and save last.ckpt) every N steps")
    g.add_argument("--compile", action="store_true", help="torch.compile the pretraining model")
    g.add_argument("--skip-pretraining", action="store_true", help="use the last.ckpt there is")
    t = p.add_argument_group("fine-tuning (benchmarks/bench_finetune.py)")
    t.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    t.add_argument("--finetune-lr", nargs=2, type=float, metavar=("PRETRAINED", "SCRATCH"))
    t.add_argument("--epochs-for", nargs="*", help="per-task epochs (default 3), e.g. SST-2=1")
    t.add_argument("--steps-for", nargs="*", help="per-task step budgets, e.g. SST-2=600")
    t.add_argument("--seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds of each row")
    rows = ["pretrained", "from scratch"]
    t.add_argument(
        "--rows", nargs="*", default=rows, choices=rows, help="only these rows (none: pretrain only)"
    )
    t.add_argument("--tfidf", action="store_true", help="add benchmarks/tfidf_baseline.py's row")
    p.add_argument("--report", default=None, help="write the table as Markdown (and a .png chart beside it)")
    args = p.parse_args(argv)
    args.scale = "tiny" if args.tiny else args.device
    for key, value in SCALES[args.scale].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for item in args.epochs_for + args.steps_for:
        if "=" not in item or item.split("=")[0] not in TASKS:
            p.error(f"{item!r} is not TASK=N with TASK one of {', '.join(TASKS)}")
    args.fit_args, args.out = fit_args, Path(args.out or f"runs/ablation-{args.scale}").resolve()
    for key in ("books", "glue", "storycloze", "tokenizer"):  # the subprocesses run in the project root
        if getattr(args, key):
            setattr(args, key, str(Path(getattr(args, key)).resolve()))
    return args


def main() -> None:
    args = parse_args()
    (out := args.out).mkdir(parents=True, exist_ok=True)
    if args.tiny:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # a tiny model runs fastest on one thread
        tiny_data(args, out)
    if args.tokenizer is None:
        args.tokenizer = str(out / "tokenizer")
        if not (out / "tokenizer" / "tokenizer.json").exists():
            tok = [f"--vocab_size={args.vocab_size}", f"--out_dir={args.tokenizer}"]
            gpt_ft("tokenizer", "--inputs", args.books, *tok)
    tokens = out / "tokens"
    if not (tokens / "meta.json").exists():
        small = ["--piece_chars=8192", "--validation_fraction=0.05"] if args.tiny else []
        workers = f"--workers={min(8, os.cpu_count() or 1)}"
        where = [f"--tokenizer={args.tokenizer}", f"--out_dir={tokens}"]
        gpt_ft("prepare", "--inputs", args.books, *where, workers, *small)
    steps = math.ceil(args.tokens / (args.batch_size * args.context))
    if not args.skip_pretraining:
        pretrain(args, out, tokens, steps)
    checkpoint = find_last_checkpoint(out / "pretrain" / "lightning_logs")  # the newest run's
    if checkpoint is None:
        raise SystemExit(f"no last.ckpt under {out / 'pretrain'}: pretrain without --skip-pretraining.")

    results: dict[str, dict[str, list[float]]] = {}  # row -> task -> best score of each seed
    runs = []
    for seed in args.seeds:
        for name, extra in finetune_rows(args, checkpoint).items():
            if name not in args.rows:
                continue
            folder = out / name.replace(" ", "-") / f"seed-{seed}"
            if not (folder / "results.json").exists():  # a finished run is kept: run again to go on
                print(f"\n== {name}, seed {seed} ==", flush=True)
                cmd = [sys.executable, "benchmarks/bench_finetune.py", *extra, f"--out={folder}",
                       f"--results={folder / 'results.json.tmp'}", f"--seed_everything={seed}",
                       *trainer_args(args)]  # fmt: skip
                cmd += (["--trainer.limit_val_batches=3"] if args.tiny else []) + args.fit_args
                subprocess.run(cmd, cwd=ROOT, check=True)
                (folder / "results.json.tmp").replace(folder / "results.json")
            for row in json.loads((folder / "results.json").read_text()):
                results.setdefault(name, {}).setdefault(row["task"], []).append(100 * row["best"])
                runs.append({"row": name, "seed": seed, **row})
    if args.tfidf:
        scores = out / "tfidf.json"
        cmd = [sys.executable, "benchmarks/tfidf_baseline.py", f"--glue={args.glue}",
               f"--storycloze={args.storycloze}", f"--json={scores}"]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, check=True)
        results["TF-IDF + linear"] = {t: [v] for t, v in json.loads(scores.read_text()).items()}
    if not results:
        return
    printed = out / "pretrain.out"
    ppl = re.findall(r"validation/perplexity ([\d.]+)", printed.read_text()) if printed.exists() else []
    step = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)["global_step"]
    shape = f"{args.preset}{f' with {{{args.shape}}}' if args.shape else ''}, context {args.context}"
    note = (
        f"Best validation epoch, {len(args.seeds)} seed(s); STS-B: Pearson x 100; the paper's figures are "
        f"test-set scores of the 12-layer GPT-1. Pretraining ({args.scale} scale, {shape}): {step} of "
        f"{steps} steps of {args.batch_size} x {args.context} tokens"
        + (f", last validation perplexity {float(ppl[-1]):.1f}." if ppl else ".")
    )
    others = {**PAPER, **(CPU_SCALE if args.scale == "cuda" else {})}
    table = summary(results, runs, note, others)
    print("\n" + table)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(table)
        means = {k: {t: statistics.fmean(v) for t, v in r.items()} for k, r in results.items()}
        bar_chart({**means, **PAPER}, Path(args.report).with_suffix(".png"), "best validation score")
        print(f"report: {args.report} (chart beside it)")


if __name__ == "__main__":
    main()
