import copy
import warnings
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


def test_the_groups_go_by_the_shapes_as_built_once_fsdp_has_flattened_the_parameters():
    """FSDP (use_orig_params, as Lightning wraps) makes each parameter a 1-D shard view of the same
    object before `configure_optimizers` runs: the matrices keep their weight decay, and Muon, which
    needs whole matrices, says so."""

    def groups(m):
        m._trainer = SimpleNamespace(estimated_stepping_batches=10)
        return [{id(p) for p in g["params"]} for g in m.configure_optimizers()["optimizer"].param_groups]

    m = module(SingleText(name="t", labels=["a", "b"]))
    m.configure_model()  # the Trainer calls it before the strategy wraps the model
    whole = groups(m)
    with torch.no_grad():
        for p in m.parameters():
            p.data = p.data.flatten()[: max(1, p.numel() // 2)]  # this rank's shard
    assert groups(m) == whole and len(whole[0]) > 0
    m.optimizer_name = "muon"
    with pytest.raises(ValueError, match=r"^--model.optimizer muon orthogonalises whole weight matrices"):
        groups(m)


def test_a_run_bounded_by_max_time_alone_needs_a_schedule_that_reads_no_length():
    """Only `max_time`: Lightning estimates infinite steps, which a decaying schedule (or a warmup
    by fraction) cannot span; a constant one with its warmup in steps runs."""
    from lightning.pytorch.callbacks import Timer

    for callbacks, bound in (([Timer(duration="00:01:00:00")], "--trainer.max_time alone"),
                             ([], "--trainer.max_epochs -1")):  # fmt: skip
        m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3)
        m._trainer = SimpleNamespace(estimated_stepping_batches=float("inf"), callbacks=callbacks)
        with pytest.raises(
            ValueError, match=f"^--model.schedule linear spans the run's steps, and {bound} gives"
        ):
            m.configure_optimizers()
    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, schedule="constant")  # warmup by fraction
    m._trainer = SimpleNamespace(estimated_stepping_batches=float("inf"), callbacks=[])
    with pytest.raises(
        ValueError,
        match=r"^--model.warmup_fraction 0.002 is a fraction of the run's steps, and --trainer.max_epochs -1 "
        r"gives no number of them: .*, or use --model.warmup_steps N \(0: none\)\.$",
    ):
        m.configure_optimizers()
    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, schedule="constant", warmup_steps=4)
    m._trainer = SimpleNamespace(estimated_stepping_batches=float("inf"), callbacks=[])
    scheduler = m.configure_optimizers()["lr_scheduler"]["scheduler"]
    assert [scheduler.lr_lambdas[0](step) for step in (0, 2, 4, 10**9)] == [0.0, 0.5, 1.0, 1.0]


def test_a_warmup_as_long_as_the_run_or_longer_is_warned_of():
    """As long as the run is too: its last step runs at (total - 1) / warmup of the peak."""
    for warmup, than in ((50, "longer than"), (30, "as long as")):
        m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, warmup_steps=warmup)
        m._trainer = SimpleNamespace(estimated_stepping_batches=30, callbacks=[])
        with pytest.warns(
            UserWarning, match=rf"warmup_steps {warmup} is {than} the run's 30 optimizer steps: .* \(0.001\)"
        ):
            m.configure_optimizers()
    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, warmup_fraction=0.9)  # named as given
    m._trainer = SimpleNamespace(estimated_stepping_batches=1, callbacks=[])
    with pytest.warns(UserWarning, match=r"^--model.warmup_fraction 0.9 \(0.9 steps\) is nearly as long as "
                      r"the run's 1 optimizer step: "):  # fmt: skip
        m.configure_optimizers()
    m._trainer = SimpleNamespace(estimated_stepping_batches=0, callbacks=[])  # max_steps 0: no step, no word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.configure_optimizers()


