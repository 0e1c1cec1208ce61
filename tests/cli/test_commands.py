"""The commands that are not LightningCLI's, in this process: explain, prepare, tokenizer and generate
(suite: tests/eval/test_suite.py)."""

import json
import sys

import pytest
import torch

from gpt_ft.cli import main
from gpt_ft.data.tokenizer import load_tokenizer, special_token_ids
from tests.background import Command
from tests.helpers import PAIR_CARD, ROOT, SENTENCES, write_corpus

PRETRAIN_MICRO = (
    "{n_positions: 64, n_embd: 32, n_layer: 2, n_head: 2, embd_pdrop: 0.0, attn_pdrop: 0.0, resid_pdrop: 0.0}"
)


def gpt_ft(capsys, *argv: str) -> str:
    """`gpt-ft ARGV` in this process; what it printed."""
    capsys.readouterr()
    main(list(argv))
    return capsys.readouterr().out


# ---- explain ----


def test_explain_json(pairs_dir, tokenizer_dir, capsys):
    card = pairs_dir / "pairs.yaml"
    card.write_text(PAIR_CARD)
    out = gpt_ft(
        capsys,
        "explain",
        "--data.task",
        str(card),
        "--data.tokenizer",
        tokenizer_dir,
        "--data.data_dir",
        str(pairs_dir),
        "--split",
        "train",
        "--index",
        "1",
        "--json=true",
    )
    shown = json.loads(out)
    tok = load_tokenizer(tokenizer_dir)
    ids = special_token_ids(tok)
    expected_ids = [
        ids.start,
        *tok('He said "yes.', add_special_tokens=False)["input_ids"],
        ids.delim,
        *tok("No dogs.", add_special_tokens=False)["input_ids"],
        ids.extract,
    ]
    assert shown == {
        "label": "not_entailment",
        "cut": False,
        "pooling": "extract",
        "sequences": [
            {  # the text read whole (a byte-level token of another script is no readable piece)
                "text": '<|start|>He said "yes.<|delim|>No dogs.<|extract|>',
                "tokens": tok.convert_ids_to_tokens(expected_ids),
                "ids": expected_ids,
                "extract_index": len(expected_ids) - 1,
            }
        ],
    }
    assert (
        shown["sequences"][0]["tokens"][0] == "<|start|>"
        and shown["sequences"][0]["tokens"][-1] == "<|extract|>"
    )


def test_explain_text_and_fit_config(pairs_dir, tokenizer_dir, capsys):
    card = pairs_dir / "pairs.yaml"
    card.write_text(PAIR_CARD)
    config = pairs_dir / "fit.yaml"
    config.write_text(
        f"trainer: {{max_epochs: 3}}\nmodel: {{lm_coef: 0.5}}\n"
        f"data: {{task: {card}, tokenizer: {tokenizer_dir}, data_dir: {pairs_dir}}}\n"
    )
    out = gpt_ft(capsys, "explain", "--config", str(config), "--split", "validation")
    assert "label 'entailment'" in out and "<|start|>" in out and "extract at" in out
    assert out.splitlines()[0].endswith("label 'entailment'")  # "Two dogs run." and "Dogs run." fit
    short = gpt_ft(capsys, "explain", "--config", str(config), "--split", "validation", "--data.max_length=6")
    assert short.splitlines()[0].endswith("label 'entailment' (cut to max_length 6)")
    # --print_config gives back what was asked: it printed the config file's values alone, at its
    # own parse, without the options after it
    asked = ["--split", "train", "--index", "1", "--json", "true"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["explain", "--config", str(config), *asked, "--print_config"])
    (pairs_dir / "printed.yaml").write_text(capsys.readouterr().out)
    again = gpt_ft(capsys, "explain", "--config", str(pairs_dir / "printed.yaml"))
    assert again == gpt_ft(capsys, "explain", "--config", str(config), *asked) and again.startswith("{")
    # the config fit prints (and writes beside a run) reads too: it was refused for its weights_only
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--print_config"])
    (pairs_dir / "fit_printed.yaml").write_text(capsys.readouterr().out)
    assert "weights_only: null" in (pairs_dir / "fit_printed.yaml").read_text()
    assert (
        gpt_ft(capsys, "explain", "--config", str(pairs_dir / "fit_printed.yaml"), "--split", "validation")
        == out
    )


