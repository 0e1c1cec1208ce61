"""`gpt-ft fit` against transformers' `Trainer`, end to end, on the same weights, tokens and schedule.

For each task (SST-2: its first --train-size training sentences by a class-stratified draw; RTE:
all of its pairs) and each model shape (GPT-1's blocks, or the Llama family's, at --layers x
--width), one random initialisation is saved as a transformers folder with the tokenizer. Then,
one whole process each, in turns:

- `ours`: `gpt-ft fit --model.init_from BASE` (packed batches, GPT-1's auxiliary LM loss λ = 0.5,
  the defaults), validating once at the end of the epoch;
- `ours, λ=0`: the same with `--model.lm_coef 0`, the Trainer's objective (the task loss alone);
- `ours, padded`: the same as `ours` with `--data.packing false`;
- `ours, λ=0, LoRA` and `ours, λ=0, 4-bit LoRA`: `ours, λ=0` training rank-8 adapters of every
  matrix (`--model.lora.rank 8`), the base weights frozen in full precision or in 4-bit NF4
  (`--model.lora.quantize nf4`, which needs torchao);
- `Trainer`: transformers' `Trainer` with `*ForSequenceClassification` from the same folder and its
  default collator (`DataCollatorWithPadding`), then `Trainer.predict` on the dev split;
- `Trainer, group_by_length`: the same with length-grouped batches (`group_by_length=True`;
  `train_sampling_strategy="group_by_length"` in transformers 5); `..., eager` (either Trainer): its
  model's attention as plain matrix products (`attn_implementation="eager"`, not SDPA's default).

Both read the same token ids (gpt_ft's GPT-1 inputs, written to jsonl for the Trainer before the
clock starts; gpt_ft's own encodings are cached by then too), the same batch size, learning rate,
linear schedule with --warmup of the steps, weight decay 0.01, gradient clipping at 1.0, epochs and
seed. Neither saves a checkpoint. The wall time is each process's, start to exit; the dev metric
is accuracy; the peak resident memory is each process's own (`ru_maxrss`); the speed in steady state
is real tokens (padding never counted) a second of training after its first window: ours the median
of `perf/tokens_per_s` as `fit` logs it every 50 steps, the Trainer's over its steps from a tenth of
the way in (`peers.RealTokenRate`). A row's ratio divides its time by the first `ours` / `ours, λ=0`
run's. Each task first prints the positions shuffled padded batches compute per real token: the
most padding-free batches can save, the ceiling of the Trainer's time over ours at λ = 0.

    python benchmarks/bench_vs_trainer.py --glue GLUE_DIR --tokenizer GPT2_BPE_DIR

`pip install -e .[bench]` brings `accelerate`, which the Trainer needs. `--device cuda` runs bf16
(`bf16-mixed` for gpt_ft, `bf16=True` for the Trainer), as `--bf16` does on a CPU.
`--init-from WEIGHTS` (a `.gguf`, a folder, a hub id) starts both from pretrained weights instead
of random ones (their tokenizer replaces --tokenizer):

    python benchmarks/bench_vs_trainer.py --glue GLUE_DIR \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --contenders "ours, λ=0" Trainer
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402  (the benchmarks' shared pieces)
import peers  # noqa: E402  (the Trainer's side: its arguments and schedule)
from paths import existing

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"SST-2": "tasks/glue/sst2.yaml", "RTE": "tasks/glue/rte.yaml"}
SHAPES = {"gpt1": ("gpt1", {}), "llama": ("smollm2-135m", {"n_positions": 2048})}
"""Each shape's preset and changes; --layers x --width with 64-wide heads make the rest."""
CONTENDERS = [
    "ours", "ours, λ=0", "ours, padded", "ours, λ=0, LoRA", "ours, λ=0, 4-bit LoRA",
    "Trainer", "Trainer, group_by_length", "Trainer, eager", "Trainer, group_by_length, eager",
]  # fmt: skip
LORA = {"LoRA": ["--model.lora.rank=8"], "4-bit LoRA": ["--model.lora.rank=8", "--model.lora.quantize=nf4"]}


