"""GGUF files in: tiny files of each family and several tensor types, written here, read by gpt_ft
and by transformers' own GGUF loading; the values of each type checked against what was written;
the tokenizer's ids; and the sentence for each file gpt_ft cannot read."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

from gpt_ft import GPT
from gpt_ft.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
from gpt_ft.eval.generation import prompt_ids
from gpt_ft.weights import pretrained as weights
from tests.helpers import tiny_hf, tiny_llama
from tests.weights.gguf_files import (
    CHAT_TEMPLATE,
    K_QUANTS,
    k_quant,
    seed_of,
    tiny_pieces,
    tiny_tokenizer,
    write_gguf,
)

pytest.importorskip("gguf")

VOCAB = 320  # the tiny tokenizer's
GGUF_TRAITS = {  # what GGUF files say of each family (the rest: transformers' defaults, as on load)
    "gemma3_text": dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16, layer_types=None,
                        rope_parameters=None),  # llama.cpp scales by the head size, whatever the config said
    "qwen3": dict(head_dim=128),  # transformers' GGUF loading takes Qwen3Config's default
    "phi3": dict(pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "smollm3": dict(num_hidden_layers=4, no_rope_layers=None),  # llama.cpp's: every fourth layer turns not
}  # fmt: skip


def tiny(family: str, **overrides):
    if family == "gpt2":  # GPT-2's own table sizes: transformers' GGUF loading takes GPT2Config's defaults
        overrides.pop("intermediate_size", None)
        return tiny_hf("gpt2", vocab_size=50257, n_positions=1024, **overrides)
    from tests.helpers import _TRAITS  # the tiny family's traits, GGUF's replacing what GGUF cannot say

    traits = {**_TRAITS.get(family, {}), **GGUF_TRAITS.get(family, {}), "intermediate_size": 64}
    model = tiny_llama(family, vocab_size=VOCAB, **{**traits, **overrides})
    with torch.no_grad():  # norms near one, as trained models have them, so values stay in range
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p)) if family != "gemma3_text" else p.mul_(0.5)
    return model


def transformers_gguf(path):
    """transformers' reading of a GGUF file, told Gemma 3's attention scale (llama.cpp's: 1/sqrt(head
    size)), which it leaves at Gemma3TextConfig's default 256."""
    from transformers import AutoModelForCausalLM

    from gpt_ft.weights.gguf_file import hf_config
    from gpt_ft.workarounds.gguf_files import read_once

    with read_once():  # (SmolLM3's files: read as Llama's)
        config = hf_config(path)
        scale = {"query_pre_attn_scalar": config.head_dim} if config.model_type == "gemma3_text" else {}
        return AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, **scale
        ).eval()


def logits(gpt, ids):
    with torch.no_grad():
        return gpt.lm_logits(gpt(ids))


FAMILIES = ["llama", "qwen2", "qwen3", "gemma3_text", "phi3", "smollm3", "olmo2", "gpt2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_file_gives_the_models_own_logits(tmp_path, family, capfd):
    hf = tiny(family)
    path = write_gguf(tmp_path / f"{family}.gguf", hf)
    capfd.readouterr()
    gpt = GPT.from_pretrained(path).eval()
    assert "GGUF tensors" not in capfd.readouterr().err  # transformers' bar, at every load
    ids = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(logits(gpt, ids), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(logits(gpt, ids), transformers_gguf(path)(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("every", [None, 2])
def test_gemma3s_global_layer_from_a_file(tmp_path, every):
    """Gemma 3 makes every sixth layer global (no window, the global rotary base) unless its file
    says otherwise (`sliding_window_pattern`, as llama.cpp reads it: here every second); a file of 7
    layers is read as the model it was written from has them, past the window."""
    period = every or 6
    kinds = ["sliding_attention" if i % period < period - 1 else "full_attention" for i in range(7)]
    hf = tiny("gemma3_text", num_hidden_layers=7, layer_types=kinds)
    assert hf.config.layer_types == kinds and kinds.count("full_attention") == (1 if every is None else 3)
    assert hf.config.rope_parameters["full_attention"] != hf.config.rope_parameters["sliding_attention"]
    pattern = {"gemma3.attention.sliding_window_pattern": every} if every else None
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "gemma3.gguf", hf, ids=pattern)).eval()
    ids = torch.randint(0, VOCAB, (2, 24))  # three windows long
    with torch.no_grad():
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)


def test_a_sentencepiece_file_that_puts_a_space_first_puts_it_before_every_piece_of_text(
    tmp_path, monkeypatch
):
    """Llama 2's, Mistral's and Phi-3-mini's files: llama.cpp puts a space before each piece of text
    between special or user-defined tokens, and before one that starts with a space, as the models' own
    tokenizer.json does; transformers' conversion put it before the first piece only, and none before a
    space. Read through gpt_ft, each text's ids are the tokenizer's own; and llama.cpp's, where
    llama-cpp-python is installed."""
    from gpt_ft.data.tokenizer import load_tokenizer
    from tests.weights.gguf_files import spaced_pieces

    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    pieces = spaced_pieces()
    path = write_gguf(tmp_path / "llama2.gguf", tiny_llama("llama", vocab_size=448), pieces)
    tokenizer = load_tokenizer(str(path))
    texts = [" leading", "two  spaces", "<start_of_turn>user\nhi there<start_of_turn> x", "\n\nnew", "é ñ 🚀"]
    for text in texts:
        assert tokenizer(text)["input_ids"] == pieces(text)["input_ids"], text
    assert pieces(" hi", add_special_tokens=False).tokens() == ["\u2581\u2581", "h", "i"]  # (two spaces)
    assert tokenizer.decode(tokenizer(texts[0], add_special_tokens=False)["input_ids"]) == texts[0]
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=True, special=True) == pieces(text)["input_ids"], text


