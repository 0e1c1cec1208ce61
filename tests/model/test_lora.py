"""LoRA: adapters start as the identity, train only what they should, and merge exactly."""

import pytest
import torch

from gpt_ft import GPT
from gpt_ft.model.lora import LoRA, LoRALinear, TokenRows, add_lora, merge_lora, merged_state_dict
from tests.helpers import TINY_LLAMA, tiny_llama

VOCAB = TINY_LLAMA["vocab_size"]


def adapted(targets=None, tied=False, new_tokens=3):
    """A tiny Llama grown by `new_tokens` special tokens, with adapters, their B drawn non-zero."""
    gpt = GPT.from_hf(tiny_llama("llama", tie_word_embeddings=tied)).eval()
    gpt.resize_token_embeddings(VOCAB + new_tokens)
    base = {k: v.clone() for k, v in gpt.state_dict().items()}
    add_lora(gpt, LoRA(rank=4, alpha=8, dropout=0.0, **({"targets": targets} if targets else {})),
             new_tokens_from=VOCAB)  # fmt: skip
    return gpt, base


def test_adapters_start_as_the_loaded_model():
    gpt, base = adapted()
    plain = GPT(gpt.config).eval()
    plain.load_state_dict(base)
    ids = torch.randint(0, VOCAB + 3, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), plain.lm_logits(plain(ids)), rtol=0, atol=1e-6)


def test_adapters_are_added_once_and_a_second_time_is_refused_untouched():
    """A model with adapters given others: one sentence, the model as it was (it froze, then met an
    adapter where a linear layer was, and stopped in an AttributeError)."""
    gpt, _ = adapted()
    trained = {n for n, p in gpt.named_parameters() if p.requires_grad}
    with pytest.raises(ValueError, match=r"^The model has LoRA adapters already: merge them first"):
        add_lora(gpt, LoRA(rank=2), new_tokens_from=VOCAB)
    assert {n for n, p in gpt.named_parameters() if p.requires_grad} == trained
    # A call refused on its token rows changes nothing either: the next one adds the adapters.
    plain = GPT.from_hf(tiny_llama("llama"))
    before = {n for n, p in plain.named_parameters() if p.requires_grad}
    with pytest.raises(ValueError, match=r"^TokenRows needs 0 < frozen <= vocab <= rows"):
        add_lora(plain, LoRA(rank=2), new_tokens_from=VOCAB + 50)
    assert {n for n, p in plain.named_parameters() if p.requires_grad} == before
    add_lora(plain, LoRA(rank=2), new_tokens_from=VOCAB - 1)


@pytest.mark.parametrize("tied", [False, True])
def test_only_adapters_and_new_token_rows_train(tied):
    gpt, _ = adapted(tied=tied)
    assert gpt.num_parameters() == GPT(gpt.config).num_parameters() + sum(
        p.numel() for n, p in gpt.named_parameters() if "lora_" in n
    )  # the frozen weights, the new rows, the adapters: no padding rows subtracted twice
    trainable = {n for n, p in gpt.named_parameters() if p.requires_grad}
    rows = {"wte.new_rows"} | ({"lm_head.new_rows"} if not tied else set())
    adapters = {f"h.{i}.{t}.lora_{m}" for i in range(2) for t in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                "mlp.c_proj") for m in "AB"}  # fmt: skip
    assert trainable == rows | adapters
    assert gpt.wte.new_rows.shape == (3, 32) and gpt.wte.frozen_rows.shape == (VOCAB, 32)
    ids = torch.tensor([[VOCAB + 1, 5, VOCAB, 7]])
    gpt.lm_logits(gpt(ids)).sum().backward()
    assert all(p.grad is None for p in gpt.parameters() if not p.requires_grad)
    assert gpt.wte.new_rows.grad[:2].abs().sum() > 0
    if not tied:  # a token not in the input: no embedding gradient (the tied head scores every row)
        assert gpt.wte.new_rows.grad[2].abs().sum() == 0 and gpt.lm_head.new_rows.grad.abs().sum() > 0


def test_token_rows_look_up_and_score_like_the_whole_matrix():
    weight = torch.randn(8, 4)
    rows = TokenRows(weight, frozen=5, vocab=7)  # row 7: padding, or a released table's unused row
    ids = torch.tensor([[0, 4, 5, 6, 2]])
    torch.testing.assert_close(rows(ids), weight[ids], rtol=0, atol=0)
    hidden = torch.randn(3, 4)
    torch.testing.assert_close(rows.logits(hidden), hidden @ weight[:7].T, rtol=0, atol=1e-6)
    torch.testing.assert_close(rows.weight, weight, rtol=0, atol=0)  # row 7 kept as it was
    assert [n for n, p in rows.named_parameters() if p.requires_grad] == ["new_rows"]
    for frozen, vocab in ((0, 7), (8, 7), (5, 9)):
        with pytest.raises(ValueError, match="TokenRows needs 0 < frozen <= vocab <= rows"):
            TokenRows(weight, frozen=frozen, vocab=vocab)


@pytest.mark.parametrize("targets", [None, ["attn.c_attn"]])
def test_merging_gives_the_same_logits(targets):
    gpt, _ = adapted(targets=targets)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.3)
    assert_merges_exactly(gpt, torch.randint(0, VOCAB + 3, (2, 20)))


def assert_merges_exactly(gpt, ids) -> None:
    """Merged in place, `gpt` is a plain model (every weight a trainable Parameter) with the adapted
    model's logits on `ids`, and `merged_state_dict` (taken before) is its state, loading strictly."""
    with torch.no_grad():
        unmerged = gpt.lm_logits(gpt(ids))
    merged_state = merged_state_dict(gpt)
    merge_lora(gpt)
    assert not any(isinstance(m, LoRALinear | TokenRows) for m in gpt.modules())
    assert all(type(p) is torch.nn.Parameter and p.requires_grad for p in gpt.parameters())
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), unmerged, rtol=0, atol=1e-5)
    ours = gpt.state_dict()
    assert merged_state.keys() == ours.keys()
    for key in ours:
        torch.testing.assert_close(merged_state[key], ours[key], rtol=0, atol=1e-6, msg=key)
    GPT(gpt.config).load_state_dict(merged_state)  # a plain model's layout: loads strictly


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(rank=0), "lora.rank must be a positive integer, got 0"),
        (dict(alpha=0), "lora.alpha must be a finite number > 0, got 0"),
        (dict(alpha=float("inf")), "lora.alpha must be a finite number > 0, got inf"),
        (dict(alpha=float("nan")), "lora.alpha must be a finite number > 0, got nan"),
        (dict(dropout=1.0), r"lora.dropout must be in \[0, 1\)"),
        (dict(targets=["attn.q_proj"]), r"lora.targets \['attn.q_proj'\] not allowed"),
        (
            dict(targets=["attn.c_attn", "mlp.c_fc", "attn.c_attn"]),
            r"lora.targets names \['attn.c_attn'\] more than once",
        ),
        (dict(checkpoint="both"), "lora.checkpoint='both'"),
        (dict(quantize="int3"), r"^lora.quantize='int3'; allowed: 'nf4', or null for none.$"),
    ],
)
def test_bad_settings_name_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        LoRA(**settings)