def test_a_warmup_by_fraction_is_not_rounded_to_whole_steps():
    """GPT-1's 0.2% of RTE's 234 steps is 0.468 of a step, as OpenAI's code (`warmup_linear`) has it:
    the first step runs at rate 0 and the second decays already (rounded to none, the first step
    ran at the full rate: a sign-like Adam step of lr on every weight)."""
    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, warmup_fraction=0.002)
    m._trainer = SimpleNamespace(estimated_stepping_batches=234, callbacks=[])
    scheduler = m.configure_optimizers()["lr_scheduler"]["scheduler"]
    lrs = [scheduler.get_last_lr()[0]]
    scheduler.optimizer.step()
    scheduler.step()
    lrs.append(scheduler.get_last_lr()[0])
    assert lrs == [0.0, pytest.approx(1e-3 * (1 - (1 - 0.468) / (234 - 0.468)), rel=1e-12)]


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


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-3, optimizer="muon")
    m._trainer = SimpleNamespace(estimated_stepping_batches=100)
    config = m.configure_optimizers()
    optimizer = config["optimizer"]
    names = {id(p): n for n, p in m.named_parameters()}
    muon = [names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]]
    rest = [names[id(p)] for g in optimizer.adamw.param_groups for p in g["params"]]
    assert sorted(muon) == sorted(
        n for n, p in m.named_parameters() if n.startswith("gpt.h.") and p.ndim == 2
    )
    assert sorted(muon + rest) == sorted(names.values())  # every parameter, once
    assert {"gpt.wte.weight", "gpt.wpe.weight", "head.weight"} <= set(rest)
    # The schedule's learning rate reaches both optimizers' groups.
    config["lr_scheduler"]["scheduler"].step()
    lrs = {g["lr"] for o in (optimizer.muon, optimizer.adamw) for g in o.param_groups}
    assert len(lrs) == 1 and 0 < lrs.pop() < 1e-3


def muon_steps(m, optimizer, batches) -> None:
    for ids in batches:
        loss = m.gpt.lm_logits(m.gpt(ids)).logsumexp(-1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_muon_adamw_steps_as_its_two_optimizers_and_resumes_from_its_state_dict():
    from gpt_ft.training.optim import MuonAdamW

    batches = [torch.randint(0, 24, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    a, b = module(None), module(None)
    opt_a = MuonAdamW(a.named_parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)
    # The same updates by hand: torch's Muon on the block matrices, adamw on the rest.
    matrices = [p for n, p in b.named_parameters() if n.startswith("gpt.h.") and p.ndim == 2]
    others = [p for n, p in b.named_parameters() if not (n.startswith("gpt.h.") and p.ndim == 2)]
    muon = torch.optim.Muon(matrices, lr=1e-2, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    rest = adamw(others, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)

    class Both:
        def step(self):
            muon.step()
            rest.step()

        def zero_grad(self):
            muon.zero_grad()
            rest.zero_grad()

    muon_steps(a, opt_a, batches[:2])
    muon_steps(b, Both(), batches[:2])
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    # Resume: a fresh optimizer loaded from the state dict continues exactly.
    state = copy.deepcopy(opt_a.state_dict())  # as a checkpoint holds it (torch shares buffers otherwise)
    c = module(None)
    c.load_state_dict(a.state_dict())
    opt_c = MuonAdamW(c.named_parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)
    opt_c.load_state_dict(state)
    assert opt_c.param_groups[0] is opt_c.muon.param_groups[0]  # still shared after loading
    muon_steps(a, opt_a, batches[2:])
    muon_steps(c, opt_c, batches[2:])
    for (name, p), q in zip(a.named_parameters(), c.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_fused_adamw_on_the_cpu_and_its_gradients_clipped_under_mixed_precision(precision):
    """The CPU gets AdamW's fused kernel too, and Lightning clips its gradients under mixed
    precision (which it refuses for an optimizer that unscales inside its step): one clipped step
    leaves the weights where the unfused optimizer puts them."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    m = module(SingleText(name="t", labels=["a", "b"]), lr=1e-2, warmup_fraction=0.0)  # the step at lr
    m._trainer = SimpleNamespace(estimated_stepping_batches=10)
    fused = m.configure_optimizers()["optimizer"]
    assert fused.defaults["fused"] is True
    reference = copy.deepcopy(m)
    plain = adamw(reference.parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    for model in (m, reference):
        for p in model.parameters():
            p.grad = torch.full_like(p, 3.0)
    MixedPrecision(precision, "cpu").clip_gradients(fused, clip_val=1.0)
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in m.parameters()]))
    assert norm == pytest.approx(1.0, rel=1e-5)
    fused.step()
    plain.step()
    for a, b in zip(m.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_muon_and_lora_are_refused_together_before_any_weights_load():
    """LoRA freezes the block matrices Muon would train: one sentence, before the weights are read."""
    from gpt_ft import GPT, GPTConfig
    from gpt_ft.model.lora import LoRA, add_lora
    from gpt_ft.training.optim import MuonAdamW

    said = "--model.optimizer muon trains the blocks' whole weight matrices, which --model.lora freezes"
    with pytest.raises(ValueError, match=said):
        GPTModule(
            init_from="never-read.ckpt",
            lora=LoRA(rank=4),
            optimizer="muon",
            task=SingleText(name="t", labels=["a", "b"]),
        )
    gpt = add_lora(GPT(GPTConfig.from_name("llama-micro", vocab_size=64)), LoRA(rank=4), new_tokens_from=60)
    with pytest.raises(ValueError, match=said):  # the optimizer alone, as a Python user builds it
        MuonAdamW(gpt.named_parameters(), lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99), eps=1e-8)
