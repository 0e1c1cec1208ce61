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


def saved_gpt(path, **config):
    """A one-layer micro GPT saved as gpt_ft saves one (its config and its prefixed tensors), with
    `config` written over its recorded fields; the entries, to edit and save again."""
    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=100, n_layer=1))
    entries = {GPT_CONFIG: {**vars(gpt.config), **config}}
    entries[STATE] = {GPT_PREFIX + k: v for k, v in gpt.state_dict().items()}
    torch.save(entries, path)
    return entries


def refusal(path) -> str:
    with pytest.raises(ValueError) as raised:
        GPT.from_pretrained(path)
    return str(raised.value).replace(str(path), "m.ckpt")


ALTERED = "the config and the weights are not of one model (the file was altered or is damaged)."


def test_a_checkpoints_sizes_are_held_against_its_tensors_before_its_model_is_built(tmp_path):
    """A config that misstates the layers or the widths was built first: a billion layers for
    hours, a width past any memory as "out of memory"; now the field is named at once."""
    path = tmp_path / "m.ckpt"
    saved_gpt(path, n_layer=10**9)
    assert (
        refusal(path)
        == f"m.ckpt's gpt_config.n_layer is 1000000000, but its tensors hold 1 layer (block 0): {ALTERED}"
    )
    saved_gpt(path, n_embd=2**40)
    assert refusal(path) == (
        f"m.ckpt's gpt_config.n_embd is {2**40}, but its tensors hold a token embedding 64 wide "
        f"(wte.weight): {ALTERED}"
    )
    saved_gpt(path, vocab_size=10**12)
    assert refusal(path) == (
        "m.ckpt's gpt_config.vocab_size is 1000000000000, but its tensors hold a token embedding of 128 rows "
        f"(wte.weight): {ALTERED}"
    )
    saved_gpt(path, vocab_multiple=10**12)
    assert refusal(path) == (
        "m.ckpt's gpt_config.vocab_multiple is 1000000000000, but its tensors hold a token embedding of 128 "
        f"rows (wte.weight), not 1000000000000: {ALTERED}"
    )
    saved_gpt(path, n_positions=2**60)
    assert refusal(path).startswith(f"m.ckpt's gpt_config.n_positions is {2**60}, but its tensors hold a ")
    for head_size in (2**58, 2**62):  # (no tensor to compare it with: torch's sizes overflow, two ways)
        saved_gpt(path, head_size=head_size)
        assert refusal(path) == (
            "m.ckpt's config describes tensors larger than any memory (past 2**63 bytes): the file was "
            "altered or is damaged."
        )


def test_a_checkpoints_tensors_of_another_shape_or_name_are_one_sentence(tmp_path):
    path = tmp_path / "m.ckpt"
    entries = saved_gpt(path)
    entries[STATE]["gpt.h.0.attn.c_attn.weight"] = torch.zeros(3, 3)
    torch.save(entries, path)
    assert refusal(path) == (
        "m.ckpt's tensors do not fit the model its config describes: size mismatch for "
        "h.0.attn.c_attn.weight: copying a param with shape torch.Size([3, 3]) from checkpoint, the shape in "
        "current model is torch.Size([192, 64])."
    )
    entries = saved_gpt(path)
    entries[STATE]["gpt.h.0.attn.extra"] = entries[STATE].pop("gpt.h.0.attn.c_attn.weight")
    torch.save(entries, path)
    assert refusal(path) == (
        "m.ckpt does not match the model its config describes: tensors missing: 1 "
        "['h.0.attn.c_attn.weight'], unexpected: 1 ['h.0.attn.extra']."
    )


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_a_checkpoints_weights_that_are_not_real_floats_are_refused(tmp_path, dtype):
    """They were cast and used (or a complex one ended in a matmul's traceback)."""
    path = tmp_path / "m.ckpt"
    entries = saved_gpt(path)
    entries[STATE]["gpt.h.0.attn.c_attn.weight"] = entries[STATE]["gpt.h.0.attn.c_attn.weight"].to(dtype)
    torch.save(entries, path)
    assert refusal(path) == (
        f"m.ckpt: its tensor h.0.attn.c_attn.weight holds {str(dtype).removeprefix('torch.')} values, not "
        "real floating-point ones as a model's weights are (the file was altered or is damaged)."
    )


def test_a_lora_checkpoints_vocabulary_is_held_against_the_rows_it_trained(tmp_path):
    """A vocabulary of a trillion tokens grew the base's table to it before anything was compared."""
    config = dict(vars(GPTConfig.from_name("gpt-micro", vocab_size=10**12, n_layer=1)), vocab_multiple=1)
    adapters = {"base": str(tmp_path / "base.ckpt"), "new_tokens_from": 100, "rank": 2, "alpha": 4}
    state = {"gpt.wte.new_rows": torch.zeros(4, 64)}
    torch.save({GPT_CONFIG: config, STATE: state, "lora": adapters}, path := tmp_path / "m.ckpt")
    assert refusal(path) == (
        "m.ckpt's gpt_config.vocab_size is 1000000000000, but its tensors hold 4 rows past the base's 100 "
        f"(wte.new_rows): {ALTERED}"
    )


def test_a_lora_checkpoint_whose_bases_lead_back_to_it_is_one_sentence(tmp_path):
    """Each read the other until Python's recursion limit, reported as a corrupt file."""
    one, two = tmp_path / "one.ckpt", tmp_path / "two.ckpt"
    config = dict(vars(GPTConfig.from_name("gpt-micro", vocab_size=100, n_layer=1)))

    def lora(path, base):
        adapters = {"base": str(base), "new_tokens_from": 100, "rank": 2, "alpha": 4}
        torch.save({GPT_CONFIG: config, STATE: {}, "lora": adapters}, path)

    lora(one, one)
    loop = "holds LoRA adapters whose base weights are"
    tail = (
        ": a chain of LoRA bases that returns to a file already read never reaches whole weights (were they "
        "saved over?); the adapters load only onto the weights they were trained on."
    )
    assert refusal(one) == f"m.ckpt {loop} the checkpoint itself{tail}"
    lora(one, two)
    lora(two, one)
    with pytest.raises(ValueError) as raised:
        GPT.from_pretrained(one)
    assert str(raised.value) == f"{two} {loop} {one}, a checkpoint read before it{tail}"
