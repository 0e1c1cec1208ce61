"""The functions behind `gpt-ft`'s commands (the table is `gpt_ft.cli.main.COMMANDS`).

`fit`, `validate`, `test` and `predict` go to the LightningCLI (gpt_ft/cli/lightning.py). Every other
command is a typed function (here, in gpt_ft/cli/explain.py, or where its work is: `generate` in
gpt_ft/eval/generation.py), and `run` runs it: jsonargparse builds its parser from the signature and
the docstring's `Args:` (each option's `--help`, with `--config FILE` and `--print_config`), parses
the arguments, builds the classes they name and calls it. Each raises ValueError or
FileNotFoundError for bad input; `gpt_ft.cli.main` turns those into one line and exit code 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from jsonargparse import Namespace, auto_parser

from gpt_ft.errors import check_output_dir, check_output_file


def run(
    function: Callable[..., None],
    name: str,
    argv: list[str],
    *,
    defaults: dict[str, Any] | None = None,
    settle: Callable[[Namespace], None] | None = None,
) -> None:
    """`gpt-ft NAME ARGV` of a typed function: its parser comes from its signature and docstring,
    and reads jsonargparse's own syntax (lists `[a, b]` or `--x+=a`, booleans `--x true`).

    Args:
        function: The command: typed parameters, a Google-style docstring whose `Args:` are the help.
        name: The command's name, for its usage line.
        argv: The arguments after the command's name.
        defaults: Defaults the signature cannot state (a class_path).
        settle: Sees the parsed arguments before the classes they name are built.
    """
    parser = auto_parser(function, prog=f"gpt-ft {name}", exit_on_error=False, set_defaults=defaults)
    cfg = parser.parse_args(argv)
    if settle is not None:
        settle(cfg)
    arguments = parser.instantiate(cfg)
    arguments.pop("config", None)
    function(**arguments)


def as_list(value: Any) -> list:
    """A list option given as one value (`--data_dir DIR`) or as a list (`--data_dir [A, t=B]`)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def lightning(subcommand: str, argv: list[str]) -> None:
    """`gpt-ft fit|validate|test|predict ARGV`: LightningCLI's subcommand."""
    from gpt_ft.cli.lightning import lightning_main

    lightning_main([subcommand, *argv])


def prepare(
    *,
    inputs: list[str] | str | None = None,
    out_dir: str,
    tokenizer: str,
    dataset: str | None = None,
    dataset_split: str = "train",
    text_field: str = "text",
    split_on: Literal["file", "blank_line", "line"] = "file",
    validation_fraction: float = 0.005,
    piece_chars: int = 1 << 16,
    workers: int = 1,
) -> None:
    """Tokenize a corpus into train/validation token files for pretraining (see gpt_ft/data/prepare.py).

    Args:
        inputs: A text file or a folder of them (searched recursively), or a list of both
            (`[a.txt, books/]`); none with --dataset.
        out_dir: Output folder (created; must be empty or an earlier output of this command).
        tokenizer: Tokenizer folder or hub id (e.g. the GPT-1 or GPT-2 BPE folder).
        dataset: Instead of files, a `datasets` dataset: a local path or, online, a hub id.
        dataset_split: The dataset's split to read.
        text_field: The dataset's text column.
        split_on: What one document is: a `file`, a `blank_line`-separated block, or a `line`.
        validation_fraction: Share of pieces written to validation.bin.
        piece_chars: Characters per piece (the unit of the train/validation split).
        workers: Tokenizer threads (1: tokenize in this thread only).
    """
    from gpt_ft.data.prepare import prepare as tokenize_corpus

    check_output_dir(out_dir, "--out_dir")
    meta = tokenize_corpus(
        out_dir,
        tokenizer,
        files=as_list(inputs),
        dataset=dataset,
        dataset_split=dataset_split,
        text_field=text_field,
        split_on=split_on,
        validation_fraction=validation_fraction,
        piece_chars=piece_chars,
        workers=workers,
    )
    t = meta["tokens"]
    rate = (t["train"] + t["validation"]) / max(meta["seconds"], 1e-9)
    print(
        f"wrote {t['train']:,} train and {t['validation']:,} validation tokens ({meta['dtype']}, "
        f"{meta['documents']:,} documents) to {out_dir} in {meta['seconds']:.1f} s ({rate:,.0f} tokens/s)"
    )


