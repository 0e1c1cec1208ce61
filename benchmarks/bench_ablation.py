"""GPT-1's ablation at CPU scale: does generative pretraining help fine-tuning?

1. trains a byte-level BPE tokenizer on the books (or takes --tokenizer), 2. `gpt-ft prepare`s
them, 3. pretrains a small GPT on them for --steps steps (stopped at --minutes at the latest),
then 4. fine-tunes the same architecture on SST-2, RTE, STS-B and Story Cloze twice through
benchmarks/bench_finetune.py: from the pretrained checkpoint, and from scratch. Both rows use the
same tokenizer, architecture, data and epochs; each prints its table.

    python benchmarks/bench_ablation.py --books ../shared/data/lm/books --glue ../shared/data/glue \\
        --storycloze ../shared/data/storycloze --minutes 45
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpt_ft.training.checkpointing import find_last_checkpoint

ROOT = Path(__file__).resolve().parents[1]
DROPOUT = "embd_pdrop: {p}, attn_pdrop: {p}, resid_pdrop: {p}"


def gpt_ft(*args: str, log: Path | None = None) -> str:
    """Runs `gpt-ft ARGS` in the project root, printing its output as it comes (its stderr goes to
    `log`), and returns that output."""
    cmd = [sys.executable, "-m", "gpt_ft", *args]
    print(f"$ gpt-ft {' '.join(args)}", flush=True)
    lines = []
    with open(log, "w") if log else open(os.devnull, "w") as sink:
        with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=sink, text=True) as proc:
            for line in proc.stdout:
                lines.append(line)
                print("  " + line.rstrip("\n"), flush=True)
    if proc.returncode != 0:
        where = f"; see {log}" if log else ""
        raise SystemExit(f"gpt-ft {args[0]} failed (exit {proc.returncode}){where}")
    return "".join(lines)


def train_tokenizer(out: Path, books: str, vocab_size: int = 8192) -> str:
    """Step 1: a byte-level BPE trained on the books into OUT/tokenizer (kept if already there)."""
    tokenizer = str(out / "tokenizer")
    if not (out / "tokenizer" / "tokenizer.json").exists():
        gpt_ft("tokenizer", books, "--vocab_size", str(vocab_size), "--out_dir", tokenizer)
    return tokenizer


def prepare_books(
    out: Path, books: str, tokenizer: str, workers: int = 2, prepare_args: tuple[str, ...] = ()
) -> Path:
    """Step 2: the books' tokens in OUT/tokens (kept if already there); `prepare_args` go to
    `gpt-ft prepare`."""
    tokens = out / "tokens"
    if not (tokens / "meta.json").exists():
        args = ["--tokenizer", tokenizer, "--out_dir", str(tokens), "--workers", str(workers)]
        gpt_ft("prepare", books, *args, *prepare_args)
    return tokens


def finetune_rows(
    *,
    glue: str,
    storycloze: str,
    tokenizer: str,
    context: int,
    checkpoint: Path,
    lr: tuple[float, float],
    epochs_for: list[str],
    steps_for: list[str],
    preset: str | None = None,
    shape: str = "",
) -> dict[str, list[str]]:
    """benchmarks/bench_finetune.py's arguments for the two rows: from the pretrained checkpoint
    (dropout 0.1) and from scratch (the same shape: `preset`, default bench_finetune's, with the
    context and the `shape` changes, e.g. 'n_layer: 6'). `lr` is (pretrained, scratch)."""
    common = [
        f"--glue={glue}",
        f"--storycloze={storycloze}",
        f"--tokenizer={tokenizer}",
        f"--max-length={context}",
        "--trainer.precision=bf16-mixed",  # where the CPU multiplies bf16 faster; else fp32, said once
        "--epochs-for",
        *epochs_for,
        "--steps-for",
        *steps_for,
    ]
    scratch = [f"--overrides={{n_positions: {context}{', ' + shape if shape else ''}}}", f"--lr={lr[1]}"]
    if preset:
        scratch.insert(0, f"--preset={preset}")
    return {
        "pretrained": [
            *common,
            f"--init-from={checkpoint}",
            f"--overrides={{{DROPOUT.format(p=0.1)}}}",
            f"--lr={lr[0]}",
        ],
        "from scratch": [*common, *scratch],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--books", default="../shared/data/lm/books")
    parser.add_argument("--glue", default="../shared/data/glue")
    parser.add_argument("--storycloze", default="../shared/data/storycloze")
    parser.add_argument("--tokenizer", default=None, help="default: train one on the books")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--context", type=int, default=256, help="model context = pretraining block")
    parser.add_argument("--batch-size", type=int, default=16, help="pretraining sequences per step")
    parser.add_argument(
        "--steps", type=int, default=1600, help="pretraining steps (the cosine schedule's length)"
    )
    parser.add_argument("--minutes", type=float, default=45, help="pretraining wall-clock limit")
    parser.add_argument("--pretrain-lr", type=float, default=6e-4, help="peak rate, after 10%% warmup")
    parser.add_argument(
        "--finetune-lr", nargs=2, type=float, default=[2.5e-4, 1e-3], metavar=("PRETRAINED", "SCRATCH")
    )
    parser.add_argument("--epochs-for", nargs="*", default=["SST-2=1"], help="per-task epochs (default 3)")
    parser.add_argument(
        "--steps-for", nargs="*", default=["SST-2=600"], help="per-task step budgets (SST-2: 600 of 2105)"
    )
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("--skip-pretraining", action="store_true", help="reuse OUT/pretrain/.../last.ckpt")
    parser.add_argument("--shape", default="", help="GPTConfig changes of both rows, e.g. 'pre_ln: true'")
    parser.add_argument("--warmup-steps", type=int, default=None, help="pretraining warmup (default 10%%)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds of each row")
    parser.add_argument(
        "--rows", nargs="*", default=["pretrained", "from scratch"], choices=["pretrained", "from scratch"],
        help="fine-tune only these rows (none: pretrain only)",
    )  # fmt: skip
    parser.add_argument("--tfidf", action="store_true", help="add benchmarks/tfidf_baseline.py's row")
    parser.add_argument("--report", default=None, help="write the table as Markdown (and a .png chart)")
    args = parser.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = args.tokenizer or train_tokenizer(out, args.books, args.vocab_size)
    tokens = prepare_books(out, args.books, tokenizer)

    if not args.skip_pretraining:
        start = time.perf_counter()
        minutes = int(args.minutes)
        printed = gpt_ft(
            "fit",
            "--config",
            "configs/pretrain/cpu.yaml",
            f"--data.token_dir={tokens}",
            f"--data.block_size={args.context}",
            f"--data.batch_size={args.batch_size}",
            # Less than one pass over the books: no dropout while pretraining.
            f"--model.overrides={{n_positions: {args.context}, {DROPOUT.format(p=0.0)}"
            f"{', ' + args.shape if args.shape else ''}}}",
            f"--trainer.max_steps={args.steps}",
            f"--trainer.max_time=00:{minutes // 60:02d}:{minutes % 60:02d}:00",
            "--trainer.val_check_interval=250",
            "--trainer.limit_val_batches=50",
            f"--model.lr={args.pretrain_lr}",
            f"--model.warmup_steps={args.warmup_steps or max(1, args.steps // 10)}",
            f"--trainer.logger.init_args.save_dir={out / 'pretrain'}",
            "--trainer.enable_progress_bar=false",
            log=out / "pretrain.log",
        )
        (out / "pretrain.out").write_text(printed)
        print(f"pretraining took {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    checkpoint = find_last_checkpoint(out / "pretrain" / "lightning_logs")  # the newest run's
    if checkpoint is None:
        raise SystemExit(
            f"no last.ckpt under {out / 'pretrain'}: pretrain first (without --skip-pretraining)"
        )

    rows = finetune_rows(
        glue=args.glue,
        storycloze=args.storycloze,
        tokenizer=tokenizer,
        context=args.context,
        checkpoint=checkpoint,
        lr=tuple(args.finetune_lr),
        epochs_for=args.epochs_for,
        steps_for=args.steps_for,
        shape=args.shape,
    )
    results: dict[str, dict[str, list[float]]] = {}  # row -> task -> best score of each seed
    for seed in args.seeds:
        for name, extra in rows.items():
            if name not in args.rows:
                continue
            print(f"\n== {name}, seed {seed} ==", flush=True)
            folder = out / name.replace(" ", "-") / f"seed-{seed}"
            if not (folder / "results.json").exists():  # a finished run is kept: rerun to go on
                cmd = [sys.executable, "benchmarks/bench_finetune.py", *extra, f"--out={folder}",
                       f"--results={folder / 'results.json.tmp'}", f"--seed_everything={seed}"]  # fmt: skip
                subprocess.run(cmd, cwd=ROOT, check=True)
                (folder / "results.json.tmp").replace(folder / "results.json")
            for row in json.loads((folder / "results.json").read_text()):
                results.setdefault(name, {}).setdefault(row["task"], []).append(100 * row["best"])
    if args.tfidf:
        scores = out / "tfidf.json"
        cmd = [sys.executable, "benchmarks/tfidf_baseline.py", f"--glue={args.glue}",
               f"--storycloze={args.storycloze}", f"--json={scores}"]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, check=True)
        results["TF-IDF + linear"] = {t: [v] for t, v in json.loads(scores.read_text()).items()}
    table = summary(results, perplexity=last_perplexity(out / "pretrain.out"))
    print("\n" + table)
    if args.report:
        Path(args.report).write_text(table)
        chart(results, Path(args.report).with_suffix(".png"))
        print(f"report: {args.report} (chart beside it)")


PAPER = {  # Radford et al. 2018: Tables 2-4 (the full model, test sets) and Table 5 (w/o pre-training)
    "pretrained": {"SST-2": 91.3, "RTE": 56.0, "STS-B": 82.0, "StoryCloze": 86.5},
    "from scratch": {"SST-2": 84.0, "RTE": 53.8, "STS-B": 30.9},
}
PAPER_ROWS = {
    "GPT-1 paper: pretrained": PAPER["pretrained"],
    "GPT-1 paper: no pretraining": PAPER["from scratch"],
}


def last_perplexity(log: Path) -> float | None:
    values = re.findall(r"validation/perplexity ([\d.]+)", log.read_text()) if log.exists() else []
    return float(values[-1]) if values else None


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def summary(results: dict[str, dict[str, list[float]]], perplexity: float | None) -> str:
    """Markdown: best validation score per task (mean ± std over seeds), the gain of pretraining,
    and the paper's figures."""
    tasks = list(next(iter(results.values())))
    lines = ["| row | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for name, by_task in results.items():
        lines.append(f"| {name} | " + " | ".join(mean_std(by_task[t]) for t in tasks) + " |")
    if "pretrained" in results and "from scratch" in results:
        gains = [statistics.fmean(results["pretrained"][t]) - statistics.fmean(results["from scratch"][t])
                 for t in tasks]  # fmt: skip
        lines.append("| gain of pretraining | " + " | ".join(f"{g:+.1f}" for g in gains) + " |")
    for name, by_task in PAPER_ROWS.items():
        lines.append(
            f"| {name} | " + " | ".join(f"{by_task[t]:.1f}" if t in by_task else "" for t in tasks) + " |"
        )
    seeds = max(len(v) for by_task in results.values() for v in by_task.values())
    note = f"Best validation epoch, {seeds} seed(s); STS-B: Pearson x 100."
    if perplexity:
        note += f" Pretraining's last validation perplexity: {perplexity:.1f}."
    return "\n".join(lines) + "\n\n" + note + "\n"


def chart(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {**{k: {t: statistics.fmean(v) for t, v in r.items()} for k, r in results.items()}, **PAPER_ROWS}
    tasks = list(next(iter(results.values())))
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (name, by_task) in enumerate(rows.items()):
        xs = [j + i * width for j, t in enumerate(tasks) if t in by_task]
        ax.bar(xs, [by_task[t] for t in tasks if t in by_task], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks)
    ax.set_ylabel("best validation score")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