def test_explain_a_checkpoints_data(finetuned, tokenizer_dir, capsys):
    """`--ckpt_path`: the task card, data folder and tokenizer the run recorded, as a fit's own
    arguments give them; an argument given still wins."""
    own = [
        "--data.task",
        str(finetuned.card),
        "--data.tokenizer",
        tokenizer_dir,
        "--data.data_dir",
        str(finetuned.root),
    ]
    for split in ("train", "validation"):
        expected = gpt_ft(capsys, "explain", *own, "--split", split, "--index", "1", "--json", "true")
        ckpt = ["--ckpt_path", str(finetuned.ckpt)]
        shown = gpt_ft(capsys, "explain", *ckpt, "--split", split, "--index", "1", "--json", "true")
        assert shown.strip().splitlines()[-1] == expected.strip().splitlines()[-1]
    with pytest.raises(SystemExit):
        main(["explain", "--ckpt_path", str(finetuned.ckpt), "--data.data_dir", "/nowhere"])
    assert "/nowhere/d/train.tsv: file not found" in capsys.readouterr().err
    logs = f"--trainer.logger.init_args.save_dir={finetuned.logs}"  # `last`: found as validate finds it
    last = gpt_ft(capsys, "explain", "--ckpt_path", "last", logs, "--split", "validation", "--index", "1",
                  "--json", "true")  # fmt: skip
    assert json.loads(last) == json.loads(shown.strip().splitlines()[-1])  # stdout: the example alone
    # a checkpoint's model is read for its context, whatever it started from (a fine-tune's init_from)
    with pytest.raises(SystemExit):
        main(["explain", "--ckpt_path", str(finetuned.ckpt), "--model.init_from", str(finetuned.ckpt),
              "--data.max_length=65"])  # fmt: skip
    assert "--data.max_length 65 is longer than the model's context of 64 tokens" in capsys.readouterr().err


def test_explain_refuses_a_language_models_token_files(tmp_path, tokenizer_dir, capsys):
    from tests.helpers import ROOT, write_corpus

    main(["prepare", "--inputs", str(write_corpus(tmp_path)), "--tokenizer", tokenizer_dir,
          "--out_dir", str(tmp_path / "tokens")])  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(
            [
                "explain",
                "--config",
                str(ROOT / "configs/pretrain/cpu.yaml"),
                f"--data.token_dir={tmp_path / 'tokens'}",
            ]
        )
    assert stopped.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpt-ft: error: gpt-ft explain shows a task's examples (--data.task CARD); a language model's token "
        "files are one stream of tokens, with none."
    )


