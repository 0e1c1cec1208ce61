import pytest
import torch

from gpt_ft import GPT, GPTConfig
from gpt_ft.weights.checkpoint import GPT_CONFIG, GPT_PREFIX, STATE
from gpt_ft.weights.pretrained import resolve_tokenizer

load_weights = GPT.from_pretrained


def test_init_from_a_finetuned_checkpoint(finetuned):
    gpt = load_weights(finetuned.ckpt)
    state = torch.load(finetuned.ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(gpt.wte.weight, state["gpt.wte.weight"])
    assert torch.equal(GPT.from_pretrained(finetuned.ckpt).wte.weight, gpt.wte.weight)


def test_a_checkpoint_file_is_the_config_and_the_prefixed_tensors(tmp_path):
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=100, n_layer=1))
    state = {GPT_PREFIX + k: v for k, v in gpt.state_dict().items()} | {"head.weight": torch.zeros(2, 64)}
    torch.save({GPT_CONFIG: dict(vars(gpt.config)), STATE: state, "other": 1}, tmp_path / "plain.ckpt")
    loaded = GPT.from_pretrained(tmp_path / "plain.ckpt")
    assert loaded.config == gpt.config
    for key, value in gpt.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    with pytest.raises(FileNotFoundError, match=r"Checkpoint \S+missing.ckpt does not exist\."):
        GPT.from_pretrained(tmp_path / "missing.ckpt")


def test_load_weights_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Checkpoint \S+nowhere.ckpt does not exist\."):
        load_weights(tmp_path / "nowhere.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(
        ValueError, match=r"other.ckpt is not a gpt_ft checkpoint: it records no model config"
    ):
        load_weights(tmp_path / "other.ckpt")


def test_resolve_tokenizer_prefers_the_given_one_then_the_weights_own(tmp_path):
    assert resolve_tokenizer("tok", None) == "tok"
    assert resolve_tokenizer("tok", str(tmp_path / "never-read.ckpt")) == "tok"
    assert resolve_tokenizer(None, None, option=None) is None
    with pytest.raises(ValueError, match=r"^no tokenizer; give --tokenizer DIR\.$"):
        resolve_tokenizer(None, None)
    # A transformers directory: its own tokenizer files, if any.
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ValueError, match=rf"^{bare} carries no tokenizer; give --data.tokenizer DIR\.$"):
        resolve_tokenizer(None, str(bare), option="--data.tokenizer")
    assert resolve_tokenizer(None, str(bare), option=None) is None
    (bare / "tokenizer.json").write_text("{}")
    assert resolve_tokenizer(None, str(bare)) == str(bare)
    # A gpt_ft checkpoint: the folder it records, beside it.
    torch.save({"state_dict": {}, "tokenizer": "tokenizer"}, tmp_path / "run.ckpt")
    (tmp_path / "tokenizer").mkdir()
    assert resolve_tokenizer(None, str(tmp_path / "run.ckpt")) == str(tmp_path / "tokenizer")
    # ... unless the file was moved without it: none (not a hub name to look up)
    (tmp_path / "tokenizer").rmdir()
    with pytest.raises(
        ValueError, match=r"run.ckpt carries no tokenizer \(a checkpoint's is the tokenizer folder"
    ):
        resolve_tokenizer(None, str(tmp_path / "run.ckpt"))
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    assert resolve_tokenizer(None, str(tmp_path / "plain.ckpt"), option=None) is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_tokenizer(None, str(tmp_path / "missing.ckpt"))


def test_weights_of_another_shape_than_their_config_says_are_one_sentence():
    """A file whose config misstates a size (a head size a reader took from a default) is named
    with the first tensor that does not fit, not PyTorch's size-mismatch traceback."""
    from gpt_ft.weights.pretrained import build

    config = GPTConfig.from_name("gpt-micro", vocab_size=40, n_positions=16, n_embd=16, n_layer=1)
    state = GPT(config).state_dict()
    state["h.0.attn.c_attn.weight"] = state["h.0.attn.c_attn.weight"][:, :8]
    fits = r"^m.gguf's tensors do not fit the model its config describes: size mismatch for h.0.attn.c_attn"
    with pytest.raises(
        ValueError, match=fits + r".weight: copying a param with shape torch.Size\(\[48, 8\]\)"
    ):
        build(config, state, "m.gguf")
