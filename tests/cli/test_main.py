"""README's bad-input table, one test per row: through the CLI, one sentence naming the culprit,
exit code 2, no traceback (unless GPT_FT_DEBUG is set), and what is already on disk left as it was. Also the
entry point's own bad input (an unknown command) and bad pretraining input."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import gpt_ft
from gpt_ft import GPT, GPTConfig
from gpt_ft.cli import main
from gpt_ft.data.prepare import prepare
from gpt_ft.data.tokenizer import load_tokenizer
from tests.helpers import MICRO, ROOT, common_args, make_task, write_corpus


@pytest.fixture
def run(tmp_path, tokenizer_dir, capsys):
    """A task, a previous run's checkpoint on disk, and `fail(args)`: runs `gpt-ft fit` with the
    task's arguments plus `args`, expects exit code 2, the checkpoint untouched and no new run
    folder, and returns the error line."""
    card = make_task("single", tmp_path)
    earlier = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"an earlier run's checkpoint")

    def fail(*args: str, command: str = "fit", base: bool = True) -> str:
        capsys.readouterr()
        argv = [command, *(common_args(card, tokenizer_dir, tmp_path) if base else []), *args]
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert earlier.read_bytes() == b"an earlier run's checkpoint"
        runs = sorted(p.name for p in earlier.parents[2].iterdir())
        assert runs == ["version_0"]  # no folder left of a run that stopped before it began
        last = err.strip().splitlines()[-1]
        assert last.startswith("gpt-ft: error: ") and last.endswith(".")
        return last

    fail.root, fail.tokenizer_dir = tmp_path, tokenizer_dir
    return fail


def dev(root: Path) -> Path:
    return root / "d" / "dev.tsv"


def test_missing_data_file(run):
    assert run(f"--data.data_dir={dev(run.root)}").endswith(  # it named DIR/d/dev.tsv/d/train.tsv
        f"The data folder {dev(run.root)} is a file: give the folder that holds the files of task 'sent'."
    )
    (run.root / "afile").write_text("kept")
    afile = run.root / "afile"
    assert run(f"--trainer.default_root_dir={afile}").endswith(  # it said "File exists"
        f"--trainer.default_root_dir {afile} is a file, not a folder: "
        "give a folder's name (the file is kept)."
    )
    assert afile.read_text() == "kept"
    dev(run.root).unlink()
    assert "d/dev.tsv: file not found (split 'validation' of task 'sent')" in run()
    dev(run.root).mkdir()
    assert "d/dev.tsv: a folder, not a file (split 'validation' of task 'sent')" in run()


def test_unreadable_data_file(run):
    dev(run.root).write_bytes(b"index\tsentence\tlabel\n0\t\xff\xfe\t1\n")
    assert "d/dev.tsv, line 2: not UTF-8 text (byte 0xff: invalid start byte); save it as UTF-8." in run()
    # UTF-16 without its BOM decodes as UTF-8 (a NUL after each ASCII letter): "1 field where there are 3"
    dev(run.root).write_bytes("index\tsentence\tlabel\n0\tgood\t1\n".encode("utf-16-le"))
    assert (
        "d/dev.tsv, line 1: not UTF-8 text (a NUL byte, as in UTF-16 text or binary data); save it" in run()
    )


def test_wrong_columns(run):
    dev(run.root).write_text("index\ttext\tlabel\n0\ta cat\t1\n")
    assert "d/dev.tsv: missing column(s) ['sentence'] needed by task 'sent'" in run()


def test_label_outside_the_label_set(run):
    dev(run.root).write_text("index\tsentence\tlabel\n0\ta cat\t1\n1\ta dog\tneutral\n")
    assert "d/dev.tsv, line 3: label 'neutral' in field 'label' is not among the labels" in run()
    # runs into folders that do not exist yet leave none of them; an empty one there before stays
    fresh, kept = run.root / "new" / "runs", run.root / "kept"
    kept.mkdir()
    for save_dir in (fresh, kept):
        assert "line 3: label 'neutral'" in run(f"--trainer.logger.init_args.save_dir={save_dir}")
    assert not (run.root / "new").exists() and list(kept.iterdir()) == []


def test_non_numeric_score(tmp_path, tokenizer_dir, capsys):
    card = make_task("similarity", tmp_path)
    (tmp_path / "d" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\thigh\n")
    with pytest.raises(SystemExit):
        main(["fit", *common_args(card, tokenizer_dir, tmp_path)])
    assert "regression score 'high' in field 'label' is not a number" in capsys.readouterr().err


def test_empty_split(run):
    dev(run.root).write_text("index\tsentence\tlabel\n")
    assert "d/dev.tsv: split 'validation' has no examples" in run()


def test_text_longer_than_the_context_is_cut_and_a_context_longer_than_the_model_stops(
    run, tokenizer_dir, capsys
):
    long = " ".join(["the cat sat on the mat ."] * 40)  # far more than 16 tokens
    dev(run.root).write_text(f"index\tsentence\tlabel\n0\t{long}\t1\n")
    card = run.root / "single.yaml"
    args = [f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}", f"--data.data_dir={run.root}"]
    main(["explain", *args, "--data.max_length=16", "--split=validation", "--json=true"])
    assert '"extract_index": 15' in capsys.readouterr().out  # cut to 16 tokens, specials kept
    assert "--data.max_length 100 is longer than the model's context of 64 tokens" in run(
        "--data.max_length=100"
    )


def test_tokenizer_that_does_not_belong_to_the_weights(run, tokenizer_dir):
    other = run.root / "other_model"
    shape = dict(n_positions=64, n_embd=32, n_layer=1, n_head=2)  # MICRO's
    GPT(GPTConfig.from_name("gpt-micro", vocab_size=1000, **shape)).to_hf().save_pretrained(other)
    n = len(load_tokenizer(tokenizer_dir))
    message = run(f"--model.init_from={other}")
    assert (
        f"The tokenizer has {n} tokens, GPT-1's framing tokens included, but the weights in {other} have "
        "1000 (a table has rows no token uses only as released: rounded up to a multiple of 64): they were "
        "not made for each other; use the tokenizer saved with the weights."
    ) in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.preset=gpt9"], "Unknown GPT preset 'gpt9'; available presets: gpt1, gpt2"),
        (["--data.task.init_args.metrics=[bleu]"], "unknown metric(s) ['bleu']; allowed: accuracy"),
    ],
)
def test_unknown_preset_or_metric(run, args, message):
    assert message in run(*args)


def test_unknown_adapter(run):
    card = run.root / "single.yaml"
    card.write_text(card.read_text().replace("SingleText", "SingleTxt"))
    assert "--data.task: class_path 'gpt_ft.adapters.SingleTxt': module 'gpt_ft.adapters' has no" in run()


def test_a_folder_or_a_data_file_for_the_task_card(run):
    for given, what in ((run.root, "a folder"), (dev(run.root), "not a YAML file")):
        assert run(f"--data.task={given}") == (
            f"gpt-ft: error: --data.task {given} is {what}: give a task card (e.g. tasks/glue/rte.yaml)."
        )


def test_checkpoint_of_another_model_shape(run, finetuned):
    small = finetuned.ckpt  # a run of MICRO's shape, n_embd 32
    wider = MICRO.replace("n_embd: 32", "n_embd: 64")
    message = run(f"--model.overrides={wider}", f"--ckpt_path={small}")
    assert f"{small} holds a model with n_embd=32 but this run builds n_embd=64" in message


def test_a_checkpoint_moved_without_its_tokenizer_starts_a_run_with_the_one_given(
    tmp_path, finetuned, tokenizer_dir
):
    """Its saved tokenizer (beside it) is not taken for a hub name: the run's own tokenizer serves."""
    import shutil

    (tmp_path / "lone").mkdir()
    lone = shutil.copy(finetuned.ckpt, tmp_path / "lone" / "last.ckpt")
    run = tmp_path / "run"
    args = [*common_args(finetuned.card, tokenizer_dir, finetuned.root), f"--trainer.default_root_dir={run}"]
    main(["fit", *args, f"--model.init_from={lone}", "--trainer.max_steps=1",
          f"--trainer.logger.init_args.save_dir={run}"])  # fmt: skip
    assert next(run.rglob("last.ckpt")).is_file()


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("--model.lr=0", "lr must be > 0, got 0.0"),
        (  # a short name two packages share: said so, not "EarlyStopping is not a file that can be read"
            "--trainer.callbacks+=EarlyStopping",
            "--trainer.callbacks: EarlyStopping names several classes: give one's full path "
            "(lightning.pytorch.callbacks.EarlyStopping, gpt_ft.training.stopping.EarlyStopping).",
        ),
        ("--model.overrides={n_layer: x}", "n_layer must be an integer, got 'x' (--model.overrides)."),
        ("--data.batch_size=0", "batch_size must be >= 1, got 0"),
        ("--model.lm_coef=-0.5", "lm_coef must be >= 0, got -0.5"),
        ("--trainer.max_epochs=x", "--trainer.max_epochs: expected int, got 'x'"),
        (  # a union's every type and literal, not its first type alone ('expected int')
            "--model.class_weights=balancd",  # a misspelt name: no word on how lists are written
            "--model.class_weights: expected list[float] or one of 'balanced', got 'balancd'.",
        ),
        (
            "--model.class_weights=[1,2,x]",  # and the item of a list at fault
            "--model.class_weights: expected list[float] or one of 'balanced', got \"[1, 2, 'x']\" "
            "(x is not a float).",
        ),
        (
            "--trainer.precision=bf17",
            "--trainer.precision: expected one of 64, 32, 16, 'transformer-engine', "
            "'transformer-engine-float16', '16-true', '16-mixed', 'bf16-true', 'bf16-mixed', '32-true', "
            "'64-true', '64', '32', '16', 'bf16', got 'bf17'.",
        ),
        # A key given twice in a mapping written inline: YAML kept the last, without a word
        (
            "--model.overrides={n_layer: 2, n_layer: 4}",
            "--model.overrides: key 'n_layer' appears twice in {n_layer: 2, n_layer: 4}; give it once.",
        ),
        ("--trainer={max_steps: 2, max_steps: 3}", "--trainer: key 'max_steps' appears twice in"),
        ("-c={trainer: {max_steps: 2, max_steps: 3}}", "-c: key 'max_steps' appears twice in"),  # as --config
        (  # a class added to a list, its required argument unset: "expected a Logger, got [...]"
            "--trainer.logger+=CSVLogger",
            "--trainer.logger: CSVLogger's save_dir is not set: give it after the class, "
            "--trainer.logger+=CSVLogger --trainer.logger.init_args.save_dir=VALUE.",
        ),
        (  # names YAML reads as booleans: said so, as of a card file's
            "--data.task.init_args.labels=[no, yes]",
            "--data.task.labels: expected str, got '[False, True]' (False is not a str): YAML reads yes, no, "
            "true, false as booleans and digits as numbers: quote each (\"['no', 'yes']\").",
        ),
        # A misspelt option: the nearest one (none was said)
        ("--model.lrr=1e-4", "unrecognized arguments: --model.lrr=1e-4 (did you mean --model.lr?)."),
        ("--trainer.precison=32", "(did you mean --trainer.precision?)."),
        # knobs refused before any work (a traceback once the run had started, a run folder left behind,
        # an install hint for what needs a GPU, barebones refusing gpt-ft's own callbacks one by one)
        (
            "--model.compile=foo",
            "--model.compile 'foo' is no torch.compile backend: give true (inductor), false",
        ),
        ("--data.num_workers=-1", "num_workers must be >= 0, got -1."),
        (
            "--trainer.precision=transformer-engine",
            "transformer-engine needs an NVIDIA GPU (Transformer Engine)",
        ),
        (
            "--trainer.barebones=true",
            "--trainer.barebones true is not supported: a gpt-ft run logs its losses",
        ),
        # the beginning of an option was taken for it (argparse's abbreviations): typed whole now
        (
            "--trainer.max_step=1",
            "unrecognized arguments: --trainer.max_step=1 (did you mean --trainer.max_steps?).",
        ),
        ("--model.eps=0", "eps must be > 0, got 0.0."),  # (AdamW's first update: 0/0 in a gradient-free row)
        (
            "--trainer.gradient_clip_val=-1",
            "--trainer.gradient_clip_val must be a finite number >= 0 (0 or null: no clipping), got -1",
        ),
        # Lightning divided by these after the first step (a ZeroDivisionError's traceback)
        (
            "--trainer.val_check_interval=0",
            "--trainer.val_check_interval must be >= 1 (batches, or epochs), got 0.",
        ),
        (
            "--trainer.check_val_every_n_epoch=-1",
            "--trainer.check_val_every_n_epoch must be >= 1 (batches, or epochs), got -1.",
        ),
    ],
)
def test_out_of_range_hyperparameters(run, arg, message):
    assert message in run(arg)


