"""How the framing tokens' new rows start: random (GPT-1 §3.3), or copied from the tokenizer's own
tokens in those roles (start: beginning of text, delim: newline, extract: end of text), the default
for the Llama family's weights."""

import warnings

import pytest
import torch

from gpt_ft import GPT
from gpt_ft.adapters import SingleText
from gpt_ft.data.tokenizer import load_tokenizer, own_framing_tokens, special_token_ids
from gpt_ft.model.lora import LoRA
from gpt_ft.training.module import GPTModule
from tests.helpers import tiny_hf
from tests.weights.gguf_files import tiny_tokenizer, write_gguf
from tests.weights.test_gguf import tiny

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("new_tokens")
    gpt2 = tiny_hf("gpt2", vocab_size=320, n_positions=64)  # the tiny tokenizer's 320 tokens
    return {
        "llama": write_gguf(folder / "llama.gguf", tiny("llama"), tokenizer=tiny_tokenizer()),
        "gpt2": write_gguf(folder / "gpt2.gguf", gpt2, tokenizer=tiny_tokenizer()),
    }


def module(path, **kwargs) -> GPTModule:
    tok = load_tokenizer(path)
    task = SingleText(name="t", labels=["a", "b"])
    return GPTModule(init_from=str(path), tokenizer=str(path), vocab_size=len(tok), task=task, **kwargs)


@pytest.mark.parametrize("lora", [None, LoRA(rank=2)])
def test_llama_weights_start_the_framing_tokens_from_their_own(weights, lora):
    path = weights["llama"]
    tok = load_tokenizer(path)
    own = own_framing_tokens(tok)
    assert own == {
        "start": tok.convert_tokens_to_ids("<|im_start|>"),
        "delim": tok("\n", add_special_tokens=False).input_ids[0],
        "extract": tok.convert_tokens_to_ids("<|im_end|>"),
    }
    ids = special_token_ids(tok)
    framing = [ids.start, ids.delim, ids.extract]
    sources = [own["start"], own["delim"], own["extract"]]
    embed = lambda m, i: m.gpt.wte.weight[i].detach()  # noqa: E731 (plain or LoRA's TokenRows)
    copied, drawn = module(path, lora=lora), module(path, lora=lora, new_tokens="random")
    torch.testing.assert_close(embed(copied, framing), embed(copied, sources), rtol=0, atol=0)
    assert not torch.equal(embed(drawn, framing), embed(drawn, sources))
    assert embed(drawn, framing).std() < 0.05  # N(0, 0.02)


def test_gpt2_weights_keep_gpt1s_random_rows_unless_told(weights):
    path = weights["gpt2"]
    tok = load_tokenizer(path)
    ids, own = special_token_ids(tok), own_framing_tokens(tok)
    embed = lambda m, i: m.gpt.wte.weight[i].detach()  # noqa: E731
    assert not torch.equal(embed(module(path), [ids.extract]), embed(module(path), [own["extract"]]))
    m = module(path, new_tokens="copied")
    torch.testing.assert_close(embed(m, [ids.start, ids.extract]), embed(m, [own["start"], own["extract"]]))


def test_rows_the_weights_already_have_stay_as_trained(tmp_path):
    """A tokenizer that holds GPT-1's framing tokens already (a model fine-tuned or pretrained with
    them): their rows are the weights', copied or not."""
    from gpt_ft.data.tokenizer import SPECIAL_TOKENS

    framing = tuple(SPECIAL_TOKENS[k] for k in ("start", "delim", "extract"))
    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), tokenizer=tiny_tokenizer(framing))
    tok = load_tokenizer(path)
    assert len(tok) == 320  # nothing added
    ids = special_token_ids(tok)
    rows = [ids.start, ids.delim, ids.extract]
    loaded = GPT.from_pretrained(path).wte.weight[rows].detach()
    for new_tokens in ("copied", "random"):
        m = module(path, new_tokens=new_tokens)
        torch.testing.assert_close(m.gpt.wte.weight[rows].detach(), loaded, rtol=0, atol=0)


