import pytest
import torch

from gpt_ft import GPT
from tests.helpers import FAMILIES, TINY, hf_families, tiny_gpt, tiny_hf


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_logits_equal_transformers(family, activation):
    key = "afn" if family == "openai-gpt" else "activation_function"
    hf = tiny_hf(family, **{key: activation})
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, TINY["vocab_size"], (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_with_right_padding(family):
    hf = tiny_hf(family)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, TINY["vocab_size"], (3, 30))
    lengths = [30, 17, 5]
    mask = torch.tensor([[1] * n + [0] * (30 - n) for n in lengths])
    with torch.no_grad():
        ours, theirs = gpt.lm_logits(gpt(ids, mask)), hf(ids, attention_mask=mask).logits
    for b, n in enumerate(lengths):
        torch.testing.assert_close(ours[b, :n], theirs[b, :n], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_base_model_hidden_states_equal_transformers(family):
    hf = tiny_hf(family, base=True)
    gpt = GPT.from_hf(hf).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(ids).last_hidden_state, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_to_hf_round_trips_every_tensor(family):
    hf = tiny_hf(family)
    back = GPT.from_hf(hf).to_hf()
    assert type(back) is type(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert torch.equal(theirs[key], ours[key]), key
    assert back.lm_head.weight.data_ptr() == back.transformer.get_input_embeddings().weight.data_ptr()
    assert (back.config.bos_token_id, back.config.eos_token_id) == (0, 0)  # the source's, not 50,256


def test_to_hf_from_scratch_model_matches_logits():
    for pre_ln in (False, True):
        gpt = tiny_gpt(pre_ln=pre_ln)
        hf = gpt.to_hf().eval()
        assert (hf.config.bos_token_id, hf.config.eos_token_id) == (None, None)  # no vocabulary's ids
        ids = torch.randint(0, TINY["vocab_size"], (2, 33))
        with torch.no_grad():
            torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("safe", [True, False])
def test_from_pretrained_local_directory(tmp_path, family, safe):
    hf = tiny_hf(family)
    if safe:
        hf.save_pretrained(tmp_path)
    else:  # transformers 5 writes safetensors only: one pytorch_model.bin, as older repos hold it
        hf.config.save_pretrained(tmp_path)
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    gpt = GPT.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)


def test_from_pretrained_reads_the_shards_its_index_lists(tmp_path):
    """A hub repo with its weights only as `pytorch_model-0000K-of-0000N.bin` shards: exactly those
    its index lists are read, as transformers reads them (the shards of an older save left beside
    them, as a newer revision downloaded into the same folder leaves them, replaced the weights)."""
    import json

    hf = tiny_hf("gpt2")
    hf.config.save_pretrained(
        tmp_path
    )  # transformers 5 writes safetensors only: shards as older repos hold them
    state = hf.state_dict()
    keys = sorted(state)
    stale = {key: torch.randn_like(value) for key, value in state.items()}
    torch.save(stale, tmp_path / "pytorch_model-00001-of-00003.bin")  # an older save's, not listed
    weight_map = {}
    for k, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        name = f"pytorch_model-0000{k + 1}-of-00002.bin"
        torch.save({key: state[key] for key in part}, tmp_path / name)
        weight_map |= dict.fromkeys(part, name)
    index = tmp_path / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    gpt = GPT.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-5)
    (tmp_path / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(FileNotFoundError, match=rf"^{index} lists pytorch_model-00002-of-00002.bin, which "):
        GPT.from_pretrained(tmp_path)
    index.unlink()
    with pytest.raises(FileNotFoundError, match=r"its shards \(pytorch_model-00001-of-00002.bin, ...\) need"):
        GPT.from_pretrained(tmp_path)


def test_integer_weights_load_cast_as_transformers_casts_them(tmp_path):
    """A tensor saved as integers (a rounded or converted file): cast to the other weights' type, as
    transformers does (it was a traceback: integers cannot require gradients)."""
    from safetensors.torch import load_file, save_file

    hf = tiny_hf("gpt2")
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    key = next(k for k in state if k.endswith("mlp.c_fc.weight"))
    state[key] = (state[key] * 100).round().to(torch.int64)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    gpt = GPT.from_pretrained(tmp_path)
    assert gpt.h[0].mlp.c_fc.weight.dtype == torch.float32
    ids = torch.randint(0, TINY["vocab_size"], (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), reference(ids).logits, rtol=0, atol=1e-4)


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        GPT.from_pretrained(tmp_path)
    tiny_hf("gpt2").config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        GPT.from_pretrained(tmp_path)


def test_a_broken_folder_is_one_sentence_naming_its_file(tmp_path):
    """A weights file cut short or not one, a config that is not JSON or of a type not read here,
    an untied causal LM without its head, a config whose sizes the tensors do not fit: one sentence
    each, naming the file (transformers', safetensors' and torch's tracebacks named none; the head
    was drawn at random and the config's whole repr printed)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from tests.helpers import TINY_LLAMA, tiny_llama

    good = tmp_path / "good"
    tiny_llama("llama").save_pretrained(good)  # untied
    whole = (good / "model.safetensors").read_bytes()

    def broken(name: str, edit) -> str:
        folder = tmp_path / name
        shutil.copytree(good, folder)
        edit(folder)
        with pytest.raises(ValueError) as raised:
            GPT.from_pretrained(folder)
        return str(raised.value).replace(str(folder), name)

    cut = broken("cut", lambda f: (f / "model.safetensors").write_bytes(whole[: len(whole) // 2]))
    assert cut.startswith(
        "cut/model.safetensors is not a readable weights file: it is truncated or corrupt ("
    )
    assert "\n" not in cut
    junk = broken("junk", lambda f: (f / "model.safetensors").write_bytes(b"garbage" * 10))
    assert junk.startswith("junk/model.safetensors is not a readable weights file")

    def as_bin(f):
        (f / "model.safetensors").unlink()
        state = load_file(good / "model.safetensors")
        torch.save(state, f / "pytorch_model.bin")
        (f / "pytorch_model.bin").write_bytes((f / "pytorch_model.bin").read_bytes()[:5000])

    assert broken("bin", as_bin).startswith("bin/pytorch_model.bin is not a readable weights file")

    def with_objects(f):
        (f / "model.safetensors").unlink()
        torch.save({**load_file(good / "model.safetensors"), "step": __import__("fractions").Fraction(1, 3)},
                   f / "pytorch_model.bin")  # fmt: skip

    assert broken("objects", with_objects).startswith(
        "objects/pytorch_model.bin holds objects other than tensors and plain values; "
    )
    assert broken("json", lambda f: (f / "config.json").write_text("{not json")) == (
        "json/config.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1))."
    )

    def config(**fields):
        def edit(f):
            values = json.loads((f / "config.json").read_text())
            values.update(fields)
            (f / "config.json").write_text(json.dumps({k: v for k, v in values.items() if v is not None}))

        return edit

    assert broken("type", config(model_type="frobnicator")).startswith(
        "type/config.json: Cannot convert a transformers model of type 'frobnicator'; allowed: 'openai-gpt'"
    )
    # Values transformers' validators refuse (huggingface_hub's errors, over lines, naming no file)
    heads = TINY_LLAMA["num_attention_heads"] + 1
    assert broken("heads", config(num_attention_heads=heads, num_key_value_heads=heads)) == (
        f"heads/config.json: transformers refuses it: The hidden size ({TINY_LLAMA['hidden_size']}) is "
        f"not a multiple of the number of attention heads ({heads})."
    )
    assert broken("words", config(vocab_size="abc")) == (
        "words/config.json: transformers refuses it: Field 'vocab_size' expected int, got str (value: 'abc')."
    )

    def headless(f):
        state = load_file(f / "model.safetensors")
        del state["lm_head.weight"]
        save_file(state, f / "model.safetensors", metadata={"format": "pt"})

    assert broken("head", headless) == (
        "head: lm_head.weight is missing, and the config says the head is untied (tie_word_embeddings)."
    )
    # A vocabulary the table does not have (its last rows were dropped), a head the config ties
    # that is not the embedding (its logits were not transformers'): transformers refuses the first.
    assert broken("vocab", config(vocab_size=TINY_LLAMA["vocab_size"] - 5)) == (
        f"vocab: config.json's vocab_size {TINY_LLAMA['vocab_size'] - 5} does not match the "
        f"{TINY_LLAMA['vocab_size']} rows of the weights' token embedding."
    )
    assert broken("tied", config(tie_word_embeddings=True)) == (
        "tied: The model's lm_head differs from its token embedding, which its config ties "
        "(tie_word_embeddings)."
    )

    def extra_layer(f):  # a layer past the config's: named, not as a q/k/v group missing its k and v
        state = load_file(f / "model.safetensors")
        state["model.layers.7.self_attn.q_proj.weight"] = state[
            "model.layers.0.self_attn.q_proj.weight"
        ].clone()
        save_file(state, f / "model.safetensors", metadata={"format": "pt"})

    assert broken("extra", extra_layer) == (
        "extra does not match the model its config describes (2 layers of width 32): tensors missing: 0 [], "
        "unexpected: 1 ['model.layers.7.self_attn.q_proj.weight']."
    )
    altered = "the config and the weights are not of one model (the file was altered or is damaged)."
    assert broken("layers", config(num_hidden_layers=None)) == (  # transformers' default: 32 layers
        f"layers's config (n_layer) is 32, but its tensors hold 2 layers (blocks 0 to 1): {altered}"
    )
    # Sizes held against the weights before the model is built, or transformers reads the config (a
    # billion layers built for hours; Qwen2's and Gemma 3's configs list each layer's kind)
    assert broken("billion", config(num_hidden_layers=10**9)) == (
        "billion/config.json's num_hidden_layers is 1000000000, but the weights of billion hold 2 layers "
        f"(blocks 0 to 1): {altered}"
    )
    assert broken("wide", config(hidden_size=2**40)) == (
        f"wide/config.json's hidden_size is {2**40}, but the weights of wide hold a token embedding 32 wide "
        f"(model.embed_tokens.weight): {altered}"
    )

    def q_proj(value):
        def edit(f):
            state = load_file(f / "model.safetensors")
            key = "model.layers.0.self_attn.q_proj.weight"
            state[key] = value(state[key])
            save_file(state, f / "model.safetensors", metadata={"format": "pt"})

        return edit

    assert broken("q", q_proj(lambda w: torch.zeros(3, 3))) == (  # (torch.cat's traceback)
        "q: model.layers.0.self_attn.q_proj.weight has shape [3, 3], not [*, 32] as the config's width "
        "(hidden_size) says."
    )
    assert broken("complex", q_proj(lambda w: w.to(torch.complex64))) == (  # (cast, its imaginary part lost)
        "complex: its tensor h.0.attn.c_attn.weight holds complex64 values, not real floating-point ones as "
        "a model's weights are (the file was altered or is damaged)."
    )


def test_models_that_cannot_be_converted():
    from transformers import BertConfig, BertModel, OpenAIGPTConfig

    from gpt_ft.weights.hf import config_from_hf

    bert = BertModel(
        BertConfig(
            vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
        )
    )
    with pytest.raises(ValueError, match="type 'bert'.*allowed: 'openai-gpt'.*'gpt2'"):
        GPT.from_hf(bert)
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        GPT.from_hf(tiny_hf("gpt2", scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ValueError, match=r"OpenAIGPTConfig.afn='tanh' is not supported"):
        config_from_hf(OpenAIGPTConfig(afn="tanh"))


@pytest.mark.parametrize(
    ("family", "activation", "ours"),
    [("openai-gpt", "gelu", "gelu_tanh"), ("gpt2", "gelu_new", "gelu_tanh"), ("gpt2", "gelu", "gelu")],
)
def test_config_from_hf_maps_the_shape_and_the_activation(family, activation, ours):
    from gpt_ft.weights.hf import config_from_hf

    key = "afn" if family == "openai-gpt" else "activation_function"
    config = config_from_hf(tiny_hf(family, **{key: activation}).config)
    assert (config.vocab_size, config.n_positions, config.n_embd, config.n_layer, config.n_head) == (
        101,
        64,
        32,
        2,
        4,
    )
    assert config.activation == ours and config.pre_ln == (family == "gpt2")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_double_heads_folder_loads_as_its_language_model(tmp_path, family):
    """gpt-ft export's multiple-choice folders (and the hub's double-heads models) hold the tied
    embedding under `lm_head.weight` alone, and a choice head transformers' causal-LM class leaves."""
    import transformers

    config_cls = hf_families()[family][0]
    torch.manual_seed(0)
    cls = getattr(transformers, "GPT2DoubleHeadsModel" if family == "gpt2" else "OpenAIGPTDoubleHeadsModel")
    cls(config_cls(**TINY)).save_pretrained(tmp_path)
    gpt = GPT.from_pretrained(tmp_path)
    assert not gpt.training  # as transformers' from_pretrained gives it: dropout off
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(0, TINY["vocab_size"], (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), reference(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["GPT2", "Llama"])
def test_a_sequence_classifier_folder_is_no_language_model(tmp_path, kind):
    """gpt-ft export's folders and hub reward models have a `score` head and no LM head: said so, not
    blamed on an untied head (Llama) or listed as an unexpected tensor (GPT-2)."""
    import transformers

    from tests.helpers import TINY_LLAMA

    config = getattr(transformers, f"{kind}Config")(**(TINY if kind == "GPT2" else TINY_LLAMA), num_labels=3)
    config.pad_token_id = 0
    getattr(transformers, f"{kind}ForSequenceClassification")(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as error:
        GPT.from_pretrained(tmp_path)
    assert str(error.value) == (
        f"{tmp_path} is a sequence classifier ({kind}ForSequenceClassification), not a language model: "
        "start from the model it was fine-tuned from, or its gpt-ft checkpoint."
    )


def test_missing_weights_are_named_by_what_they_would_be(tmp_path):
    from gpt_ft.data.tokenizer import load_tokenizer

    for name, what in (("m.gguf", "GGUF file"), ("m.ckpt", "Checkpoint"), ("m.bin", "Weights")):
        with pytest.raises(FileNotFoundError, match=rf"^{what} {tmp_path / name} does not exist\.$"):
            GPT.from_pretrained(tmp_path / name)
    with pytest.raises(FileNotFoundError, match=rf"^GGUF file {tmp_path / 'm.gguf'} does not exist\.$"):
        load_tokenizer(tmp_path / "m.gguf")