def test_a_file_named_for_phi_3_takes_the_whitespace_after_its_added_tokens(tmp_path, monkeypatch):
    """llama.cpp takes the whitespace after every added token of a file whose name holds "phi3" or "phi-3"
    but <unk>, <s> and <|endoftext|>, as Phi-3-mini's tokenizer.json does; read through gpt_ft, such a
    file's tokenizer does too (and llama.cpp's ids are its own where llama-cpp-python is installed); a
    file named otherwise takes none."""
    from gpt_ft.data.tokenizer import load_tokenizer

    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer(specials=["<|endoftext|>", "<s>", "</s>", "<unk>", "<|user|>"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<unk>", "<|user|>"]})
    text = "<|user|>\n the <s> fox </s>  dog<|endoftext|> end"
    for name, stripped in (("Phi3 Mini", True), ("tiny", False)):
        path = write_gguf(tmp_path / f"{name}.gguf", tiny("llama"), tokenizer=tokenizer, name=name)
        read = load_tokenizer(str(path))
        tokens = read.convert_ids_to_tokens(read(text, add_special_tokens=False)["input_ids"])
        after = [tokens[tokens.index(token) + 1] for token in ("<|user|>", "<s>", "</s>", "<|endoftext|>")]
        spaced = [token[0] in "\u0120\u010a" for token in after]  # (GPT-2's bytes: a space, a newline)
        assert spaced == ([False, True, False, True] if stripped else [True] * 4), after
        llama_cpp = pytest.importorskip("llama_cpp")
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        assert (
            llm.tokenize(text.encode(), add_bos=False, special=True)
            == read(text, add_special_tokens=False)["input_ids"]
        )


def test_a_gemma_files_runs_of_spaces_are_read_whole_longest_first(tmp_path, monkeypatch):
    """Gemma's files hold runs of spaces as user-defined tokens, which llama.cpp (and SentencePiece)
    take from the text whole, the longest first, before any merge: nine spaces as four, four and one
    (the space before a word is the word's piece); transformers' conversion merges them by rank, the
    runs of two first. Written again, the runs are user-defined tokens, as read. Where
    llama-cpp-python is installed, its ids for both files are checked too."""
    import gguf

    from gpt_ft.data.tokenizer import load_tokenizer
    from gpt_ft.weights.gguf_write import write_gguf as export_gguf

    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    pieces = tiny_pieces()
    model = tiny_llama("gemma3_text", vocab_size=448, head_dim=16, query_pre_attn_scalar=16)
    path = write_gguf(tmp_path / "gemma.gguf", model, pieces)
    tokenizer = load_tokenizer(str(path))
    four, runs = pieces.convert_tokens_to_ids("\u2581" * 4), [f"x{' ' * n}the" for n in (2, 3, 4, 5, 9)]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in runs]
    x, the, space_the = (pieces.convert_tokens_to_ids(t) for t in ("x", "the", "\u2581the"))
    assert ids[-1] == [x, four, four, space_the] and ids[2] == [x, four, the]
    assert tokenizer.decode(ids[-1]) == "x         the"
    folder = tmp_path / "folder"  # written again (gpt-ft export's way): the runs user-defined, as read
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    fields = gguf.GGUFReader(export_gguf(folder, tmp_path / "again.gguf")).fields
    tokens, kinds = fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.token_type"].contents()
    assert tokens[5:9] == ["\n", "  ", "   ", "    "] and kinds[5:9] == [gguf.TokenType.USER_DEFINED] * 4
    llama_cpp = pytest.importorskip("llama_cpp")
    for file in (path, tmp_path / "again.gguf"):
        llm = llama_cpp.Llama(model_path=str(file), vocab_only=True, verbose=False)
        assert [llm.tokenize(text.encode(), add_bos=False, special=False) for text in runs] == ids


@pytest.mark.parametrize("family", ["gpt2", "phi3"])
def test_sizes_the_metadata_leaves_out_come_from_the_tensors(tmp_path, family):
    """No vocabulary size, no padding id, and for GPT-2 a position table other than 1024: what
    transformers' GGUF loading would take from its config class's defaults is read from the
    tensors (the token embedding's rows, the position table's). GPT-2's MLP width is the file's
    `feed_forward_length` (transformers' reading took 4 x n_embd, and the file was refused)."""
    hf = tiny_hf("gpt2", vocab_size=VOCAB, n_positions=64, n_inner=48) if family == "gpt2" else tiny(family)
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "m.gguf", hf, sizes=False)).eval()
    assert gpt.config.vocab_size == VOCAB
    ids = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "variant", ["phi3.5-longrope", "phi4-mini-partial-longrope-tied", "half-rotary-unscaled"]
)
def test_phi3s_rotary_settings_are_read(variant, tmp_path):
    """llama.cpp writes the features of each head that rotate (Phi-4-mini: three quarters) and
    LongRoPE's factors (tensors), original context and attention factor (Phi-3.5, Phi-4-mini) where
    transformers' GGUF reading does not look: read, the logits are those of the transformers model
    the file was written from, within the original context (16) and past it."""
    from tests.weights.test_hf_phi3 import VARIANTS

    hf = tiny("phi3", **VARIANTS[variant])
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "phi.gguf", hf)).eval()
    assert (gpt.config.rotary_dim, gpt.config.rope_type) == (
        {"phi4-mini-partial-longrope-tied": 6, "half-rotary-unscaled": 4}.get(variant),
        "default" if variant == "half-rotary-unscaled" else "longrope",
    )
    for length in (12, 24):
        ids = torch.randint(0, VOCAB, (2, length))
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)


