"""LoRA on 4-bit NF4 base weights (QLoRA): close to the full-precision model, trains only the
adapters, merges into a plain model that exports, and its adapters load onto a re-quantized base."""

import copy
import io
import sys

import pytest
import torch
import torch.nn.functional as F

from gpt_ft import GPT
from gpt_ft.model.lora import NO_TORCHAO, LoRA, LoRALinear, add_lora, to_nf4
from gpt_ft.training.optim import adamw
from tests.helpers import TINY_LLAMA, tiny_llama
from tests.model.test_lora import assert_merges_exactly

pytest.importorskip("torchao", reason='the "quantize" extra')

VOCAB = TINY_LLAMA["vocab_size"]
TRAINED = ("lora_A", "lora_B", "new_rows")
# NF4 dequantizes each weight matrix with a relative (Frobenius) error of about 9%, whatever its
# scale. On the trained tiny Llama below that raises the loss by 2.5-3.6% (8 seeds and patterns
# measured); zeroing the adapted weights instead raises it by over 300%.
LOSS_TOLERANCE = 0.10


def cyclic_tokens(seed: int, batch: int = 8, length: int = 32) -> torch.Tensor:
    """Sequences that step through the vocabulary by 7 from a random start: learnable in a few steps."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=torch.Generator().manual_seed(seed))
    return (start + 7 * torch.arange(length)) % VOCAB


def lm_loss(gpt: GPT, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(gpt.lm_logits(gpt(ids[:, :-1])).flatten(0, 1), ids[:, 1:].flatten())


@pytest.fixture(scope="module")
def trained():
    """A tiny Llama trained 40 steps on `cyclic_tokens`: its loss depends on its block weights (an
    untrained one's barely does, so no quantization error could show in it)."""
    gpt = GPT.from_hf(tiny_llama("llama"))
    optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-2, weight_decay=0.0)
    for step in range(40):
        lm_loss(gpt, cyclic_tokens(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return gpt.eval()


def adapted(gpt: GPT, quantize: str | None, new_tokens: int = 3) -> GPT:
    """`gpt` grown by `new_tokens` special tokens, with rank-4 adapters whose B is drawn non-zero."""
    gpt = copy.deepcopy(gpt)
    gpt.resize_token_embeddings(VOCAB + new_tokens, generator=torch.Generator().manual_seed(0))
    add_lora(gpt, LoRA(rank=4, alpha=8, dropout=0.0, quantize=quantize), new_tokens_from=VOCAB)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.endswith(TRAINED):
                p.normal_(0.0, 0.05)
    return gpt


def trained_state(gpt: GPT) -> dict[str, torch.Tensor]:
    """What an adapters checkpoint holds of the GPT: its trainable tensors."""
    return {k: v for k, v in gpt.state_dict().items() if k.endswith(TRAINED)}


def layers(gpt: GPT) -> list[LoRALinear]:
    return [m for m in gpt.modules() if isinstance(m, LoRALinear)]


def test_the_4_bit_model_s_loss_is_within_tolerance_of_the_full_precision_one(trained):
    plain = adapted(trained, None)
    quantized = adapted(trained, "nf4")
    quantized.load_state_dict(trained_state(plain), strict=False)  # the same adapters and rows
    ids = cyclic_tokens(1000)
    with torch.no_grad():
        full, four_bit = lm_loss(plain, ids).item(), lm_loss(quantized, ids).item()
    assert four_bit != full  # the weights really are quantized
    assert abs(four_bit - full) <= LOSS_TOLERANCE * full, (full, four_bit)


def test_base_weights_are_4_bit_and_an_eighth_of_fp32(trained):
    gpt = adapted(trained, "nf4")
    for layer in layers(gpt):
        weight = layer.base.weight
        assert type(weight).__name__ == "NF4Tensor" and not weight.requires_grad
        inner = weight.__tensor_flatten__()[0]  # the tensors a subclass is made of
        stored = sum(getattr(weight, name).nbytes for name in inner)
        assert stored * 6 < weight.numel() * 4  # 0.5 bytes a weight plus the block constants
        dequantized = layer.base_weight()
        assert type(dequantized) is torch.Tensor and dequantized.dtype == torch.float32  # the model's


def test_only_adapters_and_new_rows_train_and_the_base_stays(trained):
    gpt = adapted(trained, "nf4").train()
    base = [layer.base_weight().clone() for layer in layers(gpt)]
    optimizer = adamw(gpt.parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in in_optimizer} == {id(p) for n, p in gpt.named_parameters() if n.endswith(TRAINED)}
    ids = torch.cat([cyclic_tokens(2000), torch.full((8, 1), VOCAB + 1)], dim=1)  # a new token too
    losses = []
    for _ in range(4):
        loss = lm_loss(gpt, ids)
        loss.backward()
        assert all(p.grad is None for p in gpt.parameters() if not p.requires_grad)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for layer, before in zip(layers(gpt), base):
        torch.testing.assert_close(layer.base_weight(), before, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: biases on q, k, v
def test_merging_dequantizes_and_gives_the_same_logits_and_exports(family):
    gpt = adapted(GPT.from_hf(tiny_llama(family)).eval(), "nf4")
    ids = torch.randint(0, VOCAB + 3, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        unmerged = gpt.lm_logits(gpt(ids))
    assert_merges_exactly(gpt, ids)
    hf = gpt.to_hf().eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, unmerged, rtol=0, atol=1e-4)


def test_adapters_load_onto_a_freshly_quantized_base(trained):
    """An adapters checkpoint (trained tensors only, read weights-only) on the base quantized anew
    gives the same model; a whole state dict, 4-bit tensors included, loads too."""
    gpt = adapted(trained, "nf4")
    buffer = io.BytesIO()
    torch.save(trained_state(gpt), buffer)
    buffer.seek(0)
    fresh = adapted(trained, "nf4")
    missing, unexpected = fresh.load_state_dict(torch.load(buffer, weights_only=True), strict=False)
    assert not unexpected and not any(k.endswith(TRAINED) for k in missing)
    ids = cyclic_tokens(3000)
    with torch.no_grad():
        torch.testing.assert_close(fresh.lm_logits(fresh(ids)), gpt.lm_logits(gpt(ids)), rtol=0, atol=0)
        whole = adapted(trained, "nf4")
        whole.load_state_dict(gpt.state_dict())
        torch.testing.assert_close(whole.lm_logits(whole(ids)), gpt.lm_logits(gpt(ids)), rtol=0, atol=0)


def test_bfloat16_keeps_the_weights_in_4_bits(trained):
    """`.to(torch.bfloat16)` (a bf16-true precision) keeps each base weight 4-bit, computing in bf16."""
    gpt = adapted(trained, "nf4")
    ids = cyclic_tokens(4000)
    with torch.no_grad():
        full = gpt.lm_logits(gpt(ids))
        gpt.to(torch.bfloat16)
        half = gpt.lm_logits(gpt(ids))
    for layer in layers(gpt):
        assert type(layer.base.weight).__name__ == "NF4Tensor" and layer.base.weight.dtype == torch.bfloat16
    assert half.dtype == torch.bfloat16
    assert (half.float() - full).norm() < 0.05 * full.norm()


def test_activation_checkpointing_gives_the_same_gradients(trained):
    gpt = adapted(trained, "nf4").train()
    ids = cyclic_tokens(5000)
    grads = []
    for recompute in (False, True):
        gpt.activation_checkpointing = recompute
        lm_loss(gpt, ids).backward()
        grads.append({n: p.grad.clone() for n, p in gpt.named_parameters() if p.requires_grad})
        gpt.zero_grad()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_without_torchao_one_sentence_names_the_extra(monkeypatch):
    for module in ("torchao", "torchao.quantization"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` then raises ImportError
    with pytest.raises(ValueError) as error:
        LoRA(quantize="nf4")
    assert (
        str(error.value) == NO_TORCHAO == 'lora.quantize nf4 needs torchao: pip install "gpt_ft[quantize]".'
    )


def test_a_matrix_that_is_not_whole_blocks_is_named():
    with pytest.raises(ValueError, match=r"^lora.quantize nf4 quantizes blocks of 64 weights; a matrix of "
                       r"shape \(10, 7\) has 70, not a multiple.$"):  # fmt: skip
        to_nf4(torch.randn(10, 7))
