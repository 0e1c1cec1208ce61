"""Checkpoints that are not readable and YAML that does not parse: one sentence naming the file
(and the line and column), exit code 2, nothing on disk changed."""

import re

import pytest

from gpt_ft.cli import main
from tests.helpers import common_args, make_task


@pytest.fixture
def broken(tmp_path):
    import torch

    torch.save({"state_dict": {"w": torch.ones(64)}, "gpt_config": {}}, tmp_path / "good.ckpt")
    data = (tmp_path / "good.ckpt").read_bytes()
    files = {"truncated.ckpt": data[: len(data) // 2], "empty.ckpt": b"", "text.ckpt": b"not a checkpoint"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    return tmp_path


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_torch_file_that_is_no_checkpoint(tmp_path, tokenizer_dir, capsys):
    """A state dict given as a checkpoint: one sentence (Lightning's bare `pytorch-lightning_version`
    before), and before `validate` asks for a task the checkpoint would have named."""
    import torch

    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, path)
    sentence = (
        f"gpt-ft: error: {path} is a torch file but not a checkpoint of `gpt-ft fit` (it has no 'state_dict'"
    )
    args = common_args(make_task("single", tmp_path), tokenizer_dir, tmp_path)
    assert error_of(["fit", *args, f"--ckpt_path={path}"], capsys).startswith(sentence)
    assert error_of(
        ["validate", f"--ckpt_path={path}", f"--trainer.default_root_dir={tmp_path}"], capsys
    ).startswith(sentence)
    (config := tmp_path / "config.yaml").write_text("model:\n  init_from: null\n")  # advice: not its fault
    assert error_of(
        ["validate", f"--config={config}", f"--ckpt_path={path}", f"--trainer.default_root_dir={tmp_path}"],
        capsys,
    ).startswith(sentence)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, path := tmp_path / "model.safetensors")  # it was "a torch file"
    assert error_of(
        ["validate", f"--ckpt_path={path}", f"--trainer.default_root_dir={tmp_path}"], capsys
    ).startswith(f"gpt-ft: error: {path} is a safetensors file but not a checkpoint of `gpt-ft fit`")


def test_no_task_and_no_token_folder_names_both(tokenizer_dir, capsys):
    """A run with neither data says what each is for: `validate --model.init_from` of a language
    model needs token files, not a card."""
    assert error_of(["fit", f"--data.tokenizer={tokenizer_dir}"], capsys) == (
        "gpt-ft: error: No task: give --data.task CARD (e.g. tasks/glue/rte.yaml), or --data LMDataModule "
        "--data.token_dir DIR (gpt-ft prepare's token files) for a language model."
    )  # (--data.token_dir alone: "--data: Option 'token_dir' is not accepted")


@pytest.mark.parametrize("name", ["truncated.ckpt", "empty.ckpt", "text.ckpt"])
def test_an_unreadable_checkpoint_anywhere(name, broken, tokenizer_dir, capsys):
    path = broken / name
    before = path.read_bytes()
    sentence = (
        f"gpt-ft: error: {path} is not a readable checkpoint: the file is truncated, corrupt or of another "
    )
    sentence += "kind."
    card = make_task("single", broken)
    args = common_args(card, tokenizer_dir, broken)
    assert error_of(["validate", *args, f"--ckpt_path={path}"], capsys) == sentence
    assert error_of(["fit", *args, f"--model.init_from={path}"], capsys) == sentence
    assert (
        error_of(["generate", f"--ckpt_path={path}", "--prompt=hi", f"--tokenizer={tokenizer_dir}"], capsys)
        == sentence
    )
    assert path.read_bytes() == before


