import pytest
import torch

from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.model import GPT, GPTConfig
from gpt_ft.model.weights import build_gpt, check_tokenizer_fits, load_weights, resolve_tokenizer
from gpt_ft.training.module import GPTModule


def test_init_from_a_finetuned_checkpoint(finetuned):
    gpt = load_weights(finetuned.ckpt)
    state = torch.load(finetuned.ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(gpt.wte.weight, state["gpt.wte.weight"])


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
    torch.save({"tokenizer": "tokenizer"}, tmp_path / "run.ckpt")
    assert resolve_tokenizer(None, str(tmp_path / "run.ckpt")) == str(tmp_path / "tokenizer")
    torch.save({}, tmp_path / "plain.ckpt")
    assert resolve_tokenizer(None, str(tmp_path / "plain.ckpt"), option=None) is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_tokenizer(None, str(tmp_path / "missing.ckpt"))


def test_the_tokenizer_may_add_only_a_few_special_tokens():
    for vocab in (100, 104, 108):
        check_tokenizer_fits(vocab, 100, "weights")
    for vocab in (99, 109):
        with pytest.raises(ValueError, match=rf"The tokenizer has {vocab} tokens but the weights in weights"):
            check_tokenizer_fits(vocab, 100, "weights")


def test_a_loaded_model_changes_only_its_dropouts(tmp_path):
    config = GPTConfig.from_name("gpt-micro", vocab_size=100, n_layer=1)
    GPT(config).to_hf().save_pretrained(tmp_path / "pre")
    kwargs = dict(preset="gpt1", init_from=str(tmp_path / "pre"), transfer_layers=None, vocab_size=None)
    gpt = build_gpt(overrides={"attn_pdrop": 0.0, "resid_pdrop": 0.3}, **kwargs)
    assert gpt.config.attn_pdrop == 0.0 and gpt.h[0].attn.attn_pdrop == 0.0
    assert gpt.h[0].mlp.dropout.p == 0.3 and gpt.h[0].attn.resid_dropout.p == 0.3
    with pytest.raises(
        ValueError, match=r"overrides.n_layer cannot change a loaded model \(it has n_layer=1\)"
    ):
        build_gpt(overrides={"n_layer": 2}, **kwargs)
    grown = build_gpt(overrides=None, **{**kwargs, "vocab_size": 104})  # room for the special tokens
    assert grown.config.vocab_size == 104


def test_transfer_layers_keeps_the_first_k_blocks(tmp_path, tokenizer_dir):
    config = GPTConfig.from_name("gpt-micro", vocab_size=len(load_tokenizer(tokenizer_dir)), n_layer=3)
    pretrained = GPT(config)
    pretrained.to_hf().save_pretrained(tmp_path / "pre")
    module = GPTModule(init_from=str(tmp_path / "pre"), transfer_layers=1)
    kept, fresh = module.gpt.h[0].state_dict(), module.gpt.h[1].state_dict()
    for key, value in pretrained.h[0].state_dict().items():
        assert torch.equal(kept[key], value), key
    n = config.vocab_size  # (the padding rows are not exported)
    assert torch.equal(module.gpt.wte.weight[:n], pretrained.wte.weight[:n])
    for key, value in pretrained.h[1].state_dict().items():
        if key.endswith("attn.c_attn.weight") or key.endswith("mlp.c_fc.weight"):
            assert not torch.equal(fresh[key], value), key
    assert torch.equal(module.gpt.h[2].ln_1.weight, torch.ones(config.n_embd))  # LayerNorms reset too
    with pytest.raises(ValueError, match=r"Cannot keep 4 of the model's 3 blocks"):
        GPTModule(init_from=str(tmp_path / "pre"), transfer_layers=4)
    with pytest.raises(ValueError, match="transfer_layers needs pretrained weights"):
        GPTModule(preset="gpt-micro", transfer_layers=1)
