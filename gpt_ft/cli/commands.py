"""The functions behind `gpt-ft`'s commands (the table is `gpt_ft.cli.main.COMMANDS`).

`fit`, `validate`, `test` and `predict` go to the LightningCLI (gpt_ft/cli/lightning.py); the others
parse their own arguments with jsonargparse (signatures are the schema). Each raises ValueError or
FileNotFoundError for bad input; `gpt_ft.cli.main` turns those into one line and exit code 2.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from jsonargparse import ActionConfigFile, ArgumentParser

from gpt_ft.cli.cards import cards_replace_cards
from gpt_ft.errors import check_output_dir, check_output_file
from gpt_ft.model.weights import load_weights, resolve_tokenizer


def command_parser(name: str, description: str) -> ArgumentParser:
    """A command's parser; `--config FILE` takes its arguments from YAML and `--print_config`
    shows them parsed, running nothing."""
    parser = ArgumentParser(prog=f"gpt-ft {name}", description=description, exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="arguments from a YAML file")
    return parser


def lightning(subcommand: str, argv: list[str]) -> None:
    """`gpt-ft fit|validate|test|predict ARGV`: LightningCLI's subcommand."""
    from gpt_ft.cli.lightning import lightning_main

    lightning_main([subcommand, *argv])


def explain(argv: list[str]) -> None:
    """Print example `--index` of `--split` as the model sees it."""
    from gpt_ft.cli.lightning import refuse_nulls
    from gpt_ft.data.task_data import TaskDataModule

    parser = command_parser("explain", "Print one example as the model sees it.")
    parser.add_subclass_arguments(TaskDataModule, "data", required=True)
    parser.set_defaults({"data": {"class_path": "gpt_ft.data.task_data.TaskDataModule"}})
    # The rest of a fit config is accepted and ignored, so `explain` takes the very same files.
    for section in ("model", "trainer", "optimizer", "lr_scheduler", "seed_everything", "ckpt_path"):
        parser.add_argument(f"--{section}", type=Any, default=None, help="(ignored)")
    parser.add_argument("--split", default="train", help="split name, e.g. train, validation")
    parser.add_argument("--index", type=int, default=0, help="example number within the split")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    cfg = parser.parse_args(cards_replace_cards(argv))
    refuse_nulls(cfg)
    init_from = (cfg.model or {}).get("init_from")
    cfg.data.init_args.tokenizer = resolve_tokenizer(cfg.data.init_args.tokenizer, init_from, option=None)
    data = parser.instantiate(cfg).data
    shown = data.explain(cfg.split, cfg.index)
    if cfg.json:
        print(json.dumps(shown, ensure_ascii=False))
        return
    print(f"task {data.task.name}, split {cfg.split}, example {cfg.index}: label {shown['label']!r}")
    for i, seq in enumerate(shown["sequences"]):
        k = seq["extract_index"]
        print(f"sequence {i} ({len(seq['ids'])} tokens, extract at {k}):")
        print("  " + " ".join(seq["tokens"]))
        print("  " + " ".join(str(t) for t in seq["ids"]))


def prepare(argv: list[str]) -> None:
    """Tokenize a corpus into train/validation token files (see gpt_ft/data/prepare.py)."""
    from gpt_ft.data import prepare as prep

    parser = command_parser("prepare", prep.__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="*", help="text files or folders of them")
    parser.add_function_arguments(prep.prepare, skip={"files", "progress"})
    cfg = parser.parse_args(argv)
    check_output_dir(cfg.out_dir, "--out_dir")
    kwargs = {k: v for k, v in vars(cfg).items() if k not in ("inputs", "config", "__path__")}
    meta = prep.prepare(files=cfg.inputs, **kwargs)
    t = meta["tokens"]
    rate = (t["train"] + t["validation"]) / max(meta["seconds"], 1e-9)
    print(
        f"wrote {t['train']:,} train and {t['validation']:,} validation tokens ({meta['dtype']}, "
        f"{meta['documents']:,} documents) to {cfg.out_dir} in {meta['seconds']:.1f} s ({rate:,.0f} tokens/s)"
    )


