"""A language model written as a GGUF file (gpt_ft/weights/gguf_write.py): read back through
transformers' own GGUF loader (which undoes llama.cpp's layout by its own code), the logits are the
model's and the tokenizer's ids its own; each tensor has the type llama.cpp's converter gives it;
what llama.cpp would read otherwise is refused. Where llama-cpp-python is installed, llama.cpp itself
reads the file: its tokens and logits are the model's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import tiny_hf, tiny_llama, tiny_neox
from tests.weights.gguf_files import SPACE, tiny_pieces, tiny_tokenizer

pytest.importorskip("gguf")
FAMILIES = [
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "phi3",
    "smollm3",
    "olmo2",
    "gpt_neox",
]
NOPE = dict(num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0])  # llama.cpp's SmolLM3: every fourth turns not
TEXT = "She said: it's the best film of 2024! The quick brown fox."


def lm_folder(root: Path, family: str, tokenizer=None, **overrides) -> tuple[Path, torch.nn.Module]:
    """A random transformers causal LM of `family` saved with its tokenizer (`tokenizer_of`'s)."""
    if family == "gpt2":
        model = tiny_hf("gpt2", vocab_size=320, **overrides)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.2)
    elif family == "gemma3_text":  # attention scaled by the head size's root (llama.cpp's only way), the
        # first layer sliding a window of 8 with a rotary base of its own, the second not
        bases = {"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                 "full_attention": {"rope_type": "default", "rope_theta": 1e6}}  # fmt: skip
        model = tiny_llama(family, vocab_size=448, **{"query_pre_attn_scalar": 16, "rope_parameters": bases,
                                                      **overrides})  # fmt: skip
    elif family == "gpt_neox":  # (Pythia's blocks: rotary positions on half of each head here)
        model = tiny_neox(vocab_size=320, **overrides)
    else:
        model = tiny_llama(
            family, **{"vocab_size": 320, **(NOPE if family == "smollm3" else {}), **overrides}
        )
    folder = root / family
    model.save_pretrained(folder)
    (tokenizer or tokenizer_of(family)).save_pretrained(folder)
    return folder, model


def tokenizer_of(family: str):
    """Gemma's SentencePiece-style BPE for Gemma 3, a byte-level BPE for the rest."""
    return tiny_pieces() if family == "gemma3_text" else tiny_tokenizer()


def read_back(path: Path, monkeypatch, tmp_path):
    from gpt_ft import GPT
    from gpt_ft.data.tokenizer import load_tokenizer

    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    return GPT.from_pretrained(str(path)).eval(), load_tokenizer(str(path))


@pytest.mark.parametrize("family", FAMILIES)
def test_an_f32_gguf_file_reads_back_as_the_same_model_and_tokenizer(tmp_path, monkeypatch, family):
    from gpt_ft.weights.gguf_write import write_gguf

    folder, model = lm_folder(tmp_path, family)
    path = write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    gpt, tokenizer = read_back(path, monkeypatch, tmp_path)
    ids = tokenizer_of(family)(TEXT, add_special_tokens=False)["input_ids"]
    assert tokenizer(TEXT, add_special_tokens=False)["input_ids"] == ids
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(gpt.lm_logits(gpt(x)), model(x).logits, rtol=0, atol=2e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["cache", family, "m.gguf"]
    )  # no scratch left


@pytest.mark.parametrize(("outtype", "matrix"), [("f16", "F16"), ("bf16", "BF16"), ("q8_0", "Q8_0")])
def test_each_tensor_has_the_type_llama_cpps_converter_gives_it(tmp_path, monkeypatch, outtype, matrix):
    """Norms and biases F32, matrices the chosen type; Q8_0 falls back to F16 for rows that are not
    whole 32-value blocks (the MLP's output matrix here: rows of 40)."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf

    folder, model = lm_folder(tmp_path, "qwen2", intermediate_size=40, tie_word_embeddings=True)
    path = write_gguf(folder, tmp_path / "m.gguf", outtype=outtype)
    reader = gguf.GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert (
        types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == types["blk.1.attn_q.bias"] == "F32"
    )
    assert (
        types["token_embd.weight"] == types["blk.0.attn_q.weight"] == types["blk.1.ffn_up.weight"] == matrix
    )
    assert types["blk.0.ffn_down.weight"] == ("F16" if outtype == "q8_0" else matrix)  # rows of 40
    assert "output.weight" not in types  # tied: llama.cpp reads the embedding as the head
    file_type = {"f16": 1, "bf16": 32, "q8_0": 7}[outtype]
    assert reader.fields["general.file_type"].contents() == file_type
    gpt, _ = read_back(path, monkeypatch, tmp_path)
    ids = torch.tensor([tiny_tokenizer()(TEXT)["input_ids"]])
    with torch.no_grad():
        reference = model(ids).logits
        error = (gpt.lm_logits(gpt(ids)) - reference).abs().max() / reference.abs().max()
    assert error < {"f16": 2e-3, "bf16": 2e-2, "q8_0": 2e-2}[outtype]


def test_the_metadata_is_llama_cpps(tmp_path):
    """The keys llama.cpp's llama architecture reads, with this model's values; the tokenizer as
    llama.cpp's byte-level BPE: tokens by id, special ones control tokens, merges, ids, chat template."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    folder, _ = lm_folder(tmp_path, "llama", tokenizer)
    fields = gguf.GGUFReader(write_gguf(folder, tmp_path / "m.gguf", name="tiny")).fields
    value = {key: field.contents() for key, field in fields.items()}
    assert {k: value[k] for k in ("general.architecture", "general.name", "llama.block_count",
            "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
            "llama.attention.head_count_kv", "llama.context_length", "llama.rope.dimension_count",
            "llama.vocab_size", "tokenizer.ggml.model", "tokenizer.ggml.pre")} == {  # fmt: skip
        "general.architecture": "llama", "general.name": "tiny", "llama.block_count": 2,
        "llama.embedding_length": 32, "llama.feed_forward_length": 48, "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2, "llama.context_length": 64, "llama.rope.dimension_count": 8,
        "llama.vocab_size": 320, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
    }  # fmt: skip
    assert value["llama.rope.freq_base"] == 10000.0
    assert value["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(3e-5, rel=1e-7)  # (a float32)
    assert value["tokenizer.ggml.tokens"][:4] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "!"]
    assert value["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 1]  # control, then normal
    assert len(value["tokenizer.ggml.tokens"]) == 320 and value["tokenizer.ggml.merges"][0].count(" ") == 1
    assert (value["tokenizer.ggml.bos_token_id"], value["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert value["tokenizer.ggml.add_bos_token"] is False
    assert value["tokenizer.chat_template"] == "{{ messages[0]['content'] }}"


PIECE_TEXTS = ["She said: it's  the best Việt\n\nok   four", "Stocks fell sharply;    the market closed",
               " a leading space, and trailing  ", "½ 🚀 \t tabs", "<start_of_turn>user\nhi",
               "five     spaces,\n         nine"]  # fmt: skip


def test_gemmas_sentencepiece_vocabulary_goes_in_as_llama_cpps_llama_model(tmp_path, monkeypatch, caplog):
    """Gemma's tokenizer.json as llama.cpp's SentencePiece model: special tokens control, the newline
    user-defined, bytes as bytes, every other piece (runs of spaces too, which transformers merges as
    pieces: as user-defined tokens, llama.cpp would take the longest first) scored minus its rank
    (llama.cpp merges the best-scored pair: the order of the merges); no space put first, bos added.
    Read back, the tokenizer is the same, and written again from what was read, the file's vocabulary
    is the same; llama.cpp (where installed) reads each text into the tokenizer's own ids."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf

    folder, model = lm_folder(tmp_path, "gemma3_text")
    path = write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    assert not [r for r in caplog.records if r.name == "gguf.vocab"]  # (its guess at Gemma's pair template)
    value = {key: field.contents() for key, field in gguf.GGUFReader(path).fields.items()}
    tokens, types = value["tokenizer.ggml.tokens"], value["tokenizer.ggml.token_type"]
    scores = value["tokenizer.ggml.scores"]
    assert (value["tokenizer.ggml.model"], value["tokenizer.ggml.pre"]) == ("llama", "default")
    assert value["tokenizer.ggml.add_space_prefix"] is False and value["tokenizer.ggml.add_bos_token"] is True
    assert [value[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eos", "unknown", "padding")] == [
        2,
        1,
        3,
        0,
    ]
    runs = [SPACE * n for n in (2, 3, 4)]  # (pieces: spaces as "\u2581")
    assert tokens[:9] == ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\n", *runs]
    assert types[:6] == [3] * 5 + [4] and scores[:6] == [-1000.0] * 6  # control, user-defined
    assert tokens[9:265] == [f"<0x{b:02X}>" for b in range(256)] and set(types[9:265]) == {6}
    assert set(scores[9:265]) == {0.0}
    normal = [i for i, kind in enumerate(types) if kind == 1]
    assert normal == [6, 7, 8, *range(265, 409)]
    assert [scores[i] for i in normal] == [-float(r) for r in range(147)]
    assert (tokens[409], types[409]) == ("<mask>", 3)
    assert tokens[410:] == [f"[PAD{i}]" for i in range(410, 448)] and set(types[410:]) == {5}  # unused
    pieces = tiny_pieces()
    gpt, tokenizer = read_back(path, monkeypatch, tmp_path)
    for text in PIECE_TEXTS:
        assert tokenizer(text)["input_ids"] == pieces(text)["input_ids"], text
    again = tmp_path / "again"
    model.save_pretrained(again)
    tokenizer.save_pretrained(again)
    second = gguf.GGUFReader(write_gguf(again, tmp_path / "again.gguf", outtype="f32")).fields
    for key in ("tokens", "token_type", "scores"):
        assert second[f"tokenizer.ggml.{key}"].contents() == value[f"tokenizer.ggml.{key}"], key
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in PIECE_TEXTS:
        ids = pieces(text, add_special_tokens=False)["input_ids"]
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids, text
        ids = pieces(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids, text


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_llama_2s_sentencepiece_vocabulary_puts_a_space_before_each_text(tmp_path, monkeypatch, family):
    """Llama 2's, Mistral's, TinyLlama's and Phi-3-mini's tokenizer.json (SentencePiece's BPE, a space
    put before each piece of text between added tokens) as llama.cpp's SentencePiece model with its
    `add_space_prefix`: read back, and by llama.cpp where installed, each text's ids are the
    tokenizer's own."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf
    from tests.weights.gguf_files import spaced_pieces

    pieces = spaced_pieces()
    folder, _ = lm_folder(tmp_path, family, pieces, vocab_size=448)
    path = write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    fields = gguf.GGUFReader(path).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    assert fields["tokenizer.ggml.add_space_prefix"].contents() is True
    _, tokenizer = read_back(path, monkeypatch, tmp_path)
    texts = [*PIECE_TEXTS, " x", "<start_of_turn> x\n y"]
    from transformers import AutoTokenizer

    folder_tokenizer = AutoTokenizer.from_pretrained(folder)  # (the folder as it loads: as written)
    for text in texts:
        assert (
            tokenizer(text)["input_ids"] == pieces(text)["input_ids"] == folder_tokenizer(text)["input_ids"]
        )
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=True, special=True) == pieces(text)["input_ids"], text


def test_gemma_3s_window_logit_cap_and_older_configs(tmp_path, monkeypatch):
    """Gemma 3's keys as llama.cpp reads them: the window, the layers that slide it (here the first
    of two, where llama.cpp's default slides both), their rotary base; a config from before
    `layer_types` (a period, `sliding_window_pattern`) gives the same layers. A final logit cap goes
    in as llama.cpp's key, and reading such a file back is refused, as gpt_ft's Gemma has no cap."""
    import gguf

    from gpt_ft import GPT
    from gpt_ft.weights.gguf_write import write_gguf

    def keys(folder):
        fields = gguf.GGUFReader(write_gguf(folder, tmp_path / f"{folder.parent.name}.gguf")).fields
        return {k.removeprefix("gemma3."): f.contents() for k, f in fields.items() if k.startswith("gemma3.")}

    folder, _ = lm_folder(tmp_path / "a", "gemma3_text")
    written = keys(folder)
    assert (written["attention.sliding_window"], written["rope.freq_base_swa"]) == (8, 500.0)
    assert written["attention.sliding_window_pattern"] == [True, False] and written["rope.freq_base"] == 1e6
    config = json.loads((folder / "config.json").read_text())
    del config["layer_types"]
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window_pattern": 2}))
    assert keys(folder)["attention.sliding_window_pattern"] == [True, False]
    folder, _ = lm_folder(tmp_path / "c", "gemma3_text", final_logit_softcapping=30.0)
    assert keys(folder)["final_logit_softcapping"] == 30.0
    monkeypatch.setenv("GPT_FT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"c\.gguf: .*final_logit_softcapping=30\.0 is not supported"):
        GPT.from_pretrained(str(tmp_path / "c.gguf"))


def test_ids_the_tokenizer_lacks_are_unused_tokens(tmp_path, monkeypatch):
    """A model wider than its tokenizer (embeddings padded to 336): llama.cpp's list has every id, the
    ones past the tokenizer's `[PAD{id}]` of the unused type, as llama.cpp's converter writes them."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf

    folder, _ = lm_folder(tmp_path, "qwen3")
    config = json.loads((folder / "config.json").read_text())
    model = tiny_llama("qwen3", vocab_size=336)
    model.save_pretrained(folder)
    assert (
        config["vocab_size"] == 320 and json.loads((folder / "config.json").read_text())["vocab_size"] == 336
    )
    fields = gguf.GGUFReader(write_gguf(folder, tmp_path / "m.gguf", outtype="f32")).fields
    tokens, types = fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == 336 and tokens[320:] == [f"[PAD{i}]" for i in range(320, 336)]
    assert set(types[320:]) == {gguf.TokenType.UNUSED}


def test_what_llama_cpp_would_read_otherwise_is_refused(tmp_path, monkeypatch):
    """GPT-1, SmolLM3 turning other layers or with biases, OLMo 3, a pre-tokenizer llama.cpp has no
    name for, a window, a scaling, a type: one sentence each, and no file (nor scratch) left."""
    import gguf
    from safetensors.torch import load_file, save_file
    from tokenizers import Regex, pre_tokenizers

    from gpt_ft.weights.gguf_vocab import LLAMA3_SPLIT
    from gpt_ft.weights.gguf_write import write_gguf

    def refused(folder) -> str:
        with pytest.raises(ValueError) as error:
            write_gguf(folder, tmp_path / "m.gguf")
        assert not list(tmp_path.glob("*.gguf*")) and not list(tmp_path.glob(".m.gguf*"))
        return str(error.value)

    gpt1 = tmp_path / "gpt1"
    tiny_hf("openai-gpt", vocab_size=320).save_pretrained(gpt1)
    assert "of a 'openai-gpt' model" in refused(gpt1)
    smollm3 = tmp_path / "smollm3"  # llama.cpp's turns no fourth layer, whatever the model's nope_layers
    tiny_llama("smollm3", vocab_size=320).save_pretrained(smollm3)
    assert refused(smollm3) == (
        "llama.cpp's smollm3 models take no rotary positions in every 4th layer (3, 7, ... counting from 0) "
        "and in no other; this one in layers [1] (no_rope_layers)."
    )
    folder, _ = lm_folder(tmp_path / "n", "smollm3", attention_bias=True, mlp_bias=True)
    assert (
        refused(folder)
        == "llama.cpp's smollm3 models have no attention biases; this one has attention_bias=True."
    )
    from tests.weights.gguf_files import spaced_pieces

    user = spaced_pieces()  # a token added as transformers adds one: matched in the normalized text, after
    user.add_tokens(["<tool>"])  # the "▁" put first ("<tool> x": "<tool>", "▁x"), where llama.cpp matches it
    folder, _ = lm_folder(tmp_path / "u", "llama", user, vocab_size=448)  # as written ("▁", "<tool>", "▁▁x")
    assert "added token '<tool>' has normalized, and llama.cpp takes no whitespace beside" in refused(folder)
    olmo3 = tmp_path / "olmo3"  # (llama.cpp's olmo2 lacks its window)
    tiny_llama("olmo3", vocab_size=320).save_pretrained(olmo3)
    assert "of a 'olmo3' model" in refused(olmo3)
    bert_like = tiny_tokenizer()
    bert_like.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder, _ = lm_folder(tmp_path / "w", "llama", bert_like)
    assert refused(folder).startswith(f"{folder}: llama.cpp has no pre-tokenizer this toolkit can name")
    spaced = tiny_tokenizer()  # GPT-2's pattern after a space llama.cpp would not add
    spaced.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    folder, _ = lm_folder(tmp_path / "p", "llama", spaced)
    assert refused(folder).startswith(f"{folder}: llama.cpp has no pre-tokenizer this toolkit can name")
    folder, _ = lm_folder(tmp_path / "s", "mistral", sliding_window=16)
    assert (
        refused(folder)
        == "llama.cpp's mistral models attend to every earlier token; this one slides a window."
    )
    folder, _ = lm_folder(tmp_path / "y", "qwen2", rope_parameters={"rope_type": "yarn", "factor": 2.0})
    assert refused(folder) == (
        "This qwen2 model's rotary scaling 'yarn' (rope_parameters) has no GGUF form here (default, linear)."
    )
    folder, _ = lm_folder(tmp_path / "t", "llama")
    state = load_file(folder / "model.safetensors")
    save_file({**state, "model.extra.weight": torch.ones(2, 2)}, folder / "model.safetensors")
    assert refused(folder) == f"{folder}: tensor model.extra.weight has no place in llama.cpp's llama layout."
    (folder / "model.safetensors").unlink()
    save_file(state, folder / "model.safetensors")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:  # a disk that fills while the tensors go out: no partial file
        patched.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
        with pytest.raises(OSError, match="No space left"):
            write_gguf(folder, tmp_path / "m.gguf")
    assert not list(tmp_path.glob("*.gguf*")) and not list(tmp_path.glob(".m.gguf*"))
    folder, _ = lm_folder(tmp_path / "b", "qwen3", attention_bias=True)
    assert (
        refused(folder)
        == "llama.cpp's qwen3 models have no attention biases; this one has attention_bias=True."
    )
    folder, _ = lm_folder(tmp_path / "a", "gpt2", scale_attn_weights=False)
    assert refused(folder).startswith(
        "llama.cpp's gpt2 models divide attention scores by the head size's root"
    )
    removed = tiny_tokenizer()  # a split whose matches are dropped, not kept apart
    cut = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="removed")
    removed.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [cut, pre_tokenizers.ByteLevel(use_regex=False)]
    )
    removed.backend_tokenizer.model.ignore_merges = True
    folder, _ = lm_folder(tmp_path / "r", "llama", removed)
    assert refused(folder).startswith(f"{folder}: llama.cpp has no pre-tokenizer this toolkit can name")
    past = tiny_tokenizer()  # 320 tokens for a model of 300 rows, its eos one of the 20 without a row
    past.eos_token = past.convert_ids_to_tokens(310)
    folder, _ = lm_folder(tmp_path / "v", "llama", past)
    tiny_llama("llama", vocab_size=300).save_pretrained(folder)
    assert refused(folder) == (
        f"{folder}: the tokenizer's eos token {past.eos_token} (id 310) is past the model's 300 ids: the "
        "model has no row for it."
    )
    folder, _ = lm_folder(tmp_path / "g", "gemma3_text", query_pre_attn_scalar=12)
    assert refused(folder) == (
        "llama.cpp's gemma3_text models of 2 layers divide attention scores by the root of 16; this one by "
        "the root of 12 (query_pre_attn_scalar)."
    )
    first = tiny_pieces()  # a space put before the first piece of text only, and none before a space
    first.backend_tokenizer.normalizer = None
    first.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    folder, _ = lm_folder(tmp_path / "l", "gemma3_text", first)
    assert refused(folder).startswith(f"{folder}: llama.cpp has no pre-tokenizer this toolkit can name")
    with pytest.raises(ValueError, match="--gguf_type 'q4_0': choose one of f32, f16, bf16, q8_0"):
        write_gguf(folder, tmp_path / "m.gguf", outtype="q4_0")


def test_llama_3s_rotary_scaling_travels_as_llama_cpps_frequency_factors(tmp_path, monkeypatch):
    """Llama 3's scaled rotary positions: llama.cpp reads them as `rope_freqs.weight`, the divisor of
    each frequency; transformers' GGUF loader ignores that tensor, so the factors are checked
    against transformers' own Llama 3 frequencies."""
    import gguf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from gpt_ft.weights.gguf_write import write_gguf

    scaling = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    folder, model = lm_folder(tmp_path, "llama", rope_parameters=scaling)
    reader = gguf.GGUFReader(write_gguf(folder, tmp_path / "m.gguf", outtype="f32"))
    factors = torch.tensor(np.array(next(t for t in reader.tensors if t.name == "rope_freqs.weight").data))
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    plain = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    torch.testing.assert_close(plain / factors, inv_freq.float(), rtol=1e-6, atol=0)
    assert factors.min() > 1.0 and factors.max() == 8.0  # (scaled, the slowest by the whole factor)
    config = json.loads((folder / "config.json").read_text())  # as older files name the kind: `type`
    config["rope_parameters"]["type"] = config["rope_parameters"].pop("rope_type")
    (folder / "config.json").write_text(json.dumps(config))
    again = gguf.GGUFReader(write_gguf(folder, tmp_path / "old.gguf", outtype="f32"))
    np.testing.assert_array_equal(
        next(t for t in again.tensors if t.name == "rope_freqs.weight").data, factors
    )


PHI_VARIANTS = ["phi4-mini-partial-longrope-tied", "longrope-factor-and-attention-factor-given",
                "half-rotary-unscaled"]  # fmt: skip


@pytest.mark.parametrize("variant", PHI_VARIANTS)
def test_phi_3s_rotary_settings_and_window_travel_as_llama_cpp_reads_them(tmp_path, monkeypatch, variant):
    """Phi-3.5's and Phi-4-mini's settings (the features of each head that rotate, LongRoPE's factors
    as two tensors, its original context, attention factor and window) read back by gpt_ft give the
    model's logits, within the original context (16 tokens) and past it (24). llama.cpp itself
    (where installed) takes the long factors from the first token, its context (256 at least) being
    longer than the original: its logits are those of the model with the long factors throughout."""
    from gpt_ft.weights.gguf_write import write_gguf
    from tests.weights.test_hf_phi3 import VARIANTS

    folder, model = lm_folder(tmp_path, "phi3", **VARIANTS[variant])
    path = write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    gpt, _ = read_back(path, monkeypatch, tmp_path)
    ids = torch.randint(0, 320, (1, 24))
    with torch.no_grad():
        for length in (16, 24):
            x = ids[:, :length]
            torch.testing.assert_close(gpt.lm_logits(gpt(x)), model(x).logits, rtol=0, atol=2e-5)
    llama_cpp = pytest.importorskip("llama_cpp")
    rope = model.config.rope_parameters
    if rope.get("rope_type") == "longrope":  # the same weights, the long factors throughout
        model = lm_folder(tmp_path / "long", "phi3", **dict(VARIANTS[variant], rope_parameters=dict(
            rope, short_factor=rope["long_factor"])))[1]  # fmt: skip
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, type_k=0, type_v=0)
    llm.eval(ids[0].tolist())
    with torch.no_grad():
        reference = model(ids).logits[0].numpy()
    np.testing.assert_allclose(np.array(llm.scores[:24]), reference, rtol=0, atol=1e-4)


def test_phi_3_5s_own_config_holds_its_original_context_outside_its_rotary_settings(tmp_path):
    """Phi-3.5's released config.json: `rope_scaling` {type, long and short factors} with the original
    context beside it, at the top level. The file says 16 (and the attention factor of 64 over 16),
    as transformers reads it; before, the whole context (64) and a factor of 1."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf
    from tests.weights.test_hf_phi3 import VARIANTS

    folder, model = lm_folder(tmp_path, "phi3", **VARIANTS["phi3.5-longrope"])
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_scaling"] = {
        "type": "longrope",
        "long_factor": rope["long_factor"],
        "short_factor": rope["short_factor"],
    }
    config["rope_theta"] = rope["rope_theta"]
    (folder / "config.json").write_text(json.dumps(config))
    fields = gguf.GGUFReader(write_gguf(folder, tmp_path / "m.gguf", outtype="f32")).fields
    assert fields["phi3.rope.scaling.original_context_length"].contents() == 16
    assert fields["phi3.rope.scaling.attn_factor"].contents() == pytest.approx(
        (1 + np.log(4) / np.log(16)) ** 0.5
    )
    # Phi-4-mini's share of each head given inside `rope_scaling`, as older configs hold it: 6 of 8 turn
    folder, _ = lm_folder(tmp_path / "inside", "phi3", **VARIANTS["phi4-mini-partial-longrope-tied"])
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.pop("partial_rotary_factor", None)
    config["rope_scaling"] = {**{k: rope[k] for k in ("long_factor", "short_factor")}, "type": "longrope",
                              "partial_rotary_factor": 0.75}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    path = write_gguf(folder, tmp_path / "inside.gguf", outtype="f32")
    assert gguf.GGUFReader(path).fields["phi3.rope.dimension_count"].contents() == 6


def test_malformed_longrope_settings_and_names_llama_cpp_cannot_load_are_refused(tmp_path):
    """Factors fewer than the rotating pairs, a list missing: one sentence each, no file. A file whose
    name holds "phi3" or "phi-3" makes llama.cpp look up Phi-3's own tokens, which a vocabulary may lack."""
    from gpt_ft.weights.gguf_write import write_gguf
    from tests.weights.test_hf_phi3 import VARIANTS

    folder, _ = lm_folder(tmp_path, "phi3", **VARIANTS["phi3.5-longrope"])
    config = json.loads((folder / "config.json").read_text())
    broken = [(dict(short_factor=[1.0, 2.0, 3.0]), r"\['short_factor'\] must list 4 factors, one per"),
              ({"long_factor": None}, r"\['long_factor'\] must list 4 factors, .* it has 0\.$")]  # fmt: skip
    for change, message in broken:
        rope = {**config["rope_parameters"], **change}
        (folder / "config.json").write_text(json.dumps(dict(config, rope_parameters=rope)))
        with pytest.raises(ValueError, match=message):
            write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    folder, _ = lm_folder(tmp_path / "plain", "phi3")
    for name in ("phi3-ft", "My-Phi-3.5"):
        with pytest.raises(
            ValueError, match=rf"^llama.cpp reads a GGUF file named '{name}' \(general.name\) as Phi-3's"
        ):
            write_gguf(folder, tmp_path / f"{name}.gguf", outtype="f32")
    assert not list(tmp_path.glob("*.gguf*"))
    assert write_gguf(folder, tmp_path / "my-model.gguf", outtype="f32").is_file()
    # Phi-3's four tokens all there: written under its name, and llama.cpp loads it; one missing: refused.
    # llama.cpp takes the whitespace after </s> with it there (Phi-3-mini's tokenizer.json: rstrip), and
    # after no added token elsewhere: a tokenizer that strips otherwise is refused.
    phi3_tokens = ["<|endoftext|>", "<unk>", "<s>", "</s>"]
    folder, _ = lm_folder(tmp_path / "lacks", "phi3", tiny_tokenizer(specials=phi3_tokens[:2] + ["</s>"]))
    with pytest.raises(ValueError, match=r"of which this vocabulary lacks <s>, so it could not load"):
        write_gguf(folder, folder / "phi3-ft.gguf", outtype="f32")
    folder, _ = lm_folder(tmp_path / "all", "phi3", tiny_tokenizer(specials=phi3_tokens))
    with pytest.raises(
        ValueError, match=r"added token '</s>' has no rstrip, and llama.cpp takes the whitespace"
    ):
        write_gguf(folder, folder / "phi3-ft.gguf", outtype="f32")
    spec = json.loads((folder / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        token["rstrip"] = token["content"] == "</s>"
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"added token '</s>' has rstrip, and llama.cpp takes no whitespace"):
        write_gguf(folder, folder / "ft.gguf", outtype="f32")
    # a token of whitespace alone, taken whole after the token before it takes its whitespace: refused
    spaced = json.loads((folder / "tokenizer.json").read_text())
    flags = dict(single_word=False, lstrip=False, rstrip=True, normalized=False, special=False)
    spaced["added_tokens"].append({"id": 319, "content": "\n", **flags})
    (folder / "spaced").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (folder / "spaced" / name).write_bytes((folder / name).read_bytes())
    (folder / "spaced" / "tokenizer.json").write_text(json.dumps(spaced))
    with pytest.raises(ValueError, match=r"added token '\\n' has whitespace alone, and llama.cpp takes"):
        write_gguf(folder / "spaced", folder / "phi3-ft.gguf", outtype="f32")
    out = write_gguf(folder, folder / "phi3-ft.gguf", outtype="f32")
    llama_cpp = pytest.importorskip("llama_cpp")
    from transformers import AutoTokenizer

    text, tokenizer = "<s> the </s>  fox <|endoftext|> dog", AutoTokenizer.from_pretrained(folder)
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    assert tokenizer.convert_ids_to_tokens(ids)[3:5] == ["</s>", "f"]  # (its two spaces taken with it)


def test_a_phi_3_window_shorter_than_the_context_is_refused(tmp_path):
    """llama.cpp's Phi-3 attends to every earlier token whatever the file's window (its logits are
    those of the model without one): a window under the context (Phi-3-mini-4k's 2,047 of 4,096) is
    refused; one past it (Phi-3.5's, Phi-4-mini's 262,144 of 131,072) is written."""
    from gpt_ft.weights.gguf_write import write_gguf

    folder, _ = lm_folder(tmp_path, "phi3", sliding_window=8)
    with pytest.raises(
        ValueError, match=r"^llama.cpp's phi3 models attend to every earlier token; this one slides"
    ):
        write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    folder, _ = lm_folder(tmp_path / "wide", "phi3", sliding_window=128)  # (64 positions)
    assert write_gguf(folder, tmp_path / "wide.gguf", outtype="f32").is_file()


def test_a_sharded_folder_reads_whole_into_a_file_under_new_folders(tmp_path):
    """The shards its index names, as llama.cpp's converter reads them; the file's folders made."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf

    folder, model = lm_folder(tmp_path, "llama")
    model.save_pretrained(sharded := tmp_path / "sharded", max_shard_size="20KB")
    tiny_tokenizer().save_pretrained(sharded)
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    whole = gguf.GGUFReader(write_gguf(folder, tmp_path / "whole.gguf", outtype="f32")).tensors
    parts = gguf.GGUFReader(
        write_gguf(sharded, tmp_path / "new" / "folder" / "m.gguf", outtype="f32")
    ).tensors
    assert sorted(t.name for t in parts) == sorted(t.name for t in whole)
    by_name = {t.name: t.data for t in parts}
    for tensor in whole:
        np.testing.assert_array_equal(by_name[tensor.name], tensor.data)


@pytest.mark.parametrize("family", [*FAMILIES, "olmo2-tied", "gpt_neox-tied", "gpt_neox-sequential"])
def test_llama_cpp_reads_the_file_as_the_model(tmp_path, family):
    """llama.cpp itself (llama-cpp-python, where installed): its tokens for a text are the
    tokenizer's, and its logits at every position the transformers model's (f32 weights and cache).
    A tied OLMo 2's or GPT-NeoX's head is written apart (llama.cpp could not load the file without
    it); GPT-NeoX's attention and MLP side by side or one after the other."""
    import gguf

    from gpt_ft.weights.gguf_write import write_gguf

    family, variant = family.split("-") if "-" in family else (family, None)
    tied, sequential = variant == "tied", variant == "sequential"
    overrides = (
        {"tie_word_embeddings": True} if tied else {"use_parallel_residual": False} if sequential else {}
    )
    folder, model = lm_folder(tmp_path, family, **overrides)
    path = write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    assert not tied or "output.weight" in {t.name for t in gguf.GGUFReader(path).tensors}
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, type_k=0, type_v=0)
    ids = tokenizer_of(family)(TEXT, add_special_tokens=False)["input_ids"]
    assert llm.tokenize(TEXT.encode(), add_bos=False, special=False) == ids
    llm.eval(ids)
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].numpy()
    # llama.cpp's GELU: tanh's form, from a table of fp16 values (GPT-NeoX's exact GELU too)
    atol = {"gpt2": 1e-3, "gemma3_text": 2e-3, "gpt_neox": 1e-3}.get(family, 1e-4)
    np.testing.assert_allclose(np.array(llm.scores[: len(ids)]), reference, rtol=0, atol=atol)


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "llama-bpe", "dbrx", "qwen2", "gpt-4o"])
def test_the_pre_tokenizer_is_named_as_llama_cpp_names_it(tmp_path, pre):
    """tokenizer.json's normalizer and pre-tokenizer (as SmolLM2's, Llama 3's, OLMo 2's and Qwen2's hub
    files hold them) give llama.cpp's name; where llama-cpp-python is installed, llama.cpp splits a text
    of digits, contractions and spaces into the tokenizer's own ids."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    from gpt_ft.weights.gguf_vocab import GPT4O_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT
    from gpt_ft.weights.gguf_write import write_gguf

    tokenizer = tiny_tokenizer()
    backend = tokenizer.backend_tokenizer
    split = {
        "llama-bpe": LLAMA3_SPLIT,
        "dbrx": LLAMA3_SPLIT,
        "qwen2": QWEN2_SPLIT,
        "gpt-4o": GPT4O_SPLIT,
    }.get(pre)
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    elif split is not None:
        cut = pre_tokenizers.Split(Regex(split), behavior="isolated")
        backend.pre_tokenizer = pre_tokenizers.Sequence([cut, bytes_only])
    if pre == "qwen2":
        backend.normalizer = normalizers.NFC()
    if split != LLAMA3_SPLIT:  # taking a word the vocabulary has whole: llama.cpp's Llama 3 only
        backend.model.ignore_merges = True
        folder, _ = lm_folder(tmp_path / "other", "llama", tokenizer)
        with pytest.raises(ValueError, match="llama.cpp has no pre-tokenizer this toolkit can name"):
            write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    backend.model.ignore_merges = pre == "llama-bpe"  # Llama 3's tokenizer.json: a word it has, whole
    folder, _ = lm_folder(tmp_path, "llama", tokenizer)
    path = write_gguf(folder, tmp_path / "m.gguf", outtype="f32")
    import gguf

    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == pre
    llama_cpp = pytest.importorskip("llama_cpp")
    text = "In 2024, 1,234 films; it's 12345  spaces\n\nand\tTabs I'VE seen"
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == backend.encode(text).ids