def test_mean_starts_the_new_rows_at_the_mean_of_the_loaded_ones(weights):
    path = weights["llama"]
    tok = load_tokenizer(path)
    ids = special_token_ids(tok)
    framing = [ids.start, ids.delim, ids.extract]
    loaded = GPT.from_pretrained(path).wte.weight.detach()
    mean = loaded.double().mean(dim=0).float()  # the weights' rows: the new ones are beyond them
    m = module(path, new_tokens="mean")
    assert min(framing) >= len(loaded)
    for row in framing:
        torch.testing.assert_close(m.gpt.wte.weight[row].detach(), mean, rtol=0, atol=1e-7)
    torch.testing.assert_close(m.gpt.wte.weight[: len(loaded)].detach(), loaded, rtol=0, atol=0)


def test_a_released_tables_rows_the_tokenizer_held_already_stay_as_trained(tmp_path):
    """A released table (rows past its tokenizer's) whose tokenizer holds GPT-1's framing tokens: a
    fine-tuned model written back by `to_hf` and fine-tuned again. Their rows are the weights'; only
    tokens the tokenizer gains start anew (they were all drawn again)."""
    from gpt_ft.data.tokenizer import SPECIAL_TOKENS
    from tests.helpers import tiny_llama

    framing = tuple(SPECIAL_TOKENS[k] for k in ("start", "delim", "extract"))
    tok = tiny_tokenizer(framing)
    assert len(tok) == 320
    folder = tmp_path / "released"
    tiny_llama("qwen2", vocab_size=384, tie_word_embeddings=False).save_pretrained(folder)  # 64 rows unused
    tok.save_pretrained(folder)
    loaded = GPT.from_pretrained(folder).wte.weight.detach()
    rows = tok.convert_tokens_to_ids(list(framing))
    for new_tokens in ("copied", "random", "mean"):
        m = module(folder, new_tokens=new_tokens)
        torch.testing.assert_close(m.gpt.wte.weight[rows].detach(), loaded[rows], rtol=0, atol=0)


