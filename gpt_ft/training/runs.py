"""A run from its configuration: the LightningCLI of `gpt-ft fit|validate|test|predict` and of `gpt-ft
suite`'s runs. The only place where arguments are linked (data -> model); callbacks: callbacks.py."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partialmethod
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

from gpt_ft.adapters.cards import PARSER_MODE
from gpt_ft.errors import check_context, check_output_dir
from gpt_ft.model.config import preset_config
from gpt_ft.training.callbacks import History, run_callbacks
from gpt_ft.training.config_checks import (
    card_named,
    check_token_folder,
    refuse_bad_config,
    replaced_overrides,
)
from gpt_ft.training.logged_settings import LoggedSettings
from gpt_ft.training.precision import cpu_precision, runs_on_cpu, warn_half_weights
from gpt_ft.training.predictions import check_submission
from gpt_ft.training.recorded import (
    built_on_its_own,
    plain_config,
    recorded_configuration,
    refuse_untrained,
    with_absolute_paths,
)
from gpt_ft.training.run_folders import (
    DEFAULT_LOGGER,
    checkpoint_to_read,
    earlier_logs,
    last_of_task,
    logs_follow_root_dir,
    no_earlier_checkpoints,
    no_new_empty_folders,
    runs_root,
)
from gpt_ft.training.saved import check_init_tokenizer
from gpt_ft.training.strategies import check_devices, check_rendezvous, run_plugins
from gpt_ft.weights.pretrained import resolve_tokenizer
from gpt_ft.workarounds.cli import (
    CheckpointHparamsAsDefaults,
    ConfigDumpReadFast,
    ParsersBuiltOnce,
    RunWrapped,
    parse_subcommand,
    parse_unchecked,
    print_config_asked,
    subcommand_parser,
)
from gpt_ft.workarounds.parsing import remember_class_parses
from gpt_ft.workarounds.trainer import judge_after_every_validation, no_tips, quiet_misleading_warnings

SUBCOMMANDS = ("fit", "validate", "test", "predict")  # LightningCLI's
LM_DATA = {"data": {"class_path": "gpt_ft.data.lm_data.LMDataModule"}}
remember_class_parses(LightningDataModule)  # a data module's options parsed once for each time met


class ValidatedOnce(LightningArgumentParser):
    """Writes a configuration (`dump`, `save`) unchecked unless asked: the parse checked it; YAML
    without comments through the parser mode's own dumper (`gpt_ft.adapters.cards.dump_yaml`)."""

    def dump(self, namespace, *args: Any, skip_validation: bool = True, format: str = "parser_mode",
             with_comments: bool = False, **kwargs: Any) -> str:  # fmt: skip
        if format in ("yaml", "parser_mode") and not with_comments:
            format = PARSER_MODE
        return super().dump(namespace, *args, skip_validation=skip_validation, format=format,
                            with_comments=with_comments, **kwargs)  # fmt: skip

    def save(self, namespace, path, *args: Any, skip_validation: bool = True, **kwargs: Any) -> None:
        super().save(namespace, path, *args, skip_validation=skip_validation, **kwargs)


