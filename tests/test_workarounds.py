"""Each workaround in gpt_ft/workarounds/ still finds the private API it relies on, and it still
behaves as relied on: a failure here means upstream changed it (the workaround's comment says what
to do then)."""

import enum
import inspect
import json
import logging
import sys
from argparse import ArgumentError
from contextlib import contextmanager

import pytest
import torch
from datasets import Dataset
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities.exceptions import SIGTERMException
from packaging.version import Version
from torch import nn
from torch.utils.data import DataLoader

from gpt_ft.adapters import SingleText, TaskAdapter
from gpt_ft.workarounds.cli import (
    CLI_HPARAMS,
    CheckpointHparamsAsDefaults,
    ParsersBuiltOnce,
    parse_subcommand,
)
from gpt_ft.workarounds.data import dataset_fingerprint, no_download_count
from gpt_ft.workarounds.kernels import (
    decline_step_unscaling,
    is_compiled,
    mkldnn_bf16_supported,
    torchao_import_loggers,
)
from gpt_ft.workarounds.parsing import plain, readable
from gpt_ft.workarounds.trainer import (
    clear_graceful_stop,
    judge_after_every_validation,
    loggers_write_this_step,
    logging_as,
    no_tips,
    quiet_misleading_warnings,
    request_graceful_stop,
    should_accumulate,
    summary_table,
)
from tests.helpers import TASKS, data_args, make_task


class Tiny(LightningModule):
    """A linear layer trained on 8 one-row batches."""

    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(torch.randn(8, self.hparams.width), batch_size=1)


class OnBatchEnd(Callback):
    """Calls `fn(trainer, batch_idx)` after each training batch."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.fn(trainer, batch_idx)


def make_trainer(callback: Callback, *, accumulate: int = 1, max_steps: int = -1) -> Trainer:
    return Trainer(
        max_epochs=1,
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )


# Lightning


def test_a_parser_in_the_toolkits_mode_writes_its_dump_header():
    from jsonargparse import ArgumentParser

    from gpt_ft.adapters.cards import PARSER_MODE

    parser = ArgumentParser(parser_mode=PARSER_MODE, dump_header=["lightning.pytorch==X"])
    parser.add_argument("--lr", type=float, default=0.1)
    assert parser.dump(parser.get_defaults()) == "# lightning.pytorch==X\nlr: 0.1\n"


def test_lightnings_notes_that_say_nothing_are_left_out_and_its_other_notes_kept():
    logger, said = logging.getLogger("lightning.pytorch.utilities.rank_zero"), []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger.removeFilter(no_tips)  # (a run in this process added it)
    logger.addHandler(handler)
    try:
        settings = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        Trainer(**settings, callbacks=[ModelSummary()])
        notes = ("💡 Tip:", "Trainer already configured with model summary")  # Lightning's wording
        assert [n for n in notes if any(s.startswith(n) for s in said)] == list(notes)  # else drop no_tips
        said.clear()
        logger.addFilter(no_tips)
        Trainer(**settings, callbacks=[ModelSummary()])
        assert not any(s.startswith(notes) for s in said) and any(s.startswith("GPU available") for s in said)
    finally:
        logger.removeHandler(handler)


def test_should_accumulate_is_true_inside_an_accumulation_window_and_false_where_the_optimizer_steps():
    seen = []
    fitted = make_trainer(
        OnBatchEnd(lambda trainer, i: seen.append(should_accumulate(trainer))), accumulate=3
    )
    fitted.fit(Tiny())
    # 8 batches in windows of 3: steps after the 3rd, the 6th and (the epoch's end) the 8th
    assert seen == [True, True, False, True, True, False, True, False]
    assert fitted.global_step == 3


@pytest.mark.parametrize("accumulate", [1, 2])
def test_loggers_write_this_step_says_ahead_which_steps_values_reach_the_loggers(accumulate):
    from lightning.pytorch.loggers import Logger

    class Steps(Logger):
        name, version, written = "steps", 0, []

        def log_metrics(self, metrics, step=None):
            if "x" in metrics:
                self.written.append(step)

        def log_hyperparams(self, *args, **kwargs):
            pass

    class Logs(Tiny):
        said: list[int] = []

        def training_step(self, batch, batch_idx):
            if loggers_write_this_step(self.trainer):
                self.said.append(self.trainer.global_step)
            self.log("x", float(batch_idx))
            return super().training_step(batch, batch_idx)

    logger, module = Steps(), Logs()
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=accumulate, log_every_n_steps=3, logger=logger,
                      accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)  # fmt: skip
    trainer.fit(module)
    # every micro-batch of an optimizer step the loggers write after says so; they write at its count
    assert sorted(set(module.said)) == logger.written and len(module.said) == accumulate * len(logger.written)
    assert logger.written == ([2, 5, 8, 11, 14] if accumulate == 1 else [2, 5])


def test_values_logged_as_the_training_step_from_a_later_hook_are_the_steps_own():
    from lightning.pytorch.loggers import Logger

    class Rows(Logger):
        name, version, rows = "rows", 0, []

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, metrics.get("x")))

        def log_hyperparams(self, *args, **kwargs):
            pass

    class Late(Tiny):
        def training_step(self, batch, batch_idx):
            if batch_idx % 2 == 0:  # even steps log in the step, odd ones after it, as the step
                self.log("x", float(batch_idx))
            return super().training_step(batch, batch_idx)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx % 2 == 1:
                with logging_as(self, "training_step"):
                    self.log("x", float(batch_idx))
            assert self._current_fx_name == "on_train_batch_end"

    logger = Rows()
    quiet = dict(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = Trainer(max_epochs=1, log_every_n_steps=1, logger=logger, accelerator="cpu", **quiet)
    trainer.fit(Late())
    assert logger.rows == [(i, float(i)) for i in range(8)]  # one record, each step's own value


def test_a_graceful_stop_ends_fit_after_the_batch_with_lightnings_sigterm_exception():
    def stop(trainer, i):
        if i == 2:
            request_graceful_stop(trainer)

    stopped = make_trainer(OnBatchEnd(stop))
    with pytest.raises(SIGTERMException):
        stopped.fit(Tiny())
    assert stopped.received_sigterm and stopped.global_step == 3


def test_a_withdrawn_graceful_stop_lets_fit_run_to_its_end():
    def stop_then_withdraw(trainer, i):
        if i == 2:
            request_graceful_stop(trainer)
            assert trainer.received_sigterm
            clear_graceful_stop(trainer)

    fitted = make_trainer(OnBatchEnd(stop_then_withdraw), max_steps=5)
    fitted.fit(Tiny())
    assert fitted.global_step == 5 and not fitted.received_sigterm


class Validated(Tiny):
    """Tiny, validated on one batch whose `score` is the number of validations so far."""

    validations = 0

    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            self.validations += 1
        self.log("score", float(self.validations))

    def val_dataloader(self):
        return DataLoader(torch.randn(1, self.hparams.width), batch_size=1)


@pytest.mark.parametrize("judged", [False, True])
def test_validating_after_every_batch_the_best_and_early_stopping_judge_every_validation(tmp_path, judged):
    """The int 1 passes Lightning's `val_check_interval == 1.0`: ModelCheckpoint and EarlyStopping
    judge at the epoch's end alone unless told otherwise, which the workaround does."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    kept = ModelCheckpoint(tmp_path, "{step}", monitor="score", mode="max", save_top_k=-1)
    stopping = EarlyStopping(monitor="score", mode="min", patience=2)  # rises: stops at the third
    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer = Trainer(
        max_epochs=1, val_check_interval=1, accelerator="cpu", callbacks=[kept, stopping], **quiet
    )
    if judged:
        judge_after_every_validation(trainer)
    trainer.fit(Validated())
    if judged:
        assert trainer.global_step == 3 and sorted(p.name for p in tmp_path.iterdir()) == [
            "step=1.ckpt",
            "step=2.ckpt",
            "step=3.ckpt",
        ]
    else:  # Lightning's own: the whole epoch, one checkpoint at its end
        assert trainer.global_step == 8 and [p.name for p in tmp_path.iterdir()] == ["step=8.ckpt"]


