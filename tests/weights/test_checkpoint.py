"""The checkpoint format (gpt_ft/weights/checkpoint.py): its literal keys, each typed entry written
and read back, atomic saves, and one sentence for a file that is not a readable checkpoint."""

import errno
import os
import re
from pathlib import Path

import pytest
import torch

from gpt_ft.weights import checkpoint as fmt
from gpt_ft.weights.checkpoint import Adapters, Checkpoint, safe_load, save_file


def test_the_keys_are_the_documented_ones():
    """Files written by earlier versions must stay readable: the keys are part of the format."""
    keys = [fmt.GPT_CONFIG, fmt.STATE, fmt.ADAPTERS, fmt.TOKENIZER, fmt.DATA, fmt.HYPER_PARAMETERS]
    keys += [fmt.TEMPERATURE, fmt.CLASS_WEIGHTS, fmt.PROVENANCE]
    assert keys == [
        "gpt_config", "state_dict", "lora", "tokenizer", "data_config", "hyper_parameters",
        "temperature", "class_weights", "gpt_ft",
    ]  # fmt: skip
    for key in keys:  # the module's table names each of them
        assert f'| "{key}"' in fmt.__doc__


def test_every_entry_round_trips_through_a_file(tmp_path):
    written = Checkpoint({})
    written.gpt_config = {"n_layer": 1, "n_embd": 8}
    written.state = {"gpt.wte.weight": torch.arange(6.0).view(3, 2), "head.weight": torch.ones(2, 2)}
    written.adapters = Adapters(base="org/base", new_tokens_from=40478, settings={"rank": 8, "alpha": 16})
    written.tokenizer = "tokenizer"
    written.data = {"class_path": "gpt_ft.data.task_data.TaskDataModule", "init_args": {"task": "card"}}
    written.temperature = 2.5
    written.class_weights = [0.25, 0.75]
    written.provenance = {"version": "0.1.0", "commit": "abc"}
    written.hyper_parameters["lr"] = 1e-3
    path = tmp_path / "sub" / "run.ckpt"  # the folder is made
    written.save(path)

    read = Checkpoint.read(path)
    assert read.entries.keys() == written.entries.keys()
    assert read.is_gpt_ft and read.require_gpt_config() == {"n_layer": 1, "n_embd": 8}
    assert read.gpt_state.keys() == {"wte.weight"} and torch.equal(
        read.gpt_state["wte.weight"], torch.arange(6.0).view(3, 2)
    )
    assert read.submodule_state("head").keys() == {"weight"}
    assert read.adapters == Adapters("org/base", 40478, {"rank": 8, "alpha": 16})
    assert read.entries["lora"] == {"base": "org/base", "new_tokens_from": 40478, "rank": 8, "alpha": 16}
    assert read.tokenizer == tmp_path / "sub" / "tokenizer"  # relative to the file's folder
    assert read.task_card == "card" and read.data_args == {"task": "card"}
    assert read.temperature == 2.5 and read.class_weights == [0.25, 0.75]
    assert read.provenance == {"version": "0.1.0", "commit": "abc"}
    assert read.hyper_parameters == {"lr": 1e-3}
    assert read.where == str(path)


def test_defaults_leave_no_entry_behind():
    c = Checkpoint(
        {fmt.TEMPERATURE: 2.0, fmt.CLASS_WEIGHTS: [1.0], fmt.ADAPTERS: {"base": "b", "new_tokens_from": 1}}
    )
    c.temperature, c.class_weights, c.adapters = 1.0, None, None
    assert c.entries == {}
    assert c.temperature == 1.0 and c.adapters is None and c.tokenizer is None and c.data is None
    assert c.where == "The checkpoint" and not c.is_gpt_ft
    with pytest.raises(
        ValueError,
        match=r"^The checkpoint is not a gpt_ft checkpoint: it records no model config \(gpt_config\)\.$",
    ):
        c.require_gpt_config()


