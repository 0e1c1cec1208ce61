import pytest
import torch

from gpt_ft import GPT, GPTConfig
from gpt_ft.data.tokenizer import load_tokenizer
from gpt_ft.model.lora import LoRA
from gpt_ft.training.module import GPTModule
from gpt_ft.training.saved import build_gpt, check_tokenizer_fits


def test_the_tokenizer_may_add_only_a_few_special_tokens():
    for vocab in (100, 104, 108):
        check_tokenizer_fits(vocab, 100, "weights")
    for vocab in (99, 109):
        with pytest.raises(ValueError, match=rf"The tokenizer has {vocab} tokens, .* the weights in weights"):
            check_tokenizer_fits(vocab, 100, "weights")
    with pytest.raises(ValueError, match=r"have 530 \(a table has rows no token uses only as released: rou"):
        check_tokenizer_fits(504, 530, "weights")  # (a table of 512 rows would be taken)
    check_tokenizer_fits(504, 512, "weights")


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
    # a field the config lacks: it said "(it has n_layerz=None)", as if it had one
    with pytest.raises(
        ValueError,
        match=r"^Unknown GPTConfig field\(s\) \['n_layerz'\] in --model\.overrides: did you mean 'n_layer'",
    ):
        build_gpt(overrides={"n_layerz": 3}, **kwargs)
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
    with pytest.raises(ValueError, match="^--model.transfer_layers starts blocks afresh, which --model.lora"):
        GPTModule(init_from=str(tmp_path / "pre"), transfer_layers=1, lora=LoRA())


def test_a_lora_checkpoint_on_a_released_table_with_unused_rows_loads_as_it_trained(tmp_path):
    """Qwen2.5's table has rows its tokenizer does not use, and GPT-1's special tokens take three of
    them: the adapters' checkpoint loads back onto the base with the run's vocabulary in the table."""
    from gpt_ft.training.saved import lora_checkpoint
    from gpt_ft.weights.checkpoint import Checkpoint
    from tests.helpers import tiny_llama

    tiny_llama("qwen2", vocab_size=128, tie_word_embeddings=False).save_pretrained(tmp_path / "released")
    base = str(tmp_path / "released")
    gpt = build_gpt(preset="gpt1", overrides=None, init_from=base, transfer_layers=None, vocab_size=100,
                    lora=LoRA(rank=4), new_token_ids=[97, 98, 99])  # fmt: skip
    assert (gpt.config.vocab_size, gpt.config.released_rows) == (100, 128)
    with torch.no_grad():
        for p in gpt.parameters():
            if p.requires_grad:
                p.add_(0.1)  # as if trained
    ids = torch.randint(0, 100, (2, 10))
    with torch.no_grad():
        trained = gpt.eval().lm_logits(gpt(ids))
    stored = Checkpoint({"state_dict": {f"gpt.{k}": v for k, v in gpt.state_dict().items()}})
    stored.gpt_config = vars(gpt.config)
    lora_checkpoint(stored, gpt, LoRA(rank=4), base)
    back = GPT.from_checkpoint(stored).eval()
    with torch.no_grad():
        torch.testing.assert_close(back.lm_logits(back(ids)), trained, rtol=0, atol=1e-5)


def test_a_merged_lora_model_on_a_released_table_keeps_its_unused_rows_as_released(tmp_path):
    """The merged checkpoint (and `merge_lora`) of such a run writes the table whole: the rows past
    the run's vocabulary as the weights released them, not zeros."""
    from gpt_ft.model.lora import merge_lora
    from gpt_ft.training.saved import lora_checkpoint
    from gpt_ft.weights.checkpoint import Checkpoint
    from tests.helpers import tiny_llama

    released = tiny_llama("qwen2", vocab_size=128, tie_word_embeddings=False)
    released.save_pretrained(tmp_path / "released")
    base = str(tmp_path / "released")
    gpt = build_gpt(preset="gpt1", overrides=None, init_from=base, transfer_layers=None, vocab_size=100,
                    lora=LoRA(rank=4, checkpoint="merged"), new_token_ids=[97, 98, 99])  # fmt: skip
    stored = Checkpoint({"state_dict": {f"gpt.{k}": v for k, v in gpt.state_dict().items()}})
    lora_checkpoint(stored, gpt, LoRA(rank=4, checkpoint="merged"), base)
    tables = {"wte": released.get_input_embeddings(), "lm_head": released.get_output_embeddings()}
    tables = {name: module.weight for name, module in tables.items()}
    for name, table in tables.items():
        merged = stored.state[f"gpt.{name}.weight"]
        assert merged.shape == table.shape
        assert torch.equal(merged[100:], table[100:].detach())
    merge_lora(gpt)
    for name, table in tables.items():
        assert torch.equal(getattr(gpt, name).weight[100:], table[100:].detach())


def test_a_checkpoints_data_folders_are_absolute(tmp_path, monkeypatch):
    """Recorded as typed (`--data.data_dir glue`), `gpt-ft validate --ckpt_path X` failed from any
    other working folder; a hub id stays as it is."""
    from gpt_ft.training.recorded import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "glue").mkdir()
    data = {
        "class_path": "x",
        "init_args": {"data_dir": "glue", "tokenizer": "org/tokenizer", "batch_size": 8},
    }
    args = with_absolute_paths(data)["init_args"]
    assert args == {
        "data_dir": str(tmp_path.resolve() / "glue"),
        "tokenizer": "org/tokenizer",
        "batch_size": 8,
    }


def test_refusals_spell_values_as_the_command_line_takes_them():
    """`--model.lora.quantize None` was the advice, which the command line refuses (`null`)."""
    from gpt_ft.training.saved import typed

    assert [typed(v) for v in (None, True, 4, 16.0, "nf4")] == ["null", "true", "4", "16.0", "nf4"]
    assert typed(["attn.c_attn", "mlp.c_fc"]) == "[attn.c_attn, mlp.c_fc]" and typed([]) == "[]"
