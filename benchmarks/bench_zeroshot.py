r"""Zero-shot scoring against lm-evaluation-harness: the same weights and examples, each choice's
log-likelihood and the accuracies compared.

    python benchmarks/bench_zeroshot.py --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--storycloze STORYCLOZE_DIR] [--glue GLUE_DIR] [--limit 200] [--harness lm_eval]

Story Cloze 2016's val file (1,871 stories: multiple choice), read by gpt_ft through
tasks/storycloze.yaml and by the harness through a task of its own kind written here (its
`storycloze_2016` task, the file read as a CSV rather than from the hub's script); and GLUE's RTE
and SST-2 dev files (a prompt and a word per class, as the harness's `rte` and `sst2` tasks ask:
their prompts and words, given to gpt_ft as a suite's `zero_shot` entry is), read through
tasks/glue/{rte,sst2}.yaml, the harness given each example's texts as gpt_ft reads them. gpt_ft
scores with `ZeroShotScorer` (what `gpt-ft suite --zero_shot true` runs) on its pure-PyTorch model;
the harness with its `hf` model, transformers' reading of the same weights (a GGUF file is given to
both as it is), fp32, on the CPU, in a process of its own (`--harness`: the command that runs it,
e.g. another environment's `/path/to/python -m lm_eval`). Prints each side's accuracies and wall
time, the largest gap between the two log-likelihoods of a choice, and the examples decided
otherwise.
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
from paths import existing

from gpt_ft.adapters.cards import load_card
from gpt_ft.data.files import labelled_rows
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.eval.zeroshot import ZeroShot, ZeroShotScorer
from gpt_ft.weights.pretrained import GPT, resolve_tokenizer

ROOT = Path(__file__).resolve().parents[1]
VAL = "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
STORYCLOZE = """task: storycloze_csv
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
# lm-evaluation-harness 0.4.13's GLUE tasks (lm_eval/tasks/glue/{rte,sst2}/default.yaml): the prompt
# (a Jinja template), then a space and one word per class; gpt_ft's `zero_shot` entry of the same.
GLUE = {
    "rte": ("{{sentence1}}\nQuestion: {{sentence2}} True or False?\nAnswer:", ["True", "False"]),
    "sst2": (
        "{{sentence}}\nQuestion: Is this sentence positive or negative?\nAnswer:",
        ["negative", "positive"],
    ),
}
VERBALIZED = """task: {name}_local
dataset_path: json
dataset_kwargs:
  data_files: {{validation: {path}}}
output_type: multiple_choice
validation_split: validation
doc_to_text: {prompt}
doc_to_target: label
doc_to_choice: {words}
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
"""


def ours(init_from: str, score, batch_size: int) -> tuple[dict, list[float], float]:
    """gpt_ft's accuracies from `score(scorer)`, each choice's log-likelihood (example by example),
    and the wall time."""
    start = time.perf_counter()
    gpt = GPT.from_pretrained(init_from).float()
    tok = load_tokenizer(resolve_tokenizer(None, init_from), add_specials=False)
    scorer = ZeroShotScorer(gpt, tok, batch_size=batch_size)
    scored: list[float] = []
    logprobs = scorer.logprobs
    scorer.logprobs = lambda requests: scored.extend(logprobs(requests)) or scored
    metrics = score(scorer)
    return metrics, scored, time.perf_counter() - start


def theirs(harness: list[str], init_from: Path, task: str, batch_size: int, work: Path):
    """The harness's accuracies on its task `task` (a YAML file in work/tasks), each choice's
    log-likelihood (example by example), and the wall time."""
    init_from, gguf = init_from.resolve(), init_from.suffix == ".gguf"  # transformers reads the file as it is
    weights = (
        f"pretrained={init_from.parent},gguf_file={init_from.name}" if gguf else f"pretrained={init_from}"
    )
    out = work / f"out-{task}"
    command = [*harness, "--model", "hf", "--model_args", f"{weights},dtype=float32", "--device", "cpu"]
    command += ["--tasks", task, "--include_path", str(work / "tasks"), "--log_samples"]
    command += ["--output_path", str(out), "--batch_size", str(batch_size)]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - start
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"][task]
    samples = [json.loads(line) for line in next(out.rglob(f"samples_{task}_*.jsonl")).open()]
    samples.sort(key=lambda s: s["doc_id"])
    scored = [float(resp[0][0]) for s in samples for resp in s["resps"]]
    metrics = {"accuracy": results["acc,none"]}
    if "acc_norm,none" in results:
        metrics["accuracy_norm"] = results["acc_norm,none"]
    return metrics, scored, seconds


