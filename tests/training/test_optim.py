from types import SimpleNamespace

import pytest
import torch

from gpt_ft.adapters import SingleText
from gpt_ft.training.module import GPTModule
from gpt_ft.training.optim import adamw, lr_lambda

MICRO = dict(n_positions=32, n_embd=16, n_layer=1, n_head=2, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)


def module(task, **kw) -> GPTModule:
    torch.manual_seed(0)
    return GPTModule(
        preset="gpt-micro", overrides=MICRO, vocab_size=24, task=task, classifier_dropout=0.0, **kw
    ).eval()


def test_weight_decay_only_on_matrices_and_the_schedule():
    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, warmup_fraction=0.01)
    m._trainer = SimpleNamespace(estimated_stepping_batches=1000)
    config = m.configure_optimizers()
    decay, no_decay = config["optimizer"].param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == {n for n, p in m.named_parameters() if p.ndim == 1}
    assert all(
        n.endswith(("bias", "ln_1.weight", "ln_2.weight")) for n in (names[id(p)] for p in no_decay["params"])
    )
    assert {"gpt.wte.weight", "head.weight", "gpt.h.0.attn.c_attn.weight"} <= {
        names[id(p)] for p in decay["params"]
    }
    scheduler = config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(1000):
        lrs.append(scheduler.get_last_lr()[0])
        config["optimizer"].step()
        scheduler.step()
    assert lrs[0] == 0.0  # warmup over 0.01 * 1000 = 10 steps
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[5] == pytest.approx(0.5e-3)
    assert lrs[999] == pytest.approx(1e-3 / 990)  # linear to 0 at step 1000
    assert scheduler.get_last_lr()[0] == 0.0


def test_lr_lambda_shapes():
    linear, cosine = lr_lambda("linear", 2000, 10000), lr_lambda("cosine", 2000, 10000)
    assert [linear(s) for s in (0, 1000, 2000, 6000, 10000)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    assert cosine(2000) == 1.0 and cosine(6000) == pytest.approx(0.5) and cosine(10000) == pytest.approx(0.0)
    assert lr_lambda("constant", 10, 100)(50) == 1.0


def test_adamw_leaves_frozen_parameters_out():
    matrix, bias, frozen = (torch.nn.Parameter(torch.ones(s)) for s in ((2, 2), (2,), (3, 3)))
    frozen.requires_grad_(False)
    optimizer = adamw([matrix, bias, frozen], lr=0.1, weight_decay=0.5, betas=(0.9, 0.99), eps=1e-6)
    decay, no_decay = optimizer.param_groups
    assert decay["params"] == [matrix] and no_decay["params"] == [bias]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.5, 0.0)
    assert decay["lr"] == 0.1 and decay["betas"] == (0.9, 0.99) and decay["eps"] == 1e-6
