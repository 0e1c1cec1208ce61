"""`linear`: a few rows' product split over the CPU's threads equals `F.linear`, and is split only
where nothing but the speed changes; a model decoding on it gives the same tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from gpt_ft import GPT, GPTConfig
from gpt_ft.model import linear as module
from gpt_ft.model.linear import Linear, linear


class Ops(TorchDispatchMode):
    """The names of the aten ops run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.fixture
def threads():
    """Two threads (the split is one slice a thread), whatever the machine; then as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def split_ops(*args) -> tuple[torch.Tensor, list[str]]:
    with torch.no_grad(), Ops() as ops:
        y = linear(*args)
    return y, ops.names


@pytest.mark.parametrize("out_features", [1024, 1000, 576])  # even slices; a rest of 40; 288 a slice
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1,), (3,), (2, 1), (4, 16), (64,)])
def test_a_few_rows_split_over_the_threads_equal_f_linear(threads, out_features, bias, shape):
    g = torch.Generator().manual_seed(out_features + len(shape))
    weight = torch.randn(out_features, 512, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    x = torch.randn(*shape, 512, generator=g)
    y, ops = split_ops(x, weight, b)
    assert ("baddbmm" if bias else "bmm") in ops, ops
    assert ("cat" in ops) == (out_features == 1000)  # 1000 = 2 x 480 + 40 left to F.linear
    assert y.shape == (*shape, out_features) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, weight, b), rtol=1e-6, atol=1e-5)


def test_split_by_slices_of_its_output_features(threads):
    """Each output feature is its own row's dot product (a slice put back in the wrong place, or
    a row of another slice, would show): rows of 0, 1, 2, ... and of 0, -2, -4, ... picked out."""
    weight = torch.zeros(1000, 512)
    weight[:, 0], weight[:, 1] = torch.arange(1000.0), -2 * torch.arange(1000.0)
    x = torch.zeros(2, 512)
    x[0, 0], x[1, 1] = 1.0, 1.0
    y, ops = split_ops(x, weight)
    assert "bmm" in ops
    assert torch.equal(y[0], torch.arange(1000.0)) and torch.equal(y[1], -2 * torch.arange(1000.0))


@pytest.mark.parametrize(
    "case",
    ["grad", "65 rows", "small weight", "one thread", "bfloat16", "autocast", "no rows"],
)
def test_not_split_where_it_would_change_more_than_the_speed(threads, case):
    weight, x = torch.randn(1024, 512), torch.randn(4, 512)
    if case == "65 rows":
        x = torch.randn(65, 512)
    if case == "small weight":
        weight = torch.randn(511, 512)  # 261,632 elements: under WEIGHT
    if case == "one thread":
        torch.set_num_threads(1)
    if case == "bfloat16":
        weight, x = weight.bfloat16(), x.bfloat16()
    if case == "no rows":
        x = torch.randn(0, 512)
    with torch.set_grad_enabled(case == "grad"), Ops() as ops:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"):
            y = linear(x, weight.requires_grad_(case == "grad"))
    assert "bmm" not in ops.names and "baddbmm" not in ops.names, ops.names
    assert y.shape == (x.shape[0], weight.shape[0])


def test_linear_is_nn_linear_with_its_state_dict():
    layer = Linear(512, 1024)
    plain = torch.nn.Linear(512, 1024)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(3, 512)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-6, atol=1e-5)
    assert isinstance(layer, torch.nn.Linear) and layer.state_dict().keys() == plain.state_dict().keys()


def test_greedy_decoding_on_split_products_gives_the_same_tokens(threads, monkeypatch):
    """A model whose matrices are all split (its LM head too) decodes the tokens and logits it
    decodes on `F.linear` alone, with the ordinary cache and the static one."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=600, n_positions=64, n_embd=512, n_layer=1, n_head=8)
    gpt = GPT(config).eval()
    prompt = torch.randint(0, 600, (2, 5))
    with torch.no_grad(), Ops() as ops:
        split = [gpt.generate(prompt, max_new_tokens=6, static_cache=s) for s in (False, True)]
        logits = gpt.lm_logits(gpt(prompt)[:, -1:])
    # every step: its 4 matrices with biases, and the LM head without
    assert ops.names.count("baddbmm") >= 4 * 6 and ops.names.count("bmm") >= 6
    monkeypatch.setattr(module, "split_pays", lambda x, weight: False)
    with torch.no_grad(), Ops() as ops:
        plain = gpt.generate(prompt, max_new_tokens=6)
        plain_logits = gpt.lm_logits(gpt(prompt)[:, -1:])
    assert "bmm" not in ops.names and "baddbmm" not in ops.names
    assert torch.equal(split[0], plain) and torch.equal(split[1], plain)
    torch.testing.assert_close(logits, plain_logits, rtol=1e-6, atol=1e-5)
