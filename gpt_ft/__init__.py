"""gpt_ft: pretrain a from-scratch GPT and fine-tune it the way GPT-1 did."""

from importlib import import_module
from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpt_ft.eval.classifier import Classifier
    from gpt_ft.eval.encoder import Encoder
    from gpt_ft.model import GPTConfig
    from gpt_ft.weights.pretrained import GPT

__all__ = ["GPT", "GPTConfig", "Classifier", "Encoder"]
try:
    __version__ = _version("gpt_ft")  # pyproject.toml's, as installed
except _NotInstalled:  # a source tree on the path, not installed: it still imports
    __version__ = "0+unknown"

# Each public name is imported on first use: torch for the model, and Lightning and datasets with
# `Classifier` and `Encoder`; `gpt-ft --help` and `--version` need none of them.
_HOMES = {
    "GPT": "gpt_ft.weights.pretrained",  # the model's, with weights in and out
    "GPTConfig": "gpt_ft.model",
    "Classifier": "gpt_ft.eval.classifier",
    "Encoder": "gpt_ft.eval.encoder",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'gpt_ft' has no attribute {name!r}")


def __dir__() -> list[str]:  # the public names too, not yet imported (tab completion)
    return sorted({*globals(), *__all__})