def tokenizer(*, inputs: list[str] | str, vocab_size: int, out_dir: str, min_frequency: int = 2) -> None:
    """Train a byte-level BPE tokenizer (with the GPT-1 special tokens) on text files.

    Args:
        inputs: A text file or a folder of them (searched recursively), or a list of both
            (`[a.txt, books/]`).
        vocab_size: Vocabulary size, special tokens included.
        out_dir: Folder for the tokenizer (AutoTokenizer loads it).
        min_frequency: Least count of a pair to merge.
    """
    from gpt_ft.data.prepare import find_files
    from gpt_ft.data.tokenizer import train_tokenizer

    check_output_dir(out_dir, "--out_dir")
    tok = train_tokenizer(find_files(as_list(inputs)), vocab_size, out_dir, min_frequency=min_frequency)
    print(f"trained a {len(tok)}-token byte-level BPE tokenizer into {out_dir}")


def export(*, ckpt_path: str, out: str, format: Literal["transformers", "onnx"] = "transformers") -> None:
    """Write a fine-tuned classifier as a standard transformers folder, or as ONNX.

    Args:
        ckpt_path: A fine-tuned checkpoint of gpt-ft fit.
        out: A new (or empty) folder.
        format: transformers (a folder for pipelines) or onnx (config, tokenizer and model.onnx).
    """
    from gpt_ft.eval.export import export_checkpoint

    written = export_checkpoint(ckpt_path, out, format=format)  # the folder checked before the weights load
    loads = "onnxruntime loads model.onnx" if format == "onnx" else "pipeline('text-classification') loads it"
    print(f"wrote {written}: {loads}")


def calibrate(
    *,
    ckpt_path: str,
    output: str,
    split: str | None = None,
    data_dir: str | None = None,
    overwrite: bool = False,
) -> None:
    """Fit a fine-tuned classifier's temperature on a validation split; write a new checkpoint.

    Args:
        ckpt_path: A fine-tuned checkpoint of gpt-ft fit.
        output: The calibrated checkpoint (a new file).
        split: Default: the card's first validation split.
        data_dir: Default: the one the checkpoint was trained on.
        overwrite: Replace --output if it exists.
    """
    from pathlib import Path

    from gpt_ft.eval import calibration

    if Path(output).expanduser().resolve() == Path(ckpt_path).expanduser().resolve():
        raise ValueError(f"--output {output} is the checkpoint itself: give another name, it is kept.")
    check_output_file(output, "--output", overwrite=overwrite)  # before any work
    found = calibration.calibrate(ckpt_path, output, split=split, data_dir=data_dir)
    print(
        f"temperature {found['temperature']:.4f}: expected calibration error {found['ece_before']:.4f} -> "
        f"{found['ece_after']:.4f}; wrote {output}"
    )


