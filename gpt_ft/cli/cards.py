"""A card given later replaces an earlier one wholly: the one place the command line works around
a parser behaviour."""

from __future__ import annotations


def cards_replace_cards(args: list[str]) -> list[str]:
    """`args` with `--data.task=null` before each card given whole.

    jsonargparse keeps the earlier value's init_args that a newly given class also takes, by
    design (omni-us/jsonargparse#460, the maintainer's answer: "only what gets specified is
    changed"): an SST-2 config's `submission_labels` would reach a 3-label card given after it.
    A null just before each card leaves nothing to carry over, so the card on the command line is
    the whole card; `--data.task.init_args.FIELD VALUE` still changes one field of the card before it.
    """
    out = []
    for i, arg in enumerate(args):
        if arg.startswith("--data.task=") or (arg == "--data.task" and i + 1 < len(args)):
            out.append("--data.task=null")
        out.append(arg)
    return out