def test_a_card_named_as_the_repositorys_is_found_for_the_message(run, tmp_path, monkeypatch):
    """`--data.task sst2` (or `glue/sst2.yaml` from another folder) said "class_path 'sst2' is not an
    import path": the repository's card of that name is named."""
    from tests.helpers import ROOT

    monkeypatch.chdir(tmp_path)  # (not the repository's root: the card's path from /)
    card = ROOT / "tasks" / "glue" / "sst2.yaml"
    for name in ("sst2", "glue/sst2.yaml"):
        assert run(f"--data.task={name}").endswith(
            f"--data.task: {name} is no card file here; the repository's card of that name is {card}."
        )
    glue, superglue = ROOT / "tasks" / "glue" / "rte.yaml", ROOT / "tasks" / "superglue" / "rte.yaml"
    assert run("--data.task=rte.yaml").endswith(
        f"the repository's cards of that name are {glue}, {superglue}."
    )
    assert run("--data.task=nosuchtask").endswith(
        "--data.task: nosuchtask is neither a card file nor a class path (module.Class)."
    )


def test_a_section_given_what_one_of_its_options_takes_names_that_option(run, tmp_path):
    """`--model WEIGHTS` and `--data CARD`: jsonargparse said "Unable to load config 'WEIGHTS'" and
    that the card's class is no LightningDataModule."""
    assert run("--model=org/weights").endswith(
        "--model: org/weights is no YAML file of its options (weights go to --model.init_from)."
    )
    assert run("--trainer=gone.yaml").endswith("--trainer: gone.yaml does not exist.")
    assert run(f"--data={tmp_path / 'single.yaml'}").endswith(
        "--data: class_path 'gpt_ft.adapters.SingleText' is not a subclass of LightningDataModule "
        "(a task card goes to --data.task)."
    )


