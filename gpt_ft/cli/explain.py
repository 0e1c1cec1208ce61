"""`gpt-ft explain`: one example of a task split as the model sees it (tokens, ids, extract index,
label), from the very arguments and config files `gpt-ft fit` takes."""

from __future__ import annotations

from json import dumps
from typing import TYPE_CHECKING, Any

from jsonargparse import Namespace

from gpt_ft.cli.cards import cards_replace_cards
from gpt_ft.cli.commands import run
from gpt_ft.weights.pretrained import resolve_tokenizer

if TYPE_CHECKING:  # jsonargparse reads the annotation; the module loads when the command runs
    from gpt_ft.data.task_data import TaskDataModule


def run_explain(name: str, argv: list[str]) -> None:
    """`gpt-ft explain ARGV`, read as `gpt-ft fit` reads it: a card given later replaces an earlier
    one, the data module is TaskDataModule unless a class_path says otherwise, and the tokenizer
    defaults to the one saved with `--model.init_from`'s weights."""
    data = {"data": {"class_path": "gpt_ft.data.task_data.TaskDataModule"}}
    run(explain, name, cards_replace_cards(argv), defaults=data, settle=_tokenizer_of_the_weights)


def _tokenizer_of_the_weights(cfg: Namespace) -> None:
    """No null where a class takes none; `--data.tokenizer` from `--model.init_from` where not given."""
    from gpt_ft.cli.lightning import refuse_nulls

    refuse_nulls(cfg)
    model = cfg.model or {}
    init_from = model.get("init_from") or (model.get("init_args") or {}).get("init_from")
    cfg.data.init_args.tokenizer = resolve_tokenizer(cfg.data.init_args.tokenizer, init_from, option=None)


def explain(
    *,
    data: TaskDataModule,
    split: str = "train",
    index: int = 0,
    json: bool = False,
    model: dict[str, Any] | None = None,
    trainer: Any = None,
    optimizer: Any = None,
    lr_scheduler: Any = None,
    seed_everything: Any = None,
    ckpt_path: Any = None,
) -> None:
    """Print one example as the model sees it.

    Takes the very arguments and config files of `gpt-ft fit`; what it does not use is ignored.

    Args:
        data: The task's data: --data.task CARD, --data.tokenizer DIR, --data.data_dir DIR, ...
        split: Split name, e.g. train, validation.
        index: Example number within the split.
        json: Print JSON instead of text.
        model: A fit config's model; only init_from is read, for the tokenizer saved with the weights.
        trainer: A fit config's trainer (ignored).
        optimizer: A fit config's optimizer (ignored).
        lr_scheduler: A fit config's lr_scheduler (ignored).
        seed_everything: A fit config's seed (ignored).
        ckpt_path: A fit config's checkpoint (ignored).
    """
    shown = data.explain(split, index)
    if json:
        print(dumps(shown, ensure_ascii=False))
        return
    print(f"task {data.task.name}, split {split}, example {index}: label {shown['label']!r}")
    for i, seq in enumerate(shown["sequences"]):
        k = seq["extract_index"]
        print(f"sequence {i} ({len(seq['ids'])} tokens, extract at {k}):")
        print("  " + " ".join(seq["tokens"]))
        print("  " + " ".join(str(t) for t in seq["ids"]))