def test_summary_table_formats_columns_as_model_summary_passes_them():
    # The arguments ModelSummary.summarize receives (ParameterSummary passes them on).
    assert list(inspect.signature(ModelSummary.summarize).parameters)[:6] == [
        "summary_data", "total_parameters", "trainable_parameters", "model_size", "total_training_modes",
        "total_flops",
    ]  # fmt: skip
    columns = [
        (" ", ["0", "1"]),
        ("Name", ["gpt", "head"]),
        ("Type", ["GPT", "Linear"]),
        ("Params", ["10", "2"]),
    ]
    table = summary_table(12, 2, 0.00005, {"train": 2, "eval": 0}, 0, *columns)
    assert isinstance(table, str)
    for word in ("Name", "gpt", "head", "GPT", "Linear", "Trainable params", "Total params"):
        assert word in table


class Parsed(Exception):
    """Raised by `ParseOnly` with the configuration LightningCLI parsed."""


class ParseOnly(LightningCLI):
    """A LightningCLI that stops once its configuration is final (before building anything)."""

    def before_instantiate_classes(self) -> None:
        raise Parsed(self.config)


def parse_fit(args: list[str]):
    """`gpt-ft fit ARGS` as GPTCLI parses it (its configuration, before it builds anything)."""
    from gpt_ft.training.runs import GPTCLI, lightning_main

    class FitParseOnly(GPTCLI):
        def before_instantiate_classes(self) -> None:
            raise Parsed(self.config)

    with pytest.raises(Parsed) as parsed:
        lightning_main(["fit", *args], cli=FitParseOnly)
    return parsed.value.args[0]


def parsed_width(cli_class: type[LightningCLI], ckpt: str) -> int:
    args = ["fit", "--ckpt_path", ckpt, "--model.width=3", "--trainer.accelerator=cpu"]
    with pytest.raises(Parsed) as parsed:
        cli_class(Tiny, save_config_callback=None, args=args)
    return parsed.value.args[0].fit.model.width