class GPTCLI(CheckpointHparamsAsDefaults, ConfigDumpReadFast, ParsersBuiltOnce, RunWrapped, LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Only the subcommand given gets its parser built: each of the four costs a third of a second.
        given = kwargs.get("args")
        self._only = given[0] if isinstance(given, list) and given and given[0] in SUBCOMMANDS else None
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any):
        # An option is typed whole: argparse took `--trainer.max_step` for the one option it begins
        return super().init_parser(**kwargs, parser_mode=PARSER_MODE, allow_abbrev=False)

    def subcommands(self) -> dict[str, set[str]]:  # an instance's, no longer LightningCLI's static one
        every = LightningCLI.subcommands()
        return {self._only: every[self._only]} if self._only else every

    def add_arguments_to_parser(self, parser) -> None:
        # What the model needs from the data, stated once (DESIGN: links live here only).
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data", "model.task", compute_fn=lambda data: data.task, apply_on="instantiate")
        parser.link_arguments(
            "data", "model.tokenizer", compute_fn=lambda data: data.tokenizer_path, apply_on="instantiate"
        )
        parser.set_defaults({"data": {"class_path": "gpt_ft.data.task_data.TaskDataModule"}})

    def parse_arguments(self, parser, args) -> None:
        # A checkpoint of this toolkit given to validate/test/predict brings the configuration it
        # records as the parser's defaults: the command needs no other argument, and every argument
        # given (config files included) still wins, but for the weights it is built on: its own.
        subcommand = None  # a configuration (a dict: `gpt-ft suite`'s runs) is parsed as it is
        if not isinstance(args, dict):
            subcommand = self._only
            if subcommand in ("validate", "test", "predict"):  # (an LM's --data.token_dir: its module's)
                unchecked = read_ahead(subcommand_parser(self, subcommand), args[1:])
                named, printing = unchecked.get("ckpt_path"), print_config_asked(parser)
                data = unchecked.get("data") or {}  # (its init_args, or given as --data={"task": ...})
                card = (data.get("init_args") or data).get("task")  # `last`: a run of its task
                ckpt = checkpoint_to_read(unchecked.trainer, subcommand, named, printing, card)  # (found)
                self.resolved_ckpt = ckpt if ckpt != named else None  # (a name, `last`, found)
                known = inspect.signature(self.model_class.__init__).parameters  # (a newer one's: named)
                recorded = recorded_configuration(ckpt, unchecked, known) if ckpt else {}
                language_model = "token_dir" in ((recorded.get("data") or {}).get("init_args") or {})
                if language_model and card:
                    raise ValueError(
                        f"{ckpt} is a language model's checkpoint: fine-tune it on the task first "
                        f"(gpt-ft fit --model.init_from {ckpt} --data.task CARD)."
                    )
                parser.set_defaults({f"{subcommand}.{key}": v for key, v in recorded.items()})
        if subcommand:  # LightningCLI.parse_arguments's parse, at half the cost
            self.config = parse_subcommand(self, parser, args)
            if subcommand in SUBCOMMANDS[1:]:
                built_on_its_own(self.config[subcommand], recorded, ckpt)
        else:
            super().parse_arguments(parser, args)
        config = self.config[subcommand] if subcommand in SUBCOMMANDS else self.config
        seed = config.get("seed_everything")
        if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
            # numpy would refuse it later, without naming the option
            raise ValueError(f"--seed_everything must be in [0, {2**32 - 1}], got {seed}.")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        refuse_bad_config(config, self.model_class)
        if said := replaced_overrides(config):
            rank_zero_info(said)
        accumulate = config.trainer.get("accumulate_grad_batches")
        if isinstance(accumulate, int) and accumulate < 1:  # Lightning would divide by it
            raise ValueError(f"--trainer.accumulate_grad_batches must be >= 1, got {accumulate}.")
        clip = config.trainer.get("gradient_clip_val")
        if isinstance(clip, (int, float)) and not 0 <= clip < math.inf:  # (NaN: blamed on another setting)
            raise ValueError(
                f"--trainer.gradient_clip_val must be a finite number >= 0 (0 or null: no clipping), "
                f"got {clip}."
            )
        for every in ("val_check_interval", "check_val_every_n_epoch"):  # Lightning would divide by 0
            if isinstance(n := config.trainer.get(every), int) and not isinstance(n, bool) and n < 1:
                raise ValueError(f"--trainer.{every} must be >= 1 (batches, or epochs), got {n}.")
        on_cpu = runs_on_cpu(config.trainer.get("accelerator", "auto"))
        check_devices(
            config.trainer.get("devices", "auto"), on_cpu=on_cpu, strategy=config.trainer.get("strategy")
        )
        data = (config.get("data") or {}).get("init_args") or {}
        if self.subcommand in ("validate", "test", "predict") and not config.get("ckpt_path"):
            refuse_untrained(self.subcommand, config.model.get("init_from"))
        if self.subcommand in ("test", "predict") and "token_dir" in data and "task" not in data:
            raise ValueError(
                f"gpt-ft {self.subcommand} reads a task's test split (--data.task CARD); a language model's "
                "token files have none: score them with gpt-ft validate."
            )
        if getattr(self, "resolved_ckpt", None):
            config.ckpt_path = self.resolved_ckpt
        elif str(config.get("ckpt_path")).startswith("~"):  # as a config file gives it: checks read it
            config.ckpt_path = str(Path(config.ckpt_path).expanduser())
        if self.subcommand == "predict":  # where it writes, checked before the weights load
            check_output_dir(config.model.predictions_dir, "--model.predictions_dir")
        if config.trainer.get("default_root_dir"):  # its logs and checkpoints, as well
            check_output_dir(config.trainer.default_root_dir, "--trainer.default_root_dir")
        logs_follow_root_dir(config.trainer)
        if runs_on_cpu(config.trainer.get("accelerator", "auto")):
            config.trainer.precision, why = cpu_precision(config.trainer.get("precision"))
            if why:
                rank_zero_info(why)
        if self.subcommand in (None, "fit"):  # (None: a suite's run; the precision that runs, said)
            _recipe_length(config)
        tokenizer_of_the_weights(config, fitting=self.subcommand in (None, "fit"))
        self.data_config = with_absolute_paths(plain_config(config.data.as_dict()))

    def instantiate_classes(self) -> None:
        with card_named(self.config[self.subcommand] if self.subcommand else self.config):
            super().instantiate_classes()
        judge_after_every_validation(self.trainer)
        check_context(self.datamodule, self.model.gpt.config.n_positions)
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand in ("validate", "test", "predict") and not config.get("ckpt_path"):
            refuse_untrained(self.subcommand, self.model.init_from, getattr(self.model, "head", None))
        if self.subcommand == "predict" and self.model.task is not None:
            data_dir, limit = getattr(self.datamodule, "data_dir", None), self.trainer.limit_predict_batches
            check_submission(self.model.task, self.model.predictions_dir, data_dir, limit)

    @contextmanager
    def running(self) -> Iterator[None]:
        with no_new_empty_folders(self.trainer), card_named(self.config[self.subcommand]):
            yield  # (the card's splits, found missing as they load, name the card)

    def before_fit(self) -> None:
        self.data_before_launch("fit")
        # `--ckpt_path last`: the newest last.ckpt of this logger's runs (each run has its own
        # version folder, so Lightning alone would look only in the new, empty one).
        config = self.config_init["fit"]
        if config.get("ckpt_path") == "best":  # Lightning's refusal names a callback's setting
            raise ValueError(
                "--ckpt_path best: gpt-ft fit resumes from `last` or a checkpoint's path (a best-*.ckpt's)."
            )
        if config.get("ckpt_path") == "last" and self.trainer.logger is not None:
            root = runs_root(self.trainer)
            given = [c.dirpath for c in self.trainer.checkpoint_callbacks if getattr(c, "dirpath", None)]
            task = getattr(self.datamodule, "task", None)  # a run of another task is not this one's
            found, newest = last_of_task(root, given, task.name if task else None)  # and a callback's folder
            if found is None:
                other = f" of task {task.name!r}" if task else " of a language model"
                other = f"{other} (the newest, {newest}, trained another)" if newest else ""
                said = f"no {root}/*/checkpoints/last.ckpt{other} to resume from: starting afresh"
            said = said if found is None else f"resuming from {found}"
            rank_zero_only(print)(said, flush=True)  # (DDP: by the first process)
            config.ckpt_path = self.config["fit"].ckpt_path = None if found is None else str(found)  # (saved)
        # checked, and the earlier rows kept, before the logger clears its folder
        no_earlier_checkpoints(self.trainer, config.get("ckpt_path"))
        earlier_logs(self.trainer, config.get("ckpt_path"))

    def data_before_launch(self, stage: str) -> None:
        """A run of several processes reads its task's files (encoded later) before Lightning starts
        the others from this one: a fault in them is said once, not by each; no process starts."""
        from gpt_ft.data.files import located_split  # (datasets: imported by the data module already)

        if stage != "fit":  # (before the logger's folder is made: it deletes a metrics.csv there)
            earlier_logs(self.trainer, None, stage)
        if self.trainer.world_size > 1 and hasattr(data := self.datamodule, "stage_splits"):  # (a task's)
            for split, _ in data.stage_splits(stage):
                located_split(data.task, split, data.data_dir)

    before_validate = partialmethod(data_before_launch, "validate")
    before_test = partialmethod(data_before_launch, "test")
    before_predict = partialmethod(data_before_launch, "predict")

    def instantiate_trainer(self, **kwargs: Any):
        logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(no_tips)  # (once)
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer_config = config.get("trainer", {})
        callbacks = run_callbacks(config, self.model, getattr(self, "data_config", None))
        kwargs["plugins"] = run_plugins(trainer_config.get("plugins"))
        return check_rendezvous(super().instantiate_trainer(**kwargs, callbacks=callbacks))


