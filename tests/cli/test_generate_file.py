"""`gpt-ft generate --input FILE --output FILE`: each prompt of a file continued, in batches of
prompts padded on the left, as `--prompt` continues it alone; bad files and options refused in one
sentence, before any decoding, nothing on disk changed."""

import csv
import json

import pytest

from gpt_ft.cli import main
from tests.cli.test_bad_outputs import error
from tests.helpers import cuda

PROMPTS = ["the cat", "a dog runs in the park and", "it", "the movie was not good at all , and the"]


@pytest.fixture
def model_dir(tmp_path_factory):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=400, n_positions=64)
    ).save_pretrained(folder)
    return folder


def alone(capsys, model_dir, tokenizer_dir, prompt: str, *options: str) -> str:
    """What `gpt-ft generate --prompt PROMPT` adds to the prompt."""
    capsys.readouterr()
    main(
        [
            "generate",
            f"--ckpt_path={model_dir}",
            f"--tokenizer={tokenizer_dir}",
            f"--prompt={prompt}",
            *options,
        ]
    )
    return capsys.readouterr().out.removeprefix(prompt).removesuffix("\n")


@pytest.mark.parametrize(
    "options", [["--max_new_tokens=12"], ["--max_new_tokens=6", "--num_beams=2"]], ids=["greedy", "beams"]
)
def test_each_prompt_of_a_file_is_continued_as_alone(tmp_path, capsys, model_dir, tokenizer_dir, options):
    source = tmp_path / "prompts.jsonl"
    rows = [
        {"id": i, "prompt": p, **({"continuation": "mine"} if i == 1 else {})} for i, p in enumerate(PROMPTS)
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["generate", f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}", f"--input={source}"]
    capsys.readouterr()
    main([*args, f"--output={tmp_path / 'out.jsonl'}", "--batch_size=3", *options])
    said, renamed = capsys.readouterr().out, "(as continuation_1: it has such a column)"
    assert said == f"continued 4 prompts of {source} into {tmp_path / 'out.jsonl'} {renamed}\n"
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = [alone(capsys, model_dir, tokenizer_dir, p, *options) for p in PROMPTS]
    assert [r["continuation_1"] for r in written] == expected
    assert [{k: v for k, v in r.items() if k != "continuation_1"} for r in written] == rows  # in order
    assert any(expected)  # (a continuation may be empty: the model's end token first)
    main([*args, f"--output={tmp_path / 'out.csv'}", "--batch_size=1", *options])
    with open(tmp_path / "out.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["continuation_1"] for r in table] == expected and [r["prompt"] for r in table] == PROMPTS


def test_a_prompt_the_batch_leaves_less_room_is_continued_as_alone(
    tmp_path, capsys, model_dir, tokenizer_dir
):
    """The long prompt leaves its batch 64 - n tokens of room; the short one, alone, has 60."""
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.generation import prompt_ids

    long = "the cat sat on the mat and the dog ran"
    n = len(prompt_ids(load_tokenizer(tokenizer_dir), long))
    assert 64 - n < 60
    source = tmp_path / "prompts.jsonl"
    source.write_text(json.dumps({"prompt": "a dog"}) + "\n" + json.dumps({"prompt": long}) + "\n")
    args = [
        f"--input={source}",
        f"--output={tmp_path / 'out.jsonl'}",
        "--max_new_tokens=60",
        "--batch_size=2",
    ]
    capsys.readouterr()
    main(["generate", f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}", *args])
    room = "room for fewer than --max_new_tokens 60 new tokens: continued to its end at most.\n"
    said = "note: the model's context (64 tokens, n_positions) leaves 1 of 2 prompts " + room
    assert capsys.readouterr().err.endswith(said)  # (the long one: silently cut short before)
    written = [json.loads(line)["continuation"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written == [
        alone(capsys, model_dir, tokenizer_dir, p, "--max_new_tokens=60") for p in ("a dog", long)
    ]
    for prompt, note in [(long, f"note: the model's context (64 tokens, n_positions) leaves this {n}-token "
                                f"prompt {room}"), ("a dog", "")]:  # fmt: skip
        main(["generate", f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}", f"--prompt={prompt}",
              "--max_new_tokens=60"])  # fmt: skip
        assert capsys.readouterr().err == note


def test_a_stop_text_in_brackets_is_a_text_and_a_json_list_several(capsys):
    """--stop is read as typed: '[END]' was YAML's list holding 'END', so 'END' alone stopped."""
    from gpt_ft.eval.generation import stop_texts

    with pytest.raises(SystemExit):
        main(["generate", "--ckpt_path=x.ckpt", "--prompt=hi", "--stop=[END]", "--print_config"])
    assert "stop: '[END]'" in capsys.readouterr().out
    assert stop_texts("[END]") == ["[END]"] and stop_texts("###") == ["###"] and stop_texts("") == []
    assert stop_texts('["###", "\\n\\n"]') == ["###", "\n\n"] and stop_texts(' ["a"]') == ["a"]
    with pytest.raises(ValueError, match=r"^--stop's JSON list holds 1, not a text: give texts, in double"):
        stop_texts('["a", 1]')


def test_a_stop_text_and_sampling_over_a_file(tmp_path, capsys, model_dir, tokenizer_dir):
    source = tmp_path / "prompts.csv"
    source.write_text("prompt,text\n" + "".join(f'"{p}",x\n' for p in PROMPTS))
    args = ["generate", f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}", f"--input={source}"]
    greedy = [alone(capsys, model_dir, tokenizer_dir, p, "--max_new_tokens=12") for p in PROMPTS]
    stop = next(t for t in greedy if len(t) > 3)[1:3]
    main(
        [
            *args,
            f"--output={tmp_path / 'stopped.jsonl'}",
            "--max_new_tokens=12",
            f"--stop=[{json.dumps(stop)}]",
        ]
    )
    written = [
        json.loads(line)["continuation"] for line in (tmp_path / "stopped.jsonl").read_text().splitlines()
    ]
    assert written == [t[: t.find(stop)] if stop in t else t for t in greedy]
    sampled = []
    for _ in range(2):  # seeded: the same file, batch and seed draw the same continuations
        main(
            [*args, f"--output={tmp_path / 's.jsonl'}", "--overwrite=true", "--do_sample=true", "--top_k=20"]
        )
        sampled.append((tmp_path / "s.jsonl").read_text())
    assert sampled[0] == sampled[1] and sampled[0].count("\n") == 4


def test_bad_prompt_files_and_options_are_one_sentence(tmp_path, capsys, model_dir, tokenizer_dir):
    source = tmp_path / "prompts.jsonl"
    source.write_text('{"prompt": "the cat"}\n{"text": "x"}\n')
    existing = tmp_path / "out.jsonl"
    existing.write_text("kept\n")
    base = ["generate", f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}"]
    out = f"--output={tmp_path / 'new.jsonl'}"
    give = "Give --prompt TEXT, or --input FILE with --output FILE: the prompts of a file."
    assert error(capsys, *base) == give
    assert error(capsys, *base, "--prompt=hi", f"--input={source}", out) == give
    assert error(capsys, *base, f"--input={source}") == give
    assert error(capsys, *base, "--prompt=hi", out) == (  # it asked for the --prompt it was given
        "--output FILE goes with --input FILE (a file of prompts); a --prompt's text is printed."
    )
    assert error(capsys, *base, f"--input={source}", f"--output={existing}").startswith(
        f"--output {existing} already exists: give another name, or --overwrite true"
    )
    assert existing.read_text() == "kept\n"
    assert error(capsys, *base, f"--input={source}", out, "--field=text") == (
        f"{source}, line 1: the row has no field 'text' (the prompt; --field NAME reads another)."
    )
    (tmp_path / "null.jsonl").write_text('{"text": null}\n')
    assert error(capsys, *base, f"--input={tmp_path / 'null.jsonl'}", out, "--field=text") == (
        f"{tmp_path / 'null.jsonl'}, line 1: the prompt ('text') is empty: give some text to continue."
    )
    (tmp_path / "numbers.jsonl").write_text('{"text": 7}\n')
    assert error(capsys, *base, f"--input={tmp_path / 'numbers.jsonl'}", out, "--field=text") == (
        f"{tmp_path / 'numbers.jsonl'}, line 1: the prompt ('text') is 7, not a text."
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["the cat", None]}), tmp_path / "rows.parquet")  # no lines: rows
    assert error(capsys, *base, f"--input={tmp_path / 'rows.parquet'}", out, "--field=text") == (
        f"{tmp_path / 'rows.parquet'}, row 2: the prompt ('text') is empty: give some text to continue."
    )
    assert error(capsys, *base, f"--input={source}", out, "--field=question") == (
        f"--input {source} has no column 'question' (its columns: prompt, text): name the prompts' column "
        "with --field."
    )
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.generation import prompt_ids

    long = "the cat " * 40
    n = len(prompt_ids(load_tokenizer(tokenizer_dir), long))
    source.write_text('{"prompt": "the cat"}\n\n{"prompt": "' + long + '"}\n')  # a blank line: line 3
    assert error(capsys, *base, f"--input={source}", out) == (
        f"{source}, line 3: the prompt is {n} tokens and the model's context is 64 (n_positions), leaving "
        f"no room for a new token: shorten it by at least {n - 63} tokens."
    )
    source.write_text('{"prompt": ""}\n')
    assert error(capsys, *base, f"--input={source}", out) == (
        f"{source}, line 1: the prompt is empty: give some text to continue."
    )
    assert error(capsys, *base, f"--input={source}", out, "--batch_size=0").startswith("--batch_size must be")
    assert not (tmp_path / "new.jsonl").exists()


def test_a_static_cache_decodes_the_same_tokens_and_refuses_beam_search(
    tmp_path, capsys, model_dir, tokenizer_dir, monkeypatch
):
    """`--static_cache true` reaches every decoding call (a prompt's stream, a file's batches) and
    changes no token; with beam search it is refused in one sentence, before any decoding."""
    from gpt_ft import GPT

    asked, stream, generate = [], GPT.stream, GPT.generate
    monkeypatch.setattr(GPT, "stream", lambda *a, **k: asked.append(k.get("static_cache")) or stream(*a, **k))
    monkeypatch.setattr(
        GPT, "generate", lambda *a, **k: asked.append(k.get("static_cache")) or generate(*a, **k)
    )
    eager = [alone(capsys, model_dir, tokenizer_dir, p, "--max_new_tokens=12") for p in PROMPTS]
    static = [
        alone(capsys, model_dir, tokenizer_dir, p, "--max_new_tokens=12", "--static_cache=true")
        for p in PROMPTS
    ]
    assert static == eager and asked == [False] * 4 + [True] * 4
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    args = ["generate", f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}", f"--input={source}"]
    main(
        [
            *args,
            f"--output={tmp_path / 'out.jsonl'}",
            "--batch_size=3",
            "--max_new_tokens=12",
            "--static_cache=true",
        ]
    )
    written = [json.loads(line)["continuation"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written == eager and asked[8:] == [True, True]  # two batches
    beams = error(capsys, *args[:3], "--prompt=the cat", "--num_beams=2", "--static_cache=true")
    assert beams == (
        "--static_cache goes with greedy decoding or sampling: beam search (--num_beams > 1) "
        "reorders its cache each step."
    )
    assert "static_cache" in error(capsys, *args[:3], "--prompt=the cat", "--static_cache=fast")


def test_the_static_cache_is_the_default_on_cuda_without_beam_search():
    """Left out, `--static_cache` is on where its CUDA graph pays (CUDA, greedy or sampled) and off
    on a CPU and for beam search; given, it is what it says (beam search refuses it, above)."""
    from gpt_ft.eval.generation import static_cache_for

    assert [static_cache_for(None, device, 1) for device in ("cuda", "cuda:1", "cpu", "mps")] == [
        True, True, False, False,
    ]  # fmt: skip
    assert static_cache_for(None, "cuda", 4) is False
    given = [False, True, "compiled"]
    assert [static_cache_for(value, "cuda", 1) for value in given] == given
    assert static_cache_for(True, "cpu", 1) is True


@cuda
def test_cuda_generate_decodes_on_the_static_cache_by_default_with_the_same_tokens(
    tmp_path, capsys, model_dir, tokenizer_dir, monkeypatch
):
    """On CUDA `gpt-ft generate` takes the static cache's graph unless told not to, a prompt's and a
    file's batches alike, and writes the tokens of the growing cache."""
    from gpt_ft import GPT

    asked, generate = [], GPT.generate
    monkeypatch.setattr(
        GPT, "generate", lambda *a, **k: asked.append(k.get("static_cache")) or generate(*a, **k)
    )
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    written = []
    for options in ([], ["--static_cache=false"]):
        out = tmp_path / f"out{len(options)}.jsonl"
        args = [f"--ckpt_path={model_dir}", f"--tokenizer={tokenizer_dir}", "--max_new_tokens=12"]
        main(["generate", *args, f"--input={source}", f"--output={out}", "--batch_size=3", *options])
        written.append([json.loads(line)["continuation"] for line in out.read_text().splitlines()])
    assert asked == [True, True, False, False] and written[0] == written[1]


def test_under_beam_search_a_prompt_the_batch_leaves_less_room_is_decoded_alone_even_if_it_ended():
    """Beam search's winner depends on its length limit even where it ends at an end token within
    it: a prompt with less room in its batch than alone is decoded again alone, not only when cut."""
    import torch

    from gpt_ft.eval.generation import continue_prompts

    class Model:  # ends every row at once (token 9, the end token): never cut by the batch's room
        config = type("Config", (), {"n_positions": 40})()
        limits: list[tuple[int, int]] = []

        def parameters(self):
            return iter([torch.zeros(1)])

        def generate(self, ids, max_new_tokens, attention_mask=None, **decode):
            self.limits.append((ids.shape[0], max_new_tokens))
            return torch.cat([ids, torch.full((ids.shape[0], 1), 9)], dim=1)

    prompts = [[1] * 4, [2] * 30]
    for beams, limits in ((1, [(2, 10)]), (3, [(2, 10), (1, 20)])):
        model = Model()
        model.limits = []
        assert continue_prompts(model, prompts, 2, 20, {"num_beams": beams, "eos_token_id": [9]}) == [[], []]
        assert model.limits == limits