def storycloze(folder: str, limit: int | None, work: Path):
    """Story Cloze's stories: gpt_ft's scoring, and the harness's task written for them."""
    with (Path(folder) / VAL).open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))[:limit]
    data = work / "storycloze.csv"  # the stories scored, as the harness reads them
    with data.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (work / "tasks" / "storycloze_csv.yaml").write_text(STORYCLOZE.format(path=json.dumps(str(data))))
    card = load_card(ROOT / "tasks/storycloze.yaml")
    return (
        "Story Cloze 2016 val",
        len(rows),
        lambda scorer: scorer.multiple_choice(card, rows),
        "storycloze_csv",
    )


def verbalized(name: str, glue: str, limit: int | None, work: Path):
    """A GLUE dev file scored by the harness's prompt and words: gpt_ft's scoring (its texts as the
    card reads them), and the harness's task over the same texts."""
    card = load_card(ROOT / f"tasks/glue/{name}.yaml")
    rows = labelled_rows(card, "validation", glue)[:limit]
    prompt, words = GLUE[name]
    data = work / f"{name}.jsonl"
    with data.open("w", encoding="utf-8") as f:
        for row in rows:
            fields = dict(zip(card.text_fields(), card.card_texts(row)))
            f.write(json.dumps({**fields, "label": card.output.example_label(row)}) + "\n")
    task = VERBALIZED.format(
        name=name, path=json.dumps(str(data)), prompt=json.dumps(prompt), words=json.dumps(words)
    )
    (work / "tasks" / f"{name}_local.yaml").write_text(task)
    spec = ZeroShot(
        template=prompt.replace("{{", "{").replace("}}", "}"), verbalizers=[f" {w}" for w in words]
    )
    labels = torch.tensor([card.output.example_label(row) for row in rows])

    def score(scorer) -> dict:
        return {"accuracy": float((scorer.verbalizers(card, spec, rows) == labels).double().mean())}

    return f"GLUE {card.name.upper()} dev", len(rows), score, f"{name}_local"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--init-from", type=Path, required=True, help="weights: a GGUF file or a transformers folder"
    )
    parser.add_argument("--storycloze", type=existing, default=None, help=f"the folder holding {VAL!r}")
    parser.add_argument(
        "--glue", type=existing, default=None, help="the folder holding RTE/dev.tsv, SST-2/dev.tsv"
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N examples of each task only")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--harness", default="lm_eval", help="the command that runs lm-evaluation-harness")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads for gpt_ft (default: torch's)"
    )
    args = parser.parse_args()
    if args.storycloze is None and args.glue is None:
        parser.error("give --storycloze, --glue or both: the data to score")
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"{args.init_from.name}, fp32, CPU\n")
    print(
        "| data | examples | contender | acc | acc_norm | wall s | largest gap (nats) | decided otherwise |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "tasks").mkdir()
        tasks = [storycloze(args.storycloze, args.limit, Path(work))] if args.storycloze else []
        tasks += [verbalized(name, args.glue, args.limit, Path(work)) for name in GLUE] if args.glue else []
        for title, n, score, harness_task in tasks:
            mine, my_scores, my_seconds = ours(str(args.init_from), score, args.batch_size)
            their, their_scores, their_seconds = theirs(
                shlex.split(args.harness), args.init_from, harness_task, args.batch_size, Path(work)
            )
            assert len(my_scores) == len(their_scores), (len(my_scores), len(their_scores))
            gaps = [abs(a - b) for a, b in zip(my_scores, their_scores)]
            k = len(my_scores) // n  # choices an example
            pick = lambda s, i: max(range(k), key=lambda c: s[k * i + c])  # noqa: E731  (by sum)
            differ = sum(pick(my_scores, i) != pick(their_scores, i) for i in range(n))
            for name, metrics, seconds in (
                ("gpt_ft", mine, my_seconds),
                ("lm-evaluation-harness", their, their_seconds),
            ):
                acc = 100 * metrics["accuracy"]
                norm = f"{100 * metrics['accuracy_norm']:.2f}" if "accuracy_norm" in metrics else ""
                print(
                    f"| {title} | {n:,} | {name} | {acc:.2f} | {norm} | {seconds:.1f} | "
                    f"{max(gaps):.2e} (mean {sum(gaps) / len(gaps):.2e}) | {differ} |"
                )


if __name__ == "__main__":
    main()