def test_lightning_cli_puts_checkpoint_hparams_over_the_command_line_unless_the_mixin_is_there(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("sys.argv", ["gpt-ft"])  # the arguments are `args`, not pytest's
    assert list(inspect.signature(LightningCLI._parse_ckpt_path).parameters) == ["self"]
    ckpt = tmp_path / "run.ckpt"
    torch.save({"hyper_parameters": {"width": 5}}, ckpt)
    # Lightning-AI/pytorch-lightning#20801: the checkpoint's width beats --model.width
    assert parsed_width(ParseOnly, str(ckpt)) == 5

    class Mixed(CheckpointHparamsAsDefaults, ParseOnly):
        pass

    assert parsed_width(Mixed, str(ckpt)) == 3


def test_lightning_cli_runs_the_subcommand_inside_the_mixins_context(monkeypatch):
    from gpt_ft.workarounds.cli import RunWrapped

    monkeypatch.setattr("sys.argv", ["gpt-ft"])
    assert list(inspect.signature(LightningCLI._run_subcommand).parameters) == ["self", "subcommand"]
    seen = []

    class Wrapped(RunWrapped, LightningCLI):
        @contextmanager
        def running(self):
            seen.append("entered")
            try:
                yield
            except RuntimeError as exc:
                raise ValueError(f"reworded: {exc}") from None

    def fails(trainer, *args, **kwargs):
        seen.append("ran")
        raise RuntimeError("in the run")

    monkeypatch.setattr(Trainer, "validate", fails)
    with pytest.raises(ValueError, match="^reworded: in the run$"):
        Wrapped(Tiny, save_config_callback=None, args=["validate", "--trainer.accelerator=cpu"])
    assert seen == ["entered", "ran"]


def test_lightning_cli_adds_exactly_the_named_keys_to_a_modules_hyperparameters(monkeypatch):
    monkeypatch.setattr("sys.argv", ["gpt-ft"])  # the arguments are `args`, not pytest's
    args = ["--model", f"{__name__}.Tiny", "--model.width=3", "--trainer.accelerator=cpu"]
    args += ["--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = LightningCLI(Tiny, subclass_mode_model=True, run=False, save_config_callback=None, args=args)
    assert set(cli.model.hparams) == {"width", *CLI_HPARAMS}


def test_the_configuration_read_back_by_libyaml_is_the_dict_lightning_reads(monkeypatch):
    """`ConfigDumpReadFast._dump_config` makes what Lightning's makes, and only that: the model's
    recorded hyperparameters come from it."""
    from gpt_ft.workarounds.cli import ConfigDumpReadFast

    monkeypatch.setattr("sys.argv", ["gpt-ft"])
    assert list(inspect.signature(LightningCLI._dump_config).parameters) == ["self"]
    args = ["--model", f"{__name__}.Tiny", "--model.width=3", "--trainer.accelerator=cpu"]
    args += ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.max_epochs=7"]
    kwargs = dict(subclass_mode_model=True, run=False, save_config_callback=None, args=args)
    plain = LightningCLI(Tiny, **kwargs)

    class Fast(ConfigDumpReadFast, LightningCLI):
        pass

    fast = Fast(Tiny, **kwargs)
    assert fast.config_dump == plain.config_dump and fast.config_dump["trainer"]["max_epochs"] == 7
    assert set(vars(fast)) == set(vars(plain)) and dict(fast.model.hparams) == dict(plain.model.hparams)


@pytest.mark.parametrize("subcommands", [True, False], ids=["subcommands", "run=False"])
def test_setup_parser_sets_only_the_attributes_a_reused_parser_carries(monkeypatch, subcommands):
    monkeypatch.setattr("sys.argv", ["gpt-ft"])
    added = []

    class Watched(ParseOnly):
        def setup_parser(self, *args) -> None:
            before = set(vars(self))
            super().setup_parser(*args)
            added.extend(set(vars(self)) - before)

    with pytest.raises(Parsed):
        Watched(Tiny, save_config_callback=None, run=subcommands, args=["fit"] if subcommands else [])
    assert "parser" in added and set(added) <= set(ParsersBuiltOnce.PARSER_STATE)


def test_each_cli_parses_with_its_own_copy_of_a_parser_built_once(monkeypatch):
    """Defaults one CLI sets on its parser (a checkpoint's configuration) do not reach the next."""
    monkeypatch.setattr("sys.argv", ["gpt-ft"])
    monkeypatch.setattr(ParsersBuiltOnce, "_built", {})
    built = []
    monkeypatch.setattr(
        LightningCLI,
        "setup_parser",
        lambda self, *a, real=LightningCLI.setup_parser: built.append(1) or real(self, *a),
    )

    class Reused(ParsersBuiltOnce, ParseOnly):
        def parse_arguments(self, parser, args) -> None:
            if "--defaults" in args:  # as GPTCLI does with a checkpoint's configuration
                self._subcommand_parsers["fit"].set_defaults({"model.width": 7})
                args = [a for a in args if a != "--defaults"]
            super().parse_arguments(parser, args)

    def width(*args: str) -> int:
        with pytest.raises(Parsed) as parsed:
            Reused(Tiny, save_config_callback=None, args=["fit", *args, "--trainer.accelerator=cpu"])
        return parsed.value.args[0].fit.model.width

    assert width("--defaults") == 7 and width() == 2 and width("--model.width=4") == 4
    assert len(built) == 1
    with pytest.raises(Parsed):
        Reused(Tiny, save_config_callback=None, run=False, args=[])
    assert len(built) == 2  # another kind of parser: no subcommands


@pytest.mark.parametrize("subcommand", ["fit", "validate", "predict"])
def test_a_subcommands_own_parser_parses_as_the_parser_with_subcommands(
    subcommand, tmp_path, tokenizer_dir, capsys
):
    from gpt_ft.training.runs import GPTCLI, lightning_main

    card = make_task("single", tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  max_epochs: 2\nmodel:\n  preset: gpt-micro\n")

    class Both(GPTCLI):
        def parse_arguments(self, parser, args) -> None:
            alone = parse_subcommand(self, parser, args)
            printing = any(a.startswith("--print_conf") for a in args)
            raise Parsed(alone, None if printing else parser.parse_args(args))

    data = data_args(task=card, tokenizer=tokenizer_dir, data_dir=tmp_path, batch_size=3)
    args = [subcommand, f"--config={config}", data, "--data.max_length=40", "--model.lr=0.5"]
    with pytest.raises(Parsed) as parsed:
        lightning_main(args, cli=Both)
    alone, nested = parsed.value.args
    assert alone == nested
    assert alone.subcommand == subcommand and alone[subcommand].trainer.max_epochs == 2
    init = alone[subcommand].data.init_args
    assert (init.batch_size, init.max_length, init.task.class_path) == (3, 40, "gpt_ft.adapters.SingleText")
    # --print_config is printed by the parser with subcommands, before it validates (an option is
    # typed whole: argparse's `--print_conf=` for it is refused)
    with pytest.raises(SystemExit) as printed:
        lightning_main([*args, "--print_config"], cli=Both)
    assert printed.value.code == 0 and "lr: 0.5" in capsys.readouterr().out
    with pytest.raises(ArgumentError, match="unrecognized arguments: --print_conf="):
        lightning_main([*args, "--print_conf="], cli=Both)


# torch


def test_an_indexed_action_lookup_finds_the_action_jsonargparse_walks_to(
    tmp_path, tokenizer_dir, monkeypatch
):
    """index_action_lookups: on every parser a `gpt-ft fit` parse looks keys up in (the subcommand's,
    the data module's, its card's, the card's local files'), for every key it asked, every action's
    dest and options and a key none has, with and without `exclude`, the index answers as the walk
    does; an action added later is found."""
    from jsonargparse import ArgumentParser, _core, _subcommands
    from jsonargparse._actions import _ActionConfigLoad

    import gpt_ft.adapters.cards  # noqa: F401  (installs the index, as every command's parse does)

    indexed = _subcommands.find_action_and_subcommand
    assert getattr(indexed, "indexed", False) and _core.find_action_and_subcommand is indexed
    asked: dict[int, tuple] = {}

    def seen(parser, dest, exclude=None):
        asked.setdefault(id(parser), (parser, set()))[1].add(dest)
        return indexed(parser, dest, exclude=exclude)

    for module in (_subcommands, _core):
        monkeypatch.setattr(module, "find_action_and_subcommand", seen)

    card = make_task("single", tmp_path)
    data = data_args(task=card, tokenizer=tokenizer_dir, data_dir=tmp_path, batch_size=3)
    parse_fit([data, "--model.preset=gpt-micro", "--trainer.max_epochs=1"])
    every = set().union(*(keys for _, keys in asked.values()))
    assert {"data.init_args.batch_size", "max_length", "labels", "splits"} <= every  # the 4 kinds of parser
    for parser, keys in asked.values():
        keys = keys | {"no_such_key"} | {a.dest for a in parser._actions}
        keys |= {o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--")}
        for key in sorted(keys):
            for exclude in (None, _ActionConfigLoad):
                assert indexed(parser, key, exclude) == indexed.walk(parser, key, exclude=exclude), key
    parser = ArgumentParser()
    parser.add_argument("--a", type=int)
    assert indexed(parser, "a")[0].dest == "a" and indexed(parser, "b") == (None, None)
    parser.add_argument("--b", type=int)  # the index built for `a` follows
    assert indexed(parser, "b")[0].dest == "b"
    # The index dies with its parser: kept elsewhere, it held every parser (and the run each one's
    # CLI reaches: model, trainer, optimizer state) for the life of the process.
    import gc
    import weakref

    gone = weakref.ref(parser)
    del parser
    gc.collect()
    assert gone() is None


def test_a_remembered_key_split_walks_to_what_jsonargparses_parse_finds(tmp_path, tokenizer_dir, monkeypatch):
    """remember_key_splits: at every key a `gpt-ft fit` parse asks of a namespace, the leaf, the
    parent namespace (the same object) and the parent's key are jsonargparse's; a bad key raises
    its error; keys that clash with a Namespace attribute are marked as it marks them."""
    from jsonargparse import Namespace

    remembered = Namespace._parse_key
    original = remembered.original
    asked = []

    def both(self, key):
        got, expected = remembered(self, key), original(self, key)
        assert got[0] == expected[0] and got[1] is expected[1] and got[2] == expected[2], key
        asked.append(key)
        return got

    monkeypatch.setattr(Namespace, "_parse_key", both)

    card = make_task("single", tmp_path)
    data = data_args(task=card, tokenizer=tokenizer_dir, data_dir=tmp_path, batch_size=3)
    parse_fit([data, "--model.preset=gpt-micro", "--trainer.max_epochs=1"])
    assert len(asked) > 1000 and "data.init_args.batch_size" in asked
    monkeypatch.setattr(Namespace, "_parse_key", remembered)
    ns = Namespace(a=Namespace(items=1, b=2), c={"d": Namespace(e=3)})
    ns["keys"] = Namespace(f=4)
    for key in ("a.items", "a.b", "a.b.x", "c.d.e", "c.d", "keys.f", "keys", "x.y", "a.items.z") * 2:
        assert remembered(ns, key) == original(ns, key) and remembered(ns, key)[1] is original(ns, key)[1]
    assert ns["a.items"] == 1 and ns["keys.f"] == 4
    for bad in ("a b", "a..b", ".a", 3, None):
        with pytest.raises(KeyError) as theirs:
            original(ns, bad)
        with pytest.raises(KeyError) as ours:
            remembered(ns, bad)
        assert str(ours.value) == str(theirs.value)


def test_a_remembered_class_parse_equals_jsonargparses_own(tmp_path, tokenizer_dir, monkeypatch):
    """remember_class_parses: every card under tasks/, read as the command line reads a card (a
    file's path), and `gpt-ft fit` parses of a card given to the data module by its path parse to
    what jsonargparse's own parse gives, the first time and from memory (jsonargparse's adaptation
    not called again); the card edited in place, at the same path, is read afresh; a data module of
    another class than the default's leaves none of the default's fields; `plain` tells values of
    other types apart and refuses what is not plain data."""
    from jsonargparse import ArgumentParser, _typehints

    from gpt_ft.adapters import TaskAdapter

    remembered = _typehints.adapt_class_type
    assert {TaskAdapter, LightningDataModule} <= remembered.bases
    adapt = remembered.original
    parsed_afresh = []  # the classes of the values jsonargparse's own adaptation parsed

    def recording(value, serialize, instantiate_classes, *args):
        if not (serialize or instantiate_classes):
            parsed_afresh.append(getattr(_typehints.subclass_spec_as_namespace(value), "class_path", None))
        return adapt(value, serialize, instantiate_classes, *args)

    def parse(parse_once, memory: bool):
        """What `parse_once()` returns with or without the memory; the classes parsed afresh."""
        parsed_afresh.clear()
        monkeypatch.setattr(_typehints, "adapt_class_type", remembered if memory else adapt)
        monkeypatch.setattr(remembered, "original", recording)
        return parse_once(), {c.rsplit(".", 1)[-1] for c in parsed_afresh if c}

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=TaskAdapter, sub_configs=True)  # a path read as the card's file
    for card in sorted(TASKS.rglob("*.yaml")):
        once = lambda: parser.parse_args(["--task", str(card)]).as_dict()  # noqa: E731
        own, _ = parse(once, memory=False)
        assert parse(once, memory=True)[0] == own, card
        again, afresh = parse(once, memory=True)
        stdin = "'-'" in card.read_text()  # a text jsonargparse reads standard input for, elsewhere
        assert again == own and (own["task"]["class_path"].rsplit(".", 1)[-1] in afresh) == stdin, card
    assert stdin is False and "'-'" in (TASKS / "snli.yaml").read_text()  # (its ignore_labels)

    (tmp_path / "cards").mkdir()  # the card in a folder of its own (its split files' names, elsewhere)
    card = make_task("single", tmp_path).rename(tmp_path / "cards" / "single.yaml")
    data = data_args(task=card, tokenizer=tokenizer_dir, data_dir=tmp_path)
    args = [data, "--model.preset=gpt-micro"]

    def fit_parse():
        config = parse_fit(args).fit.as_dict()
        return config["data"], config["model"]

    for labels in (None, ["bad", "good", "mixed"]):
        if labels:  # the same path, another card
            card.write_text(card.read_text().replace("[negative, positive]", str(labels).replace("'", "")))
        own, _ = parse(fit_parse, memory=False)
        first, afresh = parse(fit_parse, memory=True)
        assert first == own and {"TaskDataModule", "SingleText"} <= afresh
        again, afresh = parse(fit_parse, memory=True)  # the data module names the card's file: read again
        assert again == own and "TaskDataModule" in afresh and "SingleText" not in afresh
        assert own[0]["init_args"]["task"]["init_args"]["labels"] == (labels or ["negative", "positive"])
    card.rename(tmp_path / "single.yaml")  # beside its split files, which it names: never remembered
    data = data_args(task=tmp_path / "single.yaml", tokenizer=tokenizer_dir, data_dir=tmp_path)
    args[0] = data
    own, _ = parse(fit_parse, memory=False)
    assert parse(fit_parse, memory=True)[0] == own and "SingleText" in parse(fit_parse, memory=True)[1]
    # another data module: its parse takes the default one's fields out of the earlier value
    args[0:1] = ["--data=gpt_ft.data.lm_data.LMDataModule", f"--data.token_dir={tmp_path}"]
    own, _ = parse(fit_parse, memory=False)
    assert parse(fit_parse, memory=True)[0] == parse(fit_parse, memory=True)[0] == own
    assert own[0]["init_args"]["token_dir"] == str(tmp_path) and "task" not in own[0]["init_args"]


def test_what_a_remembered_parse_tells_apart_and_the_texts_it_refuses(tmp_path, monkeypatch):
    """`plain` tells apart values that compare equal but parse apart, and refuses what is not plain
    data; `readable` refuses the texts jsonargparse might read a file for: standard input, a URL,
    a file's path as it stands, from the home folder or from a folder given (not a folder's)."""
    from jsonargparse import Namespace

    kinds = [1, 1.0, True, "1", -0.0, 0.0, [1], (1,), {1: "a"}, {True: "a"}, {"a": 1}, Namespace(a=1)]
    assert len({plain(v) for v in kinds}) == len(kinds)
    with pytest.raises(TypeError, match="not plain data: object"):
        plain({"a": [object()]})
    with pytest.raises(TypeError, match="a text refused: 'b'"):
        plain(Namespace(a=["b"]), refuse=lambda text: text == "b")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.tsv").write_text("x\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    here = (str(tmp_path),)
    assert readable("-", ()) and readable("https://example.com/card.yaml", ())
    assert readable(str(tmp_path / "d" / "train.tsv"), ()) and readable("~/d/train.tsv", ())
    assert readable("d/train.tsv", here) and not readable("d/train.tsv", ())
    assert not readable("d", here) and not readable("label", here) and not readable("", here)


class EnvText(SingleText):
    """A card class whose class parser is first made where jsonargparse reads the environment."""


def test_a_class_parser_reading_the_environment_is_never_remembered(monkeypatch):
    """remember_class_parses: where jsonargparse reads defaults from the environment
    (JSONARGPARSE_DEFAULT_ENV, read as a class parser is made), each parse reads it again."""
    from jsonargparse import ArgumentParser, _typehints

    import gpt_ft.adapters.cards  # noqa: F401 (the cards' parses remembered)

    assert TaskAdapter in _typehints.adapt_class_type.bases
    monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "true")
    monkeypatch.setattr(sys, "argv", ["gpt-ft"])  # the prefix of its variables' names
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=TaskAdapter)
    card = json.dumps({"class_path": f"{__name__}.EnvText", "init_args": {"name": "x", "labels": ["a", "b"]}})
    for text in ("first", "second", "first"):
        monkeypatch.setenv("GPT_FT_TEXT", text)  # EnvText's `text`, as jsonargparse names it
        assert parser.parse_args(["--task", card]).task.init_args.text == text


def test_a_fused_optimizer_declining_step_unscaling_can_be_clipped_under_16_mixed():
    precision = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    layer = nn.Linear(2, 1)
    layer(torch.randn(3, 2)).sum().backward()
    optimizer = torch.optim.AdamW(layer.parameters(), fused=True)
    assert getattr(optimizer, "_step_supports_amp_scaling", False)  # the fused kernel offers to unscale
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        precision.clip_gradients(optimizer, clip_val=1.0)
    decline_step_unscaling(optimizer)
    precision.clip_gradients(optimizer, clip_val=1.0)


def test_is_compiled_after_module_compile_only():
    layer = nn.Linear(2, 1)
    assert not is_compiled(layer)
    layer.compile()  # lazy: nothing is compiled before the first call
    assert is_compiled(layer)
    assert not is_compiled(nn.Linear(2, 1))


def test_the_mkldnn_bf16_probe_exists_and_answers_a_bool():
    if torch.backends.mkldnn.is_available():
        assert callable(torch.ops.mkldnn._is_mkldnn_bf16_supported)  # not silently False after a rename
    assert isinstance(mkldnn_bf16_supported(), bool)


def test_torch_warns_about_enum_pytree_constants_on_the_named_logger():
    """The warning torchao's import causes (it registers Enum subclasses) comes from this logger
    (torch 2.13 warns; 2.11 did not)."""
    import torch.utils._pytree as pytree

    names = [logger.name for logger in torchao_import_loggers()]
    assert "torch.utils._pytree" in names and "torch.utils._pytree" in logging.root.manager.loggerDict
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch.utils._pytree")
    level = logger.level
    logger.setLevel(logging.WARNING)  # the CLI may have set ERROR in this process
    watched = [logging.root, logging.getLogger("torch")]  # any logger's record (torch's do not reach root)
    for each in watched:
        each.addHandler(handler)
    try:

        class Precision(str, enum.Enum):
            BF16 = "bf16"

        pytree.register_constant(Precision)
    finally:
        for each in watched:
            each.removeHandler(handler)
        logger.setLevel(level)
    warned = {record.name for record in records if "Enum subclass" in record.getMessage()}
    assert warned <= {"torch.utils._pytree"}
    assert warned or Version(torch.__version__).release < (2, 13)


# datasets


def test_dataset_fingerprint_follows_the_rows():
    rows = {"text": ["a", "b"], "label": [0, 1]}
    same = dataset_fingerprint(Dataset.from_dict(rows))
    assert isinstance(same, str) and same == dataset_fingerprint(Dataset.from_dict(rows))
    assert same != dataset_fingerprint(Dataset.from_dict({"text": ["a", "c"], "label": [0, 1]}))
    changed = Dataset.from_dict(rows).map(lambda row: {"label": 1 - row["label"]}, keep_in_memory=True)
    assert dataset_fingerprint(changed) != same


def test_reading_a_local_file_asks_nothing_of_the_hub(tmp_path, monkeypatch):
    """datasets counts a download of its csv builder with a HEAD request to the Hub (which waits on
    DNS without a network); inside `no_download_count` it sends none, and gpt_ft reads local files
    inside it. The switch is a module attribute of datasets, read at each call."""
    import datasets
    import datasets.load

    from gpt_ft.data.files import read_table

    requests = []

    class Session:
        def head(self, url, **kwargs):
            requests.append(url)

    monkeypatch.setattr(datasets.load, "get_session", lambda: Session())
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    path = tmp_path / "rows.csv"
    path.write_text("sentence,label\nthe cat sat .,1\n")
    datasets.load_dataset("csv", data_files={"data": str(path)}, split="data")
    assert requests and all("csv" in url for url in requests)  # what the workaround stops
    requests.clear()
    with no_download_count():
        datasets.load_dataset("csv", data_files={"data": str(path)}, split="data")
    assert requests == [] and datasets.config.HF_UPDATE_DOWNLOAD_COUNTS is True  # restored after
    assert read_table(path)["sentence"] == ["the cat sat ."] and requests == []


def test_the_flash_ops_take_the_arguments_the_varlen_dropout_pair_passes():
    """`flash_varlen_forward`/`_backward` call aten's flash ops by position and keyword: their
    schemas (present in CPU builds too) still read so."""
    import torch

    forward = str(torch.ops.aten._flash_attention_forward.default._schema)
    backward = str(torch.ops.aten._flash_attention_backward.default._schema)
    assert "cum_seq_q, Tensor? cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, " \
           "bool return_debug_mask" in forward  # fmt: skip
    assert "-> (Tensor output, Tensor softmax_logsumexp, Tensor rng_state, Tensor unused," in forward
    assert "float dropout_p, bool is_causal, Tensor rng_state, Tensor unused" in backward
    for schema in (forward, backward):
        assert "float? scale=None" in schema and "window_size_left=None" in schema
        assert "window_size_right=None" in schema


def test_the_cpu_flash_pair_is_causal_attention_and_its_gradients():
    """`cpu_flash_forward`/`_backward` on grouped heads (6 query heads over 2 key/value heads) in
    fp64: SDPA's causal output and autograd's gradients to 1e-12, the logsumexp per query head."""
    import torch
    import torch.nn.functional as F

    from gpt_ft.workarounds.kernels import cpu_flash_backward, cpu_flash_forward

    torch.manual_seed(0)
    q = torch.randn(1, 6, 19, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 19, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    grad = torch.randn(1, 6, 19, 8, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    out, lse = cpu_flash_forward(q.detach(), k.detach(), v.detach(), 0.3)
    torch.testing.assert_close(out, want.detach(), rtol=0, atol=1e-12)
    scores = (q @ k.repeat_interleave(3, 1).transpose(-1, -2) * 0.3).masked_fill(
        torch.ones(19, 19, dtype=torch.bool).triu(1), float("-inf")
    )
    torch.testing.assert_close(lse, scores.logsumexp(-1).detach(), rtol=0, atol=1e-12)
    got = cpu_flash_backward(grad, q.detach(), k.detach(), v.detach(), out, lse, 0.3)
    for g, w in zip(got, torch.autograd.grad(want, (q, k, v), grad)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_the_help_says_what_gpt_ft_does_where_lightnings_says_otherwise(subcommand, capsys):
    """Lightning's help said a run given no length trains 1000 epochs (fine-tuning trains 3), that
    the default seed is random (it is 0), and offered `best`, `hpc` and `registry` checkpoints."""
    from gpt_ft.cli import main

    with pytest.raises(SystemExit):
        main([subcommand, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "random seed" not in shown and "max_epochs = 1000" not in shown and "hpc" not in shown
    assert "true, or none given: 0." in shown and "(the newest last.ckpt of this task's runs" in shown
    if subcommand == "fit":
        assert "fine-tuning runs GPT-1's 3 epochs (pretraining: 1000)." in shown


def test_a_gguf_file_is_parsed_once_a_load(tmp_path, monkeypatch):
    """transformers' GGUF loading looks `gguf.GGUFReader` and `gguf.get_tensor_name_map` up at call
    time (gpt_ft/workarounds/gguf_files.py): loading a file's weights (its config, checks and
    tensors) parses it once and builds one tensor-name map, converting its tokenizer parses it
    once, and a tokenizer already converted none; no reader is kept after a load, and gguf's own
    names are back."""
    gguf = pytest.importorskip("gguf")
    from gpt_ft import GPT
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.weights.pretrained import resolve_tokenizer
    from gpt_ft.workarounds import gguf_files
    from tests.helpers import tiny_llama
    from tests.weights.gguf_files import tiny_tokenizer, write_gguf

    path = write_gguf(tmp_path / "m.gguf", tiny_llama("llama", vocab_size=320), tokenizer=tiny_tokenizer())
    parsed, maps = [], []
    own_init, own_map = gguf.GGUFReader.__init__, gguf.get_tensor_name_map
    monkeypatch.setattr(
        gguf.GGUFReader, "__init__", lambda self, *a, **k: parsed.append(a[0]) or own_init(self, *a, **k)
    )
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *a: maps.append(a) or own_map(*a))
    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    GPT.from_pretrained(path)
    assert len(parsed) == 1 and len(maps) == 1 and not gguf_files.OPEN  # nothing kept
    load_tokenizer(path)
    assert len(parsed) == 2
    assert resolve_tokenizer(None, str(path)) == str(path) and len(parsed) == 2  # the cache says it has one
    assert isinstance(gguf.GGUFReader, type)  # gguf's own class back


def test_a_gguf_load_in_another_thread_waits_for_the_one_under_way():
    """`read_once` entered from two threads (a caller's own): the second waits until the first has
    put gguf's own names back, then stands in itself (unguarded, a thread could save another's
    stand-in as gguf's class, and every later read recursed)."""
    import threading

    gguf = pytest.importorskip("gguf")
    from gpt_ft.workarounds import gguf_files

    own, seen = gguf.GGUFReader, []

    def second():
        with gguf_files.read_once():
            seen.append(gguf_files.OPEN["class"])

    with gguf_files.read_once():
        other = threading.Thread(target=second)
        other.start()
        other.join(timeout=0.3)
        assert other.is_alive() and not seen  # waiting
    other.join(timeout=10)
    assert seen == [own] and gguf.GGUFReader is own and not gguf_files.OPEN


def test_transformers_gguf_reader_takes_smollm3_olmo2_and_gptneox_files_within_a_load_only():
    """transformers' GGUF reader lists no `smollm3`, `olmo2` nor `gptneox` (gpt_ft/workarounds/
    gguf_files.py: once it does, drop it from `READ_AS_LLAMA`, or the GPT-NeoX tables); within
    `read_once` its tables read the first two by Llama's keys, SmolLM3's tensors as Llama's and OLMo 2's
    as stored, and GPT-NeoX's by its own keys as a GPTNeoXConfig, q/k/v by Bloom's processor; after it,
    the tables are as they were."""
    pytest.importorskip("gguf")
    from transformers import GPTNeoXConfig
    from transformers.modeling_gguf_pytorch_utils import (
        GGUF_SUPPORTED_ARCHITECTURES,
        GGUF_TO_TRANSFORMERS_MAPPING,
        TENSOR_PROCESSORS,
    )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from gpt_ft.workarounds import gguf_files

    config, tables = GGUF_TO_TRANSFORMERS_MAPPING["config"], (GGUF_SUPPORTED_ARCHITECTURES, TENSOR_PROCESSORS)
    before = [list(GGUF_SUPPORTED_ARCHITECTURES), dict(config), dict(TENSOR_PROCESSORS)]
    assert gguf_files.READ_AS_LLAMA == {"smollm3": "llama", "olmo2": None}
    unlisted = ("smollm3", "olmo2", "gptneox")
    assert not any(arch in table for arch in unlisted for table in (config, *tables))
    assert "gptneox" not in CONFIG_MAPPING  # (transformers' model type is gpt_neox)
    with gguf_files.read_once():
        assert set(unlisted) <= set(GGUF_SUPPORTED_ARCHITECTURES)
        assert config["smollm3"] is config["llama"] and config["olmo2"] is config["llama"]
        assert TENSOR_PROCESSORS["smollm3"] is TENSOR_PROCESSORS["llama"] and "olmo2" not in TENSOR_PROCESSORS
        assert config["gptneox"] is gguf_files.NEOX_KEYS and CONFIG_MAPPING["gptneox"] is GPTNeoXConfig
        assert issubclass(TENSOR_PROCESSORS["gptneox"], TENSOR_PROCESSORS["bloom"])
    assert [list(GGUF_SUPPORTED_ARCHITECTURES), dict(config), dict(TENSOR_PROCESSORS)] == before
    assert "gptneox" not in CONFIG_MAPPING


@pytest.mark.parametrize("pre", ["smollm", "gpt-2"])
def test_a_gguf_tokenizer_splits_digits_as_llama_cpp_reads_its_pre_tokenizer(tmp_path, monkeypatch, pre):
    """transformers converts a GGUF tokenizer of SmolLM's pre-tokenizer with GPT-2's pattern alone
    (gpt_ft/workarounds/gguf_files.py, `split_as_llama_cpp`): read through gpt_ft, "smollm" cuts every
    digit apart first, as llama.cpp and SmolLM2's own tokenizer.json do ("2024": four pieces where
    the vocabulary merges them), and "gpt-2" keeps GPT-2's pattern; each equals the tokenizers
    library's own encoding with that pre-tokenizer."""
    pytest.importorskip("gguf")
    from tokenizers import Tokenizer, pre_tokenizers

    from gpt_ft.data.tokenizer import load_tokenizer
    from tests.helpers import tiny_llama
    from tests.weights.gguf_files import tiny_tokenizer, write_gguf

    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    source = tiny_tokenizer()
    path = write_gguf(tmp_path / "m.gguf", tiny_llama("llama", vocab_size=320), tokenizer=source, pre=pre)
    text = "She said: it's the best film of 2024, and 12 more!"
    expected = Tokenizer.from_str(source.backend_tokenizer.to_str())
    if pre == "smollm":
        digits = pre_tokenizers.Digits(individual_digits=True)
        expected.pre_tokenizer = pre_tokenizers.Sequence([digits, expected.pre_tokenizer])
    ids = load_tokenizer(str(path))(text, add_special_tokens=False)["input_ids"]
    assert ids == expected.encode(text, add_special_tokens=False).ids
    year = load_tokenizer(str(path)).tokenize("2024")
    assert year == (["2", "0", "2", "4"] if pre == "smollm" else ["202", "4"])


@pytest.mark.parametrize("pre", ["llama-bpe", "gpt-2"])
def test_a_gguf_tokenizer_takes_a_word_it_holds_whole_where_llama_cpp_does(tmp_path, monkeypatch, pre):
    """transformers converts a GGUF tokenizer of Llama 3's pre-tokenizer to merge every piece
    (gpt_ft/workarounds/gguf_files.py, `split_as_llama_cpp`): read through gpt_ft, "llama-bpe"
    takes " zqxw", which the vocabulary holds and no merge reaches, as one token, as llama.cpp and
    Llama 3's tokenizer.json (`ignore_merges`) do; "gpt-2" merges it piece by piece. Where
    llama-cpp-python is installed, llama.cpp's ids are gpt_ft's."""
    pytest.importorskip("gguf")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from gpt_ft.data.tokenizer import load_tokenizer
    from tests.helpers import tiny_llama
    from tests.weights.gguf_files import SPECIALS, tiny_tokenizer, write_gguf

    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    spec = json.loads(tiny_tokenizer().backend_tokenizer.to_str())
    spec["model"]["vocab"]["Ġzqxw"] = 320  # (no merge makes it)
    whole = Tokenizer.from_str(json.dumps(spec))
    source = PreTrainedTokenizerFast(tokenizer_object=whole, bos_token=SPECIALS[1], eos_token=SPECIALS[2],
                                     pad_token=SPECIALS[0])  # fmt: skip
    path = write_gguf(tmp_path / "m.gguf", tiny_llama("llama", vocab_size=321), tokenizer=source, pre=pre)
    text = "a zqxw b, and zqxw"
    ids = load_tokenizer(str(path))(text, add_special_tokens=False)["input_ids"]
    assert ids.count(320) == (2 if pre == "llama-bpe" else 0)
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids


@pytest.mark.parametrize("command", ["validate", "test"])
def test_lightnings_advice_to_evaluate_on_one_device_is_quieted(command):
    """Evaluation drops the distributed sampler's repeats (gpt_ft/training/eval_metrics.py, exact on
    2 processes: tests/training/test_distributed.py), so Lightning's advice to evaluate on one device
    misleads; it showed under `gpt-ft validate` and `test` on 2 processes."""
    import warnings

    from lightning.fabric.utilities.warnings import PossibleUserWarning
    from lightning.pytorch.trainer.connectors import data_connector

    source = " ".join(inspect.getsource(data_connector).split())  # (Lightning's wording, as it warns)
    assert (
        'f"Using `DistributedSampler` with the dataloaders. During `trainer.{trainer_fn.value}()`, it is"'
        in source
    )
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        quiet_misleading_warnings()
        warnings.warn(
            f"Using `DistributedSampler` with the dataloaders. During `trainer.{command}()`, it is "
            "recommended to use `Trainer(devices=1, num_nodes=1)` ...",
            PossibleUserWarning,
        )
    assert not shown, [str(w.message) for w in shown]