@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan"), float("inf"), "2", True, None])
def test_a_temperature_no_score_can_be_divided_by_is_refused_naming_the_checkpoint(value):
    """0 and NaN made every score NaN, a negative one turned the scores against the label chosen."""
    read = Checkpoint({fmt.TEMPERATURE: value}, "runs/last.ckpt")
    with pytest.raises(ValueError) as raised:
        read.temperature
    assert str(raised.value) == (
        f"runs/last.ckpt records a temperature of {value!r}, and gpt-ft calibrate's is a positive number "
        "(every score is divided by it): calibrate the checkpoint again."
    )
    assert Checkpoint({fmt.TEMPERATURE: 2}).temperature == 2.0 and Checkpoint({}).temperature == 1.0


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not a readable checkpoint: the file is truncated, corrupt or of another kind."),
        (b"hello, world", "is not a readable checkpoint"),
        # a task's TSV given for the checkpoint: each first byte asks the unpickler for something else
        *(
            (f"{first}entence\tlabel\nfoo\t1\n".encode(), "is not a readable checkpoint")
            for first in "saeqjrGJXc.(]}"
        ),
    ],
    ids=["empty", "text", *(f"tsv-{first}" for first in "saeqjrGJXc.(]}")],
)
def test_a_file_that_is_not_a_checkpoint_is_one_sentence(tmp_path, content, message):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        Checkpoint.read(path)
    assert str(error.value).startswith(str(path))
    with pytest.raises(FileNotFoundError, match=r"^Checkpoint .*nowhere.ckpt does not exist\.$"):
        safe_load(tmp_path / "nowhere.ckpt")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes (POSIX)")