def base_folder(args, shape: str, out: Path) -> Path:
    """One random initialisation of `shape` as a transformers folder, with the tokenizer; with
    --init-from, those weights (and their tokenizer) instead."""
    import torch

    from gpt_ft import GPT, GPTConfig
    from gpt_ft.data.tokenizer import load_tokenizer

    folder, made = out / f"base-{shape}", out / f"base-{shape}" / "made_from.json"
    recipe = {"init_from": args.init_from} if args.init_from else {"tokenizer": args.tokenizer,
              "layers": args.layers, "width": args.width}  # fmt: skip
    if made.exists() and json.loads(made.read_text()) == recipe:
        return folder
    shutil.rmtree(folder, ignore_errors=True)  # made from other arguments: made again
    if args.init_from:
        peers.pretrained_folder(args.init_from, folder)
    else:
        tokenizer = load_tokenizer(args.tokenizer)
        preset, changes = SHAPES[shape]
        if (heads := args.width // 64) < 1 or args.width % 64:  # SmolLM2's 9 heads (3 for keys, values)
            raise SystemExit(f"--width {args.width}: give a multiple of 64 (a head is 64 wide).")
        llama = {
            "n_kv_head": heads // 3 if heads % 3 == 0 else heads,
            "n_inner": args.width * 8 // 3 // 64 * 64,
        }
        shaped = dict(n_layer=args.layers, n_embd=args.width, n_head=heads, vocab_size=len(tokenizer))
        config = GPTConfig.from_name(preset, **changes, **shaped, **(llama if shape == "llama" else {}))
        torch.manual_seed(0)
        GPT(config).to_hf().save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    made.write_text(json.dumps(recipe))
    return folder


def encoded_splits(args, task: str, base: Path, out: Path) -> dict[str, Path]:
    """The train and dev splits as gpt_ft encodes them (which also fills its cache), as jsonl."""
    from jsonargparse import ArgumentParser

    from gpt_ft.adapters import TaskAdapter
    from gpt_ft.data.task_data import TaskDataModule

    parser = ArgumentParser()
    parser.add_subclass_arguments(TaskAdapter, "task")
    card = parser.instantiate(parser.parse_args(["--task", str(ROOT / TASKS[task])])).task
    data = TaskDataModule(
        card, str(base), data_dir=args.glue, max_length=args.max_length, train_size=train_size(args, task)
    )
    files = {}
    for split in ("train", "validation"):
        path = files[split] = out / f"{task}-{base.name}-{split}.jsonl"
        rows = data.encoded(split, labelled=True)
        with path.open("w") as f:
            for ids, label in zip(rows["input_ids"], rows["label"]):
                f.write(json.dumps({"input_ids": ids[0], "labels": label}) + "\n")
    return files


def train_size(args, task: str) -> int | None:
    return args.train_size if task == "SST-2" else None


def ours(args, task: str, base: Path, out: Path, contender: str) -> list[str]:
    precision = "bf16-mixed" if args.device == "cuda" or args.bf16 else "32-true"
    size = train_size(args, task)
    return [
        sys.executable, "-m", "gpt_ft", "fit",
        f"--data.task={ROOT / TASKS[task]}", f"--data.data_dir={args.glue}", f"--data.tokenizer={base}",
        f"--data.max_length={args.max_length}", f"--data.batch_size={args.batch_size}",
        f"--data.packing={str('padded' not in contender).lower()}",
        *([f"--data.train_size={size}"] if size else []), *LORA.get(contender.partition("λ=0, ")[2], []),
        f"--model.init_from={base}", f"--model.lm_coef={0.0 if 'λ=0' in contender else 0.5}",
        f"--model.lr={args.lr}",
        f"--model.warmup_fraction={args.warmup}", "--model.weight_decay=0.01", "--seed_everything=0",
        f"--trainer.max_epochs={args.epochs}", "--trainer.gradient_clip_val=1.0",
        f"--trainer.precision={precision}", f"--trainer.accelerator={args.device}",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={out}",
    ]  # fmt: skip


def trainer(args, base: Path, files: dict[str, Path], out: Path, contender: str) -> list[str]:
    return [
        sys.executable, __file__, "trainer", f"--base={base}", f"--train={files['train']}",
        f"--dev={files['validation']}", f"--out={out}", f"--device={args.device}",
        f"--batch-size={args.batch_size}", f"--lr={args.lr}", f"--warmup={args.warmup}",
        f"--epochs={args.epochs}", f"--attention={'eager' if 'eager' in contender else 'sdpa'}",
        *(["--group-by-length"] if "group_by_length" in contender else []), *(["--bf16"] * args.bf16),
    ]  # fmt: skip


def run_trainer(argv: list[str]) -> None:
    """The Trainer's side, in its own process: trains, predicts the dev split, prints its accuracy and
    real tokens/s."""
    parser = peers.peer_parser()
    parser.add_argument("--group-by-length", action="store_true")
    args = parser.parse_args(argv)

    import transformers as hf
    from datasets import load_dataset

    tokenizer, speed = hf.AutoTokenizer.from_pretrained(args.base), peers.RealTokenRate()
    data = load_dataset("json", data_files={"train": args.train, "dev": args.dev})
    labels = len(set(data["train"]["labels"]))
    model = peers.peer_model(hf.AutoModelForSequenceClassification, args, tokenizer, num_labels=labels)
    training = hf.TrainingArguments(
        **peers.peer_schedule(args, len(data["train"])),
        per_device_eval_batch_size=args.batch_size,
        **peers.grouping(args.group_by_length),
    )
    run = hf.Trainer(model=model, args=training, train_dataset=data["train"], processing_class=tokenizer,
                     data_collator=speed.collator(hf.DataCollatorWithPadding(tokenizer)),  # the default
                     callbacks=[speed.callback()])  # fmt: skip
    run.train()
    predicted = run.predict(data["dev"])
    accuracy = float((predicted.predictions.argmax(-1) == predicted.label_ids).mean())
    print(json.dumps({"accuracy": accuracy, "tokens_per_s": speed.rate()}))


def timed(cmd: list[str], log: Path) -> tuple[float, float]:
    """The process's wall time in seconds and its peak resident memory in GiB."""
    start = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}); see {log}")
    return seconds, usage.ru_maxrss / 1024**2  # KiB on Linux


