"""The bad-input table's rows about where gpt-ft writes, and the cards, prompts and suite files it
reads: through the CLI, one sentence naming the option or file, exit code 2, no traceback, and
every file already on disk left as it was. (A disk that fills while a checkpoint is saved during
`fit`: tests/training/test_checkpointing.py.)"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gpt_ft import Classifier
from gpt_ft.cli import main
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.errors import WriteError, os_error_message
from tests.helpers import ROOT, common_args, make_task

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def files(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: what "nothing on disk changed" compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def error(capsys, *argv: str) -> str:
    """`gpt-ft ARGV`, which must stop with exit code 2 and one sentence and no traceback: the sentence."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpt-ft: error: ") and last.endswith(".")
    return last.removeprefix("gpt-ft: error: ")


@pytest.fixture
def labelling(tmp_path, finetuned):
    """A file to label, with the finetuned checkpoint: `label(*args)` gives the command's argv."""
    source = tmp_path / "mine.tsv"
    source.write_text("sentence\nthe cat sat on the mat .\ntwo dogs run in a park .\n")
    return lambda *args: ["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", *args]


# ---- output locations, checked before any work starts ----


def test_predictions_dir_that_is_a_file(tmp_path, finetuned, capsys):
    taken = tmp_path / "predictions"
    taken.write_text("a file of the user's")
    before = files(tmp_path)
    ckpt, where = f"--ckpt_path={finetuned.ckpt}", f"--model.predictions_dir={taken}"
    assert error(capsys, "predict", ckpt, where, *QUIET, f"--trainer.default_root_dir={tmp_path}") == (
        f"--model.predictions_dir {taken} is a file, not a folder: give a folder's name (the file is kept)."
    )
    assert files(tmp_path) == before


def test_predictions_that_would_replace_a_split_file(tmp_path, finetuned, capsys, monkeypatch):
    """A card without submission files whose test file is TASK-test.tsv, predicted into its data
    folder: refused before any work (the predictions replaced the texts)."""
    shutil.copytree(finetuned.root / "d", tmp_path / "d")
    shutil.copy(tmp_path / "d" / "test.tsv", tmp_path / "sent-test.tsv")
    card = tmp_path / "card.yaml"
    text = finetuned.card.read_text().replace("test: d/test.tsv", "test: sent-test.tsv")
    card.write_text(text.replace("  submission_files: {test: SENT.tsv}\n", ""))
    before = files(tmp_path)
    taken = tmp_path / "sent-test.tsv"
    data = f"--data={{'task': '{card}', 'data_dir': '{tmp_path}'}}"
    argv = ["predict", f"--ckpt_path={finetuned.ckpt}", data, f"--model.predictions_dir={tmp_path}", *QUIET]
    assert error(capsys, *argv, f"--trainer.default_root_dir={tmp_path}") == (
        f"--model.predictions_dir {tmp_path}: the predictions of split 'test' would replace {taken}, "
        "the task's own 'test' split file: give another folder (the file is kept)."
    )
    assert files(tmp_path) == before
    # the folder given from home (`~/...`, in a config file or quoted): the check read it literally
    # and passed, the writer expanded it and wrote over the texts
    monkeypatch.setenv("HOME", str(tmp_path.parent))
    argv[-len(QUIET) - 1] = f"--model.predictions_dir=~/{tmp_path.name}"
    assert "the task's own 'test' split file" in error(
        capsys, *argv, f"--trainer.default_root_dir={tmp_path}"
    )
    assert files(tmp_path) == before
    # Part of each split predicted: written, with a warning that it is no submission.
    part = [
        "predict",
        f"--ckpt_path={finetuned.ckpt}",
        f"--model.predictions_dir={tmp_path / 'part'}",
        *QUIET,
    ]
    with pytest.warns(UserWarning, match=r"^--trainer.limit_predict_batches 1: the files written hold part"):
        main([*part, "--trainer.limit_predict_batches=1", f"--trainer.default_root_dir={tmp_path}"])
    assert len((tmp_path / "part" / "SENT.tsv").read_text().splitlines()) == 3  # header, a batch of 2