def test_a_pipe_or_a_loop_given_as_a_checkpoint_is_one_sentence(tmp_path, capsys):
    """A named pipe waited for a writer forever (`label`, `export`, `fit` hung); a link loop made
    `calibrate` end in a traceback (Python 3.11's `resolve`), where the others named the loop."""
    from gpt_ft.cli import main

    os.mkfifo(tmp_path / "pipe.ckpt")
    with pytest.raises(ValueError, match=r"pipe.ckpt is not a regular file \(a pipe, a device\): give a "):
        safe_load(tmp_path / "pipe.ckpt")
    (tmp_path / "a.ckpt").symlink_to(tmp_path / "b.ckpt")
    (tmp_path / "b.ckpt").symlink_to(tmp_path / "a.ckpt")
    with pytest.raises(SystemExit) as stopped:
        main(["calibrate", f"--ckpt_path={tmp_path / 'a.ckpt'}", f"--output={tmp_path / 'c.ckpt'}"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {tmp_path / 'a.ckpt'}: Too many levels of symbolic links."
    )


def test_a_file_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "code.ckpt"
    torch.save({"state_dict": {}, "payload": Path("x")}, path)  # any object but tensors and plain values
    with pytest.raises(ValueError, match=r"holds objects other than tensors and plain values") as error:
        safe_load(path)
    assert str(error.value).startswith(str(path))


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's memory map (Linux)")
def test_a_checkpoint_is_read_by_mapping_its_file_and_an_old_format_one_still_reads(tmp_path):
    """Its tensors point into a mapping of the file (read only where used: `validate` reading a run's
    configuration never reads its optimizer state); torch's legacy format, which cannot be mapped,
    is read whole."""
    x = torch.arange(6.0)
    save_file({"state_dict": {"x": x}}, tmp_path / "zip.ckpt")
    torch.save({"state_dict": {"x": x}}, tmp_path / "old.ckpt", _use_new_zipfile_serialization=False)

    def mapped_from(tensor: torch.Tensor) -> set[str]:
        spans = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()]
        at = tensor.data_ptr()
        return {
            s[-1]
            for s in spans
            if len(s) > 5 and int(s[0].split("-")[0], 16) <= at < int(s[0].split("-")[1], 16)
        }

    zipped, old = (Checkpoint.read(tmp_path / name).state["x"] for name in ("zip.ckpt", "old.ckpt"))
    assert mapped_from(zipped) == {str(tmp_path / "zip.ckpt")} and torch.equal(zipped, x)
    assert not mapped_from(old) & {str(tmp_path / "old.ckpt")} and torch.equal(old, x)


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    save_file({"gpt_config": {"n_layer": 1}}, path)
    before = path.read_bytes()

    def full_disk(entries, f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fmt, "_save", full_disk)
    with pytest.raises(OSError):
        save_file({"gpt_config": {"n_layer": 2}}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["last.ckpt"]


@pytest.mark.parametrize("during", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_what_torchs_writer_reports_as_its_stream_position_is_raised_as_what_came(
    tmp_path, monkeypatch, during
):
    """torch.save's zip writer turns whatever stops a write (a full disk, a Ctrl-C: a second one stops
    gpt-ft at once) into a RuntimeError about its position: the interrupt is raised as itself (it
    was said to be a full disk), the disk's error as its own; the previous file kept either way."""
    path = tmp_path / "last.ckpt"
    save_file({"gpt_config": {"n_layer": 1}}, path)
    before = path.read_bytes()

    def stopped(entries, f):
        f.write(b"partial")
        try:
            raise during
        except BaseException:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
            ) from None

    monkeypatch.setattr(fmt.torch, "save", stopped)
    with pytest.raises(type(during)) as raised:
        save_file({"gpt_config": {"n_layer": 2}}, path)
    assert raised.value is during or raised.value.__cause__ is during  # (a WriteError naming the file)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_weights_fingerprint_of_a_table_past_float32s_integers():
    """SmolLM2's 49152 x 576 embedding: float32's evenly spaced positions end past the table (a LoRA
    run on it stopped with an IndexError); the positions of smaller tensors, those checkpoints
    recorded, are unchanged."""
    from gpt_ft.weights.checkpoint import weights_fingerprint

    table = torch.nn.Embedding(49152, 576)
    with torch.no_grad():
        table.weight.zero_()
        table.weight[-1, -1] = 1.0  # the last value is read
    before = weights_fingerprint(table)
    with torch.no_grad():
        table.weight[-1, -1] = 2.0
    assert weights_fingerprint(table) != before
    small = torch.nn.Linear(300, 70)
    with torch.no_grad():
        small.weight.copy_(torch.arange(21000.0).reshape(70, 300) / 7)
        small.bias.copy_(torch.arange(70.0))
    assert weights_fingerprint(small) == "0b8405aeab06df18"  # as recorded before


def test_a_newer_versions_model_setting_is_named_with_the_version_that_wrote_it(tmp_path):
    """A field this version's GPTConfig lacks: validate and label crashed in GPTConfig(**...) and a
    resumed fit dropped it without a word; each reads the config here, refused in one sentence."""
    from dataclasses import asdict

    from gpt_ft import GPTConfig
    from gpt_ft.weights.pretrained import gpt_from_checkpoint

    fields = asdict(GPTConfig.from_name("gpt-micro"))
    assert Checkpoint({fmt.GPT_CONFIG: fields}).gpt_config == fields
    path = tmp_path / "newer.ckpt"
    newer = Checkpoint({fmt.GPT_CONFIG: {**fields, "softcap": 30.0, "mtp_heads": 2}}, path)
    newer.provenance = {"version": "9.1.0", "commit": None}
    said = (f"{path} records model settings this version of gpt_ft does not know (mtp_heads, softcap): "
            "it was written by gpt_ft 9.1.0; read it with that version.")  # fmt: skip
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        newer.gpt_config
    with pytest.raises(ValueError, match=re.escape(said)):
        gpt_from_checkpoint(newer)
    # a model argument (hyper-parameter) the module does not take: jsonargparse named no file
    import inspect

    from gpt_ft.training.module import GPTModule
    from gpt_ft.training.recorded import recorded_run

    known = inspect.signature(GPTModule.__init__).parameters  # as `gpt-ft validate` reads a checkpoint

    newer = Checkpoint(
        {fmt.GPT_CONFIG: fields, fmt.HYPER_PARAMETERS: {"lr": 1e-4, "label_smoothing": 0.1}}, path
    )
    newer.provenance = {"version": "9.1.0", "commit": None}
    assert (
        recorded_run(Checkpoint({**newer.entries, fmt.HYPER_PARAMETERS: {"lr": 1e-4}}), known)["model"]["lr"]
        == 1e-4
    )
    said = f"{path} records model arguments this version of gpt_ft does not know (label_smoothing): it was"
    with pytest.raises(ValueError, match=re.escape(f"{said} written by gpt_ft 9.1.0")):
        recorded_run(newer, known)


def test_a_config_an_earlier_version_wrote_reads_as_the_same_model():
    """Earlier versions kept a rotary scaling's unread keys (Yarn-Llama 2's `finetuned`) and a learned
    model's unused rotary fields, which the config now refuses where a user gives them: a checkpoint
    holding them still reads, as the model it was."""
    from dataclasses import asdict

    from gpt_ft.model import GPTConfig

    llama = asdict(GPTConfig.from_name("llama-micro", vocab_size=64))
    llama["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                             "finetuned": True, "rope_theta": llama["rope_theta"]}  # fmt: skip
    gpt = {**asdict(GPTConfig.from_name("gpt-micro", vocab_size=64)), "rope_theta": 5e5, "rotary_dim": 8}
    for fields, read in [(llama, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                  "rope_theta": llama["rope_theta"]}), (gpt, None)]:  # fmt: skip
        config = Checkpoint({fmt.GPT_CONFIG: fields}).gpt_config
        assert config["rope_scaling"] == read and GPTConfig(**config).n_layer == fields["n_layer"]
    assert (config["rope_theta"], config["rotary_dim"]) == (10000.0, None)
    with pytest.raises(ValueError, match="takes no 'finetuned'"):
        GPTConfig(**llama)  # (given, not read from a file: refused)
