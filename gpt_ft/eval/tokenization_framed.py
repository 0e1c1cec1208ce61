"""The tokenizer class an exported folder names where transformers would load its tokenizer.json
through a model type's own class instead (gpt_ft/eval/framing.py, `loads_as_written`): copied into
the folder, it loads the file as written, every part of it kept."""

from transformers import TokenizersBackend


class FramedTokenizer(TokenizersBackend):
    """transformers' generic tokenizer, under a name of the folder's own."""