def test_a_phi3_file_whose_factors_miss_a_pair_is_refused(tmp_path):
    """3 long factors where 4 pairs of each head's features rotate: one sentence (llama.cpp refuses the
    file too), not a broadcasting error from deep in torch."""
    from tests.weights.test_hf_phi3 import VARIANTS

    short = {"rope_factors_long.weight": np.ones(3, dtype=np.float32)}
    path = write_gguf(tmp_path / "phi.gguf", tiny("phi3", **VARIANTS["phi3.5-longrope"]), extra=short)
    with pytest.raises(
        ValueError, match=r"phi.gguf: its rope_factors_long.weight holds 3 factors where 4 pairs"
    ):
        GPT.from_pretrained(path)


def test_a_phi3_file_without_an_attention_factor_scales_by_one(tmp_path, monkeypatch):
    """LongRoPE's factors without `rope.scaling.attn_factor`: llama.cpp scales cos and sin by 1 (its
    default), not by the factor transformers would derive; so does the model read from the file."""
    import gguf

    from tests.weights.test_hf_phi3 import VARIANTS, longrope

    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_scaling_attn_factors", lambda self, value: None)
    variant = VARIANTS["phi4-mini-partial-longrope-tied"]
    path = write_gguf(tmp_path / "phi.gguf", tiny("phi3", **variant))
    gpt = GPT.from_pretrained(path).eval()
    assert gpt.config.rope_scaling["attention_factor"] == 1.0
    rope = longrope(3, partial_rotary_factor=0.75, attention_factor=1.0)
    hf = tiny("phi3", **dict(variant, rope_parameters=rope))
    ids = torch.randint(0, VOCAB, (2, 24))
    torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_ctx, factors", [(512, "short"), (1024, "long")])
