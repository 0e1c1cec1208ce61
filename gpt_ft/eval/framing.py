"""What an export ships around the weights: the tokenizer with GPT-1's input transform in it, so that
any loader frames a text as training did (`[start] text [extract]`, `[start] premise [delim]
hypothesis [extract]`); the language model with the tokenizer's special ids; the head's weights."""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from gpt_ft.weights.hf import to_hf

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch import Tensor

    from gpt_ft.eval.classifier import Classifier


def framed_tokenizer(clf: Classifier, *, chat_template: bool = False):
    """`clf`'s tokenizer with GPT-1's input transform as its post-processor (a copy), and with
    `chat_template` its chat template (a reward model's prompts are rendered through it, as in
    training; a loader that applies one, as sentence-transformers does, would wrap every framed
    text in it again). A card that strips its texts (`strip_texts`) has each text stripped as the
    tokenizer's first normalizer. It pads on the right, where a row's score is read after its last
    real token.

    The copy is of transformers' generic fast class, which loads tokenizer.json as written: a
    built-in class (GPT-2's, Llama's, Gemma's, each derived from the generic one) would rebuild its
    normalizer from its vocabulary when loaded, the strip lost, and Llama's would pad on the left.
    """
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    tokenizer = copy.deepcopy(clf.tokenizer)
    if isinstance(tokenizer, PreTrainedTokenizerFast):  # its attributes are the generic class's
        tokenizer.__class__ = PreTrainedTokenizerFast
    if clf.task.strip_texts:  # SST-2's texts end in a space, which training never sees
        stripping(tokenizer.backend_tokenizer)
    s = clf.specials
    names = [tokenizer.convert_ids_to_tokens(i) for i in (s.start, s.delim, s.extract)]
    single, pair = clf.task.template(names)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=single, pair=pair, special_tokens=list(zip(names, (s.start, s.delim, s.extract)))
    )
    if not chat_template:  # and a text spelling a special token is text, as in training
        tokenizer.chat_template = None
        tokenizer.split_special_tokens = tokenizer.init_kwargs["split_special_tokens"] = True
    tokenizer.model_max_length = clf.max_length
    tokenizer.padding_side = tokenizer.init_kwargs["padding_side"] = "right"  # (saved as given)
    # Training keeps the start of each text (a reward model's prompt, its end: the exported one cuts
    # both texts on the left, as training does where the prompt alone is cut)
    side = "left" if clf.task.keeps_context_end else "right"
    tokenizer.truncation_side = tokenizer.init_kwargs["truncation_side"] = side
    return tokenizer


def framed_as_prompts(tokenizer) -> None:
    """A language model's tokenizer that frames a text as `gpt-ft generate` frames a prompt (with its
    beginning-of-text token where the tokenizer has one, never an end after): its own post-processor
    may add tokens pretraining never read there ([CLS] a [SEP], a closing </s>)."""
    from tokenizers.processors import TemplateProcessing

    from gpt_ft.data.pieces import text_start
    from gpt_ft.eval.generation import prompt_ids

    if tokenizer("a")["input_ids"] != prompt_ids(tokenizer, "a"):
        lead = text_start(tokenizer)
        names = tokenizer.convert_ids_to_tokens(lead)
        tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
            single=[*names, "$A"], pair=[*names, "$A", "$B:1"], special_tokens=list(zip(names, lead))
        )


def language_model(clf: Classifier):
    """`clf`'s GPT as transformers' LM-head model, its config with the tokenizer's special ids."""
    lm = to_hf(clf.gpt).float().cpu()
    lm.config.pad_token_id = clf.specials.pad
    lm.config.eos_token_id = clf.specials.eos  # the tokenizer's, not GPT-2's 50256
    bos = clf.tokenizer.bos_token_id  # (SmolLM2's <|im_start|>; GPT-2's is its end of text)
    lm.config.bos_token_id = clf.specials.eos if bos is None else bos
    lm.config.architectures = None
    return lm


