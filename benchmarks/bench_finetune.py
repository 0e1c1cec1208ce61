"""Fine-tune a model on real task data through `gpt-ft fit` and report time per epoch and the metric.

With no --init-from this is the "no pre-training" baseline (GPT-1 Table 5): the quickstart-sized
model from scratch. Each task runs as its own `gpt-ft fit` process; the printed line per epoch
holds the validation metrics and the epoch's wall time (training and validation).

    python benchmarks/bench_finetune.py --glue GLUE_DIR --storycloze STORYCLOZE_DIR \\
        --tokenizer OPENAI_GPT_DIR --epochs 3
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from paths import existing

ROOT = Path(__file__).resolve().parents[1]
TASKS = {  # card, data folder argument, metric printed
    "SST-2": ("tasks/glue/sst2.yaml", "glue", "validation/accuracy"),
    "RTE": ("tasks/glue/rte.yaml", "glue", "validation/accuracy"),
    "STS-B": ("tasks/glue/stsb.yaml", "glue", "validation/pearson"),
    "StoryCloze": ("tasks/storycloze.yaml", "storycloze", "validation/accuracy"),
}
LINE = re.compile(r"^epoch (\d+) step (\d+): (.*?)(?: \(([\d.]+) s\))?$")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", type=existing, required=True)
    parser.add_argument("--storycloze", type=existing, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--init-from", default=None, help="pretrained weights; none: from scratch")
    parser.add_argument("--preset", default="gpt-mini")
    parser.add_argument("--overrides", default="{}", help="GPTConfig changes, e.g. '{n_positions: 256}'")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epochs-for", nargs="*", default=[], help="per-task epochs, e.g. SST-2=1")
    parser.add_argument(
        "--steps-for",
        nargs="*",
        default=[],
        help="per-task step budget, validated at its end, e.g. SST-2=600",
    )
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--out", default="runs/bench_finetune")
    parser.add_argument("--results", default=None, help="also write the table's rows to this JSON file")
    args, extra = parser.parse_known_args()
    epochs_for, steps_for = (
        per_task(parser, "--epochs-for", args.epochs_for),
        per_task(parser, "--steps-for", args.steps_for),
    )
    rows = []
    for name in args.tasks:
        card, folder, metric = TASKS[name]
        data_dir = getattr(args, folder)
        # GPT-1's recipe, but a small model from scratch takes the quickstart's larger rate and warmup.
        cmd = [
            sys.executable,
            "-m",
            "gpt_ft",
            "fit",
            "--config",
            "configs/finetune/gpt1.yaml",
            "--model.warmup_fraction=0.1",
            f"--data.task={card}",
            f"--data.tokenizer={args.tokenizer}",
            f"--data.data_dir={data_dir}",
            f"--data.max_length={args.max_length}",
            f"--data.batch_size={args.batch_size}",
            f"--model.preset={args.preset}",
            f"--model.overrides={args.overrides}",
            f"--model.lr={args.lr}",
            f"--trainer.max_epochs={epochs_for.get(name, args.epochs)}",
            f"--trainer.logger.init_args.save_dir={args.out}/{name}",
            "--trainer.enable_progress_bar=false",
        ]
        if args.init_from:
            cmd.append(f"--model.init_from={args.init_from}")
        if name in steps_for:
            cmd += [  # validated at its end, whatever the epoch's length (a budget past one epoch)
                f"--trainer.max_steps={steps_for[name]}",
                f"--trainer.val_check_interval={steps_for[name]}",
                "--trainer.check_val_every_n_epoch=null",
            ]
        print(f"$ {' '.join(cmd[2:])}", flush=True)
        out = subprocess.run(cmd + extra, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(out.stderr[-3000:])
            raise SystemExit(f"{name} failed")
        epochs = []
        for line in out.stdout.splitlines():
            m = LINE.match(line)
            if m:
                print("  " + line, flush=True)
                values = dict(item.rsplit(" ", 1) for item in m[3].split(", "))
                epochs.append((float(values[metric]), float(m[4] or "nan")))
        best = max(v for v, _ in epochs)
        per_epoch = sum(t for _, t in epochs) / len(epochs)
        rows.append((name, metric.split("/")[1], len(epochs), per_epoch, epochs[-1][0], best))
    print(f"\n{'task':<11} {'metric':<9} {'epochs':>6} {'s/epoch':>8} {'last':>7} {'best':>7}")
    for name, metric, n, seconds, last, best in rows:
        print(f"{name:<11} {metric:<9} {n:>6} {seconds:>8.0f} {100 * last:>7.1f} {100 * best:>7.1f}")
    if args.results:
        keys = ("task", "metric", "epochs", "seconds_per_epoch", "last", "best")
        Path(args.results).write_text(json.dumps([dict(zip(keys, row)) for row in rows], indent=1))


def per_task(parser, option: str, items: list[str]) -> dict[str, int]:
    """`TASK=N` items as {TASK: N}, each TASK one of TASKS (a misspelt one was silently ignored)."""
    found = {}
    for item in items:
        name, _, n = item.partition("=")
        if name not in TASKS or not n.isdigit():
            parser.error(f"{option} {item!r}: give TASK=N, TASK one of {', '.join(TASKS)}")
        found[name] = int(n)
    return found


if __name__ == "__main__":
    main()