@pytest.mark.parametrize("command", ["suite", "prepare", "tokenizer"])
def test_out_dir_that_is_a_file(command, tmp_path, tokenizer_dir, capsys):
    corpus, taken = tmp_path / "corpus.txt", tmp_path / "out"
    corpus.write_text("the cat sat on the mat .\n" * 50)
    taken.write_text("a file of the user's")
    before = files(tmp_path)
    argv = {
        "suite": ["suite", str(tmp_path / "suite.yaml")],
        "prepare": ["prepare", "--inputs", str(corpus), f"--tokenizer={tokenizer_dir}"],
        "tokenizer": ["tokenizer", "--inputs", str(corpus), "--vocab_size=300"],
    }[command]
    assert error(capsys, *argv, f"--out_dir={taken}") == (
        f"--out_dir {taken} is a file, not a folder: give a folder's name (the file is kept)."
    )
    under = taken / "sub"
    assert (
        error(capsys, *argv, f"--out_dir={under}") == f"--out_dir {under}: {taken} is a file, not a folder."
    )
    assert files(tmp_path) == before


def test_label_output_that_is_a_folder_or_under_a_file(tmp_path, labelling, capsys):
    folder, taken = tmp_path / "out.tsv", tmp_path / "taken"
    folder.mkdir()
    taken.write_text("a file of the user's")
    before = files(tmp_path)
    assert (
        error(capsys, *labelling(f"--output={folder}"))
        == f"--output {folder} is a folder: give a file's name."
    )
    under = taken / "out.tsv"
    assert (
        error(capsys, *labelling(f"--output={under}"))
        == f"--output {under}: {taken} is a file, not a folder."
    )
    for meant in (f"{tmp_path}/new.tsv/", f"{tmp_path}/new.tsv/."):  # a folder meant, not there yet: the
        said = (
            f"--output {meant} names a folder, not a file: give a file's name."  # file named so was written
        )
        assert error(capsys, *labelling(f"--output={meant}")) == said
    assert files(tmp_path) == before


def test_out_dir_in_a_folder_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    out = locked / "out"
    if os.geteuid() == 0:  # root may write anywhere: the folder's mode is not enough to refuse it
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked)
    assert error(capsys, "suite", "suite.yaml", f"--out_dir={out}") == (
        f"--out_dir {out}: the folder {locked} cannot be written (permission denied)."
    )
    # A read-only file system, which refuses root too, is said as such.
    real = os.statvfs
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    monkeypatch.setattr(
        os,
        "statvfs",
        lambda path: real(path) if Path(path) != locked else SimpleNamespace(f_flag=os.ST_RDONLY),
    )
    assert error(capsys, "suite", "suite.yaml", f"--out_dir={out}") == (
        f"--out_dir {out}: the folder {locked} cannot be written (a read-only file system)."
    )
    # ... but a folder there that is a writable mount of its own (a container's volume) is written.
    from gpt_ft.errors import check_output_dir

    locked.chmod(0o755)
    out.mkdir()
    assert check_output_dir(out, "--out_dir") == out


# ---- gpt-ft label refuses an existing output unless --overwrite ----


def test_label_refuses_an_existing_output_unless_overwrite(tmp_path, labelling, capsys):
    out = tmp_path / "out.tsv"
    out.write_text("an earlier result\n")
    before = files(tmp_path)
    assert error(capsys, *labelling(f"--output={out}")) == (
        f"--output {out} already exists: give another name, or --overwrite true to replace it (it is kept)."
    )
    assert files(tmp_path) == before
    main(labelling(f"--output={out}", "--overwrite=true"))
    assert out.read_text().splitlines()[0] == "sentence\tprediction"


def test_a_path_through_a_folder_not_made_yet_is_checked_where_it_leads(tmp_path, labelling, capsys):
    """`new/../kept.tsv` is `kept.tsv` once the writer has made `new`: refused as `kept.tsv` is (each
    check saw a path that did not exist, and the file was replaced without --overwrite)."""
    from gpt_ft.eval.export import check_new_folder

    out = tmp_path / "kept.tsv"
    out.write_text("an earlier result\n")
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "mine.txt").write_text("mine")
    before = files(tmp_path)
    through = tmp_path / "new" / ".." / "kept.tsv"
    assert error(capsys, *labelling(f"--output={through}")) == (
        f"--output {through} already exists: give another name, or --overwrite true to replace it "
        "(it is kept)."
    )
    the_input = tmp_path / "new" / ".." / "mine.tsv"  # the file `labelling` labels
    assert error(capsys, *labelling(f"--output={the_input}", "--overwrite=true")) == (
        f"--output {the_input} is the input file: give another name, the input is kept."
    )
    with pytest.raises(ValueError, match=r"is not empty: give a new or empty folder \(nothing was written\)"):
        check_new_folder(tmp_path / "new" / ".." / "export", "--out")
    assert files(tmp_path) == before
    from gpt_ft.errors import check_output_dir  # what `prepare`, `tokenizer` and `suite` check next

    assert check_output_dir(tmp_path / "new" / ".." / "export", "--out_dir") == tmp_path / "export"
    through = str(tmp_path / "new" / ".." / "export")
    assert error(capsys, "prepare", "--inputs", str(out), "--out_dir", through, "--tokenizer", "unused") == (
        f"Output folder {tmp_path / 'export'} is not empty and holds no token files of gpt-ft prepare "
        "(no meta.json); choose an empty folder."
    )  # fmt: skip
    assert files(tmp_path) == before