class ConfigurationOnly(GPTCLI):
    """`gpt-ft fit`'s arguments parsed into the configuration they resolve to, as plain data in
    `resolved`; nothing is seeded, checked against the machine or built."""

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        self.resolved = {k: v for k, v in plain_config(self.config.as_dict()).items() if k != "config"}
        if (model := self.resolved.get("model") or {}).get("overrides") and not model.get("init_from"):
            preset_config(model["preset"], model["overrides"])  # checked before any of a suite's runs trains
        self.config.seed_everything = False  # LightningCLI seeds next, unless the seed is False

    def before_instantiate_classes(self) -> None:
        pass  # a build's checks and its machine's choices (CPU precision) are no part of a configuration

    def instantiate_classes(self) -> None:
        pass


class SuiteRunCLI(GPTCLI):
    """`gpt-ft fit`'s LightningCLI as `gpt-ft suite` builds a run: `trainer.min_steps` is reached even
    where the epochs would end the run first (Lightning stops at `max_epochs`), the epochs raised to
    ceil(min_steps / optimizer steps per epoch): whole epochs, each ending in a validation."""

    def instantiate_trainer(self, **kwargs: Any):
        trainer, data = super().instantiate_trainer(**kwargs), self.datamodule
        min_steps, epochs = trainer.min_steps, trainer.max_epochs
        if min_steps and epochs is not None and epochs >= 0:  # each rank takes its share of the examples
            examples = math.ceil(len(data.encoded("train", labelled=True)) / trainer.world_size)
            steps = math.ceil(math.ceil(examples / data.batch_size) / trainer.accumulate_grad_batches)
            trainer.fit_loop.max_epochs = max(epochs, math.ceil(min_steps / steps))
        return trainer


