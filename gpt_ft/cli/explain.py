"""`gpt-ft explain`: one example of a task split as the model sees it (tokens, ids, extract index,
label), from `gpt-ft fit`'s own parser: every argument and config file fit takes, `--model.init_from`
included, and four of its own (`--ckpt_path`: a checkpoint's recorded data). Only the data module is built."""

from __future__ import annotations

import sys
from contextlib import redirect_stdout
from json import dumps
from typing import Any

from gpt_ft.errors import CardError, check_context
from gpt_ft.training.config_checks import card_named, refuse_bad_config
from gpt_ft.training.recorded import recorded_configuration
from gpt_ft.training.run_folders import checkpoint_to_read
from gpt_ft.training.runs import GPTCLI, lightning_main, tokenizer_of_the_weights
from gpt_ft.workarounds.cli import parse_unchecked, print_config_asked


class ExplainCLI(GPTCLI):
    """`gpt-ft fit`'s LightningCLI, unrun, with `--split`, `--index` and `--json`; it prints one
    example of the data module the arguments build."""

    def init_parser(self, **kwargs: Any):
        parser = super().init_parser(**kwargs)
        parser.description = "Print one example of a task split as the model sees it."
        return parser

    def add_arguments_to_parser(self, parser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--split", type=str, default="train", help="Split name, e.g. train, validation.")
        parser.add_argument("--index", type=int, default=0, help="Example number within the split.")
        parser.add_argument("--json", type=bool, default=False, help="Print JSON instead of text.")
        parser.add_argument(
            "--ckpt_path", type=str | None, default=None,
            help="A checkpoint of gpt-ft fit: its task card, data and tokenizer as the defaults.",
        )  # fmt: skip
        parser.add_argument(  # (a config fit wrote or printed holds it)
            "--weights_only", type=bool | None, default=None, help="As fit's; explain reads no weights."
        )

    def parse_arguments(self, parser, args) -> None:
        unchecked = parse_unchecked(parser, args)
        with redirect_stdout(sys.stderr):  # the line naming a `last` found; stdout is the example's
            ckpt = checkpoint_to_read(
                unchecked.trainer, "explain", unchecked.get("ckpt_path"), print_config_asked(parser)
            )
        if ckpt:  # as validate reads one: what the run recorded, every argument given still winning
            parser.set_defaults(recorded_configuration(ckpt, unchecked))
        self.ckpt = ckpt
        super().parse_arguments(parser, args)

    def before_instantiate_classes(self) -> None:
        refuse_bad_config(self.config, self.model_class)
        tokenizer_of_the_weights(self.config, fitting=True)  # what fit would read, refused as fit would

    def instantiate_classes(self) -> None:
        """The data module alone: the model and the trainer are not built. Sequences longer than the
        context of the checkpoint's model, or of the one a preset would build, are refused as fit
        refuses them (weights to start from are not read for theirs)."""
        with card_named(self.config):
            self.datamodule = self.parser.instantiate(self.config, instantiate_groups=False).data
        if self.ckpt or not (model := self.config.model).get("init_from"):
            from gpt_ft.model import GPTConfig
            from gpt_ft.weights.checkpoint import Checkpoint

            read = self.ckpt and Checkpoint.read(self.ckpt).require_gpt_config()
            config = read or vars(GPTConfig.from_name(model.preset, **(model.overrides or {})))
            check_context(self.datamodule, config["n_positions"])


def run_explain(name: str, argv: list[str]) -> None:
    """`gpt-ft explain ARGV`."""
    cli = lightning_main(argv, run=False, cli=ExplainCLI, prog=f"gpt-ft {name}")
    split, index = cli.config.split, cli.config.index
    if not hasattr(cli.datamodule, "explain"):
        raise ValueError(
            "gpt-ft explain shows a task's examples (--data.task CARD); a language model's token files "
            "are one stream of tokens, with none."
        )
    try:
        with card_named(cli.config):  # a split the card lacks: --split's fault, named with the card's file
            shown: dict[str, Any] = cli.datamodule.explain(split, index)
    except CardError as exc:
        raise CardError(f"--split {split}: {exc}") if f"split {split!r};" in str(exc) else exc from None
    if cli.config.json:
        print(dumps(shown, ensure_ascii=False, allow_nan=False))
        return
    cut = f" (cut to max_length {cli.datamodule.max_length})" if shown["cut"] else ""
    print(f"task {cli.datamodule.task.name}, split {split}, example {index}: label {shown['label']!r}{cut}")
    for i, seq in enumerate(shown["sequences"]):  # an embedding card's pooling may read no extract token
        k = seq["extract_index"]
        read = {"last": f"read at {k}", "mean": "their mean read"}.get(shown["pooling"], f"extract at {k}")
        print(f"sequence {i} ({len(seq['ids'])} tokens, {read}):")
        print(f"  {seq['text']}\n  " + " ".join(seq["tokens"]))
        print("  " + " ".join(str(t) for t in seq["ids"]))