def test_weights_without_a_tokenizer_are_named(run, tmp_path):
    """No --data.tokenizer, and --model.init_from weights that carry none: those weights named (as
    `gpt-ft generate` names them), not "--model.init_from weights that carry one"."""
    from tests.helpers import tiny_hf

    tiny_hf("gpt2").save_pretrained(weights := tmp_path / "weights")
    assert run(f"--model.init_from={weights}", "--data.tokenizer=null") == (
        f"gpt-ft: error: {weights} carries no tokenizer: give --data.tokenizer DIR."
    )


def test_devices_given_on_the_command_line_are_named_as_typed(run):
    assert run("--trainer.accelerator=cpu", "--trainer.devices=-2") == (
        "gpt-ft: error: --trainer.devices -2: on the CPU, give a count of processes (1, 2, ...) or 'auto'."
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("model:\n  # lr: 1.0e-4\ntrainer:\n  max_steps: 2\n", "section 'model' is empty"),  # a traceback
        ("model:\n", "section 'model' is empty"),  # (it said the file is a str)
        ("model: [1, 2]\n", "section 'model' is a list, not a mapping"),
        ("seed_everything: 0\ntrainer:\n", "section 'trainer' is empty"),  # every setting before: dropped
        ("trainer: 5\n", "section 'trainer' is an int, not a mapping"),
    ],
)
def test_a_config_section_that_is_no_mapping_names_the_file(run, text, said):
    config = run.root / "section.yaml"
    config.write_text(text)
    assert run(f"--config={config}") == (
        f"gpt-ft: error: {config}: {said}: give its settings as a mapping (key: value), or leave the "
        "section out."
    )


