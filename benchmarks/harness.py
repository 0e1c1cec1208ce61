"""What the benchmark scripts share: interleaved timing, training steps, a Markdown/JSON report,
commands under a hard limit, `gpt-ft` as a subprocess, its logged metrics, random tokens, the
attention kernel a step runs. It imports no Lightning: the GPU checklist starts at once.

Scripts import this module as `harness` (Python puts the script's folder first on its path).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"


# ---- timing ----


def synchronize(device: str | None = None) -> None:
    """Waits for the GPU's queued work (on `device`, or wherever CUDA is in use)."""
    if device == "cuda" or (device is None and torch.cuda.is_initialized()):
        torch.cuda.synchronize()


@dataclass
class Stats:
    """Seconds per call over the runs."""

    times: list[float]

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    def rate(self, units: float) -> str:
        """`units` per second: the median, with the range of the runs."""
        return f"{units / self.median:,.0f} ({units / self.max:,.0f}-{units / self.min:,.0f})"


def measure(fn: Callable[[], object], number: int = 1) -> float:
    """Seconds per call of `fn` over `number` calls, the GPU's queue drained before and after.
    (torch.utils.benchmark's Timer adds two warm-up calls to every measurement: too many for steps
    that take seconds, which `interleaved` warms up once.)"""
    synchronize()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    synchronize()
    return (time.perf_counter() - start) / number