def label(
    *,
    ckpt_path: str,
    input: str,
    output: str,
    overwrite: bool = False,
    batch_size: int = 32,
    device: str | None = None,
) -> None:
    """Write each example of a file again with the fine-tuned model's prediction beside it.

    Args:
        ckpt_path: A fine-tuned checkpoint of gpt-ft fit.
        input: csv, tsv, json/jsonl or parquet; columns named as the card's fields.
        output: csv, tsv or jsonl (by extension); a new file.
        overwrite: Replace --output if it exists.
        batch_size: Examples per batch.
        device: Default: cuda when there is one.
    """
    from pathlib import Path

    from gpt_ft.data.files import read_table
    from gpt_ft.eval.classifier import Classifier, write_labelled

    source, target = Path(input).expanduser(), Path(output).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"--input {source} does not exist.")
    if target.suffix.lower() not in (".csv", ".tsv", ".jsonl", ".json"):
        raise ValueError(f"--output {target}: write .csv, .tsv or .jsonl.")
    if target.exists() and target.resolve() == source.resolve():
        raise ValueError(f"--output {target} is the input file: give another name, the input is kept.")
    check_output_file(target, "--output", overwrite=overwrite)
    clf = Classifier.from_checkpoint(ckpt_path, device=device)
    rows = read_table(source).to_list()
    labelled = clf.run(rows, batch_size=batch_size)
    write_labelled(target, rows, labelled)
    print(f"labelled {len(rows):,} examples of {source} into {target}")


def suite(
    suite: str,
    *,
    out_dir: str,
    init_from: str | None = None,
    tokenizer: str | None = None,
    data_dir: list[str] | str = (),
    tasks: list[str] | str | None = None,
    seeds: list[int] | None = None,
    select: Literal["last", "best"] = "last",
    fine_tune: bool = True,
    zero_shot: bool = False,
    transfer_layers: list[int] = (),
    predict: bool | None = None,
    keep_checkpoints: bool = False,
    train_sizes: list[int | Literal["all"]] | None = None,
    baselines: list[str] | str = (),
    fit_args: list[str] = (),
) -> None:
    """Fine-tune and evaluate a suite's tasks over seeds; --fit_args go to every `gpt-ft fit`.

    See gpt_ft/eval/suite.py.

    Args:
        suite: Suite file, e.g. configs/suites/glue.yaml.
        out_dir: Results folder; rerunning resumes it.
        init_from: Pretrained weights; default: from scratch.
        tokenizer: Default: the one saved with --init_from.
        data_dir: Tasks' local files: DIR for all, TASK=DIR for one, or a list of both
            (`[~/glue, storycloze=~/storycloze]`).
        tasks: Run only these of its tasks (one, or a list).
        seeds: A list (`[0, 1, 2]`); default: the suite file's.
        select: Report the last epoch or the best one.
        fine_tune: false: zero-shot only.
        zero_shot: Also score the tasks zero-shot.
        transfer_layers: Sweep the pretrained layers transferred (e.g. `[0, 3, 6, 12]`), GPT-1 Fig. 2 left.
        predict: Write test predictions; default: if the suite has a submission (a sweep: no).
        keep_checkpoints: Keep every run's checkpoints.
        train_sizes: Learning curves: training examples per run (stratified subsets, e.g. `[100,
            300, 1000, all]`); default: the suite file's.
        baselines: Learning curves measured elsewhere on the same subsets, drawn beside the rows:
            a JSON file or a list (benchmarks/tfidf_baseline.py --train-sizes ... --json FILE writes one).
        fit_args: Arguments for every `gpt-ft fit`, as a list (`[--trainer.max_epochs=2]`).
    """
    from gpt_ft.cli.lightning import build_fit
    from gpt_ft.eval.suite import SuiteRunner
    from gpt_ft.eval.suite_file import load_suite

    check_output_dir(out_dir, "--out_dir")
    runner = SuiteRunner(
        load_suite(suite),
        out_dir,
        build_run=build_fit,
        init_from=init_from,
        tokenizer=tokenizer,
        data_dir=as_list(data_dir),
        tasks=as_list(tasks) if tasks is not None else None,
        seeds=seeds,
        fit_args=list(fit_args),
        select=select,
        fine_tune=fine_tune,
        zero_shot=zero_shot,
        transfer_layers=list(transfer_layers),
        predict=predict,
        keep_checkpoints=keep_checkpoints,
        train_sizes=train_sizes,
        baselines=as_list(baselines),
    )
    runner.run()