def test_llama_cpp_reads_such_a_phi3_file_as_gpt_ft_does(tmp_path, n_ctx, factors):
    """llama.cpp itself (llama-cpp-python, where installed) on a Phi-4-mini-shaped file. It takes
    LongRoPE's long factors wherever its context is longer than the original one (here 512; it gives
    no context under 256), transformers and gpt_ft where a forward pass's positions pass it: with
    either list of factors throughout, gpt_ft's model read from the file gives llama.cpp's logits."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tests.weights.test_hf_phi3 import VARIANTS, longrope

    rope = longrope(3, partial_rotary_factor=0.75, original_max_position_embeddings=512)
    wide = dict(
        VARIANTS["phi4-mini-partial-longrope-tied"], rope_parameters=rope, max_position_embeddings=2048
    )
    path = write_gguf(tmp_path / "phi.gguf", tiny("phi3", **dict(wide, original_max_position_embeddings=512)),
                      tiny_tokenizer())  # fmt: skip
    gpt = GPT.from_pretrained(path).eval()
    scaling = gpt.config.rope_scaling
    gpt.config.rope_scaling = dict(scaling, short_factor=scaling[f"{factors}_factor"])
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, type_k=0, type_v=0
    )
    ids = torch.randint(0, VOCAB, (24,)).tolist()
    llm.eval(ids)
    reference = logits(gpt, torch.tensor([ids]))[0].numpy()
    np.testing.assert_allclose(np.array(llm.scores[: len(ids)]), reference, rtol=0, atol=1e-4)


def test_phi3s_window_is_read_and_scaled_rotary_frequencies_are_refused(tmp_path, monkeypatch):
    """llama.cpp writes Phi-3's sliding window, Llama 3.x's rotary scaling (a `rope_freqs` tensor)
    and Gemma 3's linear scaling (metadata) where transformers' GGUF reading does not look: the
    window is read, and a scaling it would drop is refused rather than computing other logits."""
    import gguf

    from tests.weights import gguf_files

    written = gguf_files._metadata

    def with_extra(extra):
        def metadata(writer, config, model_type, sizes):
            written(writer, config, model_type, sizes)
            extra(writer, config)

        monkeypatch.setattr(gguf_files, "_metadata", metadata)

    hf = tiny("phi3", sliding_window=8)
    with_extra(lambda writer, config: writer.add_sliding_window(8))
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "phi3.gguf", hf)).eval()
    ids = torch.randint(0, VOCAB, (2, 24))  # past the window
    with torch.no_grad():
        assert gpt.config.sliding_window == 8
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)
    rows = lambda c: np.ones(c.hidden_size // c.num_attention_heads // 2, dtype=np.float32)  # noqa: E731
    with_extra(lambda writer, config: writer.add_tensor("rope_freqs.weight", rows(config)))
    with pytest.raises(ValueError, match=r"rotary frequencies are scaled \(a rope_freqs tensor\)"):
        GPT.from_pretrained(write_gguf(tmp_path / "llama3.gguf", tiny("llama")))

    def linear(writer, config):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(8.0)

    with_extra(linear)
    with pytest.raises(ValueError, match=r"rotary frequencies are scaled \(rope scaling 'linear'\)"):
        GPT.from_pretrained(write_gguf(tmp_path / "gemma3.gguf", tiny("gemma3_text")))

    def longrope(writer, config):  # Phi-3-128k's and Phi-3.5's: factor tensors, an attention factor
        writer.add_rope_scaling_attn_factors(1.19)
        for kind in ("long", "short"):
            writer.add_tensor(f"rope_factors_{kind}.weight", rows(config))

    with_extra(longrope)  # (a phi3 file's are read: test_phi3s_rotary_settings_are_read)
    with pytest.raises(ValueError, match=r"rotary frequencies are scaled \(a rope_factors_long tensor\)"):
        GPT.from_pretrained(write_gguf(tmp_path / "longrope.gguf", tiny("llama")))
    with_extra(lambda writer, config: writer.add_rope_scaling_attn_factors(1.19))
    with pytest.raises(ValueError, match=r"rotary frequencies are scaled \(attention factor 1.19\)"):
        GPT.from_pretrained(write_gguf(tmp_path / "phi3-factor.gguf", tiny("phi3")))
    # A factor without a type (llama.cpp reads it as linear), and the older key for it.
    with_extra(lambda writer, config: writer.add_rope_scaling_factor(4.0))
    with pytest.raises(ValueError, match=r"rotary frequencies are scaled \(rope scaling factor 4\)"):
        GPT.from_pretrained(write_gguf(tmp_path / "factor.gguf", tiny("llama")))

    def linear_by_one(writer, config):  # llama.cpp: no scaling at all
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(1.0)

    with_extra(linear_by_one)
    hf = tiny("llama")
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "by-one.gguf", hf)).eval()
    with torch.no_grad():
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)
    with_extra(lambda writer, config: writer.add_float32(f"{writer.arch}.rope.scale_linear", 2.0))
    with pytest.raises(ValueError, match=r"rotary frequencies are scaled \(rope scaling factor 2\)"):
        GPT.from_pretrained(write_gguf(tmp_path / "scale-linear.gguf", tiny("llama")))


def test_a_file_that_rotates_part_of_each_head_is_refused_and_a_missing_head_size_is_the_width_over_heads(
    tmp_path, monkeypatch
):
    """llama.cpp rotates `rope.dimension_count` dimensions of each head (transformers' reading and
    gpt_ft's blocks rotate them all: other logits, silently); a file without `key_length` has
    heads of the width over the head count, llama.cpp's default (transformers' Qwen3 takes 128)."""
    from tests.weights import gguf_files

    written = gguf_files._metadata

    def changing(method, value):  # the writer's `method` writes `value` instead (None: nothing)
        def metadata(writer, config, model_type, sizes):
            write = getattr(type(writer), method)
            setattr(writer, method, lambda given: None if value is None else write(writer, value))
            written(writer, config, model_type, sizes)

        monkeypatch.setattr(gguf_files, "_metadata", metadata)

    changing("add_rope_dimension_count", 4)
    with pytest.raises(ValueError, match=r"partial.gguf: it rotates 4 of each head's 8 dimensions \(rope"):
        GPT.from_pretrained(write_gguf(tmp_path / "partial.gguf", tiny("llama")))
    changing("add_key_length", None)
    hf = tiny("qwen3", head_dim=8)  # 32 wide, 4 heads
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "qwen3.gguf", hf)).eval()
    ids = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)


def test_what_transformers_gguf_reading_takes_from_defaults_is_read_from_the_file(tmp_path):
    """A Qwen3 file's head size (transformers takes Qwen3Config's 128), and a `llama` file named
    "mistral" (transformers reads it as Mistral, with MistralConfig's 4,096-token window and no
    tensor names): its window is the file's (none), its names Llama's."""
    ids = torch.randint(0, VOCAB, (2, 24))
    for family, name in (("qwen3", "tiny"), ("llama", "mistral")):
        hf = tiny(family, head_dim=16) if family == "qwen3" else tiny(family)
        gpt = GPT.from_pretrained(write_gguf(tmp_path / f"{name}.gguf", hf, name=name)).eval()
        assert gpt.config.head_dim == hf.config.head_dim and gpt.config.sliding_window is None
        with torch.no_grad():
            torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)


def test_a_llama_files_biases_are_read_and_a_tensor_with_no_place_is_refused(tmp_path):
    """llama.cpp reads the biases a `llama` file's blocks carry (transformers' reading of its config
    leaves them out: their tensors were dropped); a tensor the model has no place for is refused,
    not dropped."""
    hf = tiny("llama", attention_bias=True, mlp_bias=True)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.3)
    gpt = GPT.from_pretrained(write_gguf(tmp_path / "bias.gguf", hf)).eval()
    ids = torch.randint(0, VOCAB, (2, 24))
    torch.testing.assert_close(logits(gpt, ids), hf(ids).logits.detach(), rtol=0, atol=1e-5)
    half = write_gguf(tmp_path / "half.gguf", tiny("llama", attention_bias=True, mlp_bias=False))
    with pytest.raises(ValueError, match=re.escape(f"{half}: its blocks carry attention biases and no MLP")):
        GPT.from_pretrained(half)
    stray = write_gguf(tmp_path / "stray.gguf", tiny("llama"), extra={"blk.0.attn_q_norm.weight": np.ones(8)})
    with pytest.raises(ValueError, match=re.escape(f"{stray}: 1 of its tensors have no place in the llama")):
        GPT.from_pretrained(stray)


def test_the_end_of_turn_tokens_a_file_names_stop_generation_beside_its_eos(tmp_path):
    """llama.cpp stops at a file's eot and eom tokens too, and at tokens it knows by their text
    (Gemma 3's `<end_of_turn>`, ...): they join the eos ids `generate` and an export stop at."""
    eot = {"tokenizer.ggml.eot_token_id": 7, "tokenizer.ggml.eom_token_id": 9}
    hf = tiny("llama", eos_token_id=2)
    gpt = GPT.from_pretrained(
        write_gguf(tmp_path / "eot.gguf", hf, ids={"tokenizer.ggml.eos_token_id": 2, **eot})
    )
    assert gpt.config.hf_token_ids["eos"] == [2, 7, 9] and gpt.to_hf().config.eos_token_id == [2, 7, 9]
    plain = GPT.from_pretrained(
        write_gguf(tmp_path / "plain.gguf", hf, ids={"tokenizer.ggml.eos_token_id": 2})
    )
    assert plain.config.hf_token_ids["eos"] == 2
    # and at tokens it knows by name: ChatML's <|im_end|>, <|endoftext|>, Phi-3's <|end|> (not typed a
    # control token in Phi-3's files); not at a `</s>` that is no control token (Gemma 3's, which texts
    # spell: HTML's strikethrough)
    tokenizer = tiny_tokenizer(("</s>", "<|end|>"))  # ids 3 and 4, typed as normal tokens
    ids = {"tokenizer.ggml.eos_token_id": 1}
    named = GPT.from_pretrained(write_gguf(tmp_path / "named.gguf", hf, tokenizer, ids=ids))
    assert named.config.hf_token_ids["eos"] == [1, 0, 2, 4]


@pytest.mark.parametrize(
    "family, qtype",
    [("llama", "Q4_1"), ("llama", "Q8_0"), ("qwen2", "Q4_0"), ("qwen3", "F16"), ("gemma3_text", "Q8_0"),
     ("phi3", "Q5_0"), ("gpt2", "BF16"), ("llama", "Q4_K"), ("qwen2", "Q5_K"), ("gemma3_text", "Q6_K")],
)  # fmt: skip
def test_quantized_file_equals_transformers_gguf_loading(tmp_path, family, qtype):
    # K-quants need rows of 256 values: the down projection's (intermediate_size 256) is stored so.
    k = qtype in K_QUANTS
    hf = tiny(family, intermediate_size=256) if k else tiny(family)
    path = write_gguf(
        tmp_path / "m.gguf",
        hf,
        qtype="F32" if k else qtype,
        quantize={"down_proj.weight": qtype} if k else None,
    )
    gpt = GPT.from_pretrained(path).eval()
    ids = torch.randint(0, VOCAB, (2, 24))
    torch.testing.assert_close(logits(gpt, ids), transformers_gguf(path)(ids).logits, rtol=0, atol=1e-5)


# The most a value may move: F16 and BF16 round each value (relative); the block types round to half
# a step of their block's largest magnitude m (Q4_1 and Q5_1 span max - min, at most 2m), but Q4_0
# and Q5_0 clip the end opposite to their largest value by a whole step; their scale d is an F16.
ROUNDING = {"F16": lambda w, m: w.abs() * 2**-11, "BF16": lambda w, m: w.abs() * 2**-8,
            "Q8_0": lambda w, m: m / 127 / 2, "Q4_0": lambda w, m: m / 8, "Q4_1": lambda w, m: 2 * m / 15 / 2,
            "Q5_0": lambda w, m: m / 16, "Q5_1": lambda w, m: 2 * m / 31 / 2}  # fmt: skip
F16_SCALE = 2**-9  # d's (and Q4_1's min's) F16 rounding, times the 15 (31) steps of a block


@pytest.mark.parametrize("qtype", list(ROUNDING))
def test_dequantized_weights_are_the_written_ones_within_rounding(tmp_path, qtype):
    """Written from known floats by gguf's quantizer; each value read back lies within its type's
    rounding of the float it stands for: a wrong dequantization does not."""
    hf = tiny("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf, qtype=qtype)
    gpt = GPT.from_pretrained(path)
    written = hf.model.layers[0].mlp.down_proj.weight.detach()
    read = gpt.h[0].mlp.c_proj.weight.detach()
    rows, cols = written.shape
    block_max = written.reshape(rows, cols // 32, 32).abs().amax(-1, keepdim=True).expand(-1, -1, 32)
    m = block_max.reshape(rows, cols)
    bound = ROUNDING[qtype](written, m) + (0 if qtype in ("F16", "BF16") else m * F16_SCALE)
    assert ((read - written).abs() <= bound + 1e-7).all()
    assert (read != written).any() and (read != 0).any()


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quant_values_are_the_packed_integers_times_their_scales(tmp_path, qtype):
    """K-quant blocks packed by hand from chosen integers and scales: the weights read are exactly
    d·scale·q − dmin·min (Q6_K: d·scale·(q − 32)), computed here without any dequantizer."""
    hf = tiny("qwen2", intermediate_size=256)
    path = write_gguf(tmp_path / "m.gguf", hf, quantize={"down_proj.weight": qtype})
    gpt = GPT.from_pretrained(path)
    name = "model.layers.1.mlp.down_proj.weight"
    _, values = k_quant(qtype, hf.state_dict()[name].numpy(), seed_of(name))
    torch.testing.assert_close(gpt.h[1].mlp.c_proj.weight.detach(), torch.from_numpy(values), rtol=0, atol=0)


def test_tokenizer_ids_equal_the_written_tokenizer_and_transformers_gguf(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    original = tiny_tokenizer()
    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), tokenizer=original)
    ours = load_tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = ["The quick brown fox jumps over the lazy dog.", "  stocks fell; 2024!\nNew line", "zebra émigré"]
    expected_quick = original("The quick", add_special_tokens=False).input_ids
    for text in texts:
        expected = original(text, add_special_tokens=False).input_ids
        assert ours(text, add_special_tokens=False).input_ids == expected
        assert theirs(text, add_special_tokens=False).input_ids == expected
    # The base vocabulary keeps its ids; GPT-1's framing tokens come right after it.
    assert ours.convert_tokens_to_ids(SPECIAL_TOKENS["start"]) == VOCAB
    assert ours.eos_token == "<|im_end|>" and ours.bos_token == "<|im_start|>"
    assert ours.chat_template == CHAT_TEMPLATE
    chat = ours.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    # A tokenizer.json of another vocabulary beside the file is not the file's (it was taken)
    # Llama 3's pre-tokenizer and no add_bos_token key: texts start with the beginning-of-text token,
    # as llama.cpp reads the file (none before); the key, where there is one, says
    for add_bos, lead in [(None, [original.bos_token_id]), (False, [])]:
        bos = write_gguf(
            tmp_path / f"bos-{add_bos}.gguf",
            tiny("llama"),
            tokenizer=original,
            pre="llama-bpe",
            add_bos=add_bos,
        )
        assert prompt_ids(load_tokenizer(bos), "The quick") == lead + expected_quick
    beside = shutil.copytree(tokenizer_dir, tmp_path / "beside")
    write_gguf(beside / "m.gguf", tiny("llama"), tokenizer=original)
    assert len(load_tokenizer(beside / "m.gguf")) == len(ours) != len(load_tokenizer(tokenizer_dir))


# Texts whose pieces llama.cpp's pre-tokenizers split each their own way: camel case, runs of digits,
# contractions, CJK, symbols, runs of spaces and newlines.
SPLIT_APART = ["HelloWorld 123456 don't STOP!!", "it's 12345 tHE Quick's $100 <a>=b",
               "你好世界 a+b=c   spaces\n\n\nlines", "fox's 2024 naïve"]  # fmt: skip


@pytest.mark.parametrize(
    "pre",
    [
        "gpt-2",
        "phi-2",
        "mellum",
        "jina-v2-code",
        "smollm",
        "llama-bpe",
        "qwen2",
        "deepseek-r1-qwen",
        "gpt-4o",
    ],
)
def test_a_byte_level_file_splits_text_as_llama_cpp_does(tmp_path, monkeypatch, pre):
    """Each pre-tokenizer gpt_ft reads gives llama.cpp's ids (llama-cpp-python, where installed), from
    merges learned over pieces that every one of them splits apart."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from gpt_ft.weights import gguf_tokenizer

    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    original = tiny_tokenizer(corpus=SPLIT_APART)
    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), original, pre=pre)
    ours = load_tokenizer(path, add_specials=False)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in SPLIT_APART:
        assert ours(text, add_special_tokens=False).input_ids == llm.tokenize(text.encode(), add_bos=False)


def test_a_pre_tokenizer_gpt_ft_does_not_reproduce_is_refused(tmp_path, monkeypatch):
    """DeepSeek Coder's files (GGUF `llama`) split digits one by one and letters apart from symbols:
    read by GPT-2's pattern (transformers' conversion knows no other for them), "12345" was two
    tokens of the tiny vocabulary where llama.cpp makes five. Refused, with what to give instead."""
    from gpt_ft.weights import gguf_tokenizer

    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "coder.gguf", tiny("llama"), tiny_tokenizer(), pre="deepseek-coder")
    message = (
        r"coder.gguf: llama.cpp splits its text by the pre-tokenizer 'deepseek-coder' \(tokenizer.ggml.pre\)"
    )
    with pytest.raises(ValueError, match=message + ", which gpt_ft's reading of the file does not reproduce"):
        load_tokenizer(path)
    assert len(
        load_tokenizer(write_gguf(tmp_path / "phi2.gguf", tiny("llama"), tiny_tokenizer(), pre="phi-2"))
    )


def test_a_byte_level_file_without_endoftext_gains_no_token_the_model_lacks(tmp_path, monkeypatch):
    """transformers' conversion appends GPT2Tokenizer's default `<|endoftext|>` to a vocabulary
    without one (Llama 3's): the model has no row for it, and a text spelling it got its id."""
    from gpt_ft.weights import gguf_tokenizer

    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    original = tiny_tokenizer(specials=["<|end_of_text|>", "<|im_start|>", "<|im_end|>"])
    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), tokenizer=original)
    ours = load_tokenizer(path, add_specials=False)
    assert len(ours) == len(original) == VOCAB
    text = "a <|endoftext|> b"
    assert (
        ours(text, add_special_tokens=False).input_ids == original(text, add_special_tokens=False).input_ids
    )
    assert load_tokenizer(path).convert_tokens_to_ids(SPECIAL_TOKENS["start"]) == VOCAB