def ours_results(out: Path) -> tuple[float, float | None]:
    """Dev accuracy, and real tokens/s in steady state: the median of the windows after the first."""
    rows = harness.metrics_rows(out)
    rates = [float(r["perf/tokens_per_s"]) for r in rows if r.get("perf/tokens_per_s")][1:]
    return harness.last_value(rows, "validation/accuracy"), statistics.median(rates) if rates else None


def trainer_results(log: Path) -> tuple[float, float | None]:
    """Accuracy, and real tokens/s where the runner counted them (TRL's, bench_reward.py, does not)."""
    lines = [line for line in log.read_text().splitlines() if line.startswith('{"accuracy"')]
    result = json.loads(lines[-1])
    return result["accuracy"], result.get("tokens_per_s")


def main() -> None:
    if sys.argv[1:2] == ["trainer"]:
        return run_trainer(sys.argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", type=existing, required=True, help="GLUE's folder (SST-2/, RTE/ in it)")
    parser.add_argument(
        "--tokenizer", help="GPT-2's BPE (a folder with vocab.json, merges.txt); not with --init-from"
    )
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--contenders", nargs="+", default=[c for c in CONTENDERS if c != "ours, padded"],
                        choices=CONTENDERS, metavar="CONTENDER", help=f"among {CONTENDERS}")  # fmt: skip
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=576)
    parser.add_argument("--train-size", type=int, default=8192, help="SST-2's training sentences")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=float, default=0.06, help="share of the steps")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], type=harness.device)
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 on the CPU too (bf16-mixed; the Trainer's bf16)"
    )
    parser.add_argument("--init-from", default=None, help="pretrained weights (a .gguf, a folder, a hub id) "
                        "instead of random ones at --layers x --width; --shapes is then ignored")  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_vs_trainer"))
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    if not (args.tokenizer or args.init_from):
        parser.error("give --tokenizer (random weights) or --init-from (pretrained ones)")
    out = Path(args.out).resolve()  # (a relative one from where it runs)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    setup = f"batch {args.batch_size}, max length {args.max_length}, {args.epochs} epoch(s), lr {args.lr}"
    model = args.init_from or f"{args.layers} layers x {args.width}"
    precision = "bf16" if args.bf16 or args.device == "cuda" else "fp32"
    print(f"{model}, {setup}, {args.device}, {precision}, {torch.get_num_threads()} threads")
    if args.init_from:
        args.shapes = ["pretrained"]
    rows = []
    for task in args.tasks:
        for shape in args.shapes:
            base = base_folder(args, shape, out)
            files = encoded_splits(args, task, base, out)
            ceiling = harness.padding_ceiling(files["train"], args.batch_size)
            print(f"{task}: shuffled padded batches compute {ceiling:.2f} positions a real token", flush=True)
            results = {}
            for contender in args.contenders:
                slug = contender.replace(", ", "-").replace(" ", "-").replace("λ=0", "task-loss-only")
                run_dir = out / f"{task}-{shape}-{slug}"
                log = run_dir.with_suffix(".log")
                if contender.startswith("ours"):
                    seconds, rss = timed(ours(args, task, base, run_dir, contender), log)
                    accuracy, rate = ours_results(run_dir)
                else:
                    seconds, rss = timed(trainer(args, base, files, run_dir, contender), log)
                    accuracy, rate = trainer_results(log)
                results[contender] = (seconds, accuracy, rss, rate)
                print(f"{task:6} {shape:6} {contender:26} {seconds:7.1f} s  dev accuracy {accuracy:.4f}  "
                      f"peak RSS {rss:.2f} GiB  real tokens/s {rate or 0:,.0f}", flush=True)  # fmt: skip
            mine = next((results[c][0] for c in ("ours", "ours, λ=0") if c in results), None)
            for contender, (seconds, accuracy, rss, rate) in results.items():
                ratio = seconds / mine if mine else None
                rows.append(dict(task=task, shape=shape, contender=contender, seconds=round(seconds, 1),
                                 accuracy=accuracy, peak_rss_gib=round(rss, 2), tokens_per_s=rate,
                                 vs_ours=round(ratio, 2) if ratio else None))  # fmt: skip
    print("\n| task | shape | contender | wall s | dev accuracy | peak RSS GiB | real tokens/s "
          "| its time / ours |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio, rate = f"{r['vs_ours']:.2f}x" if r["vs_ours"] else "", r["tokens_per_s"]
        cells = [r["task"], r["shape"], r["contender"], f"{r['seconds']:.0f}", f"{r['accuracy']:.4f}",
                 f"{r['peak_rss_gib']:.2f}", f"{rate:,.0f}" if rate else "", ratio]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