def test_yaml_that_does_not_parse_names_file_line_and_column(tmp_path, tokenizer_dir, capsys):
    card = tmp_path / "card.yaml"
    card.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: x\n  labels: [a, b\n  text: s\n"
    )
    problem = f"{card} is not valid YAML: line 5, column 7: expected ',' or ']', but got ':'."
    assert (
        error_of(["fit", f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}"], capsys)
        == f"gpt-ft: error: {problem}"
    )
    assert error_of(["fit", f"--config={card}"], capsys) == f"gpt-ft: error: {problem}"
    assert (
        error_of(["explain", "--data.task", str(card), f"--data.tokenizer={tokenizer_dir}"], capsys)
        == f"gpt-ft: error: {problem}"
    )
    config = tmp_path / "config.yaml"
    config.write_text(f"data:\n  task: {card}\n")  # a card named inside a config
    assert error_of(["fit", f"--config={config}", f"--data.tokenizer={tokenizer_dir}"], capsys) == (
        f"gpt-ft: error: {problem}"
    )


def test_a_key_given_twice_is_named_not_taken_silently(tmp_path, tokenizer_dir, capsys):
    """YAML's loaders keep the last of a repeated key: a card's second `labels` (swapped) flipped
    what each class means without a word, a config's second section replaced the first."""
    from gpt_ft.adapters.cards import load_card

    card = tmp_path / "card.yaml"
    card.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: x\n  labels: [a, b]\n"
        "  text: s\n  labels: [b, a]\n"
    )
    twice = f"{card}, line 6: key 'labels' appears twice."
    assert error_of(["fit", f"--data.task={card}", f"--data.tokenizer={tokenizer_dir}"], capsys) == (
        f"gpt-ft: error: {twice}"
    )
    with pytest.raises(ValueError, match=re.escape(f"Task card {twice}")):
        load_card(card)
    config = tmp_path / "config.yaml"
    config.write_text("trainer:\n  max_epochs: 1\nmodel:\n  lr: 0.1\ntrainer:\n  max_epochs: 2\n")
    assert error_of(["fit", f"--config={config}", f"--data.tokenizer={tokenizer_dir}"], capsys) == (
        f"gpt-ft: error: {config}, line 5: key 'trainer' appears twice."
    )
    config.write_text("base: &b {max_epochs: 1}\ntrainer:\n  <<: *b\n  <<: *b\n")  # merge keys may repeat
    from gpt_ft.errors.parsing import repeated_key

    assert repeated_key(config.read_text()) is None
    assert repeated_key("labels:\n  1: pos\n  '1': neg\n") is None  # an int and a string: two keys
    assert repeated_key("init_args: &x\n  name: x\n  self: *x\n") is None  # a cycle, walked once


def test_yaml_that_is_not_utf8_is_named(tmp_path, tokenizer_dir, capsys):
    """A config, card or suite file saved in Latin-1: its reader's UnicodeDecodeError names no file."""
    config, card, suite = tmp_path / "config.yaml", tmp_path / "card.yaml", tmp_path / "suite.yaml"
    config.write_bytes(b"trainer:\n  max_epochs: caf\xe9\n")
    card.write_bytes(b"class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: caf\xe9\n  labels: [a]\n")
    suite.write_bytes(b"name: caf\xe9\nseeds: [0]\ntasks:\n  - card.yaml\n")
    for argv, path, at in (
        (["fit", f"--config={config}"], config, 26),
        (["fit", "--data.task", str(card), f"--data.tokenizer={tokenizer_dir}"], card, 61),
    ):
        assert error_of(argv, capsys) == (
            f"gpt-ft: error: File {path} is not UTF-8 text (byte offset {at}: invalid continuation byte); "
            "save it as UTF-8."
        )
    config.write_text(f"data:\n  task: {card}\n")  # a card named inside a config
    assert error_of(["fit", f"--config={config}", f"--data.tokenizer={tokenizer_dir}"], capsys) == (
        f"gpt-ft: error: File {card} is not UTF-8 text (byte offset 61: invalid continuation byte); "
        "save it as UTF-8."
    )
    assert error_of(["suite", str(suite), f"--out_dir={tmp_path / 'out'}"], capsys) == (
        f"gpt-ft: error: Suite file {suite} is not UTF-8 text (invalid continuation byte); save it as UTF-8."
    )
    assert not (tmp_path / "out").exists()


def test_weights_given_as_a_section_say_where_weights_go(tmp_path, capsys):
    """`--model run.ckpt` read the checkpoint as a file of the section's options: "save it as UTF-8"."""
    for name, data in (("run.ckpt", b"PK\x03\x04\x14\x00\xa1"), ("model.gguf", b"GGUF\x03\x00\x00\x00\xff")):
        (weights := tmp_path / name).write_bytes(data)
        said = error_of(["fit", "--model", str(weights)], capsys)
        assert said.startswith(f"gpt-ft: error: File {weights} is not ") and said.endswith(
            "; weights go to --model.init_from, a checkpoint to resume to --ckpt_path."
        )