class FitRuns:
    """How `gpt-ft suite` builds its runs: each as `gpt-ft fit ARGS` would, unrun."""

    def __init__(self) -> None:
        self._resolved: tuple[list[str], dict[str, Any]] | None = None

    def resolve(self, args: list[str]) -> dict[str, Any]:
        """The configuration `gpt-ft fit ARGS` resolves to: its sections, the defaults filled in."""
        resolved = lightning_main(args, run=False, cli=ConfigurationOnly).resolved
        self._resolved = (list(args), resolved)
        return resolved

    def __call__(self, args: list[str]) -> tuple[Any, Any, Any]:
        """Model, data module and trainer of `gpt-ft fit ARGS`, built but not run, from a copy of what
        `resolve` gave for them just before if it did (the build puts Namespaces in a callback's
        mapping, which a suite's result records); a `History` of validations, `min_steps` reached."""
        last, self._resolved = self._resolved, None
        config = last[1] if last is not None and last[0] == list(args) else self.resolve(args)
        cli = lightning_main(plain_config(config), run=False, cli=SuiteRunCLI, callbacks=[History()])
        return cli.model, cli.datamodule, cli.trainer


build_fit = FitRuns()


FINE_TUNING_EPOCHS = 3  # GPT-1's recipe


def _recipe_length(config) -> None:
    """Fine-tuning given no length (epochs, steps or time) runs the recipe's 3 epochs and says so,
    not Lightning's default of 1,000. Training in half-precision weights is said to lose updates."""
    trainer, data = config.trainer, config.get("data") or {}
    warn_half_weights(trainer.get("precision"))
    fine_tuning = "task" in (data.get("init_args") or {})  # TaskDataModule; pretraining has no task
    unset = trainer.get("max_steps") in (None, -1) and trainer.get("max_time") is None
    if fine_tuning and trainer.get("max_epochs") is None and unset:
        trainer.max_epochs = FINE_TUNING_EPOCHS
        rank_zero_info(
            f"no --trainer.max_epochs given: fine-tuning runs the recipe's {FINE_TUNING_EPOCHS} epochs"
        )