def tokenizer(argv: list[str]) -> None:
    """Train a byte-level BPE tokenizer (with the GPT-1 special tokens) on text files."""
    from gpt_ft.data.prepare import find_files
    from gpt_ft.data.tokenizer import train_tokenizer

    parser = command_parser("tokenizer", "Train a byte-level BPE tokenizer on text files.")
    parser.add_argument("inputs", nargs="+", help="text files or folders of them")
    parser.add_argument(
        "--vocab_size", type=int, required=True, help="vocabulary size, special tokens included"
    )
    parser.add_argument("--out_dir", required=True, help="folder for the tokenizer (AutoTokenizer loads it)")
    parser.add_argument("--min_frequency", type=int, default=2, help="least count of a pair to merge")
    cfg = parser.parse_args(argv)
    check_output_dir(cfg.out_dir, "--out_dir")
    tok = train_tokenizer(
        find_files(cfg.inputs), cfg.vocab_size, cfg.out_dir, min_frequency=cfg.min_frequency
    )
    print(f"trained a {len(tok)}-token byte-level BPE tokenizer into {cfg.out_dir}")


def generate(argv: list[str]) -> None:
    """Continue a prompt with a gpt_ft checkpoint or a transformers directory, streaming tokens."""
    import sys

    import torch

    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.training.precision import cpu_precision

    parser = command_parser("generate", "Continue a prompt with a trained model.")
    parser.add_argument("--ckpt_path", required=True, help="a gpt_ft .ckpt or a transformers directory")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--tokenizer", default=None, help="default: the one saved with the checkpoint")
    parser.add_argument("--max_new_tokens", type=int, default=100)
    parser.add_argument("--do_sample", type=bool, default=False, help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_k", type=int | None, default=None)
    parser.add_argument("--top_p", type=float | None, default=None)
    parser.add_argument("--num_beams", type=int, default=1, help="beam search when > 1 (printed at the end)")
    parser.add_argument("--length_penalty", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--precision",
        choices=["32-true", "bf16-mixed", "bf16-true"],
        default="32-true",
        help="bf16-mixed: fp32 weights, bf16 matrix products; bf16-true: bf16 weights and KV cache",
    )
    cfg = parser.parse_args(argv)
    if cfg.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {cfg.max_new_tokens}.")
    precision = cfg.precision
    if torch.device(cfg.device).type == "cpu":
        precision, why = cpu_precision(precision)
        if why:
            print(why, file=sys.stderr, flush=True)
    tok = load_tokenizer(resolve_tokenizer(cfg.tokenizer, cfg.ckpt_path))
    gpt = load_weights(cfg.ckpt_path).to(cfg.device).eval()
    if precision == "bf16-true":
        gpt = gpt.to(torch.bfloat16)
    autocast = torch.autocast(
        torch.device(cfg.device).type, torch.bfloat16, enabled=precision == "bf16-mixed"
    )
    with autocast:
        _generate(cfg, tok, gpt)


def _generate(cfg, tok, gpt) -> None:
    import sys

    import torch

    ids = tok(cfg.prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("--prompt is empty: give some text to continue.")
    context = gpt.config.n_positions
    if len(ids) >= context:  # refused rather than cut: what the model continues is what was typed
        raise ValueError(
            f"--prompt is {len(ids)} tokens and the model's context is {context} (n_positions), leaving "
            f"no room for a new token: shorten it by at least {len(ids) - context + 1} tokens."
        )
    prompt = torch.tensor([ids], device=cfg.device)
    max_new = min(cfg.max_new_tokens, context - len(ids))
    eos = tok.eos_token_id
    print(cfg.prompt, end="", flush=True)
    if cfg.num_beams > 1:
        out = gpt.generate(
            prompt,
            max_new_tokens=max_new,
            num_beams=cfg.num_beams,
            length_penalty=cfg.length_penalty,
            eos_token_id=eos,
        )
        print(tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True), flush=True)
        return
    generator = torch.Generator(cfg.device).manual_seed(cfg.seed)
    new: list[int] = []
    shown = ""
    for token in gpt.stream(
        prompt,
        max_new_tokens=max_new,
        do_sample=cfg.do_sample,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        eos_token_id=eos,
        generator=generator,
    ):
        if eos is not None and int(token[0]) == eos:
            break
        new.append(int(token[0]))
        text = tok.decode(new, skip_special_tokens=True)
        sys.stdout.write(text[len(shown) :])  # print what the new token added, as it comes
        sys.stdout.flush()
        shown = text
    print()


def export(argv: list[str]) -> None:
    """Write a fine-tuned checkpoint as a transformers folder, or as ONNX."""
    from gpt_ft.eval.export import FORMATS, check_format, check_new_folder, export_checkpoint

    parser = command_parser("export", "Write a fine-tuned classifier as a standard transformers folder.")
    parser.add_argument("--ckpt_path", required=True, help="a fine-tuned checkpoint of gpt-ft fit")
    parser.add_argument("--out", required=True, help="a new (or empty) folder")
    parser.add_argument(
        "--format",
        choices=list(FORMATS),
        default="transformers",
        help="transformers (a folder for pipelines) or onnx (config, tokenizer and model.onnx)",
    )
    cfg = parser.parse_args(argv)
    check_new_folder(cfg.out, "--out")  # before the weights load
    check_format(cfg.format)
    out = export_checkpoint(cfg.ckpt_path, cfg.out, format=cfg.format)
    loads = (
        "onnxruntime loads model.onnx" if cfg.format == "onnx" else "pipeline('text-classification') loads it"
    )
    print(f"wrote {out}: {loads}")


def calibrate(argv: list[str]) -> None:
    """Fit a fine-tuned classifier's temperature on a validation split; write a new checkpoint."""
    from pathlib import Path

    from gpt_ft.eval import calibration

    parser = command_parser("calibrate", "Fit a classifier's temperature on a validation split.")
    parser.add_argument("--ckpt_path", required=True, help="a fine-tuned checkpoint of gpt-ft fit")
    parser.add_argument("--output", required=True, help="the calibrated checkpoint (a new file)")
    parser.add_argument("--split", default=None, help="default: the card's first validation split")
    parser.add_argument("--data_dir", default=None, help="default: the one the checkpoint was trained on")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    cfg = parser.parse_args(argv)
    if Path(cfg.output).expanduser().resolve() == Path(cfg.ckpt_path).expanduser().resolve():
        raise ValueError(f"--output {cfg.output} is the checkpoint itself: give another name, it is kept.")
    check_output_file(cfg.output, "--output", overwrite=cfg.overwrite)  # before any work
    found = calibration.calibrate(cfg.ckpt_path, cfg.output, split=cfg.split, data_dir=cfg.data_dir)
    print(
        f"temperature {found['temperature']:.4f}: expected calibration error {found['ece_before']:.4f} -> "
        f"{found['ece_after']:.4f}; wrote {cfg.output}"
    )


def label(argv: list[str]) -> None:
    """Label the examples of a csv/tsv/jsonl file with a fine-tuned checkpoint."""
    from pathlib import Path

    from gpt_ft.data.files import read_table
    from gpt_ft.eval.classifier import Classifier, write_labelled

    parser = command_parser(
        "label", "Write each example of a file again with the fine-tuned model's prediction beside it."
    )
    parser.add_argument("--ckpt_path", required=True, help="a fine-tuned checkpoint of gpt-ft fit")
    parser.add_argument(
        "--input", required=True, help="csv, tsv, json/jsonl or parquet; columns named as the card's fields"
    )
    parser.add_argument("--output", required=True, help="csv, tsv or jsonl (by extension); a new file")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--device", default=None, help="default: cuda when there is one")
    cfg = parser.parse_args(argv)
    source, target = Path(cfg.input).expanduser(), Path(cfg.output).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"--input {source} does not exist.")
    if target.suffix.lower() not in (".csv", ".tsv", ".jsonl", ".json"):
        raise ValueError(f"--output {target}: write .csv, .tsv or .jsonl.")
    if target.exists() and target.resolve() == source.resolve():
        raise ValueError(f"--output {target} is the input file: give another name, the input is kept.")
    check_output_file(target, "--output", overwrite=cfg.overwrite)
    clf = Classifier.from_checkpoint(cfg.ckpt_path, device=cfg.device)
    rows = read_table(source).to_list()
    labelled = clf.run(rows, batch_size=cfg.batch_size)
    write_labelled(target, rows, labelled)
    print(f"labelled {len(rows):,} examples of {source} into {target}")