def test_a_bad_option_in_a_config_file_names_the_file(run):
    """jsonargparse names an option from a `--config` file as if it were typed; the file is named:
    the one that gave the bad value where two give the option, and the command line where it did."""
    good, bad, unknown = (run.root / name for name in ("good.yaml", "bad.yaml", "unknown.yaml"))
    good.write_text("trainer:\n  max_epochs: 3\n")
    bad.write_text("trainer:\n  max_epochs: three\n")
    unknown.write_text("model:\n  init_args:\n    bogus: 1\n")
    expected = f"gpt-ft: error: {bad}: trainer.max_epochs: expected int, got 'three'."
    assert run(f"--config={bad}") == expected
    assert run("--config", str(good), "-c", str(bad)) == expected
    assert run("--config", str(good), "--trainer.max_epochs=x") == (
        "gpt-ft: error: --trainer.max_epochs: expected int, got 'x'."
    )
    assert run("--config", str(bad), "--trainer.max_epochs=4") == expected  # the file is read first
    assert run("-c", str(unknown)).startswith(f"gpt-ft: error: {unknown}: ")
    # Values our own checks refuse, and a task's class path that does not import, named the option alone
    checked = run.root / "checked.yaml"
    checked.write_text("seed_everything: -1\n")
    assert (
        run("-c", str(checked))
        == f"gpt-ft: error: {checked}: seed_everything must be in [0, 4294967295], got -1."
    )
    assert run("-c", str(checked), "--seed_everything=-1") == (
        "gpt-ft: error: --seed_everything must be in [0, 4294967295], got -1."
    )
    checked.write_text(
        "data:\n  task:\n    class_path: gpt_ft.adapters.SingleTxt\n    init_args: {name: x}\n"
    )
    assert run("-c", str(checked)) == (
        f"gpt-ft: error: {checked}: data.task: class_path 'gpt_ft.adapters.SingleTxt': module "
        "'gpt_ft.adapters' has no attribute 'SingleTxt'."
    )
    listed = run.root / "listed_weights.yaml"  # a list with a bad item: its message says more after the value
    listed.write_text("model:\n  class_weights: [1, x]\n")
    assert run("-c", str(listed)) == (
        f"gpt-ft: error: {listed}: model.class_weights: expected list[float] or one of 'balanced', got "
        "\"[1, 'x']\" (x is not a float)."
    )
    listed.write_text("trainer:\n  devices: [0, a]\n")  # an item whose type is also the union's
    assert run("-c", str(listed)) == (
        f"gpt-ft: error: {listed}: trainer.devices: expected list[int] or str or int, got \"[0, 'a']\" "
        "(a is not an int)."
    )
    overrides = run.root / "overrides.yaml"  # a value refused once parsed: its option said last
    overrides.write_text("model:\n  overrides: {n_layer: abc}\n")
    expected = "GPTConfig.n_layer must be an integer, got 'abc' (model.overrides)."
    assert run("-c", str(overrides)) == f"gpt-ft: error: {overrides}: {expected}"
    assert run("-c", str(overrides), "--model.overrides={n_layer: x}") == (
        "gpt-ft: error: GPTConfig.n_layer must be an integer, got 'x' (--model.overrides)."
    )
    # A file that gives the option a good value is not blamed for the command line's mapping.
    assert run("--config", str(good), "--trainer={max_epochs: abc}") == (
        "gpt-ft: error: --trainer.max_epochs: expected int, got 'abc'."
    )
    assert run("--config", str(good), "--trainer={max_epochz: 1}") == (
        "gpt-ft: error: Subcommand 'fit' does not accept option 'trainer.max_epochz'."
    )
    # --print_config's own wording of an unknown key ("Group 'model' does not accept ...") named no file.
    lrr = run.root / "lrr.yaml"
    lrr.write_text("model:\n  lrr: 0.1\n")
    assert run("--config", str(lrr), "--print_config") == (
        f"gpt-ft: error: {lrr}: Group 'model' does not accept option 'lrr'."
    )
    # A misspelt argument of a callback in a config's list of them: the file, not the command line.
    callbacks = run.root / "callbacks.yaml"
    callbacks.write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "      init_args: {monitor: validation/loss}\n"
        "    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n"
        "      init_args: {logging_interva: step}\n"
    )
    assert run("--config", str(callbacks)) == (
        f"gpt-ft: error: {callbacks}: trainer.callbacks: Option 'logging_interva' is not accepted."
    )
    # A list where a card field takes a bool: jsonargparse quotes it ('[1]'), and the file was not named.
    listed = run.root / "listed.yaml"
    listed.write_text("data:\n  task:\n    init_args:\n      strip_texts: [1]\n")
    assert run("--config", str(listed)) == (
        f"gpt-ft: error: {listed}: data.task.strip_texts: expected bool, got '[1]'."
    )
    # A card path in a config is relative to the config's folder, which the message says.
    relative = run.root / "configs" / "relative.yaml"
    relative.parent.mkdir()
    relative.write_text("data:\n  task: tasks/single.yaml\n")
    expected = (
        f"gpt-ft: error: {relative}: data.task: tasks/single.yaml does not exist: it is relative to the "
        f"config's folder, {relative.parent}."
    )
    assert run("--config", str(relative)) == expected
    assert run("--config", str(relative), "--data.task=nowhere.yaml") == expected  # the file is read first
    assert run("--data.task=nowhere.yaml") == "gpt-ft: error: --data.task: nowhere.yaml does not exist."
    gone, moved = run.root / "gone.yaml", run.root / "moved.yaml"
    gone.symlink_to(moved)  # (it was "not a file that can be read")
    assert run(f"--data.task={gone}") == (
        f"gpt-ft: error: --data.task: {gone} is a symbolic link to {moved}, which does not exist."
    )
    assert run("--data.task=gpt_ft.adapters.SingleTxt") == (  # a class path misspelled, no file
        "gpt-ft: error: --data.task: class_path 'gpt_ft.adapters.SingleTxt' does not import: gpt_ft.adapters "
        "has no 'SingleTxt'."
    )
    assert run("--trainer.callbacks+=torch.nn.Linear") == (  # one that imports: of another kind
        "gpt-ft: error: --trainer.callbacks: class_path 'torch.nn.Linear' is not a class this option takes."
    )


def test_an_option_without_its_value_says_how_to_give_one(run):
    """argparse takes a value that starts with "-" for the next option ("expected one argument")."""
    assert run("--model.lr") == (
        "gpt-ft: error: --model.lr is given no value: write --model.lr VALUE (true or false for a yes/no "
        "option; --model.lr=VALUE for a value starting with '-')."
    )
    # Several values after one option (a shell's `--inputs data/*.txt`): argparse's "unrecognized".
    several = "takes one value: where it takes several, write them as one list, '[a, b]')."
    assert run("--inputs", "a.txt", "b.txt", "c.txt", command="prepare", base=False) == (
        f"gpt-ft: error: unrecognized arguments: b.txt c.txt (--inputs {several}"
    )
    assert run("stray") == "gpt-ft: error: unrecognized arguments: stray."
    # A value YAML reads otherwise is quoted as typed ("-" reads as [None], "no" as False).
    for typed in ("-", "no", "~"):
        assert run(f"--model.lr={typed}") == f"gpt-ft: error: --model.lr: expected float, got {typed!r}."
    assert run("--model.lr=[1,2]") == "gpt-ft: error: --model.lr: expected float, got '[1,2]'."
    assert run("--inputs", "a.txt", "--bogus", "x", command="prepare", base=False) == (
        "gpt-ft: error: unrecognized arguments: --bogus x."  # an unknown option, not a second value
    )


def test_a_card_given_to_a_pretraining_config_says_whose_option_it_is(run, capsys):
    """configs/pretrain/cpu.yaml's data module reads token files: a card given with it was said to
    be at fault inside the card ("(in single.yaml)")."""
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                f"--config={ROOT / 'configs/pretrain/cpu.yaml'}",
                f"--data.task={run.root / 'single.yaml'}",
            ]
        )
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpt-ft: error: --data: Option 'task' is not accepted (the data module given reads a corpus's token "
        "files; a card is a fine-tuning config's)."
    )