def tokenizer_of_the_weights(config, fitting: bool) -> None:
    """`--data.tokenizer`, where not given, is the one saved with `--model.init_from`'s weights; one
    given to a run that starts from a checkpoint is the one it was trained with (a run resumed or
    scored from a checkpoint is held to that checkpoint's own: `check_same_tokenizer`)."""
    init_from, data = config.model.get("init_from"), config.data.init_args
    if "tokenizer" not in data:
        if init_from and data.get("token_dir"):  # a language model's token files
            check_token_folder(data.token_dir, init_from)
        return
    if data.tokenizer is not None and init_from and fitting and not config.get("ckpt_path"):
        check_init_tokenizer(data.tokenizer, init_from)
    data.tokenizer = resolve_tokenizer(data.tokenizer, init_from, option=None)
    if data.tokenizer is None and init_from:  # (as `gpt-ft generate` says it)
        raise ValueError(f"{init_from} carries no tokenizer: give --data.tokenizer DIR.")


def lightning_main(
    args: list[str] | dict[str, Any] | None,
    *,
    run: bool = True,
    cli: type[GPTCLI] = GPTCLI,
    callbacks: list[Callback] | None = None,
    prog: str = "gpt-ft",
) -> GPTCLI:
    """The LightningCLI: runs `fit ...` etc.; with run=False, builds model, data and trainer from
    `fit`'s arguments or configuration (no subcommand) and returns them unrun (`gpt-ft suite`: `cli`
    one of its subclasses, `callbacks` given to the trainer beside its own)."""
    from lightning import LightningDataModule

    quiet_misleading_warnings()
    import gpt_ft.data.lm_data  # noqa: F401  (the data classes a config may name)
    import gpt_ft.data.task_data  # noqa: F401
    from gpt_ft.training.module import GPTModule

    return cli(
        GPTModule,
        LightningDataModule,
        subclass_mode_data=True,
        args=args,
        run=run,
        trainer_defaults={"logger": DEFAULT_LOGGER, "callbacks": callbacks or []},
        save_config_callback=LoggedSettings,
        save_config_kwargs={"overwrite": True},
        parser_class=ValidatedOnce,
        parser_kwargs={"prog": prog, "exit_on_error": False},
        # The optimizer and its schedule are the module's (--model.lr, --model.optimizer, ...):
        # LightningCLI's --optimizer and --lr_scheduler would replace both, weight decay groups,
        # warmup and the schedule's resume included.
        auto_configure_optimizers=False,
    )


def read_ahead(parser, args: list[str]):
    """`args` parsed unchecked, to find the checkpoint. Fields of the task card (`--data.task.loss
    x`) given with none but the checkpoint's have no card to change yet, and are refused as options
    of none: the checkpoint named (`--ckpt_path`, as argparse reads it) gives its own first."""
    import argparse

    try:
        return parse_unchecked(parser, args, or_with=LM_DATA)
    except argparse.ArgumentError:
        named = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        named.add_argument("--ckpt_path")
        ckpt = named.parse_known_args(args)[0].ckpt_path
        if ckpt in (None, "last") or not Path(ckpt).is_file():
            raise
        parser.set_defaults(recorded_configuration(ckpt))
        return parse_unchecked(parser, args, or_with=LM_DATA)
