"""Every use of another library's private API, each behind one small named function.

Lightning, torch and datasets offer no public way to do a few things this toolkit needs. Each is
done here and only here, with a comment naming the upstream issue or pull request (or, where there
is none, the public API missing and the upstream source relied on) and what to do when upstream
changes. tests/test_workarounds.py fails when a behaviour relied on changes. Every layer uses this
module, the lowest included, so it imports no heavy library at import time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset
    from lightning.pytorch import LightningModule, Trainer
    from torch import nn
    from torch.optim import Optimizer

# Lightning --------------------------------------------------------------------------------------


def should_accumulate(trainer: Trainer) -> bool:
    """Whether the training batch under way only accumulates gradients (no optimizer step follows it).

    Lightning-AI/pytorch-lightning#11688 asks for a callback hook after the optimizer step; until
    there is one, a callback asks the training epoch loop (`TrainingEpochLoop._should_accumulate`,
    src/lightning/pytorch/loops/training_epoch_loop.py), which also knows that the epoch's last batch
    steps and that some strategies accumulate themselves. If it is renamed or removed, move to the
    hook where there is one; otherwise follow what the loop's `advance` now calls.
    """
    return trainer.fit_loop.epoch_loop._should_accumulate()


def loggers_write_this_step(trainer: Trainer) -> bool:
    """Whether the loggers write the values logged in the training step under way.

    Lightning decides it in `_LoggerConnector.should_update_logs` (every `log_every_n_steps` optimizer
    steps, counted by the epoch loop's `_batches_that_stepped`, or when the trainer should stop;
    src/lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py), on a private
    connector, and again after the step with the same answer (the count moves after it). No public
    API says it ahead. If the connector or the property changes, ask whatever `update_train_step_metrics`
    now asks; were it gone, compute `(trainer.global_step + 1) % trainer.log_every_n_steps == 0`.
    """
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


@contextmanager
def logging_as(module: LightningModule, hook: str) -> Iterator[None]:
    """`module.log` calls inside are recorded as made in `hook` (e.g. a training step's values logged
    from `on_train_batch_end`, once a callback's decision shows they will be read).

    `LightningModule.log` files a value under the hook running (`_current_fx_name`, which
    src/lightning/pytorch/trainer/call.py sets around each hook); the same name logged from two
    hooks would be two records, the stale one shadowing the fresh one. No public API logs on behalf
    of another hook. If the attribute is renamed, set whatever `call._call_lightning_module_hook`
    now sets; if logging ever takes the hook as an argument, pass it instead.
    """
    previous = module._current_fx_name
    module._current_fx_name = hook
    try:
        yield
    finally:
        module._current_fx_name = previous


def request_graceful_stop(trainer: Trainer) -> None:
    """Stop training as Lightning does on SIGTERM: after the batch under way, with `SIGTERMException`.

    No public API sets it: `Trainer.received_sigterm` (Lightning-AI/pytorch-lightning#16501) is a
    read-only property over the flag that Lightning's SIGTERM handler sets on the trainer's private
    signal connector (src/lightning/pytorch/trainer/connectors/signal_connector.py). The public
    `trainer.should_stop` ends `fit` normally instead: no `SIGTERMException` (so no exit code naming
    the signal) and not before `min_steps`/`min_epochs`. If the connector or its flag changes, set
    whatever the handler now sets; if Lightning adds a public request to stop, use it.
    """
    trainer._signal_connector.received_sigterm = True


def validation_follows(trainer: Trainer) -> bool:
    """Whether Lightning validates after the training batch just ended: its epoch loop's own test
    (private), asked in `on_train_batch_end`; False where that test is not there to ask."""
    try:
        loop = trainer.fit_loop.epoch_loop
        return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher)) and not loop._skip_next_val
    except (AttributeError, TypeError):
        return False


def clear_graceful_stop(trainer: Trainer) -> None:
    """Withdraw a stop requested by SIGTERM or `request_graceful_stop` (see there)."""
    trainer._signal_connector.received_sigterm = False


def judge_after_every_validation(trainer: Trainer) -> None:
    """`--trainer.val_check_interval 1` validates after every batch; the best checkpoint and early
    stopping then judge every validation, not only each epoch's last.

    ModelCheckpoint and EarlyStopping choose between judging at a training epoch's end and after each
    validation by testing `trainer.val_check_interval == 1.0`, which the int 1 passes too
    (src/lightning/pytorch/callbacks/model_checkpoint.py, `_should_save_on_train_epoch_end`;
    early_stopping.py, `setup`): a run validating after every batch kept the best of the epochs'
    ends alone. Their own arguments (`save_on_train_epoch_end`, `check_on_train_epoch_end`), where
    left unset, are set here before the callbacks' setup; a public setter does not exist. Once
    Lightning tells the int apart, drop this.
    """
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    if type(trainer.val_check_interval) is not int or trainer.val_check_interval != 1:
        return
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback._save_on_train_epoch_end is None:
            callback._save_on_train_epoch_end = False
        elif isinstance(callback, EarlyStopping) and callback._check_on_train_epoch_end is None:
            callback._check_on_train_epoch_end = False


def summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *columns: tuple[str, list[str]],
) -> str:
    """Lightning's model summary table of `columns` (each a name and its rows) with its totals.

    `ModelSummary.summarize`, the public hook to override, receives the columns but no public
    formatter: Lightning's own `summarize` calls the private `_format_summary_table`
    (src/lightning/pytorch/utilities/model_summary/model_summary.py); we found no upstream issue
    asking for a public one. If its signature changes, call it as `ModelSummary.summarize` then does
    (src/lightning/pytorch/callbacks/model_summary.py).
    """
    from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

    return _format_summary_table(
        total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
    )


class CheckpointHparamsAsDefaults:
    """LightningCLI mixin for a CLI whose `parse_arguments` already sets a checkpoint's recorded
    configuration as the parser's defaults: it turns off Lightning's own pass over `--ckpt_path`.

    LightningCLI applies a checkpoint's hyper-parameters over the command line's after parsing
    (`LightningCLI._parse_ckpt_path`, called from `__init__`; Lightning-AI/pytorch-lightning#20801).
    The fix, #21455 (open), makes them the parser's defaults, as the subclass does. Once a Lightning
    release has it and is the minimum, drop this mixin if the defaults Lightning sets agree with the
    subclass's; if the method is renamed before then, override the new name.
    """

    def _parse_ckpt_path(self) -> None:
        return


class ParsersBuiltOnce:
    """LightningCLI mixin: a process builds each kind of parser once (the CLI's class, the parser's
    arguments, the classes, their modes and defaults, the subcommands); each later CLI of that kind
    takes a deep copy (a few ms), so what a CLI changes on its parser stays its own. validate's and
    test's `verbose` default to false there, as their help then says (gpt_ft prints the metrics).

    LightningCLI builds its parser and one per subcommand anew at every CLI (`setup_parser`,
    src/lightning/pytorch/cli.py; about 60 ms, which `gpt-ft suite` pays two or three times a run);
    no public way gives a CLI a parser. `setup_parser` sets `PARSER_STATE` on the CLI; if it comes to
    set more, add them (tests/test_workarounds.py fails)."""

    PARSER_STATE = ("parser", "_subcommand_parsers", "_subcommand_method_arguments")
    _built: dict[str, dict] = {}

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        import copy

        defaults = {k: v for k, v in self.trainer_defaults.items() if k != "callbacks"}  # not the parser's
        kind = repr((type(self), add_subcommands, main_kwargs, subparser_kwargs, self.model_class,
                     self.datamodule_class, self.subclass_mode_model, self.subclass_mode_data,
                     self.trainer_class, defaults, self.seed_everything_default,
                     self.auto_configure_optimizers, add_subcommands and self.subcommands()))  # fmt: skip
        if kind not in self._built:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            self._built[kind] = {
                name: getattr(self, name) for name in self.PARSER_STATE if hasattr(self, name)
            }
        for name, value in copy.deepcopy(self._built[kind]).items():  # one copy: the references within kept
            setattr(self, name, value)
        parsers = getattr(self, "_subcommand_parsers", {})
        for name in {"validate", "test"} & parsers.keys():
            parsers[name].set_defaults(verbose=False)


# The keys LightningCLI adds to a module's saved hyper-parameters: `_instantiator` (how to create the
# module again, Lightning-AI/pytorch-lightning#18105) and `_class_path` (its class where the CLI
# picks one, src/lightning/pytorch/cli.py); they are not the module's arguments. #20777 (open) adds
# a public switch to leave them out: once released, use it; if the keys are renamed, rename them here.
CLI_HPARAMS: tuple[str, ...] = ("_instantiator", "_class_path")


# torch ------------------------------------------------------------------------------------------


def decline_step_unscaling(optimizer: Optimizer) -> None:
    """Have a GradScaler unscale `optimizer`'s gradients before its step, as for any optimizer, even
    where the step (a fused kernel) offers to unscale them itself.

    The flag is torch's contract between `GradScaler.step` and an optimizer
    (torch/amp/grad_scaler.py), with no public setter; Lightning reads it to refuse gradient clipping
    under 16-mixed (Lightning-AI/pytorch-lightning#15555, and #21435 for fused AdamW). If torch
    renames it, set the new name; if Lightning clips after unscaling such optimizers, drop this.
    """
    optimizer._step_supports_amp_scaling = False


def is_compiled(module: nn.Module) -> bool:
    """Whether `module.compile()` (torch.compile in place) has been called on `module`.

    `Module.compile` keeps the compiled call in `Module._compiled_call_impl`
    (torch/nn/modules/module.py) and says so nowhere public; pytorch/pytorch#103553 asked for such a
    flag. If the attribute goes, record it ourselves where `compile` is called.
    """
    return getattr(module, "_compiled_call_impl", None) is not None


def mkldnn_bf16_supported() -> bool:
    """Whether oneDNN has bf16 matrix instructions on this CPU (AVX-512 BF16 or AMX).

    torch has no public check for the CPU (`torch.cuda.is_bf16_supported` is for GPUs); its own
    inductor and tests call the private op `torch.ops.mkldnn._is_mkldnn_bf16_supported`, registered
    in aten/src/ATen/native/mkldnn/RegisterMkldnnOpContextClass.cpp. Where it is missing (renamed, or
    a build without oneDNN) the answer is False, and bf16 falls back to fp32: safe. Use a public
    check when torch adds one.
    """
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def torchao_import_loggers() -> list[logging.Logger]:
    """The loggers torchao's import writes to about parts no command uses: torchao's own (CUDA
    kernels a CPU-only torch cannot load) and that of torch's private pytree module, which warns
    that torchao registers Enum subclasses as pytree constants (pytorch/ao#4848; the fix, pytorch/ao#4849,
    is open). Once a torchao with the fix is the minimum, drop the pytree logger; if torch moves the
    module, follow its new name (the warning's log line names the file).
    """
    return [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]


def flash_varlen_forward(q, k, v, cu_seqlens, max_seqlen: int, dropout_p: float, scale, left: int):
    """FlashAttention-2's variable-length causal forward with attention dropout: (out, logsumexp,
    rng_state, unused). `torch.nn.attention.varlen.varlen_attn` hardcodes a rate of 0
    (pytorch/pytorch#179382; the pull request adding `dropout_p`, #179390, closed unmerged), so
    the aten op it wraps (`_flash_attention_forward`, as SDPA's flash path calls it) is called
    directly. When `varlen_attn` takes a rate, use it and drop this pair."""
    import torch

    out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, True, False,
        scale=scale, window_size_left=left, window_size_right=0,
    )  # fmt: skip
    return out, lse, rng, unused


def flash_varlen_backward(grad, q, k, v, out, lse, cu_seqlens, max_seqlen: int, dropout_p: float, rng, unused,
                          scale, left: int):  # fmt: skip
    """The backward of `flash_varlen_forward` (aten's `_flash_attention_backward`): (dq, dk, dv),
    the forward's dropout mask redrawn from its `rng` state."""
    import torch

    return torch.ops.aten._flash_attention_backward(
        grad, q, k, v, out, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, True, rng,
        unused, scale=scale, window_size_left=left, window_size_right=0,
    )  # fmt: skip


def cpu_flash_forward(q, k, v, scale):
    """SDPA's CPU flash kernel, causal, on queries (1, nh, n, hs) and keys/values (1, nkv, n, hs),
    nh a multiple of nkv: (out, logsumexp (1, nh, n), fp32 or fp64). SDPA returns no logsumexp and
    has no public backward, and running it under autograd on each sequence of a flat row costs a
    zeroed row-sized gradient per sequence (its slice's backward); so the aten op SDPA's CPU flash
    path calls (`_scaled_dot_product_flash_attention_for_cpu`) is called directly. Should it be
    renamed, follow what `scaled_dot_product_attention` calls on a CPU; if it goes, the dense mask
    remains (`PackedRows`)."""
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)


def cpu_flash_backward(grad, q, k, v, out, lse, scale):
    """The backward of `cpu_flash_forward` (aten's `..._for_cpu_backward`): (dq, dk, dv)."""
    import torch

    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return op(grad, q, k, v, out, lse, 0.0, True, scale=scale)


# datasets ---------------------------------------------------------------------------------------


def dataset_fingerprint(dataset: Dataset) -> str:
    """datasets' fingerprint of `dataset`: a hash of its source and of every transform since, the key
    of its cache.

    datasets keeps it in `Dataset._fingerprint` with no public accessor; its own documentation of
    fingerprints reads that attribute (huggingface/datasets#1703). If it goes, hash what the rows
    come from ourselves (the files' paths, sizes and modification times).
    """
    return dataset._fingerprint


@contextmanager
def no_download_count() -> Iterator[None]:
    """datasets' loading of local files, without the request that counts a download.

    `datasets.load_dataset("csv", data_files=...)` first sends a HEAD request to the Hub to count a
    download of the packaged builder (`datasets.load.increase_load_count`, a 3 s timeout). On a
    machine without a network it waits on DNS instead: about 5 s, once per process, before a local
    file is read. A local file is no download, so the count is switched off for the call, through
    the module-level switch that datasets' own `HF_UPDATE_DOWNLOAD_COUNTS` environment variable
    sets (`datasets.config.HF_UPDATE_DOWNLOAD_COUNTS`, read at each call). If datasets moves or
    renames it, the request costs time again but nothing breaks.
    """
    import datasets

    saved = datasets.config.HF_UPDATE_DOWNLOAD_COUNTS
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = saved


# jsonargparse -----------------------------------------------------------------------------------


def config_file_being_read(text: str) -> str | None:
    """The config file (as named, where that is relative to here) whose whole text jsonargparse is
    loading as `text`, if it is loading one: a sub-config file (a card given as a path), a `--config`.

    jsonargparse keeps the files it is reading on a private context stack (`_util.config_load_stack`,
    for its loop check), and calls the loader with the text alone; it has no public way to ask. If the
    stack is renamed or changes shape, this answers None and a file's problem is named by the parser
    (without its line) instead."""
    from pathlib import Path

    try:
        from jsonargparse._util import config_load_stack

        real, shown = config_load_stack.get()[-1]
        # The loader sees every value parsed while a file is open (hundreds a parse): the file's
        # size rules most out without reading it.
        if (
            Path(real).stat().st_size != len(text.encode("utf-8"))
            or Path(real).read_text(encoding="utf-8") != text
        ):
            return None
        return shown if Path(shown).resolve() == Path(real) else real  # as named, where that is here
    except (ImportError, LookupError, IndexError, ValueError, TypeError, OSError):
        return None


def file_not_decoded(exc: BaseException) -> str | None:
    """The file jsonargparse was reading (a `--config` file, or a task card given as a path) when
    `exc` or an exception it was raised from met text that is not UTF-8: the UnicodeDecodeError names
    none. Read off its traceback, from the innermost frame that holds a `jsonargparse.Path` (its
    reader's `self`); if jsonargparse comes to name the file itself, drop this. None elsewhere."""
    import jsonargparse

    while exc is not None and not isinstance(exc, UnicodeDecodeError):
        exc = exc.__cause__ or exc.__context__
    tb, found = exc.__traceback__ if exc is not None else None, None
    while tb is not None:
        held = [v for v in tb.tb_frame.f_locals.values() if isinstance(v, jsonargparse.Path)]
        found, tb = str(held[-1]) if held else found, tb.tb_next
    return found


def parse_unchecked(parser, args: list[str]):
    """`args` parsed unchecked and unprinted (`--print_config` waits for the full parse): to read one
    option ahead. jsonargparse's `_skip_validation` and `_ActionPrintConfig` are private (its parse_env
    and dump use them); if they go, drop the keyword, catch the parse's error, let it print."""
    from jsonargparse._actions import _ActionPrintConfig

    with _ActionPrintConfig.skip_print_config():
        return parser.parse_args(args, _skip_validation=True)


def print_config_asked(parser) -> bool:
    """Whether `parse_unchecked` met `--print_config`; the request jsonargparse keeps on the parser is
    taken off (the full parse would print at its first `--config` file, that file's values alone)."""
    return vars(parser).pop("print_config", ...) is not ...  # (its value may be None)


def required_arguments(parser) -> tuple[str, ...]:
    """The destinations a jsonargparse parser requires, from argparse's private `_actions` (no public
    accessor; `get_defaults` lists them with None too). If it goes, read the class's signature."""
    return tuple(a.dest for a in parser._actions if a.required)