def suite(argv: list[str]) -> None:
    """Fine-tune and evaluate a suite's task cards over seeds (see gpt_ft/eval/suite.py)."""
    from gpt_ft.cli.lightning import build_fit
    from gpt_ft.eval.suite import SuiteRunner
    from gpt_ft.eval.suite_file import load_suite

    fit_args: list[str] = []
    if "--" in argv:  # everything after `--` goes to every `gpt-ft fit`
        cut = argv.index("--")
        argv, fit_args = argv[:cut], argv[cut + 1 :]
    parser = command_parser(
        "suite",
        "Fine-tune and evaluate every task of a suite file over seeds; "
        "arguments after `--` go to every `gpt-ft fit`.",
    )
    parser.add_argument("suite", help="suite file, e.g. configs/suites/glue.yaml")
    parser.add_argument("--out_dir", required=True, help="results folder; rerunning resumes it")
    parser.add_argument("--init_from", default=None, help="pretrained weights; default: from scratch")
    parser.add_argument("--tokenizer", default=None, help="default: the one saved with --init_from")
    parser.add_argument(
        "--data_dir",
        type=list[str],
        default=[],
        help="tasks' local files: DIR for all, or TASK=DIR (repeatable)",
    )
    parser.add_argument("--tasks", type=list[str] | None, default=None, help="run only these of its tasks")
    parser.add_argument("--seeds", type=list[int] | None, default=None, help="default: the suite file's")
    parser.add_argument(
        "--select", choices=["last", "best"], default="last", help="report the last epoch or the best one"
    )
    parser.add_argument("--fine_tune", type=bool, default=True, help="false: zero-shot only")
    parser.add_argument("--zero_shot", type=bool, default=False, help="also score the tasks zero-shot")
    parser.add_argument(
        "--transfer_layers",
        type=list[int],
        default=[],
        help="sweep the pretrained layers transferred (e.g. 0 3 6 12), GPT-1 Fig. 2 left",
    )
    parser.add_argument(
        "--predict",
        type=bool | None,
        default=None,
        help="write test predictions; default: if the suite has a submission (a sweep: no)",
    )
    parser.add_argument("--keep_checkpoints", type=bool, default=False, help="keep every run's checkpoints")
    parser.add_argument(
        "--train_sizes",
        type=list[int | Literal["all"]] | None,
        default=None,
        help="learning curves: training examples per run (stratified subsets, e.g. 100 300 1000 all); "
        "default: the suite file's",
    )
    parser.add_argument(
        "--baselines",
        type=list[str],
        default=[],
        help="learning curves measured elsewhere on the same subsets, drawn beside the rows: JSON files "
        "(benchmarks/tfidf_baseline.py --train-sizes ... --json FILE writes one)",
    )
    repeatable = ("--data_dir", "--tasks", "--seeds", "--transfer_layers", "--train_sizes", "--baselines")
    cfg = parser.parse_args(_repeatable(argv, repeatable))
    check_output_dir(cfg.out_dir, "--out_dir")
    runner = SuiteRunner(
        load_suite(cfg.suite),
        cfg.out_dir,
        build_run=build_fit,
        init_from=cfg.init_from,
        tokenizer=cfg.tokenizer,
        data_dir=cfg.data_dir,
        tasks=cfg.tasks,
        seeds=cfg.seeds,
        fit_args=fit_args,
        select=cfg.select,
        fine_tune=cfg.fine_tune,
        zero_shot=cfg.zero_shot,
        transfer_layers=cfg.transfer_layers,
        predict=cfg.predict,
        keep_checkpoints=cfg.keep_checkpoints,
        train_sizes=cfg.train_sizes,
        baselines=cfg.baselines,
    )
    runner.run()


def _repeatable(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`--seeds 0 1 2` and `--data_dir A --data_dir t=B` as the JSON lists jsonargparse reads."""
    out: list[str] = []
    lists: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in options:
            values = lists.setdefault(name, [])
            if eq:
                values.append(value)
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            continue
        out.append(arg)
        i += 1
    for name, values in lists.items():
        given_as_list = len(values) == 1 and values[0].lstrip().startswith("[")
        out.append(f"{name}={values[0] if given_as_list else json.dumps(values)}")
    return out