@pytest.mark.parametrize(
    "command, end", [("fit", ", and `--ckpt_path last` resumes from the last checkpoint."), ("predict", ".")]
)
def test_a_lost_peer_is_one_sentence_and_resuming_is_advised_to_training_alone(
    monkeypatch, capsys, command, end
):
    from importlib import import_module

    cli = import_module("gpt_ft.cli.main")  # the module (the package's `main` is its function)

    def lost(name, args):
        raise RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:5"
        )

    monkeypatch.setitem(cli.COMMANDS, command, cli.Command("", lost))
    assert error_of([command], capsys) == (
        "gpt-ft: error: rank 0 lost another process of this distributed run (Connection closed by peer: it "
        f"stopped or was killed); every process stops now{end}"
    )


@pytest.mark.parametrize("command", ["fit", "validate", "predict", "label", "embed", "export"])
def test_a_checkpoint_link_that_leads_nowhere_is_named_so(tmp_path, tokenizer_dir, capsys, command):
    """A checkpoint given as a symbolic link to a file moved away, or a loop of links, is said as it
    is, not as a file that "does not exist" (which the user sees in the folder)."""
    (tmp_path / "last.ckpt").symlink_to(tmp_path / "moved.ckpt")
    (tmp_path / "a.ckpt").symlink_to(tmp_path / "b.ckpt")
    (tmp_path / "b.ckpt").symlink_to(tmp_path / "a.ckpt")
    (tmp_path / "in.csv").write_text("sentence\na text\n")
    more = {"label": ["--input", str(tmp_path / "in.csv"), "--output", str(tmp_path / "o.csv")],
            "embed": ["--input", str(tmp_path / "in.csv"), "--output", str(tmp_path / "o.npy")],
            "export": ["--out", str(tmp_path / "out")],
            "fit": common_args(make_task("single", tmp_path), tokenizer_dir, tmp_path),
            }.get(command, [])  # fmt: skip
    gone = error_of([command, f"--ckpt_path={tmp_path / 'last.ckpt'}", *more], capsys)
    assert f"{tmp_path}/last.ckpt is a symbolic link to {tmp_path}/moved.ckpt, which does not exist." in gone
    loop = error_of([command, f"--ckpt_path={tmp_path / 'a.ckpt'}", *more], capsys)
    assert f"{tmp_path}/a.ckpt" in loop and ("loop of symbolic links" in loop or "Too many levels" in loop)


def test_an_altered_checkpoint_is_one_sentence_not_a_model_built_for_hours(finetuned, tmp_path, capsys):
    """A config of a billion layers was built before its tensors were compared (`label`, `validate`
    and `fit --model.init_from` hung), and a temperature no score divides by gave NaN scores."""
    import shutil

    import torch

    entries = torch.load(finetuned.ckpt, map_location="cpu", weights_only=True)
    entries["gpt_config"]["n_layer"] = 10**9
    torch.save(entries, altered := tmp_path / "altered.ckpt")
    shutil.copytree(finetuned.ckpt.parent / entries["tokenizer"], tmp_path / entries["tokenizer"])
    sentence = (
        f"gpt-ft: error: {altered}'s gpt_config.n_layer is 1000000000, but its tensors hold 1 layer "
        "(block 0): the config and the weights are not of one model (the file was altered or is damaged)."
    )
    (tmp_path / "in.csv").write_text("sentence\na text\n")
    label = ["label", "--input", str(tmp_path / "in.csv"), "--output", str(tmp_path / "o.csv")]
    assert error_of([*label, f"--ckpt_path={altered}"], capsys) == sentence
    validate = ["validate", f"--ckpt_path={altered}", f"--trainer.default_root_dir={tmp_path}"]
    assert error_of(validate, capsys) == sentence
    args = common_args(finetuned.card, str(finetuned.ckpt.parent / "tokenizer"), finetuned.root)
    assert error_of(["fit", *args, f"--model.init_from={altered}"], capsys) == sentence
    entries["gpt_config"]["n_layer"], entries["temperature"] = 1, float("nan")
    torch.save(entries, altered)
    nan = (
        f"gpt-ft: error: {altered} records a temperature of nan, and gpt-ft calibrate's is a positive number "
        "(every score is divided by it): calibrate the checkpoint again."
    )
    assert error_of([*label, f"--ckpt_path={altered}"], capsys) == nan
    assert error_of(validate, capsys) == nan  # (named by its file: it was "The checkpoint")
    assert not (tmp_path / "o.csv").exists()
