"""gpt_ft: pretrain a from-scratch GPT and fine-tune it the way GPT-1 did."""

from importlib.metadata import version as _version

from gpt_ft.model import GPTConfig
from gpt_ft.weights.pretrained import GPT  # the model's, with weights in and out

__all__ = ["GPT", "GPTConfig", "Classifier"]
__version__ = _version("gpt_ft")  # pyproject.toml's, as installed


def __getattr__(name: str):
    # `Classifier` brings Lightning and datasets with it: imported on first use only.
    if name == "Classifier":
        from gpt_ft.eval.classifier import Classifier

        return Classifier
    raise AttributeError(f"module 'gpt_ft' has no attribute {name!r}")
