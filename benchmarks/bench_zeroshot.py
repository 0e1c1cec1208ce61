r"""Zero-shot scoring against lm-evaluation-harness: the same weights and examples, each choice's
log-likelihood and the accuracies compared.

    python benchmarks/bench_zeroshot.py --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf \
        --storycloze STORYCLOZE_DIR [--limit 200] [--harness lm_eval]

Story Cloze 2016's val file (1,871 stories), read by gpt_ft through tasks/storycloze.yaml and by
the harness through a task of its own kind written here (its `storycloze_2016` task, the file
read as a CSV rather than from the hub's script). gpt_ft scores with `ZeroShotScorer` (what
`gpt-ft suite --zero_shot true` runs) on its pure-PyTorch model; the harness with its `hf` model,
transformers' reading of the same weights (a GGUF file is given to both as it is), fp32, on the
CPU, in a process of its own (`--harness`: the command that runs it, e.g. another environment's
`/path/to/python -m lm_eval`). Prints each side's acc and acc_norm and wall time, the largest
gap between the two log-likelihoods of a choice, and the stories whose predicted ending differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from gpt_ft.adapters.cards import load_card
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval.zeroshot import ZeroShotScorer
from gpt_ft.weights.pretrained import GPT, resolve_tokenizer

ROOT = Path(__file__).resolve().parents[1]
VAL = "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
TASK = """task: storycloze_csv
dataset_path: csv
dataset_kwargs:
  data_files: {{validation: {path}}}
output_type: multiple_choice
validation_split: validation
doc_to_text: "{{{{[InputSentence1, InputSentence2, InputSentence3, InputSentence4]|join(' ')}}}}"
doc_to_target: "{{{{AnswerRightEnding - 1}}}}"
doc_to_choice: "{{{{[RandomFifthSentenceQuiz1, RandomFifthSentenceQuiz2]}}}}"
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
"""


def ours(init_from: str, rows: list[dict], batch_size: int) -> tuple[dict, list[float], float]:
    """gpt_ft's accuracies, each choice's log-likelihood (story by story), and the wall time."""
    start = time.perf_counter()
    gpt = GPT.from_pretrained(init_from).float()
    tok = load_tokenizer(resolve_tokenizer(None, init_from), add_specials=False)
    scorer = ZeroShotScorer(gpt, tok, batch_size=batch_size)
    scored: list[float] = []
    logprobs = scorer.logprobs
    scorer.logprobs = lambda requests: scored.extend(logprobs(requests)) or scored
    metrics = scorer.multiple_choice(load_card(ROOT / "tasks/storycloze.yaml"), rows)
    return metrics, scored, time.perf_counter() - start


def theirs(harness: list[str], init_from: Path, data: Path, batch_size: int, work: Path):
    """The harness's accuracies, each choice's log-likelihood (story by story), and the wall time."""
    (work / "tasks").mkdir()
    (work / "tasks" / "storycloze_csv.yaml").write_text(TASK.format(path=json.dumps(str(data))))
    init_from, gguf = init_from.resolve(), init_from.suffix == ".gguf"  # transformers reads the file as it is
    weights = (
        f"pretrained={init_from.parent},gguf_file={init_from.name}" if gguf else f"pretrained={init_from}"
    )
    command = [*harness, "--model", "hf", "--model_args", f"{weights},dtype=float32", "--device", "cpu"]
    command += ["--tasks", "storycloze_csv", "--include_path", str(work / "tasks"), "--log_samples"]
    command += ["--output_path", str(work / "out"), "--batch_size", str(batch_size)]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start
    results = json.loads(next((work / "out").rglob("results_*.json")).read_text())["results"][
        "storycloze_csv"
    ]
    samples = [
        json.loads(line) for line in next((work / "out").rglob("samples_storycloze_csv_*.jsonl")).open()
    ]
    samples.sort(key=lambda s: s["doc_id"])
    scored = [float(resp[0][0]) for s in samples for resp in s["resps"]]
    return {"accuracy": results["acc,none"], "accuracy_norm": results["acc_norm,none"]}, scored, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--init-from", type=Path, required=True, help="weights: a GGUF file or a transformers folder"
    )
    parser.add_argument("--storycloze", type=Path, required=True, help=f"the folder holding {VAL!r}")
    parser.add_argument("--limit", type=int, default=None, help="the first N stories only")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--harness", default="lm_eval", help="the command that runs lm-evaluation-harness")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads for gpt_ft (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with (args.storycloze / VAL).open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))[: args.limit]
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "val.csv"  # the stories scored, as the harness reads them
        with data.open("w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        mine, my_scores, my_seconds = ours(str(args.init_from), rows, args.batch_size)
        harness = shlex.split(args.harness)
        their, their_scores, their_seconds = theirs(
            harness, args.init_from, data, args.batch_size, Path(work)
        )

    assert len(my_scores) == len(their_scores) == 2 * len(rows), (len(my_scores), len(their_scores))
    gaps = [abs(a - b) for a, b in zip(my_scores, their_scores)]
    pick = lambda s, i: int(s[2 * i + 1] > s[2 * i])  # noqa: E731  (the likelier ending, by sum)
    differ = [i for i in range(len(rows)) if pick(my_scores, i) != pick(their_scores, i)]
    print(f"Story Cloze 2016 val, {len(rows):,} stories, {args.init_from.name}, fp32, CPU\n")
    print("| contender | acc | acc_norm | wall s |\n|---|---:|---:|---:|")
    for name, metrics, seconds in (
        ("gpt_ft", mine, my_seconds),
        ("lm-evaluation-harness", their, their_seconds),
    ):
        acc, norm = 100 * metrics["accuracy"], 100 * metrics["accuracy_norm"]
        print(f"| {name} | {acc:.2f} | {norm:.2f} | {seconds:.1f} |")
    print(
        f"\nlog-likelihood of a choice, largest gap: {max(gaps):.2e} nats (mean {sum(gaps) / len(gaps):.2e})"
    )
    print(f"stories whose likelier ending differs: {len(differ)}{f' (rows {differ[:10]})' if differ else ''}")


if __name__ == "__main__":
    main()
