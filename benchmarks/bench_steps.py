"""Process reward models on PRMBench: `gpt-ft fit` against transformers' Trainer with a token
classifier, end to end, on the same weights, solutions and schedule; the trivial baselines beside.

PRMBench's rows (its 25 JSON-lines files: PRM800K solutions with planted errors, `error_steps`
counted from 1) are split by question (seed 0; 80/10/10 of the questions, so that no question is in
two splits) into OUT/{train,validation,test}.jsonl, which tasks/steps/prmbench.yaml reads. A row
whose error step lies outside its solution is dropped and counted (PRMBench has 100). `--train-size`
and `--eval-size` keep the first records of the questions in that order. Then, one whole process
each, in turns:

- `ours`: `gpt-ft fit` on tasks/steps/prmbench.yaml (`[start] question [delim] step_1 [extract] ...`,
  packed batches, binary cross-entropy at every step's extract token, no auxiliary LM loss: the
  defaults), validating at the end (which chooses the threshold), then `gpt-ft test` from last.ckpt;
- `ours, from scratch`: the same shape and tokenizer, random weights;
- `Trainer`: transformers' `Trainer` with `*ForTokenClassification` (2 labels) from the same folder,
  on gpt_ft's token ids, labels at each extract token and -100 elsewhere (what TRL's PRMTrainer
  built), `DataCollatorForTokenClassification`'s padding; then the validation split chooses the
  threshold (the same grid) and the test split is scored.

Both take the same batch of solutions, learning rate, linear schedule with --warmup of the steps,
weight decay 0.01, clipping at 1.0, epochs and seed; neither saves more than gpt_ft's last.ckpt.
Scored on the test split: F1 of the wrong steps, first-error accuracy and ProcessBench's F1. The
baselines need no model: "no error" judges every step right, "the last step" the last step wrong.

    python benchmarks/bench_steps.py --prmbench PRMBENCH_DIR \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf

`--rounds R` runs every contender R times in turns and keeps its fastest run (a busy machine only
ever slows a run), printing every run's time. `--tokenizer DIR --layers L --width W` starts from
random weights instead. `pip install -e .[bench]` brings `accelerate`, which the Trainer needs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_vs_trainer  # noqa: E402  (the model folders and the timing of whole processes)
import harness  # noqa: E402
import peers  # noqa: E402  (the Trainer's side: its arguments and schedule)
from paths import existing

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "tasks" / "steps" / "prmbench.yaml"
CONTENDERS = ["ours", "ours, from scratch", "Trainer"]
METRICS = ("step_f1", "first_error_accuracy", "processbench_f1")


def split_prmbench(args, out: Path) -> tuple[Path, int]:
    """OUT/data/{train,validation,test}.jsonl split by question, and how many rows were dropped."""
    data = out / "data"
    rows, dropped = [], 0
    files = sorted(Path(args.prmbench).glob("*.jsonl"))
    if not files:
        below = sorted({str(p.parent) for p in Path(args.prmbench).glob("*/*.jsonl")})
        raise SystemExit(
            f"--prmbench {args.prmbench} holds no .jsonl files: give PRMBench's folder of them"
            + (f" ({', '.join(below)}?)" if below else ".")
        )
    for path in files:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            n = len(row["modified_process"])
            if all(1 <= k <= n for k in row["error_steps"]):
                rows.append(row)
            else:
                dropped += 1
    questions = sorted({r["original_question"] for r in rows})
    random.Random(0).shuffle(questions)
    cut = [0, round(len(questions) * 0.8), round(len(questions) * 0.9), len(questions)]
    order = {q: i for i, q in enumerate(questions)}
    rows.sort(key=lambda r: order[r["original_question"]])  # a question's rows together, questions shuffled
    data.mkdir(parents=True, exist_ok=True)
    for k, split in enumerate(("train", "validation", "test")):
        kept = [r for r in rows if cut[k] <= order[r["original_question"]] < cut[k + 1]]
        kept = kept[: args.train_size if split == "train" else args.eval_size]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    return data, dropped


def encoded_steps(args, base: Path, data: Path, out: Path) -> dict[str, Path]:
    """Each split as gpt_ft encodes it (which also fills its cache), as the Trainer's jsonl: the
    token ids and a label at each extract token (1 right, 0 wrong), -100 elsewhere."""
    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule

    module = TaskDataModule(load_card(CARD), str(base), data_dir=str(data), max_length=args.max_length)
    files = {}
    for split in ("train", "validation", "test"):
        path = files[split] = out / f"{base.name}-{split}.jsonl"
        encoded = module.encoded(split, labelled=True)
        with path.open("w") as f:
            for ids, at, label in zip(encoded["input_ids"], encoded["extract_index"], encoded["label"]):
                labels = [-100] * len(ids[0])
                for k, value in zip(at, label):
                    labels[k] = -100 if value != value else int(value >= 0.5)  # NaN: unlabelled
                f.write(json.dumps({"input_ids": ids[0], "labels": labels}) + "\n")
    return files


def ours(
    args,
    base: Path,
    data: Path,
    out: Path,
    *,
    card: Path = CARD,
    scratch: bool = False,
    validate: bool = True,
) -> list[list[str]]:
    """`gpt-ft fit` of `card` (from `base`, or at its shape from scratch), then `gpt-ft test`."""
    precision = "bf16-mixed" if args.device == "cuda" or args.bf16 else "32-true"
    start = [f"--model.preset={args.preset}", f"--model.overrides={json.dumps(args.overrides)}"] if scratch \
        else [f"--model.init_from={base}"]  # fmt: skip
    common = [
        f"--data.task={card}", f"--data.data_dir={data}", f"--data.tokenizer={base}",
        f"--data.max_length={args.max_length}", f"--data.batch_size={args.batch_size}",
        f"--trainer.precision={precision}", f"--trainer.accelerator={args.device}",
        "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}",
    ]  # fmt: skip
    fit = [
        sys.executable, "-m", "gpt_ft", "fit", *common, *start, f"--model.lr={args.lr}",
        f"--model.warmup_fraction={args.warmup}", "--model.weight_decay=0.01", "--seed_everything=0",
        f"--trainer.max_epochs={args.epochs}", "--trainer.gradient_clip_val=1.0",
        *([] if validate else ["--trainer.limit_val_batches=0"]),
    ]  # fmt: skip
    shutil.rmtree(out / "lightning_logs", ignore_errors=True)  # a rerun's test reads its own version_0
    last = out / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    return [fit, [sys.executable, "-m", "gpt_ft", "test", *common, f"--ckpt_path={last}"]]


def trainer(args, base: Path, files: dict[str, Path], out: Path) -> list[str]:
    return [
        sys.executable, __file__, "trainer", f"--base={base}", f"--train={files['train']}",
        f"--dev={files['validation']}", f"--test={files['test']}", f"--out={out}", f"--device={args.device}",
        f"--batch-size={args.batch_size}", f"--lr={args.lr}", f"--warmup={args.warmup}",
        f"--epochs={args.epochs}", *(["--bf16"] if args.bf16 else []),
    ]  # fmt: skip


def run_trainer(argv: list[str]) -> None:
    """The Trainer's side, in its own process: trains, chooses the threshold on the validation
    split, prints the test split's step metrics."""
    parser = peers.peer_parser()
    parser.add_argument("--test", required=True)
    args = parser.parse_args(argv)

    import torch
    from datasets import load_dataset
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
    )

    from gpt_ft.adapters.outputs import LabelSpec
    from gpt_ft.adapters.steps import StepOutput

    tokenizer = AutoTokenizer.from_pretrained(args.base)
    data = load_dataset("json", data_files={"train": args.train, "dev": args.dev, "test": args.test})
    model = peers.peer_model(AutoModelForTokenClassification, args, tokenizer, num_labels=2)
    training = TrainingArguments(
        **peers.peer_schedule(args, len(data["train"])), per_device_eval_batch_size=args.batch_size
    )
    collator = DataCollatorForTokenClassification(tokenizer)
    run = Trainer(model=model, args=training, train_dataset=data["train"], data_collator=collator)
    run.train()

    def steps(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(solutions, max steps) probabilities of "right" and labels, NaN-padded as gpt_ft's."""
        predicted = run.predict(data[split])
        logits, labels = torch.tensor(predicted.predictions), torch.tensor(predicted.label_ids)
        right = logits.float().softmax(-1)[..., 1]
        rows = [
            (right[i][labels[i] != -100], labels[i][labels[i] != -100].float()) for i in range(len(labels))
        ]
        width = max(len(p) for p, _ in rows)
        pad = lambda x: torch.nn.functional.pad(x, (0, width - len(x)), value=float("nan"))  # noqa: E731
        return torch.stack([pad(p) for p, _ in rows]), torch.stack([pad(y) for _, y in rows])

    output = StepOutput("prmbench", LabelSpec(), label_form="error_steps", one_based=True, max_steps=1,
                        threshold=0.5, count_steps=len)  # fmt: skip
    probabilities, labels = steps("dev")
    with_threshold = lambda p, t: torch.cat([p, torch.full((len(p), 1), t)], dim=1)  # noqa: E731
    threshold = output.choose(with_threshold(probabilities, 0.5), labels)["threshold"]
    probabilities, labels = steps("test")
    values = output.metric_values(with_threshold(probabilities, threshold), labels, list(METRICS))
    print(json.dumps({"threshold": threshold, **{k: float(v) for k, v in values.items()}}))


def baselines(data: Path) -> dict[str, dict[str, float]]:
    """The test split's metrics of judging every step right, and of judging the last step wrong."""
    import torch

    from gpt_ft.adapters.metrics import step_metric_values

    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    width = max(len(r["modified_process"]) for r in rows)
    labels = torch.full((len(rows), width), float("nan"), dtype=torch.float64)
    last = torch.full_like(labels, float("nan"))
    for i, r in enumerate(rows):
        n = len(r["modified_process"])
        labels[i, :n] = torch.tensor([0.0 if k + 1 in r["error_steps"] else 1.0 for k in range(n)])
        last[i, :n] = 1.0
        last[i, n - 1] = 0.0
    half = torch.full((len(rows), 1), 0.5, dtype=torch.float64)
    return {
        "baseline: no error": step_metric_values(torch.where(labels.isnan(), labels, 1.0), half, labels),
        "baseline: the last step": step_metric_values(last, half, labels),
    }


def prmbench_arguments(
    doc: str, contenders: list[str], *, batch: int, unit: str, out: str
) -> argparse.Namespace:
    """The arguments of a PRMBench benchmark (this one and bench_rank.py), parsed; OUT made (by
    default `out` under the repository, a relative --out from where it runs)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prmbench", type=existing, required=True, help="PRMBench's folder of .jsonl files")
    parser.add_argument("--init-from", default=None, help="pretrained weights (a .gguf, a folder, a hub id)")
    parser.add_argument("--tokenizer", help="a tokenizer for random weights; not with --init-from")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--contenders", nargs="+", default=contenders, choices=contenders)
    parser.add_argument("--train-size", type=int, default=None, help="the first N training records")
    parser.add_argument("--eval-size", type=int, default=None, help="the first N validation and test records")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=batch, help=f"{unit} a batch")
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--warmup", type=float, default=0.06, help="share of the steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], type=harness.device)
    parser.add_argument("--bf16", action="store_true", help="bf16 on the CPU too")
    parser.add_argument("--out", default=str(ROOT / out))
    parser.add_argument("--rounds", type=int, default=1, help="run every contender this many times, in turns")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--split-only", action="store_true", help="write OUT/data/*.jsonl and stop")
    args = parser.parse_args()
    if not (args.tokenizer or args.init_from or args.split_only):
        parser.error("give --tokenizer (random weights) or --init-from (pretrained ones)")
    args.out = Path(args.out).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return args


def timed_commands(commands: list[list[str]], log: Path) -> float:
    """The commands run one after the other, each logged to its own file: their wall seconds."""
    return sum(bench_vs_trainer.timed(c, log.with_suffix(f".{i}.log"))[0] for i, c in enumerate(commands))


def main() -> None:
    if sys.argv[1:2] == ["trainer"]:
        return run_trainer(sys.argv[2:])
    args = prmbench_arguments(__doc__, CONTENDERS, batch=8, unit="solutions", out="runs/bench_steps")
    out = args.out
    import torch

    from gpt_ft import GPT

    data, dropped = split_prmbench(args, out)
    if args.split_only:
        return print(f"wrote {data}/train.jsonl, validation.jsonl and test.jsonl; {dropped} rows dropped "
                     "(an error step outside the solution)")  # fmt: skip
    counts = {s: sum(1 for _ in open(data / f"{s}.jsonl")) for s in ("train", "validation", "test")}
    print(f"PRMBench split by question: {counts} solutions; {dropped} rows dropped (an error step outside "
          f"the solution); {args.init_from or 'random weights'}, {args.batch_size} a batch, {args.epochs} "
          f"epoch(s), lr {args.lr}, {args.device}, {torch.get_num_threads()} threads")  # fmt: skip
    base = bench_vs_trainer.base_folder(args, "pretrained" if args.init_from else "llama", out)
    shape = vars(GPT.from_pretrained(str(base)).config)  # from scratch: the same shape, random weights
    args.preset, args.overrides = "gpt1", {k: v for k, v in shape.items() if k != "vocab_size"}
    files = encoded_steps(args, base, data, out) if "Trainer" in args.contenders else {}

    def run(contender: str, run_dir: Path) -> tuple[float, dict]:
        log = run_dir.with_suffix(".log")
        if contender.startswith("ours"):
            seconds = timed_commands(ours(args, base, data, run_dir, scratch="scratch" in contender), log)
            rows = harness.metrics_rows(run_dir)
            return seconds, {m: harness.last_value(rows, f"test/{m}") for m in METRICS}
        seconds = bench_vs_trainer.timed(trainer(args, base, files, run_dir), log)[0]
        return seconds, json.loads(
            [x for x in log.read_text().splitlines() if x.startswith('{"threshold"')][-1]
        )

    trivial = {name: {m: float(v[m]) for m in METRICS} for name, v in baselines(data).items()}
    peers.in_rounds(args, run, METRICS, "step F1 (wrong) | first error | ProcessBench F1", trivial)


if __name__ == "__main__":
    main()