@contextlib.contextmanager
def quiet_saves() -> Iterator[None]:
    """transformers' progress bars (`save_pretrained`'s "Writing model shards") off while within."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


def head_weights(clf: Classifier) -> tuple[Tensor, Tensor | None]:
    """The task head's weight and bias, divided by a calibrated classifier's temperature."""
    t, head = clf.temperature, clf.head
    return head.weight.detach() / t, head.bias.detach() / t if head.bias is not None else None


TOKENIZER_PARTS = ("normalizer", "pre_tokenizer", "model", "post_processor", "decoder", "added_tokens")


def loads_as_written(folder: Path, tokenizer) -> None:
    """Makes transformers' `AutoTokenizer` load the tokenizer saved in `folder` as `tokenizer` is.

    AutoTokenizer picks a class by the folder's model type, and some rebuild the normalizer and
    pre-tokenizer from the vocabulary whatever tokenizer.json holds (transformers 5 loads every
    qwen2 folder through Qwen2Tokenizer: a card's strip and a tokenizer's own pre-tokenizer lost,
    other ids for the same text). There the folder names a class of its own (`auto_map`,
    gpt_ft/eval/tokenization_framed.py, copied beside the files) that loads the file as written,
    with or without `trust_remote_code`. A folder that still loads otherwise is refused."""
    from transformers import AutoTokenizer

    from gpt_ft.eval import tokenization_framed

    wanted = json.loads(tokenizer.backend_tokenizer.to_str())

    def as_written(loaded) -> bool:
        parts = json.loads(loaded.backend_tokenizer.to_str())
        return all(parts.get(part) == wanted.get(part) for part in TOKENIZER_PARTS)

    if as_written(AutoTokenizer.from_pretrained(folder)):
        return
    shutil.copy(tokenization_framed.__file__, folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_framed.FramedTokenizer"]}
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if not as_written(served := AutoTokenizer.from_pretrained(folder)):
        raise ValueError(
            f"transformers' AutoTokenizer loads the tokenizer written to {folder} as "
            f"{type(served).__name__}, which tokenizes a text otherwise than the model was trained to: "
            "the folder would serve other tokens."
        )


# What Python's str.strip takes off (training strips so): Unicode's White_Space, which the `Strip`
# normalizer takes, and the four separators U+001C-U+001F, which it leaves.
_PYTHON_SPACE = (
    r"[\t-\r\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)


def stripping(backend) -> None:
    """`backend` (a `tokenizers.Tokenizer`) made to strip each text first, as training strips it.

    A SentencePiece-style pre-tokenizer (`Metaspace`: Llama 2's, Mistral's, Phi-3's) marks the
    text's start with its space symbol only where the text starts at its first character, which a
    stripped one with spaces before it no longer does: the mark is then put by a normalizer after
    the strip instead (as older tokenizer files did), where each text gets it.

    A tokenizer's added tokens (Gemma's newlines and runs of spaces, Qwen3's `<think>`; a chat
    template's special tokens, in a rendered chat) are taken from the raw text before any normalizer
    runs, so the strip would miss them at a text's ends and strip the text beside them within it.
    They are found in the stripped text instead (normalized), each whose spelling normalizes as it
    did, alone and within a text; where some are whitespace, a text of whitespace alone is left as
    it is (stripped, their spellings would be empty)."""
    from tokenizers import Regex
    from tokenizers.normalizers import Prepend, Replace, Sequence
    from tokenizers.pre_tokenizers import Metaspace

    spec, before = json.loads(backend.to_str()), backend.normalizer
    words = [t for t in spec["added_tokens"] if not t["normalized"]]
    space, text = _PYTHON_SPACE, f"[^{_PYTHON_SPACE[1:]}"  # (a character that is not whitespace)
    ends = rf"\A{space}+(?={text})|(?<={text}){space}+\z"  # whitespace before or after some text
    steps = [
        Replace(Regex(ends if any(t["content"].isspace() for t in words) else rf"\A{space}+|{space}+\z"), "")
    ]
    pre = backend.pre_tokenizer
    if isinstance(pre, Metaspace) and pre.prepend_scheme != "never":
        mark = pre.replacement  # (not before a text that starts with it: Metaspace's "first" does not)
        steps += [Prepend(mark), Replace(Regex(rf"\A{mark}{mark}"), mark)]
        pre.prepend_scheme = "never"
        backend.pre_tokenizer = pre
    backend.normalizer = after = Sequence([*steps, *([] if before is None else [before])])
    if words:
        was = before.normalize_str if before is not None else str
        for word in words:  # (a normalizer that marks a text's start, Llama 2's, would spell "</s>"
            c = word["content"]  # as "▁</s>", found only after a space: those keep their raw match)
            within = was(f"x{c}x") == f"{was('x')}{was(c)}{was('x')}"
            word["normalized"] = within and after.normalize_str(c) == was(c)
        whole = {**json.loads(backend.to_str()), "added_tokens": spec["added_tokens"]}
        backend.__setstate__(json.dumps(whole).encode())  # (in place: the tokenizer holding it sees it)
