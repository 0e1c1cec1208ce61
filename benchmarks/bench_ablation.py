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


def print_table(results: dict[str, dict[str, dict]]) -> None:
    """Best validation score per task, one line per row (`results`: row -> task -> bench_finetune row)."""
    tasks = list(next(iter(results.values())))
    print(f"\n{'best validation score':<22}" + "".join(f"{t:>12}" for t in tasks))
    for name, by_task in results.items():
        print(f"{name:<22}" + "".join(f"{100 * by_task[t]['best']:>12.1f}" for t in tasks))


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
    args = parser.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = args.tokenizer or train_tokenizer(out, args.books, args.vocab_size)
    tokens = prepare_books(out, args.books, tokenizer)

    if not args.skip_pretraining:
        start = time.perf_counter()
        minutes = int(args.minutes)
        gpt_ft(
            "fit",
            "--config",
            "configs/pretrain/cpu.yaml",
            f"--data.token_dir={tokens}",
            f"--data.block_size={args.context}",
            f"--data.batch_size={args.batch_size}",
            # Less than one pass over the books: no dropout while pretraining.
            f"--model.overrides={{n_positions: {args.context}, {DROPOUT.format(p=0.0)}}}",
            f"--trainer.max_steps={args.steps}",
            f"--trainer.max_time=00:{minutes // 60:02d}:{minutes % 60:02d}:00",
            "--trainer.val_check_interval=250",
            "--trainer.limit_val_batches=50",
            f"--model.lr={args.pretrain_lr}",
            f"--model.warmup_steps={max(1, args.steps // 10)}",
            f"--trainer.logger.init_args.save_dir={out / 'pretrain'}",
            "--trainer.enable_progress_bar=false",
            log=out / "pretrain.log",
        )
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
    )
    results = {}
    for name, extra in rows.items():
        print(f"\n== {name} ==", flush=True)
        folder = out / name.replace(" ", "-")
        cmd = [
            sys.executable,
            "benchmarks/bench_finetune.py",
            *extra,
            f"--out={folder}",
            f"--results={folder / 'results.json'}",
        ]
        subprocess.run(cmd, cwd=ROOT, check=True)
        results[name] = {row["task"]: row for row in json.loads((folder / "results.json").read_text())}
    print_table(results)


if __name__ == "__main__":
    main()
