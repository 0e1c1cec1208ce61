"""`gpt-ft generate`'s printing of tokens as they come."""

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gpt_ft.eval.generation import print_as_they_come


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: one token per UTF-8 byte, so most characters span tokens."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def printed(tok, ids: list[int], eos: int | None, capsys) -> str:
    print_as_they_come(tok, iter(torch.tensor([[i]]) for i in ids), [] if eos is None else [eos], prompt=[])
    return capsys.readouterr().out


def test_characters_split_across_tokens_are_printed_whole(capsys):
    tok = byte_tokenizer()
    text = "café 日本 🙂!"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())
    assert printed(tok, ids, None, capsys) == text + "\n"
    cut = tok("日本", add_special_tokens=False)["input_ids"][:4]  # 本's first byte, never completed
    assert printed(tok, cut, None, capsys) == "日\n"  # (U+FFFD at the end: the length limit's cut)
    from gpt_ft.eval.generation import continuation  # (a file's continuations too)

    whole = tok("日本", add_special_tokens=False)["input_ids"]
    assert continuation(tok, [], cut) == "日" and continuation(tok, cut[:3], cut[3:]) == ""  # (本 unfinished)
    assert continuation(tok, whole[:3], whole[3:]) == "本"  # (finished by the tokens that complete it)
    end = tok("!", add_special_tokens=False)["input_ids"][0]
    assert printed(tok, [*ids[:5], end, *ids[5:]], end, capsys) == "café\n"  # nothing after the end token


def test_a_stop_text_ends_the_continuation_unprinted_and_what_may_begin_one_waits(capsys):
    """A stop text ends the printing where it starts, though tokens (one a byte here) cut it
    anywhere: what may begin one waits until it is known (printing cannot take text back), and
    comes out where no stop follows."""
    tok = byte_tokenizer()

    def until(text: str, stops: list[str]) -> str:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        print_as_they_come(tok, iter(torch.tensor([[i]]) for i in ids), [], prompt=[], stops=stops)
        return capsys.readouterr().out

    assert until("one. ##two## three", ["##t"]) == "one. \n"
    assert until("a # b ## c", ["##t", "END"]) == "a # b ## c\n"  # '#', '##' waited, then came out
    assert until("x 日本 END y", ["本 E"]) == "x 日\n"


def test_generate_never_writes_the_task_framing_tokens(finetuned, monkeypatch, capsys):
    """A fine-tuned instruct model's extract row starts as a copy of its end-of-turn token's and its
    tied head came to score it higher: greedy decoding wrote <|extract|> <|delim|> ... instead of
    stopping. gpt-ft generate suppresses the framing and padding tokens, in every decoding."""
    from gpt_ft.cli import main
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.model.gpt import GPT

    vocab = load_tokenizer(str(finetuned.ckpt.parent / "tokenizer")).get_vocab()
    framing = sorted(vocab[t] for t in ("<|start|>", "<|delim|>", "<|extract|>", "<|pad|>") if t in vocab)
    assert len(framing) >= 3
    given, stream, generate = [], GPT.stream, GPT.generate
    monkeypatch.setattr(GPT, "stream", lambda *a, **k: given.append(k["suppress_tokens"]) or stream(*a, **k))
    monkeypatch.setattr(
        GPT, "generate", lambda *a, **k: given.append(k["suppress_tokens"]) or generate(*a, **k)
    )
    for beams in ("1", "2"):
        main(
            [
                "generate",
                f"--ckpt_path={finetuned.ckpt}",
                "--prompt=the cat",
                "--max_new_tokens=3",
                f"--num_beams={beams}",
            ]
        )
    assert given == [framing, framing] and capsys.readouterr().out.startswith("the cat")


def test_a_prompt_and_a_stop_text_are_read_as_typed(finetuned, monkeypatch, capsys):
    """jsonargparse reads a value it may take as None as YAML: `--prompt '# Title'` (a comment) was
    refused as no prompt, `--stop '###'` dropped without a word. A JSON list still gives several."""
    from gpt_ft.cli import main
    from gpt_ft.eval import generation

    seen = []
    monkeypatch.setattr(generation, "print_as_they_come", lambda tok, _, eos, ids, stops: seen.append(stops))
    for prompt, stop, stops in (
        ("# the cat", "###", ["###"]),
        ("null", '["a", "# b"]', ["a", "# b"]),
        ("~", "# b", ["# b"]),
    ):
        main(
            [
                "generate",
                f"--ckpt_path={finetuned.ckpt}",
                "--prompt",
                prompt,
                "--stop",
                stop,
                "--max_new_tokens=2",
            ]
        )
        assert capsys.readouterr().out == prompt and seen.pop() == stops


def test_decoding_stops_at_the_end_of_text_a_tokenizer_holds_beside_another_eos(tokenizer_dir):
    """`gpt-ft prepare` ends each document with `<|endoftext|>`; a tokenizer whose eos is another
    token (SmolLM2's `</s>`-style) kept it out of the stop tokens, so `generate` and an exported
    language model ran past every end of text the model learned."""
    from types import SimpleNamespace

    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.generation import stop_tokens

    tok = load_tokenizer(tokenizer_dir)
    end = tok.convert_tokens_to_ids("<|endoftext|>")
    assert stop_tokens(tok, SimpleNamespace(hf_token_ids={"eos": [7]})) == [end, 7]
    tok.add_special_tokens({"eos_token": "</s>"})
    eos = tok.convert_tokens_to_ids("</s>")
    assert eos != end and stop_tokens(tok, SimpleNamespace(hf_token_ids=None)) == [eos, end]
