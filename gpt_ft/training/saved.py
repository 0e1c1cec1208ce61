"""What a run's checkpoint holds beyond the model, and the GPT a run starts from.

A `GPTModule` checkpoint is Lightning's, with gpt_ft's entries added through
`gpt_ft.weights.checkpoint.Checkpoint` (the format's one home): the module's GPT is its attribute
`gpt`, so its tensors are the "gpt." ones and the file is also a checkpoint the model layer reads
with no run's arguments. `build_gpt` makes the GPT a run starts from; a LoRA run's checkpoints
hold its trained weights and the base weights' name (or the merged model); `recorded_run` reads
the arguments it records."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from gpt_ft.errors import FileProblem
from gpt_ft.model.config import GPTConfig, preset_config
from gpt_ft.model.gpt import with_dropout
from gpt_ft.model.lora import LoRA, add_lora, merged_state_dict
from gpt_ft.weights.checkpoint import GPT_PREFIX, Adapters, Checkpoint, weights_fingerprint
from gpt_ft.weights.hf_llama import is_llama_style
from gpt_ft.weights.hub import pinned
from gpt_ft.weights.pretrained import GPT, SPECIAL_TOKEN_ROOM, check_tokenizer_fits
from gpt_ft.weights.state_checks import check_real_weights, check_shapes


def build_gpt(
    *,
    preset: str,
    overrides: dict[str, Any] | None,
    init_from: str | None,
    transfer_layers: int | None,
    vocab_size: int | None,
    tokenizer: str | None = None,
    lora: LoRA | None = None,
    new_token_ids: list[int] | None = None,
    new_tokens: Literal["random", "copied", "mean"] | None = None,
    own_tokens: dict[int, int] | None = None,
    lm_alone: bool = False,
) -> GPT:
    """The GPT a run starts from: loaded weights (only dropouts may change, the first
    `transfer_layers` blocks kept) or a fresh preset, grown to fit the tokenizer's special tokens;
    with `lora`, the loaded weights frozen and adapters added (only the new tokens' rows train).

    Released weights may have more rows than their tokenizer has tokens: GPT-1's special tokens
    (`new_token_ids`) then take unused rows, re-initialised as new tokens are, and the table keeps
    its released size. The framing tokens' rows start random (GPT-1 §3.3), copied from the
    tokenizer's own tokens in those roles (`own_tokens`: {row: source}), or at the mean of the
    loaded rows (`mean`); `new_tokens=None` copies for the Llama family's weights only. The
    `tokenizer`'s size is the vocabulary's where `vocab_size` is not given. A language model alone
    (`lm_alone`, no task) predicts the text's tokens: gpt_ft's framing and padding tokens, appended
    after them and in no text, take no share of its next-token probabilities (`GPT.lm_rows`; as
    copies of the tokens they start from, they took half of those tokens', and a checkpoint scored
    again takes the same rows)."""
    if new_tokens not in (None, "random", "copied", "mean"):  # (the command line's parser refuses it)
        raise ValueError(f"new_tokens must be one of random, copied, mean, got {new_tokens!r}.")
    if vocab_size is None and tokenizer is not None:  # (linked from the data by the CLI; from Python:)
        from gpt_ft.data.tokenizer import load_tokenizer

        vocab_size = len(load_tokenizer(tokenizer))  # its rows, special tokens added, as the data counts
    if init_from:
        GPTConfig.check_fields(overrides or {}, "in --model.overrides")  # (before the weights load)
        if lora is not None and Path(init_from).is_absolute() and not Path(init_from).exists():
            raise FileNotFoundError(  # a LoRA checkpoint names its base weights by where they were
                f"The base weights {init_from} do not exist: LoRA adapters need them (a LoRA checkpoint "
                "names them by their path); give their place with --model.init_from."
            )
        gpt = GPT.from_pretrained(init_from).train()  # loaded in eval mode; Lightning leaves modes as found
        if lora is not None:  # recorded with the adapters: the base they adapt, as loaded
            gpt.base_fingerprint, gpt.base_loaded = weights_fingerprint(gpt), str(init_from)
        if overrides:
            for key, value in overrides.items():
                if key.endswith("pdrop"):
                    setattr(gpt.config, key, value)
                elif getattr(gpt.config, key, None) != value:
                    raise ValueError(
                        f"overrides.{key} cannot change a loaded model (it has {key}="
                        f"{getattr(gpt.config, key, None)}); only dropouts can."
                    )
            gpt = with_dropout(gpt)
        if transfer_layers is not None:
            if lora is not None:  # LoRA would freeze the fresh blocks, and its checkpoint not hold them
                raise ValueError(
                    "--model.transfer_layers starts blocks afresh, which --model.lora would freeze "
                    "untrained: fine-tune every weight (no lora) to transfer only some layers."
                )
            gpt.reset_blocks(transfer_layers)
    else:
        if transfer_layers is not None:
            raise ValueError("transfer_layers needs pretrained weights: give --model.init_from.")
        gpt = GPT(
            preset_config(preset, overrides, **({} if vocab_size is None else {"vocab_size": vocab_size}))
        )
    drawn: set[int] = set()  # the rows this call starts: the special tokens the weights lack
    if init_from and vocab_size is not None:
        check_tokenizer_fits(vocab_size, gpt.config.vocab_size, init_from)
        if vocab_size < gpt.config.vocab_size:  # a released table with unused rows (checked above)
            gpt.config.released_rows = gpt.config.vocab_size
            gpt.config.vocab_size = vocab_size
        inside = [i for i in new_token_ids or [] if i < gpt.config.vocab_size]  # unused rows a token takes
        reinitialise_rows(gpt, inside)
        drawn.update(inside)

    loaded_vocab = min([gpt.config.vocab_size, *(new_token_ids or [])])  # LoRA trains the new tokens' rows
    if vocab_size is not None and vocab_size > gpt.config.vocab_size:
        drawn.update(range(gpt.config.vocab_size, vocab_size))
        gpt.resize_token_embeddings(vocab_size)  # the special tokens the weights lack (GPT-1 §3.3)
    if new_tokens is None:
        new_tokens = "copied" if is_llama_style(gpt.config) else "random"
    if init_from and new_tokens == "copied":  # only rows drawn here: the weights' own stay as trained
        own_tokens = framing_copies(tokenizer) if own_tokens is None else own_tokens
        copy_token_rows(gpt, {row: source for row, source in own_tokens.items() if row in drawn})
    if init_from and new_tokens == "mean":
        mean_token_rows(gpt, sorted(drawn))
    if lm_alone and tokenizer is not None:
        from gpt_ft.data.tokenizer import SPECIAL_TOKENS, load_tokenizer

        vocab = load_tokenizer(tokenizer).get_vocab()
        ours = sorted(vocab[token] for token in SPECIAL_TOKENS.values() if token in vocab)
        if ours and ours == list(range(ours[0], gpt.config.vocab_size)):  # (the vocabulary's last rows)
            gpt.lm_rows = ours[0]
    if lora is not None:
        if not init_from:
            raise ValueError("lora adapts pretrained weights: give --model.init_from.")
        add_lora(gpt, lora, new_tokens_from=loaded_vocab)
    return gpt


def framing_copies(tokenizer: str | None) -> dict[int, int]:
    """GPT-1's framing tokens by id, each with the id of the tokenizer's own token in that role."""
    if tokenizer is None:
        return {}
    from gpt_ft.data.tokenizer import load_tokenizer, own_framing_rows

    return own_framing_rows(load_tokenizer(tokenizer))


def reinitialise_rows(gpt: GPT, ids: list[int]) -> None:
    """Rows `ids` of the token embedding (and an untied head) drawn anew, N(0, initializer_range)."""
    with torch.no_grad():
        for table in (gpt.wte, gpt.lm_head):
            if table is not None and ids:
                rows = table.weight[ids]
                table.weight[ids] = rows.normal_(0.0, gpt.config.initializer_range)


def copy_token_rows(gpt: GPT, copies: dict[int, int]) -> None:
    """Rows of the token embedding (and an untied head) set to copies of others: `{row: source}`."""
    with torch.no_grad():
        for table in (gpt.wte, gpt.lm_head):
            if table is not None and copies:
                table.weight[list(copies)] = table.weight[list(copies.values())].clone()


def mean_token_rows(gpt: GPT, rows: list[int]) -> None:
    """Rows of the token embedding (and an untied head) set to the mean of the vocabulary's other
    rows (not the table's padding), the average input a new token starts from (Hewitt 2021)."""
    with torch.no_grad():
        for table in (gpt.wte, gpt.lm_head):
            if table is not None and rows:
                keep = torch.zeros(len(table.weight), dtype=torch.bool, device=table.weight.device)
                keep[: gpt.config.vocab_size] = True
                keep[rows] = False
                table.weight[rows] = table.weight[keep].double().mean(dim=0).to(table.weight.dtype)


def not_its_tokenizer(tokenizer, where, saved, option: str, given: dict, own: dict, why=None) -> str:
    """The refusal of a tokenizer that is not the one `where` was trained with, given by `option`
    (`--data.token_dir`: token files', whose tokens are the fault), naming the first token that
    differs between the vocabularies `given` and `own` (the saved one's), or `why`."""
    why = why or vocabulary_difference(given, own)
    if option == "--data.token_dir":
        return (
            f"--data.token_dir {Path(tokenizer).parent} was prepared with another tokenizer than {where} "
            f"was trained with ({why}): its tokens stand for other text. "
            f"Prepare the corpus again with --tokenizer {saved}."
        )
    return (
        f"{option} {tokenizer} is not the tokenizer {where} was trained with ({why}). Give the one it "
        f"was trained with (a copy is saved in {saved})."
    )


def reading_difference(given, own, parts=("normalizer", "pre_tokenizer")) -> str | None:
    """The first of `parts` of the fast tokenizers `given` and `own` (their tokenizer.json) that
    differs, as `not_its_tokenizer` says it (a lowercasing normalizer dropped: the same vocabulary
    reads text as other ids); None where they agree, or either is no fast tokenizer."""
    import json

    if not (hasattr(given, "backend_tokenizer") and hasattr(own, "backend_tokenizer")):
        return None
    given, own = (json.loads(t.backend_tokenizer.to_str()) for t in (given, own))
    part = next((p for p in parts if given.get(p) != own.get(p)), None)
    return part and f"its {part.replace('_', '-')} is another: the same text becomes other tokens"


def vocabulary_difference(given: dict, own: dict) -> str:
    """The first token (by id) that moved, then that `given` adds, then that it lacks, said of the
    given tokenizer against the saved one."""
    moved = sorted((i, token) for token, i in own.items() if given.get(token, i) != i)
    if moved:
        i, token = moved[0]
        return (
            f"its {token!r} is token {given[token]}, the saved one's {i}: the same text becomes other tokens"
        )
    added = sorted((i, token) for token, i in given.items() if token not in own)
    if added:
        return f"it holds {added[0][1]!r} (token {added[0][0]}), which the saved one does not"
    lacking = sorted((i, token) for token, i in own.items() if token not in given)
    return f"it lacks the saved one's {lacking[0][1]!r} (token {lacking[0][0]})" if lacking else "same tokens"


def check_init_tokenizer(tokenizer: str, init_from: str, option: str = "--data.tokenizer") -> None:
    """A tokenizer given to a run that starts from a gpt_ft checkpoint keeps each token of the one
    saved with it at its id: one of the same size but other tokens would read every text as other
    ids without a word. It may add a few tokens, and gpt_ft's framing tokens may move (they come
    after tokens a user added); one that lacks a token (the end of text `prepare` added to the
    tokenizer it was given, saved with the weights) is refused, naming the token.
    Released weights' tokenizers (transformers folders, GGUF files) are not compared."""
    from gpt_ft.weights.pretrained import locate, weights_tokenizer

    try:
        saved = weights_tokenizer(init_from) if locate(init_from)[0] == "checkpoint" else None
    except (OSError, ValueError):  # weights that cannot be read: build_gpt says why
        return
    if saved is None or Path(tokenizer).expanduser().resolve() == Path(saved).resolve():
        return
    from gpt_ft.data.tokenizer import SPECIAL_TOKENS, load_tokenizer

    framing = set(SPECIAL_TOKENS.values())
    theirs, ours = (load_tokenizer(t, add_specials=False) for t in (tokenizer, saved))
    given, own = ({k: i for k, i in t.get_vocab().items() if k not in framing} for t in (theirs, ours))
    moved = any(given.get(token, i) != i for token, i in own.items())
    why = not moved and reading_difference(theirs, ours)
    if moved or len(set(given) - set(own)) > SPECIAL_TOKEN_ROOM or set(own) - set(given) or why:
        raise ValueError(not_its_tokenizer(tokenizer, init_from, saved, option, given, own, why))


def base_reference(init_from: str) -> str:
    """How a LoRA checkpoint names its base weights: an absolute path, or the hub id with the commit
    its weights came from (a repository updated since would load others)."""
    local = Path(init_from).expanduser()
    return str(local.resolve()) if local.exists() else pinned(init_from)


def lora_checkpoint(checkpoint: Checkpoint, gpt: nn.Module, lora: LoRA, init_from: str) -> None:
    """A LoRA run's checkpoint: the trained weights and the base weights' name (the frozen weights
    come from there), or with `lora.checkpoint == "merged"` the merged model as a plain checkpoint."""
    state = checkpoint.state
    if lora.checkpoint == "merged":
        merged = merged_state_dict(gpt)
        others = {k: v for k, v in state.items() if not k.startswith(GPT_PREFIX)}
        checkpoint.state = {**others, **{GPT_PREFIX + k: v for k, v in merged.items()}}
        checkpoint.hyper_parameters["lora"] = None  # a plain model from now on
        return
    frozen = {GPT_PREFIX + n for n, p in gpt.named_parameters() if not p.requires_grad}
    checkpoint.state = {k: v for k, v in state.items() if k not in frozen}
    checkpoint.adapters = Adapters.of(lora, base=base_reference(init_from), new_tokens_from=gpt.wte.frozen,
                                      fingerprint=getattr(gpt, "base_fingerprint", None))  # fmt: skip


def check_fits(
    loaded: Checkpoint, config: GPTConfig, head: nn.Module | None, task, where: str, init_from: str | None
) -> None:
    """A checkpoint of another shape, task head or kind than the run's (built from `init_from`, or
    a preset), named in one sentence (not a page of size mismatches)."""
    stored = loaded.gpt_config or {}
    differ = config.differing_shapes(stored) if stored else {}  # {field: the checkpoint's value}
    if differ:
        theirs = ", ".join(f"{k}={v}" for k, v in differ.items())
        ours = ", ".join(f"{k}={getattr(config, k)}" for k in differ)
        preset = (
            "give the same --model.preset/--model.overrides, or start anew from it with --model.init_from"
        )
        fix = f"give the --model.init_from it was trained from, not {init_from}" if init_from else preset
        raise FileProblem(f"{where} holds a model with {theirs} but this run builds {ours}: {fix}.")
    rows = loaded.submodule_state("head").get("weight")
    if loaded.state and rows is None and head is not None:  # (a sharded checkpoint's tensors load apart)
        raise FileProblem(
            f"{where} is a language model's checkpoint, not a task's: fine-tuning starts from it "
            "with --model.init_from, not --ckpt_path."
        )
    if rows is not None and head is None:  # (`load_from_checkpoint` given no task)
        other = ", or read it with Classifier.from_checkpoint" if loaded.task_card else " (it records none)"
        raise FileProblem(f"{where} is a task's checkpoint: give its task (a card) to read or resume it"
                         f"{other}; it resumes no pretraining.")  # fmt: skip
    if rows is not None and rows.shape[0] != head.out_features:
        raise FileProblem(
            f"{where} has a task head of {rows.shape[0]} outputs but task {task.name!r} needs "
            f"{head.out_features}: fine-tune it anew with --model.init_from."
        )
    if rows is not None:  # (tensors of another shape or kind: the file was altered or is damaged)
        state = loaded.submodule_state("head")
        check_real_weights(loaded.state, ["head." + name for name, _ in head.named_parameters()], where)
        check_shapes(head, state, where, described=f"the head of task {task.name!r}", prefix="head.")


def check_same_tokenizer(checkpoint: Checkpoint, data, where: str) -> None:
    """A run resumed or scored from a checkpoint reads its texts with the tokenizer it was trained
    with (`data`'s, the data module's): one of the same size but other tokens would turn every text
    into other ids without a word. The copy saved beside the checkpoint is compared."""
    tokenizer, path = getattr(data, "tokenizer", None), getattr(data, "tokenizer_path", None)
    if (tokenizer is None and path is None) or not checkpoint.tokenizer or not Path(where).is_file():
        return
    saved = Path(where).parent / checkpoint.tokenizer
    if not saved.is_dir() or (path is not None and Path(path).expanduser().resolve() == saved.resolve()):
        return
    from gpt_ft.data.tokenizer import load_tokenizer

    tokenizer = tokenizer or load_tokenizer(path)  # token files' (pretraining): their folder's tokenizer
    kept = load_tokenizer(saved)
    given, own = tokenizer.get_vocab(), kept.get_vocab()
    why = given == own and reading_difference(tokenizer, kept, ("normalizer", "pre_tokenizer", "model"))
    if given != own or why:
        option = "--data.token_dir" if getattr(data, "token_dir", None) else "--data.tokenizer"
        raise FileProblem(not_its_tokenizer(path, where, saved, option, given, own, why))


def typed(value: Any) -> str:
    """A value as the command line takes it: `null`, `true`, `[a, b]`."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return f"[{', '.join(map(typed, value))}]" if isinstance(value, list | tuple) else str(value)


def check_lora_resume(
    checkpoint: Checkpoint, lora: LoRA | None, where: str, gpt: nn.Module | None = None
) -> None:
    """A LoRA run resumes from adapters only, of the same settings and base weights (`gpt`'s, as
    `build_gpt` loaded them), and adapters only resume a LoRA run: one sentence."""
    if lora is not None and checkpoint.adapters is None:
        raise FileProblem(
            f"{where} holds no LoRA adapters (a merged or plain model) and a LoRA run resumes only "
            "from adapters: start anew from it with --model.init_from."
        )
    if lora is None and checkpoint.adapters is not None:
        raise FileProblem(
            f"{where} holds LoRA adapters: resume it with the same --model.lora, or load it with "
            "Classifier.from_checkpoint or --model.init_from."
        )
    saved = checkpoint.adapters.settings if lora is not None else {}

    def plain(value):  # the order of lora.targets changes no adapter
        return sorted(value) if isinstance(value, list) else value

    shape = [f"--model.lora.{key} {typed(saved[key])} (this run: {typed(getattr(lora, key))})"
             for key in ("rank", "alpha", "targets", "quantize")
             if key in saved and plain(saved[key]) != plain(getattr(lora, key))]  # fmt: skip
    if shape:  # other adapters: a size mismatch, or the same tensors scaled otherwise without a word
        raise FileProblem(f"{where} holds LoRA adapters trained with {'; '.join(shape)}: resume with those.")
    if lora is not None and (loaded := getattr(gpt, "base_fingerprint", None)):
        checkpoint.adapters.check_base(loaded, where, getattr(gpt, "base_loaded", None))
    if lora is not None and gpt is not None:
        checkpoint.check_adapters_whole(gpt, where)