def test_the_special_tokens_are_the_ones_the_file_names_whatever_the_conversion_made_of_them(
    tmp_path, monkeypatch
):
    """transformers 5.17's conversion takes the eos token from the bos id and drops the padding
    token; the ids the file names win, so nothing is added and generation stops where it should."""
    from transformers import AutoTokenizer

    from gpt_ft.weights import gguf_tokenizer

    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), tokenizer=tiny_tokenizer())
    convert = AutoTokenizer.from_pretrained

    def as_transformers_5_17(*args, **kwargs):
        tokenizer = convert(*args, **kwargs)
        tokenizer.eos_token, tokenizer.pad_token = tokenizer.bos_token, None
        return tokenizer

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", as_transformers_5_17)
    gguf_tokenizer._tokenizer.cache_clear()
    try:
        tok = load_tokenizer(path)
    finally:
        gguf_tokenizer._tokenizer.cache_clear()
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert len(tok) == VOCAB + 3  # start, delim, extract: the file's padding token is kept


def test_a_converted_tokenizer_is_kept_in_the_cache(tmp_path, monkeypatch):
    """The second process reads the tokenizer from the cache: the file is not opened again."""
    from gpt_ft.weights import gguf_tokenizer

    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), tokenizer=tiny_tokenizer())
    first = load_tokenizer(path)
    (entry,) = (tmp_path / "cache" / "gguf-tokenizers").iterdir()
    assert entry.name.startswith("m-") and (entry / "tokenizer.json").is_file()
    gguf_tokenizer._tokenizer.cache_clear()  # as in a new process

    def not_again(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(gguf_tokenizer, "open_checked", not_again)
    again = load_tokenizer(path)
    text = "The quick brown fox, 2024!\n"
    assert again(text).input_ids == first(text).input_ids and len(again) == len(first)
    assert again.chat_template == CHAT_TEMPLATE and again.eos_token == first.eos_token
    gguf_tokenizer._tokenizer.cache_clear()
    # Another file under the same name, size and modification time (a copy that kept the time)
    # is another entry: its change time and inode differ.
    monkeypatch.undo()
    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    stat, data = path.stat(), path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    load_tokenizer(path)
    assert len(list((tmp_path / "cache" / "gguf-tokenizers").iterdir())) == 2
    gguf_tokenizer._tokenizer.cache_clear()
    # set as a service sets it, unexpanded (`~/...`): in the home folder, not a folder named `~` here
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(gguf_tokenizer.CACHE, "~/cache")
    assert gguf_tokenizer.cache_dir() == tmp_path / "cache" / "gguf-tokenizers"


def test_a_tokenizer_of_an_architecture_transformers_does_not_read_is_named(tmp_path, monkeypatch):
    """transformers' GGUF reader refuses an architecture it lacks (olmoe) even for the tokenizer
    alone; its message named no file. One it has that gpt_ft lacks (mamba) gives its tokenizer."""
    from gpt_ft.weights import gguf_tokenizer

    monkeypatch.setenv(gguf_tokenizer.CACHE, str(tmp_path / "cache"))
    good = write_gguf(tmp_path / "llama.gguf", tiny("llama"), tokenizer=tiny_tokenizer())
    for arch in ("mamba", "olmoe"):
        (path := tmp_path / f"{arch}.gguf").write_bytes(good.read_bytes().replace(b"llama", arch.encode(), 1))
        if arch == "mamba":
            assert len(load_tokenizer(str(path))) == len(load_tokenizer(str(good)))
            continue
        with pytest.raises(
            ValueError, match=rf"^{re.escape(str(path))}: transformers reads no tokenizer from it \("
        ):
            load_tokenizer(str(path))
    gguf_tokenizer._tokenizer.cache_clear()


def test_the_weights_name_their_tokenizer_and_a_folder_holding_one_file_is_read(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    path = write_gguf(folder / "m-Q8_0.gguf", tiny("llama"), tokenizer=tiny_tokenizer(), qtype="Q8_0")
    assert weights.weights_tokenizer(path) == str(path)
    assert weights.weights_tokenizer(folder) == str(path)
    a, b = GPT.from_pretrained(path).eval(), GPT.from_pretrained(folder).eval()
    ids = torch.randint(0, VOCAB, (1, 12))
    assert torch.equal(logits(a, ids), logits(b, ids))
    assert len(load_tokenizer(folder)) == VOCAB + 3  # start, delim, extract (its pad token is its own)
    bare = write_gguf(tmp_path / "bare.gguf", tiny("llama"))  # no tokenizer in it: the weights name none
    assert weights.weights_tokenizer(bare) is None
    with pytest.raises(ValueError, match=r"bare.gguf carries no tokenizer \(no tokenizer.ggml.tokens\)"):
        load_tokenizer(bare)
    write_gguf(folder / "m-F32.gguf", tiny("llama"))
    with pytest.raises(
        ValueError, match=r"holds several GGUF files \(m-F32.gguf, m-Q8_0.gguf\); name the one"
    ):
        GPT.from_pretrained(folder)


def test_not_gguf_cut_short_foreign_architecture_and_unreadable_type_are_one_sentence(tmp_path):
    good = write_gguf(tmp_path / "m.gguf", tiny("llama"), qtype="Q8_0")
    data = good.read_bytes()

    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file, not a model")
    with pytest.raises(
        ValueError, match=r"model.gguf is not a GGUF file: it does not start with GGUF's magic"
    ):
        GPT.from_pretrained(not_gguf)

    for cut in (len(data) - 1000, 40):
        short = tmp_path / f"short{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"short{cut}.gguf is cut short or corrupt"):
            GPT.from_pretrained(short)
        with pytest.raises(ValueError, match=rf"short{cut}.gguf is cut short or corrupt"):
            load_tokenizer(short)

    for arch in ("mamba", "olmoe"):  # (llama.cpp writes OLMoE, which transformers' GGUF reader lacks)
        foreign = tmp_path / f"{arch}.gguf"
        foreign.write_bytes(data.replace(b"llama", arch.encode(), 1))
        with pytest.raises(
            ValueError, match=rf"holds a '{arch}' model; gpt_ft reads GGUF files of llama, qwen2"
        ):
            GPT.from_pretrained(foreign)


def test_a_type_gguf_cannot_dequantize_is_named(tmp_path, monkeypatch):
    import gguf

    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), qtype="Q4_0")

    def cannot(data, qtype):
        if qtype == gguf.GGMLQuantizationType.Q4_0:
            raise NotImplementedError("Dequantization for Q4_0 is not yet implemented")
        return np.asarray(data)

    monkeypatch.setattr(gguf.quants, "dequantize", cannot)
    with pytest.raises(ValueError, match=r"tensor \S+ is stored as Q4_0, which gguf \S+ cannot dequantize"):
        GPT.from_pretrained(path)


