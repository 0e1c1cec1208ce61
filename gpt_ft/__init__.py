"""gpt_ft: pretrain a from-scratch GPT and fine-tune it the way GPT-1 did."""

from importlib.metadata import version as _version

from gpt_ft.model import GPTConfig
from gpt_ft.weights.pretrained import GPT  # the model's, with weights in and out

__all__ = ["GPT", "GPTConfig", "Classifier", "Encoder"]
__version__ = _version("gpt_ft")  # pyproject.toml's, as installed


def __getattr__(name: str):
    # `Classifier` and `Encoder` bring Lightning and datasets with them: imported on first use only.
    if name == "Classifier":
        from gpt_ft.eval.classifier import Classifier

        return Classifier
    if name == "Encoder":
        from gpt_ft.eval.encoder import Encoder

        return Encoder
    raise AttributeError(f"module 'gpt_ft' has no attribute {name!r}")