def test_explain_bad_input_exits_nonzero_with_one_sentence(pairs_dir, tokenizer_dir, capsys):
    card = pairs_dir / "pairs.yaml"
    card.write_text(PAIR_CARD)
    (pairs_dir / "PAIRS/train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    args = ["--data.task", str(card), "--data.tokenizer", tokenizer_dir, "--data.data_dir", str(pairs_dir)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["explain", *args])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1:] == [  # above it, only progress bars
        f"gpt-ft: error: {pairs_dir}/PAIRS/train.tsv, line 2: label 'maybe' in field 'label' is not among "
        "the labels ['entailment', 'not_entailment']."
    ]
    with pytest.raises(SystemExit) as stopped:
        main(["explain", *args, "--index", "7"])
    assert stopped.value.code == 2 and "Traceback" not in capsys.readouterr().err
    # Sequences longer than the preset's context: refused as fit refuses them (they were shown).
    (pairs_dir / "PAIRS/train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(SystemExit) as stopped:
        main(["explain", *args, "--model.preset=gpt-micro", "--model.overrides={n_positions: 16}"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gpt-ft: error: --data.max_length 512 is longer than the model's context of 16 tokens "
        "(n_positions); use at most 16."
    )


# ---- tokenizer, prepare, fit, generate ----


def test_tokenizer_command(tmp_path, capsys):
    corpus = write_corpus(tmp_path)
    out = gpt_ft(
        capsys,
        "tokenizer",
        "--inputs",
        str(corpus),
        "--vocab_size",
        "300",
        "--out_dir",
        str(tmp_path / "tok"),
    )
    assert out.startswith("trained a 300-token byte-level BPE tokenizer into ")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert len(tok) == 300 and tok.convert_tokens_to_ids("<|extract|>") == 3


def test_pretrain_then_finetune_with_only_the_checkpoint_then_generate(
    tmp_path, tokenizer_dir, monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    corpus = write_corpus(tmp_path, n_files=6, lines=60)
    out = gpt_ft(
        capsys,
        "prepare",
        "--inputs",
        str(corpus),
        "--tokenizer",
        tokenizer_dir,
        "--out_dir",
        str(tmp_path / "tokens"),
        "--validation_fraction",
        "0.2",
        "--piece_chars",
        "400",
    )
    assert "train and" in out and "tokens/s" in out
    logs = tmp_path / "runs"
    main(
        [
            "fit",
            "--config",
            "configs/pretrain/cpu.yaml",
            f"--data.token_dir={tmp_path / 'tokens'}",
            "--data.block_size=32",
            "--data.batch_size=8",
            f"--model.overrides={PRETRAIN_MICRO}",
            "--trainer.max_steps=60",
            "--trainer.val_check_interval=20",
            "--model.warmup_steps=5",
            f"--trainer.logger.init_args.save_dir={logs}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch ")]
    losses = [float(ln.split("validation/loss ")[1].split(",")[0].split(" ")[0]) for ln in lines]
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.5, lines
    ckpt = next(logs.rglob("last.ckpt"))
    assert "perf/tokens_per_s" in next(logs.rglob("metrics.csv")).read_text().splitlines()[0]
    assert (ckpt.parent / "tokenizer" / "tokenizer.json").is_file()
    assert torch.load(ckpt, weights_only=True)["tokenizer"] == "tokenizer"
    with pytest.raises(SystemExit):  # a language model's data has no test split
        main(["test", f"--ckpt_path={ckpt}"])
    assert "gpt-ft test reads a task's test split (--data.task CARD); a language model's token files" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):  # a task given to a language model's checkpoint: fine-tune it first
        main(["validate", f"--ckpt_path={ckpt}", f"--data.task={ROOT / 'tasks/glue/sst2.yaml'}"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: {ckpt} is a language model's checkpoint: fine-tune it on the task first "
        f"(gpt-ft fit --model.init_from {ckpt} --data.task CARD)."
    )
    # Scored on other token files and blocks: the options of its data module, as its config names it.
    other = ["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir, "--validation_fraction", "0.5"]
    gpt_ft(capsys, *other, "--out_dir", str(tmp_path / "other"))
    scored = []
    for data in (
        [f"--data.token_dir={tmp_path / 'other'}", "--data.block_size=16"],
        ["--data.class_path=gpt_ft.data.lm_data.LMDataModule"]
        + [f"--data.init_args.token_dir={tmp_path / 'other'}", "--data.init_args.block_size=16"],
    ):
        logs_at = f"--trainer.logger.init_args.save_dir={tmp_path / 'scored'}"  # (not the repository's runs/)
        main(["validate", f"--ckpt_path={ckpt}", *data, "--trainer.enable_progress_bar=false", logs_at])
        scored.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored[0] == scored[1] and scored[0].startswith("validate: validation/loss ")
    assert float(scored[0].split()[2].rstrip(",")) != losses[-1]

    # Fine-tune from the checkpoint alone: model shape and tokenizer come with it.
    data = tmp_path / "d"
    data.mkdir()
    (data / "train.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SENTENCES))
    )
    (data / "dev.tsv").write_text("sentence\tlabel\nThe cat sat on the mat.\t0\n")
    card = tmp_path / "card.yaml"
    card.write_text(
        "class_path: gpt_ft.adapters.SingleText\ninit_args:\n  name: s\n  labels: [a, b]\n"
        "  local: {splits: {train: d/train.tsv, validation: d/dev.tsv}}\n"
    )
    main(
        [
            "fit",
            f"--model.init_from={ckpt}",
            f"--data.task={card}",
            f"--data.data_dir={tmp_path}",
            "--data.max_length=32",
            "--trainer.max_epochs=1",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'ft'}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )
    assert "validation/accuracy" in capsys.readouterr().out
    finetuned = next((tmp_path / "ft").rglob("last.ckpt"))
    pre, post = (torch.load(p, weights_only=True)["state_dict"]["gpt.wpe.weight"] for p in (ckpt, finetuned))
    assert pre.shape == post.shape == (64, 32)
    with pytest.raises(SystemExit):  # a task's checkpoint takes no language model's data options
        main(["validate", f"--ckpt_path={finetuned}", f"--data.token_dir={tmp_path / 'other'}"])
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("Option 'token_dir' is not accepted.")

    for weights in (ckpt, finetuned):
        out = gpt_ft(
            capsys, "generate", "--ckpt_path", str(weights), "--prompt", "The cat", "--max_new_tokens", "12"
        )
        # A continuation follows the prompt (a micro model may well continue with newlines).
        assert out.startswith("The cat") and len(out) > len("The cat\n")
    beam = ["--max_new_tokens", "8", "--num_beams", "3"]
    assert gpt_ft(capsys, "generate", "--ckpt_path", str(ckpt), "--prompt", "The cat", *beam).startswith(
        "The cat"
    )
    sampled = ["--max_new_tokens", "8", "--do_sample", "true", "--top_k", "5", "--temperature", "0.8"]
    assert gpt_ft(capsys, "generate", "--ckpt_path", str(ckpt), "--prompt", "The cat", *sampled).startswith(
        "The cat"
    )


def test_generate_bad_input(tmp_path, capsys, tokenizer_dir):
    """A folder that holds no model says so (before asking for a tokenizer it would not need); a
    model's folder without a tokenizer asks for one; a tokenizer not made for the model, and
    decoding options that do not go together, are refused before anything is printed."""
    from transformers import GPT2Config, GPT2LMHeadModel

    (tmp_path / "empty").mkdir()
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    model.save_pretrained(tmp_path / "model")
    fitting = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=400))
    fitting.save_pretrained(tmp_path / "fits")
    prompt = ["--prompt", "the cat", f"--tokenizer={tokenizer_dir}"]
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "the cat"}\n')
    file = [f"--input={tmp_path / 'prompts.jsonl'}", f"--output={tmp_path / 'out.jsonl'}", prompt[2]]
    expected = {
        ("empty",): f"{tmp_path / 'empty'} is not a transformers model directory: it has no config.json.",
        ("model",): f"{tmp_path / 'model'} carries no tokenizer; give --tokenizer DIR.",
        ("model", *prompt): f"The tokenizer has 400 tokens, GPT-1's framing tokens included, but the "
        f"weights in {tmp_path / 'model'} have 50: they were not made for each other; use the tokenizer "
        "saved with the weights.",
        ("fits", *prompt, "--do_sample=true", "--temperature=0"): "--temperature must be > 0, got 0.0; use "
        "--do_sample false for greedy decoding.",
        ("fits", *prompt, "--do_sample=true", "--num_beams=2"): "Beam search is deterministic: use "
        "--num_beams 1 with --do_sample true.",
        ("fits", *prompt, "--repetition_penalty=0"): "--repetition_penalty must be > 0 (1: none), got 0.0.",
        ("fits", *file, "--do_sample=true", "--top_p=1.5"): "--top_p must be in (0, 1], got 1.5.",
        ("fits", *prompt, '--stop=["x", ""]'): "--stop holds an empty text, which every continuation starts "
        "with: give texts.",
    }
    for (name, *args), message in expected.items():
        with pytest.raises(SystemExit) as stopped:
            main(["generate", "--ckpt_path", str(tmp_path / name), *(args or ["--prompt", "hi"])])
        assert stopped.value.code == 2
        out, err = capsys.readouterr()
        assert err.strip().splitlines()[-1] == f"gpt-ft: error: {message}" and out == ""


def test_beam_search_prints_no_end_token_as_greedy_decoding_prints_none(
    tmp_path, capsys, tokenizer_dir, monkeypatch
):
    """An end-of-turn id a folder's generation_config.json lists may be an ordinary token, which
    `skip_special_tokens` keeps: beam search printed its text (and the padding after) after the
    continuation. The beams' result is given here: a random model's beams seldom end."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gpt_ft import GPT
    from gpt_ft.data.tokenizer import load_tokenizer

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=400)).save_pretrained(tmp_path)
    tok = load_tokenizer(tokenizer_dir)
    body, (end,) = (tok(text, add_special_tokens=False)["input_ids"] for text in (" sat on the", " mat"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": end}))
    seen = []

    def beams(self, ids, **kwargs):
        seen.append(kwargs["eos_token_id"])
        return torch.tensor([[*ids[0].tolist(), *body, end, end]])  # the ended beam, padded with its end

    monkeypatch.setattr(GPT, "generate", beams)
    args = ["generate", f"--ckpt_path={tmp_path}", "--prompt=the cat", f"--tokenizer={tokenizer_dir}"]
    main([*args, "--max_new_tokens=12", "--num_beams=3"])
    assert end in seen[0] and capsys.readouterr().out == "the cat sat on the\n"


def test_generate_penalises_repetition_and_stops_at_a_stop_text(tmp_path, capsys, tokenizer_dir):
    """`--repetition_penalty` decodes as `GPT.generate` does with it (greedy and beam search), and
    `--stop` cuts the continuation where a stop text starts."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gpt_ft import GPT
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.generation import continuation, framing_tokens

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=400)).save_pretrained(tmp_path)
    tok, gpt = load_tokenizer(tokenizer_dir), GPT.from_pretrained(tmp_path)
    prompt = tok("the cat", add_special_tokens=False)["input_ids"]
    args = ["generate", f"--ckpt_path={tmp_path}", "--prompt=the cat", f"--tokenizer={tokenizer_dir}"]
    framing = {"suppress_tokens": framing_tokens(tok, 400)}  # (as the command: never the framing tokens)
    for beams in (1, 3):
        new = gpt.generate(
            torch.tensor([prompt]), max_new_tokens=20, num_beams=beams, repetition_penalty=1.3, **framing
        )
        text = continuation(tok, prompt, new[0, len(prompt) :].tolist())
        plain = continuation(
            tok,
            prompt,
            gpt.generate(torch.tensor([prompt]), max_new_tokens=20, num_beams=beams, **framing)[
                0, len(prompt) :
            ].tolist(),
        )
        assert text != plain
        main([*args, "--max_new_tokens=20", f"--num_beams={beams}", "--repetition_penalty=1.3"])
        assert capsys.readouterr().out == f"the cat{text}\n"
        stop = text[len(text) // 2 : len(text) // 2 + 2]
        main(
            [
                *args,
                "--max_new_tokens=20",
                f"--num_beams={beams}",
                "--repetition_penalty=1.3",
                f"--stop=[{json.dumps(stop)}]",
            ]
        )
        assert capsys.readouterr().out == f"the cat{text[: text.find(stop)]}\n"
    # Sampling's settings without sampling: said, not silently left unread (the text is greedy's)
    main([*args, "--max_new_tokens=20", "--top_p=0.5", "--temperature=0.7"])
    printed = capsys.readouterr()
    greedy = gpt.generate(torch.tensor([prompt]), max_new_tokens=20)[0, len(prompt) :].tolist()
    assert printed.out == f"the cat{continuation(tok, prompt, greedy)}\n"
    assert printed.err.strip().splitlines()[-1] == (
        "note: --temperature, --top_p shape sampling only: greedy decoding reads none of them "
        "(--do_sample true samples)."
    )
    main([*args, "--max_new_tokens=2", "--top_k=5"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "note: --top_k shapes sampling only: greedy decoding does not read it (--do_sample true samples)."
    )


def test_a_continuation_is_decoded_after_its_prompt(tmp_path):
    """GPT-1's decoder spaces the words it joins: the first new word is spaced from the prompt."""
    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.generation import continuation
    from tests.data.test_tokenizer import GPT1_MERGES, GPT1_VOCAB, _write_bpe

    gpt1 = load_tokenizer(_write_bpe(tmp_path / "gpt1", GPT1_VOCAB, GPT1_MERGES))
    hello, world = (gpt1(w, add_special_tokens=False)["input_ids"] for w in ("hello", "world"))
    assert gpt1.decode(world) == "world" and continuation(gpt1, hello, world) == " world"
    assert continuation(gpt1, hello, world + world) == " world world"


TORCHAO_SCRIPT = (
    "import sys\nfrom gpt_ft.cli import main\n"
    "sys.argv = ['gpt-ft', 'explain', '--card', 'none.yaml']  # the program (from Python: levels put back)\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    "import torchao.prototype.mx_formats.config\n"  # what transformers imports of it
)


def start_torchao_import(root):
    from importlib.util import find_spec

    return [Command([sys.executable, "-c", TORCHAO_SCRIPT], cwd=root)] if find_spec("torchao") else []


@pytest.mark.background(start=start_torchao_import)
def test_a_command_that_loads_transformers_models_prints_nothing_of_torchao(background):
    """transformers imports torchao (the quantize extra) where it is installed; under a CPU-only
    torch its import logs kernels it cannot load and deprecated registrations: no command shows them."""
    pytest.importorskip("torchao")
    (run,) = background.runs
    assert "none.yaml" in run.stderr  # the command ran (and failed, in one sentence)
    assert "torchao" not in run.stderr and "register_constant" not in run.stderr, run.stderr


def shown(argv: list[str], capsys) -> dict:
    """What `gpt-ft ARGV --print_config` says the parser read."""
    import yaml

    with pytest.raises(SystemExit) as stop:
        main([*argv, "--print_config"])
    assert stop.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_print_config_with_a_checkpoint_shows_what_the_command_would_run(finetuned, capsys, tmp_path):
    """`validate --ckpt_path CKPT --print_config` (and explain's) shows the checkpoint's recorded
    configuration, as the command would run it (it showed the defaults), what is given winning; a
    checkpoint not there yet previews what is given."""
    ckpt = f"--ckpt_path={finetuned.ckpt}"
    for argv in (["validate", ckpt], ["explain", ckpt]):
        config = shown([*argv, "--data.batch_size=3"], capsys)
        data = config["data"]["init_args"]
        assert data["task"]["class_path"] == "gpt_ft.adapters.SingleText", argv
        assert (data["batch_size"], data["max_length"]) == (3, 64)
        assert config["model"]["preset"] == "gpt-micro"
    config = shown(["validate", f"--ckpt_path={tmp_path / 'later.ckpt'}"], capsys)
    assert config["ckpt_path"] == str(tmp_path / "later.ckpt")
    # `last` is found first (it showed the defaults), the line naming it kept off the YAML.
    logs = f"--trainer.logger.init_args.save_dir={finetuned.logs}"
    config = shown(["validate", "--ckpt_path=last", logs], capsys)
    assert config["model"]["preset"] == "gpt-micro" and config["ckpt_path"] == "last"


def piped(path, text: str):
    """A named pipe at `path` that gives `text` to its first reader and nothing to each later one (a
    shell's `<(...)` is spent after one read), until the block ends."""
    import os
    import threading
    from contextlib import contextmanager

    @contextmanager
    def pipe():
        os.mkfifo(path)
        done = threading.Event()

        def write() -> None:
            path.write_text(text)
            while not done.is_set():
                path.write_text("")

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            yield path
        finally:
            done.set()
            while writer.is_alive():  # its open waits for a reader (perhaps not yet: each try gives one)
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
                writer.join(0.01)

    return pipe()


def test_a_piped_config_is_read_once_whatever_reads_it_again(tmp_path, capsys, monkeypatch):
    """`--config <(envsubst < run.yaml)` is a pipe, which holds its text for one read: it is read
    once, before the parse, so that validate (which reads its configs twice: the first time for the
    checkpoint) takes it too, and a DDP run's other processes its text; its card path is the working
    folder's, as a pipe has none. Validate said "63 is empty", fit "gave no text" for a card path."""
    monkeypatch.chdir(ROOT)
    text = "seed_everything: 3\ndata:\n  task: tasks/glue/sst2.yaml\n"
    with piped(tmp_path / "config", text) as pipe:
        config = shown(["validate", "--config", str(pipe)], capsys)
    assert (
        config["seed_everything"] == 3 and config["data"]["init_args"]["task"]["init_args"]["name"] == "sst2"
    )
    with piped(tmp_path / "empty", "") as pipe, pytest.raises(SystemExit) as stopped:
        main(["fit", f"--config={pipe}"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gpt-ft: error: --config {pipe} is a pipe that gave no text."
    )
    # checked and named as a config file is: a key twice, broken YAML, a bad value, a card's path
    for i, (text, said) in enumerate(
        [
            ("model:\n  lr: 1\n  lr: 2\n", "--config {}, line 3: key 'lr' appears twice."),
            ("model:\n  lr: [1\n", "--config {} is not valid YAML: line 3, column 1: expected ',' or ']', "
             "but got '<stream end>'."),
            ("model:\n  lr: fast\n", "{}: model.lr: expected float, got 'fast'."),
            ("data:\n  task: ../tasks/glue/sst2.yaml\n", "{}: data.task: ../tasks/glue/sst2.yaml does not "
             "exist: a pipe's paths are relative to where gpt-ft runs."),
        ]
    ):  # fmt: skip
        with piped(tmp_path / f"bad{i}", text) as pipe, pytest.raises(SystemExit) as stopped:
            main(["fit", "--config=configs/quickstart.yaml", "-c", str(pipe), "--print_config"])
        assert stopped.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == "gpt-ft: error: " + said.format(pipe)


def test_typed_commands_read_jsonargparse_syntax_as_given(capsys):
    """Nothing rewrites a command line: lists are `[a, b]` (a list of paths or names also takes one
    value), booleans `true`/`false`, and a suite's arguments for every fit are a list."""
    argv = ["suite", "s.yaml", "--out_dir", "o", "--seeds", "[0, 1]", "--data_dir", "glue"]
    argv += [
        "--tasks",
        "[a, b]",
        "--predict",
        "true",
        "--fine_tune",
        "false",
        "--fit_args",
        "[--data.batch_size=2]",
    ]
    got = shown(argv, capsys)
    assert (got["seeds"], got["data_dir"], got["tasks"]) == ([0, 1], "glue", ["a", "b"])
    assert (got["predict"], got["fine_tune"], got["fit_args"]) == (True, False, ["--data.batch_size=2"])
    got = shown(["suite", "s.yaml", "--out_dir", "o", "--data_dir", "[glue, rte=r]"], capsys)
    assert got["data_dir"] == ["glue", "rte=r"]
    got = shown(["prepare", "--inputs", "[a.txt, books]", "--tokenizer", "t", "--out_dir", "o"], capsys)
    assert got["inputs"] == ["a.txt", "books"]
    dataset = ["prepare", "--dataset", "wiki", "--tokenizer", "t", "--out_dir", "o"]
    assert shown(dataset, capsys)["inputs"] == ""  # (none)
    with pytest.raises(SystemExit) as stop:  # a boolean takes its value
        main(["explain", "--config", "configs/quickstart.yaml", "--json"])
    assert stop.value.code == 2
    assert "--json" in capsys.readouterr().err


def test_every_parameter_of_a_command_is_documented():
    """A typed command's `--help` is its docstring: each parameter has its line under `Args:`."""
    import inspect

    from docstring_parser import parse

    from gpt_ft.data.prepare import prepare
    from gpt_ft.data.tokenizer import train_tokenizer
    from gpt_ft.eval.calibration import calibrate
    from gpt_ft.eval.export import export_checkpoint
    from gpt_ft.eval.generation import generate
    from gpt_ft.eval.labelling import label
    from gpt_ft.eval.suite import SuiteRunner

    functions = [generate, prepare, train_tokenizer, label, calibrate, export_checkpoint]
    functions.append(SuiteRunner.__init__)
    for function in functions:
        documented = [p.arg_name for p in parse(function.__doc__).params]
        parameters = [p for p in inspect.signature(function).parameters if p != "self"]
        assert documented == parameters, function.__name__


def test_every_command_lists_its_options_with_their_help(capsys):
    """`gpt-ft X --help` for each command of the table: its usage line, and its options with their
    documentation (explain: fit's options, --model.init_from among them, and its own three)."""
    from gpt_ft.cli.main import COMMANDS

    for name in COMMANDS:
        with pytest.raises(SystemExit) as stop:
            main([name, "--help"])
        assert stop.value.code in (0, None), name
        out = capsys.readouterr().out
        usage = out.splitlines()[0]  # LightningCLI's commands: "usage: gpt-ft [options] fit ..."
        assert usage.startswith("usage: gpt-ft") and f" {name} " in f"{usage} ", name
        assert "--config" in out, name
    main_help = {
        "explain": ["--model.init_from", "--split SPLIT", "Split name, e.g. train, validation.",
                    "Example number within the split.", "Print JSON instead of text."],
        "prepare": ["--inputs", "A text file or a folder of them"],
        "suite": ["--fit_args", "Every `gpt-ft fit`'s extra arguments: a list"],
        # Lightning's descriptions of the Trainer's methods and of LightningDataModule, cut off where
        # their first line ends ("Useful to"), and no word of the data's options: gpt-ft's own
        "fit": ["Train a model: fine-tune it on a task card (--data.task CARD)", "The data: a task's (the "
                "default, TaskDataModule: its options: --data.help TaskDataModule;", "The checkpoint:",
                "The folder of a run's logs and checkpoints (default runs/"],
        "predict": ["Write a checkpoint's predictions for its task's test splits as submission files"],
        "validate": ["Also print Lightning's table of the results (a line of them is printed either way). "
                     "(type: bool, default: False)"],  # gpt_ft's line, not the table
        "test": ["Also print Lightning's table of the results"],
    }  # fmt: skip
    for name, expected in main_help.items():
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # help text wraps
        for text in expected:
            assert text in out, (name, text)
    with pytest.raises(
        SystemExit
    ):  # a dataclass's options: described (its attribute docstrings were not read)
        main(["fit", "--model.lora.help", "LoRA"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--model.lora.rank RANK Rank r of each update B A. (type: int, default: 8)" in out
    with pytest.raises(SystemExit):  # a class inside the data module's: its options named whole (--task.text)
        main(["fit", "--data.task.help", "SingleText"])
    out = capsys.readouterr().out
    assert "--data.task.text TEXT" in out and "--data.task.name NAME" in out and "[--task." not in out


def test_generate_starts_the_prompt_as_the_tokenizer_starts_texts_and_stops_where_the_config_says(
    tokenizer_dir,
):
    """A tokenizer that begins texts with its BOS (Llama's, Gemma's) gets it before the prompt, none
    gets none, and an end-of-text token after the text is never added; decoding stops at the
    tokenizer's end of text and at every one the weights' config lists."""
    from types import SimpleNamespace

    from tokenizers import processors

    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.eval.generation import prompt_ids, stop_tokens

    tok = load_tokenizer(tokenizer_dir)
    bare = tok("the cat", add_special_tokens=False)["input_ids"]
    assert prompt_ids(tok, "the cat") == bare  # this tokenizer adds nothing to a text
    bos, eos = tok.convert_tokens_to_ids(["<|start|>", "<|extract|>"])
    tok.bos_token, tok.eos_token = "<|start|>", "<|extract|>"
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|start|> $A <|extract|>", special_tokens=[("<|start|>", bos), ("<|extract|>", eos)]
    )
    assert tok("the cat")["input_ids"] == [bos, *bare, eos]
    assert prompt_ids(tok, "the cat") == [bos, *bare]
    end = tok.convert_tokens_to_ids("<|endoftext|>")  # where prepared documents end: always a stop
    assert stop_tokens(tok, SimpleNamespace(hf_token_ids=None)) == [eos, end]
    assert stop_tokens(tok, SimpleNamespace(hf_token_ids={"eos": [7, eos, 9]})) == [eos, 7, 9, end]


def test_an_option_given_as_tilde_alone_is_the_home_folder():
    """`--data.data_dir=~`: no shell expands it after `=`, and YAML reads a lone `~` as null (the
    run then read no folder, or logged into ./runs, without a word)."""
    from pathlib import Path

    from gpt_ft.data.folders import piped_configs_read

    home = str(Path.home())
    given = ["--data.data_dir=~", "--trainer.default_root_dir", "~", "--out=~/x", "-c=~", "--model.lr=~",
             "--model.classifier_dropout=~"]  # fmt: skip
    assert piped_configs_read(given) == [f"--data.data_dir={home}", *given[1:]]  # (lr: said as given)
    paths = ["--ckpt_path", "--output", "--trainer.callbacks.dirpath", "--model.init_from"]
    assert piped_configs_read([f"{o}=~" for o in paths]) == [f"{o}={home}" for o in paths]