def test_commands_take_a_gguf_file_fit_explain_and_the_classifier(tmp_path, capsys):
    """`gpt-ft explain`, `gpt-ft fit` (LoRA too) and `gpt-ft generate` take a `.gguf` file (the
    tokenizer is the file's); the checkpoint keeps that tokenizer beside it, and `Classifier` loads
    it (a LoRA checkpoint's base weights from the file)."""
    from gpt_ft import Classifier
    from gpt_ft.cli import main
    from gpt_ft.weights.checkpoint import safe_load
    from tests.helpers import make_task

    path = write_gguf(tmp_path / "m.gguf", tiny("llama"), tokenizer=tiny_tokenizer(), qtype="Q8_0")
    card = make_task("single", tmp_path)
    data = [
        f"--data.task={card}",
        f"--data.data_dir={tmp_path}",
        "--data.batch_size=2",
        "--data.max_length=64",
    ]

    capsys.readouterr()
    main(["explain", "--model.lr=1e-4", f"--model.init_from={path}", *data, "--json=true"])
    shown = json.loads(capsys.readouterr().out)
    tok = load_tokenizer(path)
    ids = tok("two dogs run in a park .", add_special_tokens=False).input_ids
    assert shown["sequences"][0]["ids"] == [VOCAB, *ids, VOCAB + 2]  # start, the text, extract

    logs = tmp_path / "logs"
    main(["fit", f"--model.init_from={path}", *data, "--trainer.max_epochs=1", "--seed_everything=0",
          f"--trainer.default_root_dir={logs}", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", f"--trainer.logger.init_args.save_dir={logs}"])  # fmt: skip
    ckpt = next(logs.rglob("*.ckpt"))
    clf = Classifier.from_checkpoint(ckpt, device="cpu")
    assert (
        clf.tokenizer("two dogs run", add_special_tokens=False).input_ids
        == tok("two dogs run", add_special_tokens=False).input_ids
    )
    (outcome,) = clf.predict([{"sentence": "the cat sat on the mat ."}])
    assert outcome["label"] in ("negative", "positive")
    assert sum(outcome["scores"].values()) == pytest.approx(1.0)

    # LoRA on the file's weights: the checkpoint names the file as its base, and loads from it.
    lora = tmp_path / "lora"
    main(["fit", f"--model.init_from={path}", "--model.lora.rank=2", *data, "--trainer.max_epochs=1",
          f"--trainer.default_root_dir={lora}", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", f"--trainer.logger.init_args.save_dir={lora}"])  # fmt: skip
    adapters = next(lora.rglob("last.ckpt"))
    assert safe_load(adapters)["lora"]["base"] == str(path.resolve())
    (outcome,) = Classifier.from_checkpoint(adapters, device="cpu").predict([{"sentence": "the cat sat ."}])
    assert outcome["label"] in ("negative", "positive")

    capsys.readouterr()
    main(["generate", f"--ckpt_path={path}", "--prompt=The quick brown", "--max_new_tokens=3"])
    assert capsys.readouterr().out.startswith("The quick brown")


def test_a_gpt2_file_whose_head_is_a_copy_of_the_embedding_quantized_apart(tmp_path):
    """llama.cpp's GPT-2 files may carry `output.weight`, the embedding's copy, which a quantizer
    stores apart (Q4_K_M: the head Q6_K, the embedding Q4_K): the head is read from it, as llama.cpp
    does (it was refused, "not tied"). A copy left equal keeps the head tied."""
    hf = tiny("gpt2", tie_word_embeddings=False)
    with torch.no_grad():
        hf.lm_head.weight.copy_(hf.transformer.wte.weight)
    ids = torch.randint(0, VOCAB, (2, 16))
    tied = GPT.from_pretrained(write_gguf(tmp_path / "same.gguf", hf)).eval()
    assert tied.config.tie_embeddings and tied.lm_head is None
    path = write_gguf(tmp_path / "apart.gguf", hf, quantize={"lm_head.weight": "Q8_0"})
    import gguf

    from gpt_ft.weights import gguf_file

    assert {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}["output.weight"] == "Q8_0"
    gpt = GPT.from_pretrained(path).eval()
    assert not gpt.config.tie_embeddings
    with torch.no_grad():
        hf.lm_head.weight.copy_(gguf_file.read(path)[1]["lm_head.weight"])  # the head as stored
        assert not torch.equal(hf.lm_head.weight, hf.transformer.wte.weight)
        torch.testing.assert_close(logits(gpt, ids), hf(ids).logits, rtol=0, atol=1e-5)
        again = GPT.from_hf(gpt.to_hf()).eval()  # exported untied, and read back so
        torch.testing.assert_close(logits(again, ids), hf(ids).logits, rtol=0, atol=1e-5)