# ---- a write that fails (no space left): one sentence naming the file, the previous one kept ----


def test_a_full_disk_while_writing_predictions(tmp_path, finetuned, capsys, monkeypatch):
    out = tmp_path / "pred"
    out.mkdir()
    (out / "SENT.tsv").write_text("index\tprediction\n0\tearlier\n")
    before = files(out)

    def full(self, *args, **kwargs):
        raise ENOSPC

    monkeypatch.setattr(Path, "write_text", full)
    argv = ["predict", f"--ckpt_path={finetuned.ckpt}", f"--model.predictions_dir={out}", *QUIET]
    assert error(capsys, *argv, f"--trainer.default_root_dir={tmp_path / 'run'}") == (
        f"{out / 'SENT.tsv'}: could not be written (No space left on device); the previous file is kept."
    )
    assert files(out) == before  # no temporary file left either


def test_sigterm_while_predicting_stops_it_with_nothing_written(tmp_path, finetuned, capsys, monkeypatch):
    """Lightning's predict loop never asks whether SIGTERM came (its others stop at the batch's
    end): `kill` let `predict` run to its end, write its file and exit 0."""
    import signal

    from gpt_ft.training.module import GPTModule

    step = GPTModule.predict_step

    def killed(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler marks it; the batch ends
        return step(self, *args, **kwargs)

    monkeypatch.setattr(GPTModule, "predict_step", killed)
    out = tmp_path / "pred"
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["predict", f"--ckpt_path={finetuned.ckpt}", f"--model.predictions_dir={out}", *QUIET,
              f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    assert stopped.value.code == 143 and capsys.readouterr().err.endswith("gpt-ft: stopped by SIGTERM\n")
    assert not out.exists() or not any(out.iterdir())


def test_a_disk_that_fills_as_the_labels_file_closes(tmp_path, labelling, capsys, monkeypatch):
    """The rows still buffered fail to flush again as the file closes: that error replaced the
    sentence (a traceback, exit 1) and left the hidden file behind, filling the disk."""
    from gpt_ft.eval.labelling import LabelledFile

    out = tmp_path / "out.jsonl"
    before = files(tmp_path)

    class Full:  # a file whose buffered rows cannot be flushed: its close fails too
        def __init__(self, file):
            self.file = file

        def write(self, text):
            raise ENOSPC

        def close(self):
            self.file.close()
            raise ENOSPC

    def full(self, *args):
        self.file = Full(self.file)
        self.file.write('{"sentence": "the cat')

    monkeypatch.setattr(LabelledFile, "_write", full)
    assert error(capsys, *labelling(f"--output={out}")) == (
        f"{out}: could not be written (No space left on device); nothing was written there."
    )
    assert files(tmp_path) == before


def test_a_lone_carriage_return_in_a_csv_cell_is_quoted(tmp_path, finetuned):
    """csv quotes the characters of its line terminator ("\\n") only: a cell holding a bare CR went out
    unquoted, and the file read back with a row more."""
    import csv

    source, out = tmp_path / "cr.csv", tmp_path / "out.csv"
    source.write_bytes(b'sentence,id\n"a good film\r",1\nthe cast,2\n')
    main(["label", f"--ckpt_path={finetuned.ckpt}", f"--input={source}", f"--output={out}"])
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    assert [r[:2] for r in rows] == [["sentence", "id"], ["a good film\r", "1"], ["the cast", "2"]]


def test_a_full_disk_while_writing_labels(tmp_path, labelling, capsys, monkeypatch):
    from gpt_ft.eval.labelling import LabelledFile

    out = tmp_path / "out.jsonl"
    out.write_text('{"earlier": 1}\n')
    before = files(tmp_path)

    def half_then_full(self, *args):
        self.file.write('{"sentence": "the cat')
        raise ENOSPC

    monkeypatch.setattr(LabelledFile, "_write", half_then_full)
    assert error(capsys, *labelling(f"--output={out}", "--overwrite=true")) == (
        f"{out}: could not be written (No space left on device); the previous file is kept."
    )
    assert files(tmp_path) == before


def test_sigterm_while_labelling_is_one_line_and_keeps_the_earlier_file(
    tmp_path, labelling, capsys, monkeypatch
):
    """SIGTERM (`kill`, a scheduler's stop) in a command that is no Lightning run stops it as Ctrl-C
    does: its temporary file goes, the earlier file stays, one line and the shell's 143; the handler
    before it comes back."""
    import os
    import signal

    from gpt_ft.eval.labelling import LabelledFile

    out = tmp_path / "out.jsonl"
    out.write_text('{"earlier": 1}\n')
    before, handler = files(tmp_path), signal.getsignal(signal.SIGTERM)

    def killed_halfway(self, *args):
        self.file.write('{"sentence": "the cat')
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(LabelledFile, "_write", killed_halfway)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(labelling(f"--output={out}", "--overwrite=true"))
    assert stopped.value.code == 143 and capsys.readouterr().err.endswith("gpt-ft: stopped by SIGTERM\n")
    assert files(tmp_path) == before and signal.getsignal(signal.SIGTERM) == handler


def test_a_stop_while_the_tokenizer_trains_ends_it_at_once(tmp_path, monkeypatch):
    """The Rust trainer would hold a Python handler back until it ended: while it trains (nothing
    written yet), Ctrl-C and SIGTERM end the process as they end any program; the handlers that
    clean up are back for the save."""
    import signal

    from gpt_ft.data import tokenizer

    corpus, seen, lines = tmp_path / "corpus.txt", [], tokenizer.file_lines
    corpus.write_text("the cat sat on the mat .\n" * 50)
    # a signal this process was started ignoring (SIGINT, under `&` in a script) stays ignored
    stops = [
        signal.SIG_IGN if signal.getsignal(s) == signal.SIG_IGN else signal.SIG_DFL
        for s in (signal.SIGINT, signal.SIGTERM)
    ]
    handler = signal.getsignal(signal.SIGINT)

    def read(paths):
        seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
        yield from lines(paths)

    monkeypatch.setattr(tokenizer, "file_lines", read)
    main(["tokenizer", "--inputs", str(corpus), "--vocab_size=300", f"--out_dir={tmp_path / 'tok'}"])
    assert seen == [tuple(stops)] and (tmp_path / "tok/tokenizer.json").is_file()
    assert signal.getsignal(signal.SIGINT) is handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `cmd &` starts it: ignored, it stays so
    try:
        main(["tokenizer", "--inputs", str(corpus), "--vocab_size=300", f"--out_dir={tmp_path / 'tok2'}"])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert seen[1] == (signal.SIG_IGN, signal.SIG_DFL)


def test_an_output_another_process_wrote_meanwhile_is_kept(tmp_path, labelling, capsys, monkeypatch):
    """Two runs given one new --output: the one that ends second is refused, not written over the
    first one's file (it was checked only as each started); with --overwrite true it replaces it."""
    from gpt_ft.eval.labelling import LabelledFile

    out, write = tmp_path / "out.tsv", LabelledFile.write

    def another_run_ends_first(self, rows, labelled):
        write(self, rows, labelled)
        out.write_text("the other run's labels\n")

    monkeypatch.setattr(LabelledFile, "write", another_run_ends_first)
    assert error(capsys, *labelling(f"--output={out}")) == (
        f"--output {out} was written by another process while this one ran: give another name, "
        "or --overwrite true to replace it (it is kept)."
    )
    assert out.read_text() == "the other run's labels\n" and not list(tmp_path.glob(".*.tmp"))
    main(labelling(f"--output={out}", "--overwrite=true"))
    assert out.read_text().startswith("sentence\tprediction\n")


def test_a_full_disk_while_writing_a_suite_report(tmp_path, monkeypatch):
    from gpt_ft.eval import results

    (tmp_path / "results.md").write_text("# earlier results\n")
    before = files(tmp_path)

    def full(*args, **kwargs):
        raise ENOSPC

    monkeypatch.setattr(results, "results_markdown", full)
    report = {"tasks": {}, "config": {"seeds": [0], "init_from": None, "select": "last"}, "suite": "s"}
    with pytest.raises(WriteError) as failed:
        results.write_results(tmp_path, report)
    kept = "could not be written (No space left on device); the previous file is kept."
    assert os_error_message(failed.value) == f"{tmp_path / 'results.md'}: {kept}"
    assert files(tmp_path) == {**before, "results.json": (tmp_path / "results.json").read_bytes()}


def test_a_full_disk_under_safetensors_or_tokenizers_is_one_sentence(
    tmp_path, finetuned, tokenizer_dir, capsys, monkeypatch
):
    """Their Rust writers raise their own errors around the I/O error ("... (os error 28)"):
    named as any full disk is, the earlier folder kept."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    def full(kind):
        def save(*args, **kwargs):
            raise kind("Error while serializing: I/O error: No space left on device (os error 28)")

        return save

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full(SafetensorError))
    out = tmp_path / "export"
    assert error(capsys, "export", f"--ckpt_path={finetuned.ckpt}", f"--out={out}") == (
        f"{out}: could not be written (No space left on device); nothing was written there."
    )
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    shutil.copytree(tokenizer_dir, tmp_path / "tok")
    before = files(tmp_path / "tok")
    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full(Exception))
    args = [
        "tokenizer",
        f"--inputs={corpus}",
        "--vocab_size=300",
        f"--out_dir={tmp_path / 'tok'}",
        "--overwrite=true",
    ]
    assert error(capsys, *args) == (
        f"{tmp_path / 'tok'}: could not be written (No space left on device); the previous folder is kept."
    )
    assert files(tmp_path / "tok") == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ---- cards checked when they load ----


@pytest.mark.parametrize(
    ("kind", "arg", "message"),
    [
        (
            "single",
            "--data.task.init_args.metrics=[accuracy, pearson]",
            "Task 'sent': unknown metric(s) ['pearson']; allowed: accuracy, f1, matthews "
            "(the metrics of a classification task).",
        ),
        (
            "similarity",
            "--data.task.init_args.metrics=[accuracy]",
            "Task 'sts': unknown metric(s) ['accuracy']; allowed: pearson, spearman "
            "(the metrics of a regression task).",
        ),
        (
            "single",
            "--data.task.init_args.labels=[negative, positive, negative]",
            "Task 'sent': label name(s) ['negative'] appear more than once in `labels`.",
        ),
        (
            "single",
            "--data.task.init_args.main_metric=f1",
            "Task 'sent': main_metric 'f1' is not among metrics ['accuracy'].",
        ),
    ],
)
def test_cards_are_checked_when_they_load(kind, arg, message, tmp_path, tokenizer_dir, capsys):
    card = make_task(kind, tmp_path)
    before = files(tmp_path)
    assert error(capsys, "fit", *common_args(card, tokenizer_dir, tmp_path), arg) == f"{card}: {message}"
    assert files(tmp_path) == before


# ---- a prompt longer than the model's context ----


def test_generate_refuses_a_prompt_longer_than_the_context(finetuned, capsys):
    prompt = "the cat sat on the mat . " * 12
    n = len(
        load_tokenizer(str(finetuned.ckpt.parent / "tokenizer"))(prompt, add_special_tokens=False)[
            "input_ids"
        ]
    )
    assert n > 64  # the micro model's context
    assert error(capsys, "generate", f"--ckpt_path={finetuned.ckpt}", f"--prompt={prompt}") == (
        f"--prompt is {n} tokens and the model's context is 64 (n_positions), leaving no room for a new "
        f"token: shorten it by at least {n - 63} tokens."
    )


# ---- a suite file naming a card that does not exist ----


@pytest.mark.parametrize("entry", ["- tasks/glue/nope.yaml", "- card: tasks/glue/nope.yaml"])
def test_a_suite_file_naming_a_missing_card(entry, tmp_path, capsys):
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: s\ntasks:\n  {entry}\n")
    before = files(tmp_path)
    assert error(capsys, "suite", str(suite), f"--out_dir={tmp_path / 'out'}") == (
        f"{suite}: task card tasks/glue/nope.yaml does not exist."
    )
    assert files(tmp_path) == before and not (tmp_path / "out").exists()


# ---- the typed commands' own mistakes ----

NOT_A = "--device '{}' is not a device: give cpu, cuda or cuda:N."
NOT_A_DEVICE = NOT_A.format("gpu7")


@pytest.mark.parametrize(
    "command, args, message",
    [
        ("label", ["--input={folder}", "--output={out}.tsv"], "--input {folder} is a folder; give a file."),
        ("label", ["--input={text}", "--output={out}.tsv", "--batch_size=0"],
         "--batch_size must be >= 1, got 0."),
        ("label", ["--input={text}", "--output={out}.tsv", "--device=gpu7"], NOT_A_DEVICE),
        ("embed", ["--input={folder}", "--output={out}.npy"], "--input {folder} is a folder; give a file."),
        ("label", ["--input={fifo}", "--output={out}.tsv"],  # `--input <(...)`: said to be missing
         "--input {fifo} is not a regular file (a pipe, a device): give a file."),
        ("embed", ["--input={jsonl}", "--output={jsonl}", "--overwrite=true"],
         "--output {jsonl} is the input file: give another name, the input is kept."),
        ("generate", ["--prompt=the cat", "--num_beams=0"], "--num_beams must be >= 1, got 0."),
        ("generate", ["--prompt=the cat", "--device=gpu7"], NOT_A_DEVICE),
        ("label", ["--input={text}", "--output={out}.tsv", "--device=meta"], NOT_A.format("meta")),
        *([] if torch.backends.mps.is_available() else [  # a device this torch is not built for
            ("label", ["--input={text}", "--output={out}.tsv", "--device=mps"], NOT_A.format("mps"))
        ]),
    ],
)  # fmt: skip
def test_a_typed_commands_bad_value_is_one_sentence_naming_it(
    command, args, message, tmp_path, finetuned, capsys
):
    """A folder for a file, a zero count, a device torch has no name for, the input as the output:
    one sentence, before any work, nothing written (a text file's contents: tests/eval/test_encoder.py)."""
    paths = {"folder": tmp_path / "texts", "text": tmp_path / "mine.tsv", "latin1": tmp_path / "latin1.txt",
             "empty": tmp_path / "empty.txt", "out": tmp_path / "out",
             "jsonl": tmp_path / "mine.jsonl", "fifo": tmp_path / "in.fifo"}  # fmt: skip
    paths["folder"].mkdir()
    os.mkfifo(paths["fifo"])
    paths["text"].write_text("sentence\nthe cat sat on the mat .\n")
    paths["latin1"].write_bytes(b"the cat sat .\ncaf\xe9 au lait\n")
    paths["empty"].write_bytes(b"")
    paths["jsonl"].write_text('{"text": "the cat sat ."}\n')
    before = files(tmp_path)
    argv = [command, f"--ckpt_path={finetuned.ckpt}", *(a.format(**paths) for a in args)]
    assert error(capsys, *argv) == message.format(**paths)
    assert files(tmp_path) == before


def test_a_checkpoint_folder_or_a_missing_one_for_a_checkpoint_file(tmp_path, finetuned, capsys):
    folder = finetuned.ckpt.parent
    assert error(capsys, "validate", f"--ckpt_path={folder}") == (
        f"--ckpt_path {folder} is a folder; give a checkpoint file (last.ckpt)."
    )
    typo = folder / "lats.ckpt"  # not "No task: give --data.task", which the checkpoint would have given
    for command in ("validate", "test", "predict"):
        assert error(capsys, command, f"--ckpt_path={typo}") == f"--ckpt_path {typo} does not exist."
    text = tmp_path / "mine.tsv"
    text.write_text("sentence\nthe cat sat on the mat .\n")
    label = ["label", f"--ckpt_path={folder}", f"--input={text}", f"--output={tmp_path / 'out.tsv'}"]
    assert error(capsys, *label) == f"{folder} is a folder: give a checkpoint file in it (last.ckpt)."


def test_pretrained_weights_given_for_a_checkpoint_say_where_they_go(tmp_path, capsys):
    """A GGUF file or a transformers folder is not a fine-tuned checkpoint: the sentence says what it
    is and how to start from it, instead of calling it corrupt or asking for a last.ckpt it lacks."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    for weights, kind in ((gguf, "a GGUF file"), (hf, "a transformers model folder")):
        assert error(capsys, "export", f"--ckpt_path={weights}", f"--out={tmp_path / 'out'}") == (
            f"{weights} is {kind} of pretrained weights, not a checkpoint of `gpt-ft fit`: start a run "
            f"from it with --model.init_from {weights}."
        )
    assert not (tmp_path / "out").exists()


def test_lightnings_own_optimizer_options_are_refused_for_the_models(capsys):
    """LightningCLI's --optimizer and --lr_scheduler would replace the module's optimizer and its
    schedule (weight decay groups, warmup, Muon, the resume's alignment) without a word."""
    config = f"--config={ROOT / 'configs/quickstart.yaml'}"
    assert error(capsys, "fit", config, "--optimizer=SGD", "--optimizer.lr=5") == (
        "unrecognized arguments: --optimizer=SGD --optimizer.lr=5 (the optimizer and its schedule are "
        "the model's: --model.optimizer, --model.lr, ...)."
    )


def test_label_of_a_plain_text_file_and_calibrate_on_a_split_without_labels(tmp_path, finetuned, capsys):
    text = tmp_path / "mine.txt"
    text.write_text("the cat sat on the mat .\n")
    out = tmp_path / "out.tsv"
    assert error(capsys, "label", f"--ckpt_path={finetuned.ckpt}", f"--input={text}", f"--output={out}") == (
        f"--input {text}: give a .csv, .tsv, .json/.jsonl or .parquet file (by its extension)."
    )  # the card's `format` field, which the message named, is no option of label
    ckpt, calibrated = f"--ckpt_path={finetuned.ckpt}", f"--output={tmp_path / 'c.ckpt'}"
    assert error(capsys, "calibrate", ckpt, calibrated, "--split=test") == (
        "Split 'test' of task 'sent' holds no labelled examples."
    )
    assert not out.exists() and not (tmp_path / "c.ckpt").exists()
    own = f"--output={finetuned.ckpt}"  # the checkpoint itself
    assert error(capsys, "calibrate", ckpt, own, "--overwrite=true") == (
        f"--output {finetuned.ckpt} is the input file: give another name, the input is kept."
    )
    shutil.copytree(finetuned.root / "d", tmp_path / "d")
    with (tmp_path / "d" / "dev.tsv").open("a") as f:
        f.write("9\ta fine film .\tmaybe\n")  # line 7: the header, 5 rows, then this one
    message = error(capsys, "calibrate", ckpt, calibrated, f"--data_dir={tmp_path}")
    assert message.startswith(f"{tmp_path / 'd' / 'dev.tsv'}, line 7: ") and "'maybe'" in message
    beside = tmp_path / "c.tokenizer"  # where the tokenizer goes along: a file, then a folder there
    beside.write_text("mine")
    assert error(capsys, "calibrate", ckpt, calibrated, "--overwrite=true") == (
        f"{beside}, where --output's tokenizer goes, exists: give another --output."
    )
    beside.unlink()
    beside.mkdir()
    (beside / "mine.txt").write_text("mine")
    assert error(capsys, "calibrate", ckpt, calibrated) == (
        f"{beside}, where --output's tokenizer goes, exists: give another --output, or --overwrite true to "
        "replace it."
    )
    assert (beside / "mine.txt").read_text() == "mine" and not (tmp_path / "c.ckpt").exists()


def test_cuda_asked_for_where_torch_sees_none_is_one_sentence(monkeypatch):
    import torch

    from gpt_ft.eval.devices import device_named

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"^--device cuda: torch sees no CUDA device here; give --device cpu"
    ):
        device_named("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ValueError, match=r"^--device cuda:2: torch sees 2 CUDA device\(s\), cuda:0 to cuda:1"
    ):
        device_named("cuda:2")
    assert device_named("cuda:1") == "cuda:1" and device_named("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # from Python, named as it is given there
    python = r"^device='cuda': torch sees no CUDA device here; give device='cpu'\.$"
    with pytest.raises(ValueError, match=python):
        Classifier.from_checkpoint("never-read.ckpt", device="cuda")


def test_a_null_in_a_commands_config_file_is_named(tmp_path, capsys):
    """jsonargparse takes `null` from a config file for any argument (the command line refuses one):
    the command then failed on it with a TypeError's traceback."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat .\n" * 20)
    config = tmp_path / "tok.yaml"
    config.write_text(
        f"inputs: [{corpus}]\nvocab_size: 300\nmin_frequency: null\nout_dir: {tmp_path / 'tok'}\n"
    )
    assert error(capsys, "tokenizer", "--config", str(config)) == "--min_frequency: expected int, got null."
    assert not (tmp_path / "tok").exists()