@pytest.mark.parametrize("new_tokens", ["random", "mean"])
def test_unused_rows_a_new_token_takes_start_anew_when_the_table_grows_too(tmp_path, new_tokens):
    """A table two rows past its tokenizer, which gains three tokens: the first two take the unused
    rows, which start as new rows do (they kept the table's values, and LoRA froze them)."""
    from tests.helpers import tiny_llama

    tok, folder = tiny_tokenizer(), tmp_path / "table"
    model = tiny_llama("qwen2", vocab_size=322, tie_word_embeddings=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[320:] = 5.0  # the two rows no token uses
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    new = special_token_ids(load_tokenizer(folder))
    rows = [new.start, new.delim, new.extract]
    assert rows == [320, 321, 322]
    loaded = GPT.from_pretrained(folder).wte.weight.detach()
    for lora in (None, LoRA(rank=2)):
        m = module(folder, new_tokens=new_tokens, lora=lora)
        got = m.gpt.wte.weight[rows].detach()
        if new_tokens == "mean":
            torch.testing.assert_close(
                got, loaded[:320].double().mean(0).float().expand(3, -1), rtol=0, atol=1e-6
            )
        else:
            assert got.abs().max() < 1.0  # drawn N(0, 0.02), not the table's 5.0
        trainable = {n for n, p in m.gpt.named_parameters() if p.requires_grad}
        assert lora is None or "wte.new_rows" in trainable and m.gpt.wte.frozen == 320


def test_a_lora_run_on_a_released_table_is_read_again_from_its_checkpoint(tmp_path, capsys):
    """The checkpoint's saved tokenizer holds the tokens the run added: read again, the same rows
    are the new ones (the weights' own tokenizer lacks them), so validate loads its adapters; and
    their order aside, the same lora.targets resume."""
    from gpt_ft.cli import main
    from gpt_ft.model.lora import TARGETS
    from gpt_ft.training.saved import check_lora_resume
    from gpt_ft.weights.checkpoint import Adapters, Checkpoint
    from tests.helpers import make_task, tiny_llama

    card, folder = make_task("single", tmp_path), tmp_path / "released"
    tiny_llama("qwen2", vocab_size=384, tie_word_embeddings=False).save_pretrained(folder)  # 64 rows unused
    tiny_tokenizer().save_pretrained(folder)
    logs = f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"
    main(["fit", f"--data.task={card}", f"--data.data_dir={tmp_path}", "--data.batch_size=2",
          "--data.max_length=32", f"--model.init_from={folder}", "--model.lora.rank=2",
          "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
          logs])  # fmt: skip
    capsys.readouterr()
    main(["validate", "--ckpt_path=last", logs, "--trainer.enable_progress_bar=false"])
    assert "validation/accuracy" in capsys.readouterr().out
    # In Python, as Lightning loads a module: the frozen base weights the checkpoint leaves out are
    # the module's own (init_from's), without a warning listing each one as missing
    from gpt_ft.adapters.cards import load_card

    last = next((tmp_path / "runs").rglob("last.ckpt"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = GPTModule.load_from_checkpoint(last, task=load_card(card))
    assert not [w for w in caught if "state dict" in str(w.message) or "missing" in str(w.message).lower()]
    stored = Checkpoint(torch.load(last, weights_only=False)).state
    assert all(torch.equal(m.state_dict()[k], v) for k, v in stored.items()) and len(stored) < len(
        m.state_dict()
    )
    saved = Checkpoint({})
    saved.adapters = Adapters.of(LoRA(rank=2, targets=list(TARGETS)[:2]), base="b", new_tokens_from=0)
    check_lora_resume(saved, LoRA(rank=2, targets=list(TARGETS)[:2][::-1]), "last.ckpt")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_language_model_alone_scores_the_weights_own_tokens(weights, family):
    """Pretraining or scoring a language model (no task) from released weights: the framing tokens
    added after its vocabulary, which no text holds, take no share of its next-token probabilities
    (copies of `<|im_start|>`, a newline and `<|im_end|>` took half of each of theirs: a perplexity 8%
    too high on text with many newlines), so its LM loss is the weights' own; with a task, every
    row counts (GPT-1's auxiliary loss reads the framing tokens too)."""
    from gpt_ft.training.lm_loss import lm_losses, plain_losses

    path = weights[family]
    alone, tasked = GPTModule(init_from=str(path), tokenizer=str(path)), module(path, new_tokens="copied")
    own = GPT.from_pretrained(str(path)).eval()
    assert alone.gpt.lm_rows == own.config.vocab_size == 320 and tasked.gpt.lm_rows is None
    scratch = GPTModule(
        preset="gpt-micro", tokenizer=str(path)
    )  # from scratch: the same rows (fit, validate)
    assert scratch.gpt.lm_rows == 320 and scratch.gpt.config.vocab_size == len(load_tokenizer(path)) > 320
    newline = load_tokenizer(path)("\n", add_special_tokens=False).input_ids[0]
    ids = torch.tensor([[5, 17, newline, 40, newline, 9, 101, newline]])
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(
            own.lm_logits(own(ids))[0, :-1], ids[0, 1:], reduction="none"
        )
        for m, equal in ((alone, True), (tasked, False)):
            for cpu_chunks in (True, False):  # the chunked CPU loss, and the plain one (GPUs, LoRA)
                gpt = m.gpt.eval()
                hidden = gpt(ids)[0, :-1]
                losses = (lm_losses if cpu_chunks else plain_losses)(gpt, hidden, ids[0, 1:])
                assert torch.allclose(losses, expected, atol=1e-5) == equal