def test_a_logger_whose_package_is_not_installed(run, monkeypatch):
    """TensorBoard's logger without tensorboard: the one sentence `--trainer.accelerator tpu` gets,
    not jsonargparse's four lines."""
    from lightning.fabric.loggers import tensorboard

    monkeypatch.setattr(tensorboard, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(tensorboard, "_TENSORBOARDX_AVAILABLE", False)
    assert run("--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger") == (
        "gpt-ft: error: a package this run needs is not installed: Neither `tensorboard` nor "
        "`tensorboardX` is available. Try `pip install`ing either."
    )


def test_debug_shows_the_traceback(run, monkeypatch):
    monkeypatch.setenv("GPT_FT_DEBUG", "1")
    with pytest.raises(Exception, match="lr must be > 0"):
        main(["fit", *common_args(run.root / "single.yaml", run.tokenizer_dir, run.root), "--model.lr=0"])


class RunsCode:
    """Unpickling it would create a file: the trace of code run from a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_checkpoint_that_would_run_code_is_refused(run):
    import torch

    evil, marker = run.root / "evil.ckpt", run.root / "code-ran"
    torch.save({"gpt_config": {}, "state_dict": {}, "payload": RunsCode(marker)}, evil)
    message = run(f"--ckpt_path={evil}", command="validate")
    assert f"{evil} holds objects other than tensors and plain values" in message
    assert "weights_only=True" in run(f"--model.init_from={evil}")
    assert "weights_only=True" in run(f"--ckpt_path={evil}")  # resuming reads it the same way
    assert not marker.exists()


def test_bad_hyperparameter_exits_with_one_sentence(tmp_path, tokenizer_dir, monkeypatch, capsys):
    """As from the shell: `main()` reads sys.argv."""
    card = make_task("single", tmp_path)
    argv = ["gpt-ft", "fit", *common_args(card, tokenizer_dir, tmp_path), "--model.lm_coef=-1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "gpt-ft: error: lm_coef must be >= 0, got -1.0."
    assert "Traceback" not in err


def last_error(capsys, *argv: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err[-2000:]
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_bad_pretraining_input(tmp_path, tokenizer_dir, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("  \n")
    empty = [
        "prepare",
        "--inputs",
        str(tmp_path / "empty"),
        "--tokenizer",
        tokenizer_dir,
        "--out_dir",
        str(tmp_path / "t0"),
    ]
    assert "holds no text" in last_error(capsys, *empty)
    assert not (tmp_path / "t0" / "train.bin").exists()
    (tmp_path / "small.txt").write_text("the cat sat on the mat . " * 40)  # one piece, drawn for validation
    small = ["prepare", "--inputs", str(tmp_path / "small.txt"), "--tokenizer", tokenizer_dir,
             "--out_dir", str(tmp_path / "t1"), "--validation_fraction", "0.99"]  # fmt: skip
    message = last_error(capsys, *small)
    assert (
        "to the validation split and none to train: give a smaller --piece_chars (65,536), a lower "
        "--validation_fraction (0.99) or more text." in message
    )
    assert not (tmp_path / "t1" / "train.bin").exists()
    assert last_error(capsys, "tokenizer", "--inputs", str(tmp_path / "small.txt"), "--vocab_size", "300",
                      "--min_frequency", "-1", "--out_dir", str(tmp_path / "tok")) == (
        "gpt-ft: error: --min_frequency must be >= 0, got -1."
    )  # fmt: skip

    corpus = write_corpus(tmp_path, n_files=1, lines=10)
    assert prepare(
        out_dir=tmp_path / "tokens",
        tokenizer=tokenizer_dir,
        inputs=[str(corpus)],
        validation_fraction=0,
        progress=False,
    )
    n = json.loads((tmp_path / "tokens" / "meta.json").read_text())["tokens"]["train"]
    fit = ["fit", "--config", "configs/pretrain/cpu.yaml", f"--data.token_dir={tmp_path / 'tokens'}"]
    message = last_error(capsys, *fit, f"--data.block_size={n}")
    assert f"holds {n} tokens, fewer than one block of block_size + 1 = {n + 1}" in message


def test_unknown_command_and_usage(capsys):
    assert last_error(capsys, "prepare") == (  # named as typed (it said "out_dir, tokenizer")
        "gpt-ft: error: the following arguments are required: --out_dir, --tokenizer."
    )
    assert last_error(capsys, "prepare", "--out=x", "--tokenizer=t", "--inputs=[a]") == (  # not --out_dir
        "gpt-ft: error: unrecognized arguments: --out=x."
    )
    assert last_error(capsys, "fitt") == (
        "gpt-ft: error: unknown command 'fitt' (did you mean fit?); choose from fit, validate, test, "
        "predict, explain, prepare, tokenizer, generate, label, embed, suite, calibrate, export."
    )
    with pytest.raises(SystemExit) as no_command:  # a usage error, as argparse's
        main([])
    assert no_command.value.code == 2
    with pytest.raises(SystemExit) as asked:
        main(["--help"])
    assert asked.value.code == 0
    usage = capsys.readouterr().out
    assert usage.count("usage: gpt-ft") == 2
    assert usage.startswith(
        "usage: gpt-ft {fit,validate,test,predict,explain,prepare,tokenizer,generate,label,embed,suite,"
        "calibrate,export}"
    )
    assert "  suite      fine-tune and evaluate many tasks over seeds" in usage
    main(["--version"])
    assert capsys.readouterr().out == f"gpt-ft {gpt_ft.__version__}\n"


@pytest.mark.parametrize("command", ["label", "generate", "embed", "export"])
def test_a_typed_command_names_the_config_file_giving_an_unknown_option(tmp_path, capsys, command):
    config = tmp_path / "settings.yaml"
    config.write_text("bogus:\n  x: 1\nlimit: 3\n")
    assert last_error(capsys, command, "--config", str(config)) == (
        f"gpt-ft: error: {config}: Option 'bogus.x' is not accepted."
    )
    config.write_text("colour: red\n")
    assert last_error(capsys, command, "--config", str(config)) == (
        f"gpt-ft: error: {config}: Option 'colour' is not accepted."
    )


def fit_llama_family(root: Path, tokenizer_dir: str, family: str, *args: str) -> Path:
    """`gpt-ft fit` of GPT-1's recipe from a tiny transformers model of `family` on a pair task
    for 1 epoch, plus `args`; returns the run's last.ckpt."""
    from tests.helpers import tiny_llama

    weights = root / "weights"
    if not weights.exists():
        tiny_llama(family, vocab_size=len(load_tokenizer(tokenizer_dir)) - 4).save_pretrained(weights)
    card = make_task("pair", root)
    logs = root / "runs" / "-".join([family, *args]).replace("/", "_")
    main(["fit", "--config", str(ROOT / "configs/finetune/gpt1.yaml"), f"--model.init_from={weights}",
          f"--data.tokenizer={tokenizer_dir}", f"--data.task={card}", f"--data.data_dir={root}",
          "--data.batch_size=2", "--data.max_length=64", "--trainer.max_epochs=1", "--model.lr=1e-3",
          f"--trainer.logger.init_args.save_dir={logs}", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", *args])  # fmt: skip
    (metrics,) = logs.rglob("metrics.csv")
    assert "validation/accuracy" in metrics.read_text().splitlines()[0]
    (ckpt,) = logs.rglob("last.ckpt")
    return ckpt


PAIR = {"sentence1": "the cat sat on the mat .", "sentence2": "a cat sat ."}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3_text"])
def test_fine_tunes_a_llama_family_checkpoint(tmp_path, tokenizer_dir, family):
    """GPT-1's recipe from a transformers Llama/Qwen2/Qwen3/Gemma 3 directory: the special tokens
    grow its embedding (and untied head), it trains and validates, the Classifier reads the
    checkpoint, and the fine-tuned model goes back to transformers with the same logits."""
    from gpt_ft import Classifier

    ckpt = fit_llama_family(tmp_path, tokenizer_dir, family)
    clf = Classifier.from_checkpoint(ckpt, device="cpu")
    gpt = clf.gpt
    assert gpt.config.hf_model_type == family and (gpt.lm_head is None) == gpt.config.tie_embeddings
    exported = gpt.to_hf()
    assert exported.config.model_type == family and exported.config.vocab_size == gpt.config.vocab_size
    assert exported.config.tie_word_embeddings == gpt.config.tie_embeddings
    ids = torch.randint(0, gpt.config.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, gpt.lm_logits(gpt(ids)), rtol=0, atol=1e-5)
    (pred,) = clf.predict([PAIR])
    assert pred["label"] in ("entailment", "not_entailment") and sum(
        pred["scores"].values()
    ) == pytest.approx(1)


def test_lora_checkpoints_hold_the_adapters_or_the_merged_model(tmp_path, tokenizer_dir, capsys, monkeypatch):
    """--model.lora: checkpoints of the trained weights only (plus the base's name) resume and
    load; with lora.checkpoint=merged the same run's checkpoint is a plain model that predicts
    the same probabilities."""
    from transformers import AutoModelForCausalLM

    from gpt_ft import Classifier
    from gpt_ft.weights.checkpoint import safe_load

    adapters = fit_llama_family(tmp_path, tokenizer_dir, "llama", "--model.lora.rank=4")
    stored = safe_load(adapters)
    assert stored["lora"]["base"] == str((tmp_path / "weights").resolve()) and stored["lora"]["rank"] == 4
    keys = set(stored["state_dict"])
    assert keys and all(k.endswith(("lora_A", "lora_B", "new_rows")) or k.startswith("head.") for k in keys)
    assert adapters.stat().st_size < (tmp_path / "weights" / "model.safetensors").stat().st_size / 2
    capsys.readouterr()
    quiet = [
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    main(["validate", f"--ckpt_path={adapters}", *quiet])  # the base weights and adapters, nothing else given
    assert "validation/accuracy" in capsys.readouterr().out
    # adapters in part: the rest would start afresh beside them, without a word
    partial = adapters.parent / "partial.ckpt"  # beside its tokenizer
    torch.save(
        {**stored, "state_dict": {k: v for k, v in stored["state_dict"].items() if not k.endswith("lora_B")}},
        partial,
    )
    lacks = rf"^{partial} lacks LoRA weights \['h.0.attn.c_attn.lora_B', .*: it is not a complete LoRA"
    with pytest.raises(ValueError, match=lacks):
        Classifier.from_checkpoint(partial, device="cpu")
    with pytest.raises(SystemExit):
        main(["validate", f"--ckpt_path={partial}", *quiet])
    assert re.search(lacks[1:], capsys.readouterr().err)
    merged = fit_llama_family(tmp_path, tokenizer_dir, "llama", "--model.lora.rank=4",
                              "--model.lora.checkpoint=merged")  # fmt: skip
    assert "lora" not in safe_load(merged)
    main(["validate", f"--ckpt_path={merged}", *quiet])  # a plain model now
    assert "validation/accuracy" in capsys.readouterr().out
    (a,), (b,) = (Classifier.from_checkpoint(c, device="cpu").predict([PAIR]) for c in (adapters, merged))
    assert a["label"] == b["label"]
    for label, p in a["scores"].items():
        assert b["scores"][label] == pytest.approx(p, abs=1e-5)
    # resuming: from the adapters, and the merged file named in one sentence
    fit_llama_family(tmp_path, tokenizer_dir, "llama", "--model.lora.rank=4", f"--ckpt_path={adapters}",
                     "--trainer.max_epochs=2")  # fmt: skip
    with pytest.raises(SystemExit):
        fit_llama_family(tmp_path, tokenizer_dir, "llama", "--model.lora.rank=4", f"--ckpt_path={merged}",
                         "--trainer.max_epochs=2")  # fmt: skip
    assert f"{merged} holds no LoRA adapters (a merged or plain model)" in capsys.readouterr().err
    # other adapter settings: a page of size mismatches, or the same tensors scaled otherwise, silently
    with pytest.raises(SystemExit):
        fit_llama_family(tmp_path, tokenizer_dir, "llama", "--model.lora.rank=2", "--model.lora.alpha=64",
                         f"--ckpt_path={adapters}", "--trainer.max_epochs=3")  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {adapters} holds LoRA adapters trained with --model.lora.rank 4 (this run: 2); "
        "--model.lora.alpha 16.0 (this run: 64.0): resume with those."
    )
    (tmp_path / "weights").rename(tmp_path / "moved")  # the base named in the adapters' checkpoint
    with pytest.raises(
        FileNotFoundError, match=rf"^{adapters} holds LoRA adapters of base weights that cannot be"
    ):
        Classifier.from_checkpoint(adapters, device="cpu")
    with pytest.raises(SystemExit):
        main(["validate", f"--ckpt_path={adapters}", *quiet])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: The base weights {(tmp_path / 'weights').resolve()} do not exist: LoRA adapters "
        "need them (a LoRA checkpoint names them by their path); give their place with --model.init_from."
    )
    main(["validate", f"--ckpt_path={adapters}", f"--model.init_from={tmp_path / 'moved'}", *quiet])
    assert "validation/accuracy" in capsys.readouterr().out
    # Other weights of the same shape where the base was: named by their fingerprints, not adapted.
    other = AutoModelForCausalLM.from_pretrained(tmp_path / "moved")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn_like(p))
    other.save_pretrained(tmp_path / "weights")
    trained_on = safe_load(adapters)["lora"]["base_fingerprint"]
    changed = (
        rf"holds LoRA adapters of other base weights than {tmp_path / 'weights'} holds now \(fingerprint"
    )
    # Each command names the remedy it takes (Classifier, export and label take no --model.init_from).
    base = re.escape(str((tmp_path / "weights").resolve()))
    needed = rf"the weights they were trained on are needed \(put them back at {base}\), or a checkpoint"
    with pytest.raises(ValueError, match=rf"^{adapters} {changed} \w+, trained on {trained_on}\): {needed}"):
        Classifier.from_checkpoint(adapters, device="cpu")
    with pytest.raises(SystemExit):
        main(["validate", f"--ckpt_path={adapters}", *quiet])
    err = capsys.readouterr().err
    assert re.search(changed, err) and "are needed (give them with --model.init_from)" in err
    # A hub id's base moves with its newest commit: no path to put them back at, the commit to pin.
    from gpt_ft.weights import pretrained

    stored = torch.load(adapters, weights_only=False)
    stored["lora"]["base"] = "org/tiny"
    torch.save(stored, hub_made := adapters.parent / "hub.ckpt")  # beside its tokenizer
    load = pretrained.load_gpt
    monkeypatch.setattr(pretrained, "load_gpt", lambda base, *read: load(str(tmp_path / "weights")))
    with pytest.raises(
        ValueError, match=r"needed \(the commit they were trained on: --model.init_from org/tiny@COM"
    ):
        Classifier.from_checkpoint(hub_made, device="cpu")
    monkeypatch.undo()
    other.save_pretrained(tmp_path / "changed")  # given in the base's place: that folder named
    with pytest.raises(SystemExit):
        main(["validate", f"--ckpt_path={adapters}", f"--model.init_from={tmp_path / 'changed'}", *quiet])
    assert re.search(
        rf"other base weights than {tmp_path / 'changed'} holds now \(trained on {tmp_path / 'weights'}'s\)",
        capsys.readouterr().err,
    )


def test_lora_on_4_bit_weights_fine_tunes_and_its_adapters_load(tmp_path, tokenizer_dir, capsys):
    """--model.lora.quantize nf4: the run trains on the 4-bit base; its checkpoint holds the trained
    weights only, records the setting, validates and loads (the base quantized anew, then merged)."""
    pytest.importorskip("torchao", reason='the "quantize" extra')
    from gpt_ft import Classifier
    from gpt_ft.weights.checkpoint import safe_load

    lora = ["--model.lora.rank=4", "--model.lora.quantize=nf4"]
    ckpt = fit_llama_family(tmp_path, tokenizer_dir, "llama", *lora)
    stored = safe_load(ckpt)
    assert stored["lora"]["quantize"] == "nf4" and stored["hyper_parameters"]["lora"]["quantize"] == "nf4"
    keys = set(stored["state_dict"])
    assert keys and all(k.endswith(("lora_A", "lora_B", "new_rows")) or k.startswith("head.") for k in keys)
    capsys.readouterr()
    quiet = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
    main(["validate", f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}", *quiet])
    assert "validation/accuracy" in capsys.readouterr().out
    (pred,) = Classifier.from_checkpoint(ckpt, device="cpu").predict([PAIR])
    assert sum(pred["scores"].values()) == pytest.approx(1)


def test_an_unknown_quantization_or_a_missing_package_is_named(run, monkeypatch):
    assert run("--model.lora.quantize=int3") == (
        "gpt-ft: error: --model.lora.quantize: expected one of 'nf4', got 'int3'."
    )
    for module in ("torchao", "torchao.quantization"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed: `import` raises
    assert run("--model.lora.quantize=nf4") == (
        'gpt-ft: error: lora.quantize nf4 needs torchao: pip install "gpt_ft[quantize]".'
    )


def test_released_weights_with_more_rows_than_their_tokenizer_has_tokens(tmp_path, tokenizer_dir):
    """A Qwen2-shaped model saved with its own tokenizer, its rows rounded up to a multiple of 64 (as
    Qwen2.5's 151,936 for 151,665 tokens): fine-tunes with no --data.tokenizer, and writes the table
    back whole."""
    from gpt_ft.eval.classifier import Classifier
    from tests.helpers import tiny_llama

    tokenizer = load_tokenizer(tokenizer_dir)
    n = len(tokenizer)
    weights = tmp_path / "released"
    rows = (n // 64 + 1) * 64
    released = tiny_llama("qwen2", vocab_size=rows, tie_word_embeddings=False)
    released.save_pretrained(weights)
    tokenizer.save_pretrained(weights)
    card = make_task("pair", tmp_path)
    main(["fit", "--config", str(ROOT / "configs/finetune/gpt1.yaml"), f"--model.init_from={weights}",
          f"--data.task={card}", f"--data.data_dir={tmp_path}", "--data.batch_size=2", "--data.max_length=64",
          "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])  # fmt: skip
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")
    gpt = Classifier.from_checkpoint(ckpt, device="cpu").gpt
    assert gpt.config.vocab_size == n and gpt.config.released_rows == rows
    exported = gpt.to_hf()
    assert exported.get_input_embeddings().weight.shape[0] == rows == exported.config.vocab_size
    # The released rows of the model's own tokens are kept (untrained: frozen by nothing, but the
    # unused rows past the tokenizer are never looked up or predicted, so they stay as released).
    before = released.get_input_embeddings().weight
    after = exported.get_input_embeddings().weight
    torch.testing.assert_close(after[n:], before[n:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA accelerator is available here")
def test_a_setting_lightning_refuses_is_one_sentence(tmp_path, tokenizer_dir, capsys):
    """Lightning's MisconfigurationException (here: a CUDA accelerator on a machine without one)
    ends in its own sentence and exit code 2, not a traceback."""
    card = make_task("single", tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["fit", *common_args(card, tokenizer_dir, tmp_path), "--trainer.accelerator=cuda"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "gpt-ft: error: `CUDAAccelerator` can not run on your system" in err and "Traceback" not in err


def test_a_command_that_joined_a_process_group_destroys_it_before_exiting(monkeypatch, tmp_path):
    """A gloo group left to the interpreter's exit can abort a finished DDP process (exit -6, seen
    once under load in `gpt-ft predict` on 2 processes): every command destroys its group."""
    import torch.distributed as dist

    entry = importlib.import_module("gpt_ft.cli.main")

    def joins(name, args):
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))

    monkeypatch.setitem(entry.COMMANDS, "joins", entry.Command("a run on one process", joins))
    entry.main(["joins"])
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "command, raised, said",
    [
        ("fit", lambda: torch.empty(2**48), "out of memory (it asked for 1048576.00 GiB more): lower "
         "--data.batch_size (raise --trainer.accumulate_grad_batches as much to keep a step's examples) or "
         "the sequences' length (--data.max_length; a corpus's --data.block_size), or a smaller model."),
        ("calibrate", lambda: torch.empty(2**48), "out of memory (it asked for 1048576.00 GiB more)."),
        ("predict", lambda: (_ for _ in ()).throw(torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB")),
         "out of GPU memory (it asked for 2.00 GiB more): lower --data.eval_batch_size."),
        ("label", lambda: torch.empty(2**48), "out of memory (it asked for 1048576.00 GiB more): lower "
         "--batch_size."),
        ("fit", lambda: (_ for _ in ()).throw(OSError(28, "No space left on device")),
         "a file could not be written (No space left on device): the run's config.yaml, metrics.csv or "
         "logs, under --trainer.default_root_dir (runs/ unless given)."),
    ],
)  # fmt: skip
def test_memory_run_out_and_a_full_disk_naming_no_file_are_one_sentence(
    monkeypatch, capsys, command, raised, said
):
    """torch's allocators (the CPU's, the real error; CUDA's) and a write that names no file (jsonargparse
    saving config.yaml, fsspec closing metrics.csv) were a traceback, exit 1."""
    entry = importlib.import_module("gpt_ft.cli.main")
    monkeypatch.setitem(entry.COMMANDS, command, entry.Command("runs out", lambda name, args: raised()))
    with pytest.raises(SystemExit) as stopped:
        entry.main([command])
    assert stopped.value.code == 2 and capsys.readouterr().err == f"gpt-ft: error: {said}\n"


def test_the_cli_keeps_freed_memory_unless_malloc_was_tuned_already(monkeypatch):
    """On Linux, every command first raises glibc's mmap threshold to 1 GiB and its trim threshold
    to 2 GiB (`mallopt`); not where the user set malloc's thresholds in the environment."""
    from gpt_ft.training import memory as entry

    calls = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(entry.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(entry.sys, "platform", "linux")
    for name in entry.GLIBC_MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    entry.keep_freed_memory()
    assert calls == [(-3, 1 << 30), (-1, (1 << 31) - 1)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    calls.clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    entry.keep_freed_memory()
    assert calls == []


def test_ctrl_c_in_a_command_without_a_trainer_is_one_line_and_exit_130(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    """`gpt-ft prepare` (or any command that is no Lightning run) stopped by Ctrl-C: the shell's
    exit code and one line, not a traceback; what it was writing is cleaned up as ever."""
    import gpt_ft.data.prepare as preparing

    def interrupted(paths, split_on):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(preparing, "file_documents", interrupted)
    out = tmp_path / "tokens"
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "prepare",
                "--inputs",
                str(write_corpus(tmp_path)),
                "--tokenizer",
                tokenizer_dir,
                "--out_dir",
                str(out),
            ]
        )
    assert stopped.value.code == 130 and not out.exists()
    assert capsys.readouterr().err.endswith("gpt-ft: stopped by Ctrl-C (SIGINT)\n")


def test_a_checkpoint_whose_card_class_cannot_be_imported_is_named(tmp_path, capsys, finetuned):
    """A card of an adapter of one's own whose module is not importable here: `label` said "a
    package this run needs is not installed" (the import's error, hidden by the sentence that names
    the checkpoint and the class, was read first)."""
    import shutil

    import torch

    saved = torch.load(finetuned.ckpt, weights_only=False)
    saved["data_config"]["init_args"]["task"]["class_path"] = "my_own_tasks.TripleText"
    torch.save(saved, ckpt := tmp_path / "last.ckpt")
    shutil.copytree(finetuned.ckpt.parent / "tokenizer", tmp_path / "tokenizer")
    (rows := tmp_path / "rows.tsv").write_text("sentence\na cat .\n")
    assert last_error(
        capsys, "label", f"--ckpt_path={ckpt}", f"--input={rows}", f"--output={tmp_path / 'o.tsv'}"
    ) == (
        f"gpt-ft: error: The task card recorded in {ckpt}: class_path 'my_own_tasks.TripleText': No module "
        "named 'my_own_tasks' (a module of your own is found where PYTHONPATH names its folder)."
    )


def test_output_read_by_a_pipe_that_closed_ends_quietly(monkeypatch, capsys):
    """`gpt-ft generate ... | head`: the reader closed the pipe; a traceback of BrokenPipeError ended
    the command (or, at the last flush, exit code 1 and no word), where a shell's tools end quietly."""
    cli = importlib.import_module("gpt_ft.cli.main")  # (the module: `gpt_ft.cli.main` is its function)

    def cut(name, args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.COMMANDS, "explain", cli.COMMANDS["explain"]._replace(run=cut))
    monkeypatch.setattr(cli.os, "dup2", lambda fd, fd2: None)  # (pytest's own stdout stays)
    monkeypatch.setattr(cli.sys, "stdout", open(os.devnull, "w"))  # noqa: SIM115 (closed with the test's)
    with pytest.raises(SystemExit) as stopped:
        main(["explain"])
    assert stopped.value.code == 141 and capsys.readouterr().err == ""


def test_a_command_called_from_python_leaves_its_process_as_it_found_it(tmp_path, finetuned, monkeypatch):
    """A notebook's second run given no seed took the first run's (Lightning's seed_everything left
    PL_GLOBAL_SEED behind, which the next seed_everything(None) reads back); warnings' filters and
    format and the torchao loggers' levels stayed changed too. Loading a checkpoint drew from
    torch's random generator (a model made at random to be overwritten), so a seeded notebook's
    later draws depended on it."""
    import logging
    import warnings

    from gpt_ft.weights.checkpoint import Checkpoint
    from gpt_ft.weights.pretrained import gpt_from_checkpoint

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    filters, shown = list(warnings.filters), warnings.formatwarning
    monkeypatch.setattr(logging.getLogger("gpt_ft"), "handlers", [])  # (as in a fresh process)
    monkeypatch.setattr(logging.getLogger("gpt_ft"), "level", logging.NOTSET)
    names = ("torchao", "torch.utils._pytree", "gpt_ft")
    levels = [(logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names]
    quiet = [
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    main(["validate", f"--ckpt_path={finetuned.ckpt}", "--seed_everything=5", *quiet])
    assert "PL_GLOBAL_SEED" not in os.environ and "PL_SEED_WORKERS" not in os.environ
    assert warnings.filters == filters and warnings.formatwarning is shown
    assert [(logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names] == levels
    torch.manual_seed(0)
    drawn = torch.get_rng_state()
    checkpoint = Checkpoint.read(finetuned.ckpt)
    gpt = gpt_from_checkpoint(checkpoint)
    assert torch.equal(torch.get_rng_state(), drawn) and {p.device.type for p in gpt.parameters()} == {"cpu"}
    # Its weights its own: not the file's mapped tensors, nor those of another model of the same read.
    other, saved = gpt_from_checkpoint(checkpoint), checkpoint.gpt_state["wpe.weight"].clone()
    with torch.no_grad():
        gpt.wpe.weight.add_(1.0)
    assert torch.equal(other.wpe.weight, saved) and torch.equal(checkpoint.gpt_state["wpe.weight"], saved)
