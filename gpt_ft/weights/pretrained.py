"""Weights from disk or the hub, and the tokenizer that goes with them: the one place a name of
weights is resolved, and the public `GPT` (the model's, with weights in and out).

Anything that names weights (`GPT.from_pretrained`, `--model.init_from`, `Classifier`) takes a
gpt_ft checkpoint file (its format: `checkpoint.py`), a local transformers directory, a GGUF file
or a folder holding one (`gguf_file.py`), or a hub id (`ORG/NAME[@revision]`, see `hub.py`):
`locate` says which. The tokenizer saved with them (or carried in the GGUF file) is used unless one
is given. The readers (`hf.py`, `gguf_file.py`, `checkpoint.py`) return configs and tensors; the
models are built here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from gpt_ft.errors import FileProblem, absent
from gpt_ft.model import gpt as model
from gpt_ft.model.config import GPTConfig
from gpt_ft.model.lora import LoRA, add_lora, merge_lora
from gpt_ft.weights import gguf_file, gguf_tokenizer, hf, hub
from gpt_ft.weights.checkpoint import Checkpoint, weights_fingerprint
from gpt_ft.weights.state_checks import check_real_weights, check_sizes, load_state

# What makes a folder a tokenizer: any one of a `save_pretrained` output's files, or both files of
# a BPE as OpenAI published it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
BPE_FILES = ("vocab.json", "merges.txt")

Kind = Literal["checkpoint", "transformers", "gguf"]


class GPT(model.GPT):
    """`gpt_ft.model.GPT` with weights in and out: from a transformers model or any name of weights
    (`from_pretrained`), from a checkpoint already read, and to transformers (`to_hf`). A model
    loaded comes in eval mode (dropout off), as transformers' `from_pretrained` gives one: its
    logits are the weights' own; `.train()` before training it in a loop of one's own."""

    @classmethod
    def from_hf(cls, hf_model) -> GPT:
        """A GPT with the weights of a transformers OpenAIGPT*, GPT2*, Llama-family or GPTNeoX*
        model (LM-head or base)."""
        return build(*hf.from_hf(hf_model)).eval()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> GPT:
        """A GPT from a gpt_ft checkpoint, a transformers directory, a GGUF file or a hub id."""
        return load_gpt(path).eval()

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint | str | os.PathLike) -> GPT:
        """The GPT of a gpt_ft checkpoint (its file, or one already read: `Checkpoint.read`); LoRA
        adapters are loaded onto their base weights and merged."""
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = Checkpoint.read(checkpoint)
        return gpt_from_checkpoint(checkpoint).eval()

    def to_hf(self):
        """The matching transformers LM-head model (OpenAIGPTLMHeadModel, GPT2LMHeadModel or the
        family's *ForCausalLM), same weights."""
        return hf.to_hf(self)


def locate(name: str | os.PathLike) -> tuple[Kind, Path]:
    """What a name of weights is, and where: a `.ckpt` (or any other file) is a gpt_ft checkpoint,
    a `.gguf` file (or a folder holding one) GGUF, a folder a transformers directory; a hub id is
    its snapshot's folder."""
    given = Path(name).expanduser()
    path = given if given.is_file() or given.suffix == ".ckpt" else hub.local(name)
    gguf = gguf_file.find(path)
    if gguf is not None:
        return "gguf", gguf
    if path.is_dir():
        return "transformers", path
    if not path.is_file():
        what = {".ckpt": "Checkpoint ", ".gguf": "GGUF file "}.get(path.suffix, "Weights ")
        raise FileNotFoundError(f"{what}{path} {absent(path)}.")
    return "checkpoint", path


def load_gpt(name: str | os.PathLike, read: tuple[Path, ...] = ()) -> GPT:
    """A GPT from any name of weights (see `locate`; `read`: as `gpt_from_checkpoint` takes it)."""
    kind, path = locate(name)
    if kind == "gguf":
        return build(*gguf_file.read_weights(path), str(path))
    if kind == "transformers":
        return build(*hf.read_folder(path))
    return gpt_from_checkpoint(Checkpoint.read(path), read)


def _on_meta(config: GPTConfig, source: str) -> GPT:
    """A GPT of `config` on the meta device (no memory, no random draws: its weights are loaded
    next); a config whose tensors no memory holds (their sizes overflow torch's) is one sentence
    naming `source`."""
    try:
        with torch.device("meta"):
            return GPT(config)
    except (RuntimeError, TypeError) as exc:  # (torch's words, over a page of frames for a TypeError)
        if "overflow" not in str(exc).lower():
            raise
        raise FileProblem(
            f"{source}'s config describes tensors larger than any memory (past 2**63 bytes): the file was "
            "altered or is damaged."
        ) from None


def build(config: GPTConfig, state: dict[str, Tensor], source: str) -> GPT:
    """A GPT of `config` holding `state` (read from `source`, named in the error)."""
    check_sizes(vars(config), state, lambda field: f"{source}'s config ({field})", "its tensors")
    gpt = _on_meta(config, source)
    parameters = [name for name, _ in gpt.named_parameters()]
    check_real_weights(state, parameters, source, integers=True)
    floating = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
    state = {k: v if v.is_floating_point() else v.to(floating) for k, v in state.items()}  # as transformers
    fresh_head = not config.tie_embeddings and "lm_head.weight" not in state and "wte.weight" in state
    if (
        fresh_head
    ):  # a base model (LlamaModel, ...): a head made afresh, as transformers' *ForCausalLM makes it
        seeded = torch.Generator().manual_seed(0)
        head = torch.randn(state["wte.weight"].shape, generator=seeded, dtype=state["wte.weight"].dtype)
        state["lm_head.weight"] = head * config.initializer_range
    shape = f" ({config.n_layer} layers of width {config.n_embd})"
    load_state(gpt, state, source, described="the model its config describes", shape=shape, assign=True)
    # Transposed views from the conversion become contiguous tensors (faster matmuls, clean saves),
    # in float32 as GGUF files' are: a released bf16 or fp16 folder is trained and scored in fp32
    # (the precision setting computes in bf16 where asked) beside the fp32 heads.
    for module in gpt.modules():
        for name, p in module.named_parameters(recurse=False):
            p = p.detach().float() if p.is_floating_point() else p.detach()
            setattr(module, name, torch.nn.Parameter(p.contiguous()))
    gpt.fresh_lm_head = fresh_head
    return gpt


def refuse_fresh_head(gpt: GPT, source: str, use: str) -> None:
    """A model whose LM head was made afresh (`build`: weights of a base model) refused for `use`,
    which reads the head's next-token probabilities: they would be noise."""
    if getattr(gpt, "fresh_lm_head", False):
        raise ValueError(
            f"{source} holds a base model without an LM head (a head made afresh is noise): {use} reads "
            "next-token probabilities; give a causal language model's weights (*ForCausalLM)."
        )


def gpt_from_checkpoint(checkpoint: Checkpoint, read: tuple[Path, ...] = ()) -> GPT:
    """The GPT of a gpt_ft checkpoint already read; LoRA adapters are loaded onto their base
    weights and merged (`read`: the LoRA checkpoints whose bases led here, a loop refused).

    Its sizes are held against its tensors before the model is built (on the meta device: no
    weights drawn to be replaced, no random draws), and its tensors loaded whole, each a float."""
    fields, where = checkpoint.require_gpt_config(), checkpoint.where
    config = GPTConfig(**fields)
    adapters = checkpoint.adapters
    state = checkpoint.gpt_state
    if adapters is None:
        check_sizes(vars(config), state, lambda field: f"{where}'s gpt_config.{field}", "its tensors")
        gpt = _on_meta(config, where)
        check_real_weights(state, [name for name, _ in gpt.named_parameters()], where)
        dtype = torch.get_default_dtype()  # (as a model built on the CPU holds its weights: bf16 saves too)
        # copies: the read tensors map the file (rewritten in place, it would change the model) and
        # are the Checkpoint's (a second model from it would share the first's weights)
        state = {k: v.to(dtype, copy=True) if v.is_floating_point() else v.clone() for k, v in state.items()}
        load_state(gpt, state, where, described="the model its config describes", assign=True)
        return gpt
    read = (*read, checkpoint.path.resolve()) if checkpoint.path is not None else read
    base = Path(adapters.base).expanduser()
    if base.is_file() and base.resolve() in read:  # (a loop never reaches whole weights)
        which = (
            "the checkpoint itself" if base.resolve() == read[-1] else f"{base}, a checkpoint read before it"
        )
        raise FileProblem(
            f"{where} holds LoRA adapters whose base weights are {which}: a chain of LoRA bases that returns "
            "to a file already read never reaches whole weights (were they saved over?); the adapters load "
            "only onto the weights they were trained on."
        )
    new_rows = state.get("wte.new_rows")  # (the rows past the base's that the adapters trained)
    if new_rows is not None and config.vocab_size != adapters.new_tokens_from + len(new_rows):
        raise FileProblem(
            f"{where}'s gpt_config.vocab_size is {config.vocab_size}, but its tensors hold "
            f"{len(new_rows)} rows past the base's {adapters.new_tokens_from} (wte.new_rows): the config "
            "and the weights are not of one model (the file was altered or is damaged)."
        )
    try:
        gpt = load_gpt(adapters.base, read)
    except FileNotFoundError as exc:  # its own sentence named the base alone, not the checkpoint asked for
        raise FileNotFoundError(
            f"{checkpoint.where} holds LoRA adapters of base weights that cannot be read "
            f"({str(exc).rstrip('.')}): put them back at that path (`--model.lora.checkpoint merged` "
            "saves checkpoints that stand alone)."
        ) from None
    hub = not Path(adapters.base).is_absolute()  # a hub id: recorded with its commit since, as given before
    pin = adapters.base if "@" in adapters.base else f"{adapters.base}@COMMIT"
    at = f"the commit they were trained on: --model.init_from {pin} to fit, validate, test"
    remedy = f"{at} and predict" if hub else f"put them back at {adapters.base}"
    adapters.check_base(weights_fingerprint(gpt), checkpoint.where, remedy=remedy)
    if config.released_rows:  # a released table with unused rows, as `build_gpt` reads it
        gpt.config.released_rows, gpt.config.vocab_size = config.released_rows, config.vocab_size
    elif config.vocab_size > gpt.config.vocab_size:
        gpt.resize_token_embeddings(config.vocab_size)
    add_lora(gpt, LoRA(**adapters.settings), new_tokens_from=adapters.new_tokens_from)
    checkpoint.check_adapters_whole(gpt)
    check_real_weights(state, [name for name, _ in gpt.named_parameters()], where)
    load_state(gpt, state, where, described="the adapters its settings describe", strict=False)
    return merge_lora(gpt)


def is_tokenizer_dir(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer (see `TOKENIZER_FILES`, `BPE_FILES`)."""
    return any((directory / f).is_file() for f in TOKENIZER_FILES) or all(
        (directory / f).is_file() for f in BPE_FILES
    )


def weights_tokenizer(path: str | os.PathLike) -> str | None:
    """The tokenizer of these weights: saved beside a gpt_ft checkpoint, in a transformers
    directory or hub snapshot, or carried in a GGUF file."""
    kind, found = locate(path)
    if kind == "gguf":
        return str(found) if gguf_tokenizer.carries_tokenizer(found) else None
    if kind == "transformers":
        return str(found) if is_tokenizer_dir(found) else None
    recorded = Checkpoint.read(found).tokenizer  # (its tensors mapped, none read)
    return str(recorded) if recorded and recorded.is_dir() else None  # a copy not moved with the file: none


def resolve_tokenizer(
    tokenizer: str | None, weights: str | None, *, option: str | None = "--tokenizer"
) -> str | None:
    """The tokenizer to use: the one given, else the one saved with `weights`.

    When neither has one, the error names `option` (the argument that gives a tokenizer); with
    `option=None` the answer is then None and the caller decides.
    """
    if tokenizer is None and weights:
        tokenizer = weights_tokenizer(weights)
    if tokenizer is None and option is not None:
        carries = f"{weights} carries no tokenizer" if weights else "no tokenizer"
        if weights and str(weights).endswith(".ckpt"):
            carries += " (a checkpoint's is the tokenizer folder saved beside it)"
        raise ValueError(f"{carries}; give {option} DIR.")
    return tokenizer


SPECIAL_TOKEN_ROOM = 8  # start, delim, extract and pad (GPT-1 §3.3), with room to spare
# Released tables round their rows up to a multiple of 64, leaving rows no token uses: Qwen2.5
# 271 (151,936 for 151,665 tokens), Phi-3 53 (32,064), Pythia 27 (50,304).
RELEASED_PADDING = 1024


def check_tokenizer_fits(vocab_size: int, weights_vocab: int, init_from: str) -> None:
    """The tokenizer may add the few special tokens the weights lack, or have fewer tokens than a
    released table has rows (padded to a round number), nothing else."""
    released = weights_vocab % 64 == 0 and 0 < weights_vocab - vocab_size < RELEASED_PADDING
    if not (released or weights_vocab <= vocab_size <= weights_vocab + SPECIAL_TOKEN_ROOM):
        rows = " (a table has rows no token uses only as released: rounded up to a multiple of 64)"
        raise ValueError(
            f"The tokenizer has {vocab_size} tokens, GPT-1's framing tokens included, but the weights in "
            f"{init_from} have {weights_vocab}{rows * (weights_vocab > vocab_size)}: they were not made "
            "for each other; use the tokenizer saved with the weights."
        )
