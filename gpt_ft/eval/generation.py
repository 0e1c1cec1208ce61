"""`gpt-ft generate`: a prompt continued by a trained model, each new token printed as it comes; or
each prompt of a file, in batches of prompts padded on the left, written beside its row.

The model is a gpt_ft checkpoint, a transformers folder or a GGUF file; decoding is greedy,
sampled (temperature, top-k, top-p) or a beam search (whose continuation is printed at the end),
with a repetition penalty where asked, and ends at an end-of-text token or at a stop text. A
prompt that leaves no room in the model's context for a new token is refused rather than cut.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from gpt_ft.data.pieces import document_end, text_start
from gpt_ft.errors import at_least_one, check_output_file, input_file
from gpt_ft.eval.batched_decoding import continue_prompts, until_eos
from gpt_ft.eval.devices import device_named
from gpt_ft.model.decoding import check_decoding, stop_ids
from gpt_ft.training.precision import cpu_precision
from gpt_ft.training.saved import check_init_tokenizer
from gpt_ft.weights.pretrained import GPT, check_tokenizer_fits, refuse_fresh_head, resolve_tokenizer


def generate(
    *,
    ckpt_path: str,
    prompt: str = "",
    input: str | None = None,
    output: str | None = None,
    field: str = "prompt",
    overwrite: bool = False,
    batch_size: int = 16,
    tokenizer: str | None = None,
    max_new_tokens: int = 100,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    repetition_penalty: float = 1.0,
    stop: str = "",
    static_cache: bool | Literal["compiled"] | None = None,
    seed: int = 0,
    device: str | None = None,
    precision: Literal["32-true", "bf16-mixed", "bf16-true"] = "32-true",
) -> None:
    """Continue a prompt with a trained model, or each prompt of a file.

    Args:
        ckpt_path: A gpt_ft .ckpt, a transformers folder, a .gguf file or a hub id.
        prompt: The text to continue (or --input); read as typed ('# Title' too).
        input: A file of prompts (csv, tsv, json/jsonl or parquet), one a row in the column --field:
            each continued, in batches, and written to --output.
        output: With --input: its rows again with a `continuation` column (csv, tsv, json, jsonl or
            parquet, by extension; tsv puts a line break as a space); a new file.
        field: With --input: the column that holds the prompts.
        overwrite: Replace --output if it exists.
        batch_size: With --input: prompts decoded together (padded on the left, the shortest first).
        tokenizer: Default: the one saved with the checkpoint.
        max_new_tokens: Most tokens to add (fewer where the model's context ends first).
        do_sample: Sample instead of greedy decoding.
        temperature: Sampling temperature.
        top_k: Sample among the k likeliest tokens only.
        top_p: Sample among the likeliest tokens whose probabilities add up to p only.
        num_beams: Beam search when > 1 (printed at the end).
        length_penalty: Beam search: a beam's log-probability is divided by its length to this power.
        repetition_penalty: Above 1, the tokens already in the text are less likely (CTRL's penalty,
            as transformers applies it; 1.2 is common); 1: none.
        stop: A text that ends the continuation when it produces it (not printed), as typed
            ('###', '[END]'), or several, a JSON list: '["###", "\\n\\n"]' (double quotes: a line
            break is \\n).
        static_cache: Keys and values in a cache of fixed shape; on CUDA each token's step is then
            replayed as one CUDA graph (the same tokens; gpt1 at batch 1 on an H200: 855 tokens/s
            against 373, docs/gpus.md), kept for the next batch of the same size. compiled: the step
            compiled first (a size's first batch waits for the compile). Not with beam search.
            Default: true on CUDA (greedy decoding or sampling), false elsewhere.
        seed: Seed of the sampling.
        device: Default: cuda when there is one.
        precision: bf16-mixed: fp32 weights, bf16 matrix products; bf16-true: bf16 weights and KV cache.
    """
    from gpt_ft.data.tokenizer import embedding_size, load_tokenizer  # transformers: when the command runs

    at_least_one(max_new_tokens, "--max_new_tokens")
    at_least_one(num_beams, "--num_beams")
    prompt = prompt or None  # (a str, never YAML: '# Title' is no comment, 'null' no None)
    if prompt is not None and output is not None and input is None:
        raise ValueError(
            "--output FILE goes with --input FILE (a file of prompts); a --prompt's text is printed."
        )
    if (prompt is None) == (input is None) or (output is None) != (input is None):
        raise ValueError("Give --prompt TEXT, or --input FILE with --output FILE: the prompts of a file.")
    files = None
    if input is not None:
        at_least_one(batch_size, "--batch_size")
        files = prompt_files(input, output, overwrite)  # checked before the weights load
    if static_cache and num_beams > 1:
        raise ValueError(
            "--static_cache goes with greedy decoding or sampling: beam search (--num_beams > 1) "
            "reorders its cache each step."
        )
    stops = stop_texts(stop)
    if "" in stops:
        raise ValueError("--stop holds an empty text, which every continuation starts with: give texts.")
    shaping = {"--temperature": temperature != 1.0, "--top_k": top_k is not None}
    shaping["--top_p"] = top_p is not None
    if not do_sample and (unread := [name for name, given in shaping.items() if given]):
        decoding = "beam search" if num_beams > 1 else "greedy decoding"
        verb, reads = ("shapes", "does not read it") if len(unread) == 1 else ("shape", "reads none of them")
        print(f"note: {', '.join(unread)} {verb} sampling only: {decoding} {reads} "
              "(--do_sample true samples).", file=sys.stderr, flush=True)  # fmt: skip
    device = device_named(device)
    static_cache = static_cache_for(static_cache, device, num_beams)
    if torch.device(device).type == "cpu":
        precision, why = cpu_precision(precision)
        if why:
            print(why, file=sys.stderr, flush=True)
    gpt = GPT.from_pretrained(ckpt_path).to(device).eval()  # first: a path that holds no model says so
    refuse_fresh_head(gpt, str(ckpt_path), "generate")
    if tokenizer is not None:  # a gpt_ft checkpoint's own, or one that keeps its tokens' ids
        check_init_tokenizer(tokenizer, ckpt_path, "--tokenizer")
    tok = load_tokenizer(resolve_tokenizer(tokenizer, ckpt_path))
    check_tokenizer_fits(embedding_size(tok), gpt.config.vocab_size, ckpt_path)
    if precision == "bf16-true":
        gpt = gpt.to(torch.bfloat16)
    eos = stop_tokens(tok, gpt.config)
    decode = dict(
        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos,
        repetition_penalty=repetition_penalty, generator=torch.Generator(device).manual_seed(seed),
        suppress_tokens=framing_tokens(tok, gpt.config.vocab_size), static_cache=static_cache,
    )  # fmt: skip
    beams = dict(num_beams=num_beams, length_penalty=length_penalty) if num_beams > 1 else {}
    options = (temperature, top_k, top_p, num_beams, do_sample, repetition_penalty)
    with torch.autocast(torch.device(device).type, torch.bfloat16, enabled=precision == "bf16-mixed"):
        if files is not None:
            check_decoding(gpt, torch.zeros(1, 1, dtype=torch.long, device=device), 1, *options, cli=True)
            continue_file(
                gpt, tok, *files, field, batch_size, max_new_tokens, {**decode, **beams}, stops, overwrite
            )
            return
        ids = checked_prompt(gpt, prompt_ids(tok, prompt), "--prompt")
        start = torch.tensor([ids], device=device)
        max_new = min(max_new_tokens, gpt.config.n_positions - len(ids))
        note_context_room(gpt.config.n_positions, [ids], max_new_tokens)
        check_decoding(gpt, start, max_new, *options, cli=True)  # before printing
        print(prompt, end="", flush=True)
        if num_beams > 1:
            new = gpt.generate(start, max_new_tokens=max_new, **decode, **beams)[0, len(ids) :].tolist()
            print(until_stop(continuation(tok, ids, until_eos(new, eos)), stops)[0], flush=True)
            return
        print_as_they_come(tok, gpt.stream(start, max_new_tokens=max_new, **decode), eos, ids, stops)


def static_cache_for(static_cache: bool | str | None, device: str, num_beams: int) -> bool | str:
    """`--static_cache` as given, or by default: on CUDA, where its graph replays a token's step in
    one launch, unless beam search (which reorders its cache); elsewhere the growing cache."""
    if static_cache is not None:
        return static_cache
    return torch.device(device).type == "cuda" and num_beams == 1


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def note_context_room(context: int, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Say on stderr where the model's context leaves prompts room for fewer than `max_new_tokens`
    new tokens: `gpt-ft generate` continues them to the context's end at most."""
    if short := [len(p) for p in prompts if context - len(p) < max_new_tokens]:
        many = f"{len(short):,} of {len(prompts):,} prompts"
        which = f"this {short[0]}-token prompt" if len(prompts) == 1 else many
        print(
            f"note: the model's context ({context} tokens, n_positions) leaves {which} room for fewer "
            f"than --max_new_tokens {max_new_tokens} new tokens: continued to its end at most.",
            file=sys.stderr,
        )


def checked_prompt(gpt: GPT, ids: list[int], where: str) -> list[int]:
    """A prompt's ids, refused in one sentence starting with `where` where the model cannot continue
    them: empty, filling its context (refused rather than cut: what the model continues is what was
    typed), or holding an id past its embedding rows."""
    context = gpt.config.n_positions
    if not ids:
        raise ValueError(f"{where} is empty: give some text to continue.")
    if len(ids) >= context:
        raise ValueError(
            f"{where} is {len(ids)} tokens and the model's context is {context} (n_positions), leaving "
            f"no room for a new token: shorten it by at least {plural(len(ids) - context + 1, 'token')}."
        )
    if max(ids) >= gpt.config.vocab_size:
        raise ValueError(
            f"{where} holds token id {max(ids)}, past the model's {gpt.config.vocab_size} embedding rows: "
            "use the tokenizer saved with the weights."
        )
    return ids


def prompt_files(input: str, output: str, overwrite: bool) -> tuple[Path, Path]:
    """--input and --output, checked before any work: a file of a known format to read, a new file
    of a known format to write."""
    from gpt_ft.data.file_faults import file_format
    from gpt_ft.eval.labelling import WHOLE_ROWS

    source, target = input_file(input, "--input"), Path(output).expanduser()
    if target.suffix.lower() not in (".csv", ".tsv", *WHOLE_ROWS):
        raise ValueError(f"--output {target}: write .csv, .tsv, .json, .jsonl or .parquet.")
    check_output_file(output, "--output", overwrite=overwrite, reads=source)
    if file_format(source) is None:
        raise ValueError(
            f"--input {source}: give a .csv, .tsv, .json/.jsonl or .parquet file (by its extension)."
        )
    return source, target


def continue_file(
    gpt: GPT, tok, source: Path, target: Path, field: str, batch_size: int, max_new_tokens: int,
    decode: dict, stops: list[str], overwrite: bool,
) -> None:  # fmt: skip
    """Each prompt of `source` (its column `field`) continued, `batch_size` at a time, the shortest
    first (the least padding), and written beside its row to `target`; a prompt the model cannot
    continue is refused naming its line, before any is decoded."""
    from gpt_ft.data.file_faults import file_format, record_lines
    from gpt_ft.data.files import read_table
    from gpt_ft.data.json_faults import json_records
    from gpt_ft.eval.labelling import write_labelled
    from gpt_ft.eval.progress import batches_bar

    table = read_table(source)
    if field not in table.column_names:
        raise ValueError(
            f"--input {source} has no column {field!r} (its columns: {', '.join(table.column_names)}): "
            "name the prompts' column with --field."
        )
    rows = json_records(source, table.to_list())
    lines = record_lines(source, file_format(source))  # (a parquet file has rows, not lines)
    places = [f"line {n}" for n in lines] if lines else [f"row {n}" for n in range(1, len(rows) + 1)]
    prompts = []
    for row, at in zip(rows, places):
        text = row.get(field)
        if field not in row:
            raise ValueError(f"{source}, {at}: the row has no field {field!r} (the prompt; --field "
                             "NAME reads another).")  # fmt: skip
        if text is None:
            raise ValueError(f"{source}, {at}: the prompt ({field!r}) is empty: give some text to continue.")
        if not isinstance(text, str):
            raise ValueError(f"{source}, {at}: the prompt ({field!r}) is {text!r}, not a text.")
        prompts.append(checked_prompt(gpt, prompt_ids(tok, text), f"{source}, {at}: the prompt"))
    note_context_room(gpt.config.n_positions, prompts, max_new_tokens)
    new = continue_prompts(gpt, prompts, batch_size, max_new_tokens, decode, batches_bar("generate"))
    texts = [until_stop(continuation(tok, p, n), stops)[0] for p, n in zip(prompts, new)]
    names = write_labelled(
        target,
        rows,
        [({"label": t}, t) for t in texts],
        columns={"label": "continuation"},
        overwrite=overwrite,
    )
    renamed = (
        f" (as {names['continuation']}: it has such a column)"
        if names["continuation"] != "continuation"
        else ""
    )
    print(f"continued {len(rows):,} prompt{'s' * (len(rows) != 1)} of {source} into {target}{renamed}")


def prompt_ids(tok, prompt: str) -> list[int]:
    """The prompt's tokens as the model saw texts in training: with the tokenizer's beginning-of-text
    token where it starts texts with one (Llama, Gemma), never an end-of-text token after."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    lead = text_start(tok)
    return lead + ids if ids and lead and ids[:1] != lead else ids


def framing_tokens(tok, vocab_size: int | None = None) -> list[int]:
    """The ids of GPT-1's task framing tokens (start, delim, extract) and the padding token the
    tokenizer holds, those below the model's `vocab_size` (a base model's has none): never written.
    A fine-tuned model's head may score one above the token its row was copied from
    (`--model.new_tokens copied`), such as an instruct model's end of turn."""
    from gpt_ft.data.tokenizer import SPECIAL_TOKENS

    vocab = tok.get_vocab()
    ids = sorted(vocab[token] for token in SPECIAL_TOKENS.values() if token in vocab)
    return [i for i in ids if vocab_size is None or i < vocab_size]


def stop_tokens(tok, config) -> list[int]:
    """Where decoding stops: the tokenizer's eos token, those the weights' config lists (instruct
    models end a turn with more than one), and the token `gpt-ft prepare` ends each document with
    (`document_end`), which a tokenizer may hold beside another eos (SmolLM2-Instruct's
    `<|endoftext|>` beside its `<|im_end|>`; Llama 3's `<|end_of_text|>` beside `<|eot_id|>`)."""
    listed, end = (config.hf_token_ids or {}).get("eos"), tok.get_vocab().get(document_end(tok))
    return list(dict.fromkeys([*stop_ids(tok.eos_token_id), *stop_ids(listed), *stop_ids(end)]))


def continuation(tok, prompt: list[int], new: list[int]) -> str:
    """The text `new` adds to the prompt's: decoded after the prompt, so that a tokenizer that
    spaces words when it joins them (GPT-1's, SentencePiece's) puts the space before the first. A
    character the last tokens hold only the first bytes of (byte-level BPE: U+FFFD once decoded) is
    left out: it comes with the tokens that complete it, or not at all where decoding stopped."""
    before = tok.decode(prompt, skip_special_tokens=True)
    after = tok.decode(prompt + new, skip_special_tokens=True)
    text = after[len(before) :] if after.startswith(before) else tok.decode(new, skip_special_tokens=True)
    return text.rstrip("\ufffd")


def until_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to the first of the stop texts in it, and whether one was."""
    ends = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def held_back(text: str, stops: list[str]) -> int:
    """How many of `text`'s last characters may begin a stop text: not printed until it is known."""
    return max((k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)


def print_as_they_come(
    tok, tokens: Iterator[Tensor], eos: list[int], prompt: list[int], stops: list[str] = ()
) -> None:
    """Print the text each new token adds as it comes, up to the end-of-text token or a stop text
    (not printed; what may begin one waits). A character that a token holds only the first bytes
    of waits for the tokens that complete it (`continuation`)."""
    new: list[int] = []
    shown = text = ""
    for token in tokens:
        if int(token[0]) in eos:
            break
        new.append(int(token[0]))
        text = continuation(tok, prompt, new)
        text, stopped = until_stop(text, stops)
        ready = text[: len(text) - (0 if stopped else held_back(text, stops))]
        sys.stdout.write(ready[len(shown) :])
        sys.stdout.flush()
        shown = ready
        if stopped:
            break
    print(until_stop(text, stops)[0][len(shown) :])


def stop_texts(stop: str | list[str]) -> list[str]:
    """--stop's texts: one as typed, or those of a JSON list of texts ('["###", "\\n\\n"]'). Read
    here, not as YAML, for which '[END]' would be a list holding 'END'."""
    if not isinstance(stop, str):
        return list(stop)
    try:
        given = json.loads(stop) if stop.lstrip().startswith("[") else None
    except ValueError:
        given = None
    if not isinstance(given, list):
        return [stop] if stop else []
    if not_texts := [v for v in given if not isinstance(v, str)]:
        raise ValueError(
            f"--stop's JSON list holds {not_texts[0]!r}, not a text: give texts, in double quotes."
        )
    return given