def interleaved(
    fns: dict[Hashable, Callable[[], object]], runs: int, number: int = 1, warmup: int = 1
) -> dict[Hashable, Stats]:
    """Times each of `fns` once per run, interleaved so that machine noise hits all alike, the
    order reversed every other run; `warmup` untimed calls of each first."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    for run in range(runs):
        for name in fns if run % 2 == 0 else list(fns)[::-1]:
            times[name].append(measure(fns[name], number))
    return {name: Stats(t) for name, t in times.items()}


def timed(fn: Callable[[], object], repeat: int = 3) -> Stats:
    """`fn` timed `repeat` times after one untimed call."""
    return interleaved({"fn": fn}, runs=repeat)["fn"]


def logits_loss(hf: bool) -> Callable:
    """The mean next-token cross-entropy of `ids` through the full logits of ours (or, with `hf`,
    of a transformers model): one formula for both libraries, to compare their models alone."""

    def loss(model, ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids[:, :-1]).logits if hf else model.lm_logits(model(ids[:, :-1]))
        return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())

    return loss


def lm_step(
    model,
    optimizer,
    ids: torch.Tensor,
    autocast: torch.dtype | None,
    hf: bool = False,
    loss_fn: Callable | None = None,
):
    """One language-modelling training step of `model` (ours, or transformers' with `hf`) on `ids`:
    `loss_fn(model, ids)` (by default the plain cross-entropy of the model's logits), backward,
    optimizer step."""
    loss_fn = loss_fn or logits_loss(hf)

    def step() -> None:
        with torch.autocast(ids.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            loss = loss_fn(model, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# ---- reports ----


@dataclass
class Row:
    check: str
    result: str
    status: str = ""  # "pass", "FAIL", "skip", or "" for a figure


@dataclass
class Report:
    """Rows of figures, written as a Markdown table and as JSON."""

    title: str
    note: str = ""
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"    {row.check}: {row.result} {row.status}", file=sys.stderr, flush=True)

    @property
    def failed(self) -> int:
        return sum(r.status == "FAIL" for r in self.rows)

    def markdown(self) -> str:
        lines = [f"# {self.title}", "", *([self.note, ""] if self.note else [])]
        lines += ["| check | result | |", "|---|---|---|"]
        lines += [f"| {r.check} | {r.result} | {r.status} |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> None:
        """The Markdown at `path`, the JSON beside it (same name, .json)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        for file, text in (
            (path, self.markdown()),
            (path.with_suffix(".json"), json.dumps(asdict(self), indent=1)),
        ):
            partial = file.with_name(
                f".{file.name}.partial"
            )  # a process killed while writing leaves the last
            partial.write_text(text.rstrip("\n") + "\n")
            partial.replace(file)

    @classmethod
    def read(cls, path: Path) -> Report:
        data = json.loads(path.read_text())
        return cls(data["title"], data["note"], [Row(**r) for r in data["rows"]])


def device(name: str) -> str:
    """`--device`'s type: `cuda` on a machine without one is refused in one sentence, not a traceback."""
    if name == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("cuda: no CUDA device here (torch.cuda.is_available() is False)")
    return name


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def report_argument(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--report", type=Path, default=RUNS / f"{name}.md", help=f"Markdown report (default runs/{name}.md)"
    )


# ---- gpt-ft ----


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float


def gpt_ft(*args: str, log: Path | None = None, echo: bool = True, check: bool = True) -> Run:
    """Runs `gpt-ft ARGS` in the project root; its stdout is returned (and printed as it comes with `echo`),
    its stderr goes to `log`. With `check`, a failure ends the script in stderr's last line, tail shown."""
    cmd = [sys.executable, "-m", "gpt_ft", *args]
    if echo:
        print(f"$ gpt-ft {' '.join(args)}", flush=True)
    lines, start = [], time.perf_counter()
    sink = open(log, "w+", errors="replace") if log else tempfile.TemporaryFile("w+", errors="replace")
    try:
        with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=sink, text=True) as proc:
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    print("  " + line.rstrip("\n"), flush=True)
        sink.seek(0)  # (with no log, its words are said all the same)
        text = sink.read() if check and proc.returncode else ""
    finally:
        sink.close()
    if check and proc.returncode != 0:
        print(text[-3000:], end="", file=sys.stderr)
        last = [line.strip() for line in text.splitlines() if line.strip()][-1:]
        raise SystemExit(
            f"gpt-ft {args[0]} failed (exit {proc.returncode}){''.join(f': {t[:300]}' for t in last)}"
        )
    return Run(proc.returncode, "".join(lines), time.perf_counter() - start)


def metrics_rows(log_dir: Path) -> list[dict[str, str]]:
    """The rows of the newest metrics.csv (CSVLogger) under `log_dir`."""
    files = sorted(log_dir.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime_ns)
    if not files:
        return []
    with open(files[-1]) as f:
        return list(csv.DictReader(f))


def last_value(rows: list[dict[str, str]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key)]
    return values[-1] if values else None


# ---- pieces of runs ----


def random_tokens(folder: Path, vocab_size: int, train: int, validation: int) -> Path:
    """A `gpt-ft prepare`-shaped folder of random tokens."""
    import numpy as np

    from gpt_ft.data.folders import tokenizer_digests
    from gpt_ft.data.prepare import META, SPLIT_FILES, token_dtype

    # Checkpoints keep the data's tokenizer beside them: any small one will do for random tokens.
    shutil.copytree(ROOT / "examples" / "quickstart" / "tokenizer", folder / "tokenizer", dirs_exist_ok=True)
    dtype, counts = token_dtype(vocab_size), {"train": train, "validation": validation}
    rng = np.random.default_rng(0)
    for split, n in counts.items():
        rng.integers(0, vocab_size, n, dtype=np.int64).astype(dtype).tofile(folder / SPLIT_FILES[split])
    meta = {"dtype": dtype, "vocab_size": vocab_size, "eos_token_id": None, "tokens": counts, "documents": 1,
            "tokenizer": "tokenizer", "tokenizer_files": tokenizer_digests(folder / "tokenizer"),
            "sources": ["random"], "seconds": 0}  # fmt: skip
    (folder / META).write_text(json.dumps(meta))
    return folder


def bar_chart(rows: dict[str, dict[str, float]], path: Path, ylabel: str) -> None:
    """Grouped bars, one group per column (the first row's keys), one bar per row, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = list(next(iter(rows.values())))
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (name, values) in enumerate(rows.items()):
        xs = [j + i * width for j, c in enumerate(columns) if c in values]
        ax.bar(xs, [values[c] for c in columns if c in values], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], columns)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def padding_ceiling(train: Path, batch_size: int, epochs: int = 20) -> float:
    """Positions per real token that shuffled padded batches compute over the training split (the
    mean of `epochs` shuffles): what padding-free batches can save at most, as a ratio of work."""
    lengths = [len(json.loads(line)["input_ids"]) for line in train.open()]  # jsonl rows
    draw, padded = random.Random(0), 0
    for _ in range(epochs):
        order = draw.sample(lengths, len(lengths))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        padded += sum(max(b) * len(b) for b in batches)
    return padded / (epochs * sum(lengths))
