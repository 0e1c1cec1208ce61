"""GPT-1's ablation at GPU scale: a GPT-1-shaped model pretrained on the books, then fine-tuned on
SST-2, RTE, STS-B and Story Cloze, against the same model fine-tuned from scratch.

The work is split into phases, kept in OUT/state.json (--out, default runs/gpu_ablation):

    tokenizer            a byte-level BPE trained on the books (as bench_ablation.py does), or --tokenizer
    prepare              `gpt-ft prepare` of the books
    pretrain             `gpt-ft fit` of configs/pretrain/gpt1.yaml + configs/trainer/gpu.yaml (bf16-mixed)
                         for --tokens tokens (max_steps), resumed from last.ckpt in every call
    finetune-pretrained  benchmarks/bench_finetune.py, one task per run, from the pretrained checkpoint
    finetune-scratch     the same runs from a freshly initialised model of the same shape
    report               the table beside the CPU-scale ablation's and the paper's figures, as Markdown

Each call does what fits in --budget-minutes and exits 0, saying what it did and what is left;
run the same command again until it prints DONE. Pretraining stops itself in time through
Lightning's `max_time` (which counts the training time of all the resumed calls, so each call
sets it to the time already trained plus what this call can spend); stopping, Lightning validates
and gpt-ft's SaveLast writes last.ckpt, and the next call resumes from it. A fine-tuning run is
the unit of resumption: one that cannot finish before the budget runs out is stopped and run again
whole by the next call. Fine-tuning checkpoints are deleted once a run's scores are recorded, and a
resumed pretraining's older checkpoints once the newer last.ckpt is written.

On a lent GPU: the wheels (benchmarks/gpu_wheels.sh) and the data (benchmarks/gpu_data.sh) are
carried in `.whl` and `.data`, and the same device call, repeated until DONE, unpacks the data and
goes on (the machine stays warm between calls and keeps runs/; the report comes back as
$OUT/gpu_ablation.md). The call is in benchmarks/README.md.

Give --books, --glue and --storycloze where the data lies on that machine; add --compile to
torch.compile the pretraining model, --preset or --shape for a smaller one, --tokens for a longer
or shorter pretraining. Arguments after `--` go to every fine-tuning `gpt-ft fit`. The whole
pipeline runs on the CPU in a couple of minutes on a slice of the data, with a tiny model:

    python benchmarks/gpu_ablation.py --device cpu --tiny --out runs/gpu_ablation_tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_ablation import DROPOUT, PAPER, ROOT, finetune_rows, gpt_ft, prepare_books, train_tokenizer
from bench_finetune import TASKS

PHASES = ["tokenizer", "prepare", "pretrain", "finetune-pretrained", "finetune-scratch", "report"]
ROWS = {"finetune-pretrained": "pretrained", "finetune-scratch": "from scratch"}

# The settings that differ between the full run and --tiny (None in argparse: taken from here).
FULL = {
    "vocab_size": 8192,
    "preset": "gpt1",
    "shape": "",
    "context": 512,
    "batch_size": 64,
    "accumulate": 1,
    "tokens": 200_000_000,
    "pretrain_lr": 2.5e-4,
    "pretrain_dropout": 0.1,
    "val_every": 1000,
    "finetune_lr": [6.25e-5, 2.5e-4],
    "epochs_for": [],
    "steps_for": [],
}
TINY = {
    "vocab_size": 1024,
    "preset": "gpt-mini",
    "shape": "n_layer: 2, n_embd: 64, n_head: 2",
    "context": 64,
    "batch_size": 8,
    "accumulate": 1,
    "tokens": 1500 * 8 * 64,
    "pretrain_lr": 1e-3,
    "pretrain_dropout": 0.0,
    "val_every": 250,
    "finetune_lr": [2.5e-4, 1e-3],
    "epochs_for": [f"{task}=1" for task in TASKS],
    "steps_for": [f"{task}=6" for task in TASKS],
}
# --tiny: books, GLUE and validation cut to this; fine-tuning validates on a few batches.
TINY_BOOKS, TINY_BOOK_CHARS, TINY_ROWS = 3, 100_000, 200
TINY_FIT_ARGS = ["--trainer.limit_val_batches=3"]
# Seconds a call keeps for what surrounds pretraining's training time (process start, loading,
# the last checkpoint), and for a `gpt-ft validate`, until a call has measured them.
OVERHEAD = {"gpu": (90.0, 45.0, 60.0), "cpu": (10.0, 8.0, 2.0)}  # fit, validate, least worth training

# Figures to set ours beside (percent; Story Cloze and STS-B as in bench_finetune: accuracy, Pearson).
METRICS = {"SST-2": "acc", "RTE": "acc", "STS-B": "Pearson", "StoryCloze": "acc"}
CPU_SCALE = {  # README, "GPT-1 on a laptop": pre-LN gpt-mini pretrained 55 min on the books (seed means)
    "pretrained": {"SST-2": 76.2, "RTE": 53.9, "STS-B": 19.1, "StoryCloze": 68.2},
    "from scratch": {"SST-2": 76.6, "RTE": 52.9, "STS-B": 18.0, "StoryCloze": 67.1},
}
# Settings a started pretraining cannot change, and those whose change restarts the fine-tuning.
PRETRAIN_KEYS = [
    "tiny",
    "tokenizer",
    "vocab_size",
    "preset",
    "shape",
    "context",
    "batch_size",
    "accumulate",
    "tokens",
    "pretrain_lr",
    "pretrain_dropout",
    "val_every",
]
FINETUNE_KEYS = ["finetune_lr", "epochs", "epochs_for", "steps_for", "fit_args"]


def say(text: str) -> None:
    print(text, flush=True)


class Ablation:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.deadline = self.start + 60 * args.budget_minutes
        self.out = (ROOT / args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.state_file = self.out / "state.json"
        self.state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
        self.overhead = OVERHEAD["gpu" if args.device == "gpu" else "cpu"]
        if args.report:
            self.report_path = Path(args.report)
        elif os.environ.get("OUT"):
            self.report_path = Path(os.environ["OUT"]) / "gpu_ablation.md"
        else:
            self.report_path = self.out / "gpu_ablation.md"
        self.steps = math.ceil(args.tokens / (args.batch_size * args.accumulate * args.context))
        self.tokenizer: str | None = args.tokenizer
        self.tokens_dir = self.out / "tokens"
        self.check_settings()

    # ---- state ----

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        tmp = self.state_file.with_name(".state.json.tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.state_file)

    def done(self, phase: str) -> bool:
        return phase in self.state.get("done", [])

    def mark_done(self, phase: str) -> None:
        self.state.setdefault("done", [])
        if phase not in self.state["done"]:
            self.state["done"].append(phase)
        self.save()

    def check_settings(self) -> None:
        settings = {k: getattr(self.args, k) for k in PRETRAIN_KEYS + FINETUNE_KEYS}
        stored = self.state.get("settings")
        if stored is None:
            self.state["settings"] = settings
            self.save()
            return
        changed = [k for k in PRETRAIN_KEYS if stored.get(k) != settings[k]]
        if changed:
            was = ", ".join(f"{flag(k)} {stored.get(k)!r}" for k in changed)
            raise SystemExit(
                f"{self.out} holds an ablation started with {was}: give the same arguments, or another --out."
            )
        changed = [k for k in FINETUNE_KEYS if stored.get(k) != settings[k]]
        if changed:
            say(f"fine-tuning settings changed ({', '.join(flag(k) for k in changed)}): its runs start over")
            shutil.rmtree(self.out / "finetune", ignore_errors=True)
            self.state["finetune"] = {}
            self.state["done"] = [p for p in self.state.get("done", []) if p in PHASES[:3]]
            self.state["settings"] = settings
            self.save()

    # ---- phases ----

    def run(self) -> None:
        say(
            f"gpu_ablation: {self.out}, {self.args.budget_minutes:g} min for this call, "
            f"device {self.args.device}{' (tiny)' if self.args.tiny else ''}"
        )
        for phase in PHASES:
            if self.done(phase) and phase != "report":  # the report is written and printed every time
                self.say_done(phase)
                if phase == "tokenizer" and self.tokenizer is None:
                    self.tokenizer = str(self.out / "tokenizer")
                continue
            finished = getattr(self, "phase_" + phase.replace("-", "_"))()
            if not finished:
                self.write_report(final=False)
                rest = [p for p in PHASES if not self.done(p)]
                say(f"left: {', '.join(rest)}; resume with the same command")
                return
            self.mark_done(phase)
        say("DONE")

    def say_done(self, phase: str) -> None:
        st = self.state.get("pretrain", {})
        if phase == "pretrain" and st.get("perplexity"):
            say(f"pretrain: done, {st['step']} steps, validation perplexity {st['perplexity']:.2f}")
        elif phase in ROWS:
            results = self.state.get("finetune", {}).get(ROWS[phase], {})
            scores = ", ".join(f"{t} {100 * r['best']:.1f}" for t, r in results.items())
            say(f"{phase}: done ({scores})")
        else:
            say(f"{phase}: done")

    def phase_tokenizer(self) -> bool:
        if self.tokenizer is None:
            t0 = time.monotonic()
            self.tokenizer = train_tokenizer(self.out, self.books(), self.args.vocab_size)
            say(f"tokenizer: {self.tokenizer} ({time.monotonic() - t0:.0f} s)")
        else:
            say(f"tokenizer: given, {self.tokenizer}")
        return True

    def phase_prepare(self) -> bool:
        t0 = time.monotonic()
        extra = ("--piece_chars", "8192", "--validation_fraction", "0.05") if self.args.tiny else ()
        workers = min(8, os.cpu_count() or 1)
        prepare_books(self.out, self.books(), self.tokenizer, workers, extra)
        meta = json.loads((self.tokens_dir / "meta.json").read_text())
        train, val = meta["tokens"]["train"], meta["tokens"]["validation"]
        say(
            f"prepare: {train:,} training and {val:,} validation tokens in {self.tokens_dir} "
            f"({time.monotonic() - t0:.0f} s)"
        )
        if not val:
            raise SystemExit(f"{self.tokens_dir} has no validation tokens: give more books.")
        return True

    def phase_pretrain(self) -> bool:
        args, st = self.args, self.state.setdefault("pretrain", {"calls": []})
        logs = self.out / "pretrain" / "lightning_logs"
        last = newest_last(logs)
        step, trained = progress(last) if last else (0, 0.0)
        if step < self.steps:
            fit_s = st.get("fit_overhead_s", self.overhead[0])
            validate_s = st.get("validate_s", self.overhead[1])
            budget = self.left() - fit_s - validate_s
            if budget < self.overhead[2]:
                say(f"pretrain: step {step}/{self.steps}; too little of this call is left to train")
                return False
            max_time = trained + budget
            t0 = time.monotonic()
            log = self.out / f"pretrain-{len(st['calls'])}.log"
            output = self.gpt_ft(*self.pretrain_args(max_time), log=log)
            wall = time.monotonic() - t0
            last = newest_last(logs)
            if last is None:
                raise SystemExit(f"gpt-ft fit wrote no last.ckpt under {logs}; see {log}.")
            new_step, new_trained = progress(last)
            st["fit_overhead_s"] = round(max(wall - (new_trained - trained), 0.0) * 1.2 + 5, 1)
            st["calls"].append(
                {"from_step": step, "to_step": new_step, "train_s": round(new_trained - trained, 1)}
            )
            prune(logs, keep=last)
            ppl = last_perplexity(output, new_step)
            step, trained = new_step, new_trained
        else:
            ppl = st.get("perplexity") if st.get("perplexity_step") == step else None
        if ppl is None:
            t0 = time.monotonic()
            ppl = self.validate(last)
            st["validate_s"] = round((time.monotonic() - t0) * 1.2 + 5, 1)
        st.update(
            step=step, train_s=round(trained, 1), perplexity=ppl, perplexity_step=step, checkpoint=str(last)
        )
        self.save()
        tokens = step * args.batch_size * args.accumulate * args.context
        say(
            f"pretrain: step {step}/{self.steps} ({tokens / 1e6:.1f}M of {self.steps_tokens() / 1e6:.1f}M "
            f"tokens, {trained / 60:.1f} min of training in all), validation perplexity {ppl:.2f}"
        )
        return step >= self.steps

    def phase_finetune_pretrained(self) -> bool:
        return self.finetune("pretrained")

    def phase_finetune_scratch(self) -> bool:
        return self.finetune("from scratch")

    def phase_report(self) -> bool:
        self.write_report(final=True)
        return True

    # ---- pretraining ----

    def pretrain_args(self, max_time: float) -> list[str]:
        a = self.args
        model = f"n_positions: {a.context}, {DROPOUT.format(p=a.pretrain_dropout)}"
        if a.shape:
            model += f", {a.shape}"
        args = [
            "fit",
            "--config",
            "configs/pretrain/gpt1.yaml",
            *self.trainer_args(),
            f"--data.token_dir={self.tokens_dir}",
            f"--data.block_size={a.context}",
            f"--data.batch_size={a.batch_size}",
            f"--trainer.accumulate_grad_batches={a.accumulate}",
            f"--model.preset={a.preset}",
            f"--model.overrides={{{model}}}",
            f"--model.lr={a.pretrain_lr}",
            f"--model.warmup_steps={min(2000, max(1, self.steps // 10))}",
            f"--trainer.max_steps={self.steps}",
            "--trainer.max_epochs=-1",
            f"--trainer.max_time={duration(max_time)}",
            f"--trainer.val_check_interval={a.val_every * a.accumulate}",
            f"--trainer.logger.init_args.save_dir={self.out / 'pretrain'}",
            "--trainer.enable_progress_bar=false",
            "--ckpt_path=last",
        ]
        if a.compile:
            args.append("--model.compile=true")
        return args

    def trainer_args(self) -> list[str]:
        """One GPU in bf16-mixed, or the CPU (for every `gpt-ft fit` and `validate`)."""
        return (
            ["--config=configs/trainer/gpu.yaml"]
            if self.args.device == "gpu"
            else ["--trainer.accelerator=cpu"]
        )

    def validate(self, checkpoint: Path) -> float:
        output = self.gpt_ft(
            "validate",
            f"--ckpt_path={checkpoint}",
            *self.trainer_args(),
            f"--trainer.logger.init_args.save_dir={self.out / 'validate'}",
            "--trainer.enable_progress_bar=false",
            log=self.out / "validate.log",
        )
        found = re.findall(r"validation/perplexity\s+([\d.]+)", output)
        if not found:
            raise SystemExit(
                f"gpt-ft validate printed no validation perplexity; see {self.out / 'validate.log'}."
            )
        return float(found[0])

    def steps_tokens(self) -> int:
        return self.steps * self.args.batch_size * self.args.accumulate * self.args.context

    def gpt_ft(self, *args: str, log: Path) -> str:
        try:
            return gpt_ft(*args, log=log)
        except SystemExit:
            show_tail(log)
            raise

    # ---- fine-tuning ----

    def finetune(self, row: str) -> bool:
        a = self.args
        results = self.state.setdefault("finetune", {}).setdefault(row, {})
        folder = self.out / "finetune" / row.replace(" ", "-")
        for task in a.tasks:
            if task in results:
                say(f"{row} {task}: done, best {100 * results[task]['best']:.1f}")
                continue
            need = self.estimate(row, task)
            left = self.left()
            if left < (need or self.overhead[0]):
                why = f"needs about {need:.0f} s" if need else "not started"
                say(f"{row} {task}: {why}, {max(left, 0):.0f} s of this call left")
                return False
            shutil.rmtree(folder / task, ignore_errors=True)  # a run stopped by an earlier call
            result = folder / f"{task}.json"
            cmd = [
                sys.executable,
                "benchmarks/bench_finetune.py",
                *self.rows()[row],
                f"--tasks={task}",
                f"--epochs={a.epochs}",
                f"--out={folder}",
                f"--results={result}",
                *self.trainer_args(),
                *(TINY_FIT_ARGS if a.tiny else []),
                *a.fit_args,
            ]
            say(f"\n== {row}: {task} ==")
            t0 = time.monotonic()
            log = self.out / "finetune.log"
            finished = run_before(cmd, self.deadline, log)
            seconds = time.monotonic() - t0
            if finished is None:
                stopped = self.state.setdefault("stopped", {})
                stopped[f"{row}/{task}"] = round(seconds, 1)
                self.save()
                if seconds > 0.8 * 60 * a.budget_minutes:
                    raise SystemExit(
                        f"{row} {task} did not finish in {seconds / 60:.1f} min, most of a call: give it "
                        f"fewer epochs or steps (--epochs-for {task}=N, --steps-for {task}=N) or more "
                        "--budget-minutes."
                    )
                say(f"{row} {task}: stopped after {seconds:.0f} s, at the end of this call's budget")
                return False
            if finished != 0 or not result.exists():
                show_tail(log)
                raise SystemExit(f"{row} {task} failed (exit {finished}); its output is above.")
            (row_result,) = json.loads(result.read_text())
            results[task] = {**row_result, "seconds": round(seconds, 1)}
            self.save()
            for ckpt in (folder / task).rglob("*.ckpt"):
                ckpt.unlink()
        return True

    def rows(self) -> dict[str, list[str]]:
        a = self.args
        return finetune_rows(
            glue=self.glue(),
            storycloze=a.storycloze,
            tokenizer=self.tokenizer,
            context=a.context,
            checkpoint=Path(self.state["pretrain"]["checkpoint"]),
            lr=tuple(a.finetune_lr),
            epochs_for=a.epochs_for,
            steps_for=a.steps_for,
            preset=a.preset,
            shape=a.shape,
        )

    def estimate(self, row: str, task: str) -> float | None:
        """Seconds the run should take: the other row's run of the task, else at least what a
        stopped attempt took."""
        for other, results in self.state.get("finetune", {}).items():
            if other != row and task in results:
                return results[task]["seconds"] * 1.15 + 10
        stopped = self.state.get("stopped", {}).get(f"{row}/{task}")
        # A run stopped late in a call gets the next call's whole budget, whatever it needs.
        return min(stopped * 1.2, 0.9 * 60 * self.args.budget_minutes) if stopped else None

    # ---- data ----

    def books(self) -> str:
        if not self.args.tiny:
            return self.args.books
        folder = self.out / "tiny-books"
        if not folder.exists():
            files = sorted((ROOT / self.args.books).glob("*.txt"))[:TINY_BOOKS]
            if not files:
                raise SystemExit(f"{self.args.books} holds no .txt books.")
            folder.mkdir()
            for f in files:
                (folder / f.name).write_text(
                    f.read_text(encoding="utf-8")[:TINY_BOOK_CHARS], encoding="utf-8"
                )
        return str(folder)

    def glue(self) -> str:
        if not self.args.tiny:
            return self.args.glue
        folder = self.out / "tiny-glue"
        if not folder.exists():
            for card in ("SST-2", "RTE", "STS-B"):
                (folder / card).mkdir(parents=True)
                for split in ("train", "dev", "test"):
                    with open(ROOT / self.args.glue / card / f"{split}.tsv", encoding="utf-8") as f:
                        head = [line for _, line in zip(range(TINY_ROWS + 1), f)]
                    (folder / card / f"{split}.tsv").write_text("".join(head), encoding="utf-8")
        return str(folder)

    # ---- report ----

    def write_report(self, final: bool) -> None:
        results = self.state.get("finetune", {})
        pretrain = self.state.get("pretrain", {})
        if not results and not pretrain.get("step"):
            return
        text = self.report(results, pretrain, final)
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        self.report_path.write_text(text)
        if final:
            say("\n" + text)
        say(f"report: {self.report_path}")

    def report(self, results: dict, pretrain: dict, final: bool) -> str:
        a = self.args
        tasks = [t for t in TASKS if t in a.tasks]
        head = "| | " + " | ".join(f"{t} {METRICS[t]}" for t in tasks) + " |"
        lines = [head, "|---" * (len(tasks) + 1) + "|"]

        def row(name: str, values: dict, digits: str = ".1f", sign: str = "") -> None:
            cells = [format(values[t], sign + digits) if t in values else "–" for t in tasks]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")

        ours = {r: {t: 100 * v["best"] for t, v in results.get(r, {}).items()} for r in ROWS.values()}
        scale = "tiny check" if a.tiny else "GPU scale"
        row(f"{scale}: pretrained", ours["pretrained"])
        row(f"{scale}: from scratch", ours["from scratch"])
        both = set(ours["pretrained"]) & set(ours["from scratch"])
        row(f"{scale}: gain", {t: ours["pretrained"][t] - ours["from scratch"][t] for t in both}, sign="+")
        row("CPU scale (README): pretrained", CPU_SCALE["pretrained"])
        row("CPU scale (README): from scratch", CPU_SCALE["from scratch"])
        row("GPT-1 paper: pretrained", PAPER["pretrained"])
        row("GPT-1 paper: w/o pre-training (Table 5)", PAPER["from scratch"])

        shape = a.preset + (f" with {{{a.shape}}}" if a.shape else "")
        epochs = ", ".join([f"{a.epochs} each", *a.epochs_for])
        steps = f"; steps {', '.join(a.steps_for)}" if a.steps_for else ""
        setup = (
            "Best validation score per task (percent), fine-tuned from the pretrained model and from "
            f"scratch: the same tokenizer ({a.vocab_size} tokens, byte-level BPE trained on the books), "
            f"shape ({shape}, context {a.context}), data and epochs ({epochs}{steps}); learning rates "
            f"{a.finetune_lr[0]:g} (pretrained) and {a.finetune_lr[1]:g} (scratch)."
        )
        step = pretrain.get("step", 0)
        ppl = pretrain.get("perplexity")
        how = (
            f"device {a.device}"
            + (", bf16-mixed" if a.device == "gpu" else "")
            + (", compiled" if a.compile else "")
        )
        pretraining = (
            f"Pretraining: {step * a.batch_size * a.accumulate * a.context / 1e6:.1f}M tokens ({step} of "
            f"{self.steps} steps of {a.batch_size * a.accumulate} x {a.context}), "
            f"{pretrain.get('train_s', 0) / 60:.1f} min of training in {len(pretrain.get('calls', []))} "
            f"call(s), {how}" + (f"; validation perplexity {ppl:.2f}." if ppl else ".")
        )
        left = ", ".join(p for p in PHASES if not self.done(p))
        text = [
            "# GPT-1's pretraining ablation" + (" (tiny check)" if a.tiny else " at GPU scale"),
            "",
            *([] if final else [f"*In progress: {left} left.*", ""]),
            setup,
            "",
            pretraining,
            "",
            *lines,
            "",
            "The paper's figures are test-set scores of the 12-layer GPT-1 pretrained on BooksCorpus; "
            "ours and the CPU-scale ones are validation scores (Story Cloze: the last 374 rows of the "
            "2016 validation set; the rest trains).",
            "",
            "| run | task | epochs | s/epoch | last | best | seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, by_task in results.items():
            for t, r in by_task.items():
                text.append(
                    f"| {name} | {t} | {r['epochs']} | {r['seconds_per_epoch']:.0f} | "
                    f"{100 * r['last']:.1f} | {100 * r['best']:.1f} | {r['seconds']:.0f} |"
                )
        return "\n".join(text) + "\n"


# ---- helpers ----


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def duration(seconds: float) -> str:
    """Lightning's max_time, DD:HH:MM:SS."""
    s = max(1, int(seconds))
    return f"{s // 86400:02d}:{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def newest_last(logs: Path) -> Path | None:
    found = [p for p in logs.glob("version_*/checkpoints/last.ckpt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def progress(checkpoint: Path) -> tuple[int, float]:
    """(optimizer steps, seconds trained) of a checkpoint, as Lightning's Timer counts them."""
    import torch

    ckpt = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=True)
    timer = next((v for k, v in ckpt.get("callbacks", {}).items() if k.startswith("Timer")), {})
    return int(ckpt["global_step"]), float(timer.get("time_elapsed", {}).get("train", 0.0))


def prune(logs: Path, keep: Path) -> None:
    """Deletes the checkpoints of the runs before the one holding `keep`."""
    for ckpt in logs.glob("version_*/checkpoints/*.ckpt"):
        if ckpt.parent != keep.parent:
            ckpt.unlink()


def last_perplexity(output: str, step: int) -> float | None:
    """The validation perplexity `gpt-ft fit` printed at `step`, if it validated there."""
    found = re.findall(r"^\s*epoch \d+ step (\d+): .*?validation/perplexity ([\d.]+)", output, re.M)
    return next((float(p) for s, p in reversed(found) if int(s) == step), None)


def run_before(cmd: list[str], deadline: float, log: Path) -> int | None:
    """Runs `cmd` in the project root, printing its output; its exit code, or None when it was
    stopped (with its children) at `deadline`."""
    say("$ " + " ".join(cmd[1:]))
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=sink, text=True, start_new_session=True
        )

        def echo() -> None:
            for line in proc.stdout:
                say("  " + line.rstrip("\n"))

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        reader.join(timeout=5)
    return code


def show_tail(log: Path, lines: int = 25) -> None:
    if log.exists():
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        say(f"--- last lines of {log} ---\n" + "\n".join(tail))


def parse_args(argv: list[str]) -> argparse.Namespace:
    fit_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument(
        "--books", default="../shared/data/lm/books", help="folder of .txt books to pretrain on"
    )
    data.add_argument("--glue", default="../shared/data/glue", help="folder holding SST-2, RTE, STS-B")
    data.add_argument("--storycloze", default="../shared/data/storycloze", help="the Story Cloze 2016 folder")
    data.add_argument("--tokenizer", default=None, help="a tokenizer folder; default: train one on the books")
    data.add_argument(
        "--vocab-size", type=int, help="of the tokenizer trained on the books (8192; tiny 1024)"
    )
    model = p.add_argument_group("pretraining (defaults: full run; --tiny)")
    model.add_argument("--preset", help="GPT preset (gpt1; gpt-mini)")
    model.add_argument(
        "--shape", help="changes to the preset, e.g. 'n_layer: 6, n_embd: 384, n_head: 6' ('' ; 2 x 64)"
    )
    model.add_argument("--context", type=int, help="model context = pretraining block (512; 64)")
    model.add_argument("--batch-size", type=int, help="sequences per micro-batch (64; 8)")
    model.add_argument(
        "--accumulate",
        type=int,
        help="micro-batches per optimizer step (1; 1); above 1, a call stopping inside an accumulation "
        "window resumes without that window's first micro-batches",
    )
    model.add_argument("--tokens", type=int, help="pretraining tokens, made max_steps (200M; 768,000)")
    model.add_argument("--pretrain-lr", type=float, help="peak rate, cosine to 0 (2.5e-4; 1e-3)")
    model.add_argument("--pretrain-dropout", type=float, help="dropout while pretraining (0.1; 0)")
    model.add_argument(
        "--val-every", type=int, help="validate (and save last.ckpt) every N steps (1000; 250)"
    )
    model.add_argument("--compile", action="store_true", help="torch.compile the pretraining model")
    tune = p.add_argument_group("fine-tuning (benchmarks/bench_finetune.py)")
    tune.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    tune.add_argument(
        "--finetune-lr",
        nargs=2,
        type=float,
        metavar=("PRETRAINED", "SCRATCH"),
        help="(6.25e-5 2.5e-4; 2.5e-4 1e-3)",
    )
    tune.add_argument("--epochs", type=int, default=3, help="epochs per task (GPT-1: 3)")
    tune.add_argument("--epochs-for", nargs="*", help="per-task epochs, e.g. SST-2=1 (none; each 1)")
    tune.add_argument("--steps-for", nargs="*", help="per-task step budgets, e.g. SST-2=600 (none; each 6)")
    run = p.add_argument_group("the run")
    run.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    run.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny model on a slice of the data: the pipeline in minutes on a CPU",
    )
    run.add_argument(
        "--out", default="runs/gpu_ablation", help="state, checkpoints, logs (relative to the project)"
    )
    run.add_argument("--budget-minutes", type=float, default=8.5, help="what this call may spend")
    run.add_argument(
        "--report", default=None, help="Markdown report; default $OUT/gpu_ablation.md, else in --out"
    )
    args = p.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.fit_args = fit_args
    for item in args.epochs_for + args.steps_for:
        if "=" not in item or item.split("=")[0] not in TASKS:
            p.error(f"{item!r} is not TASK=N with TASK one of {', '.join(TASKS)}")
    return args


def main() -> None:
    args = parse_args(sys.argv[1:])
    if args.tiny and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"  # a tiny model runs fastest on one thread
    Ablation(args).run()


if __name__ == "__main__":
    main()
