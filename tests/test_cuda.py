"""The GPU checklist's correctness checks (benchmarks/gpu_check.py runs them with `pytest -k cuda`):
transformers' logits in fp32, the bf16-mixed loss, the flash kernel on the batches that should get
it, and `fit` logging tokens/s and MFU. The layouts, cached generation and the quickstart through
configs/trainer/gpu.yaml have their CUDA tests beside their code (`-k cuda` selects them all)."""

import pytest
import torch
import torch.nn.functional as F

from gpt_ft import GPT, GPTConfig
from gpt_ft.cli import main
from gpt_ft.data.batches import collate, collate_blocks
from gpt_ft.data.tokenizer import SpecialTokenIds
from gpt_ft.training.module import GPTModule
from gpt_ft.training.terms import batch_terms
from gpt_ft.training.throughput import dense_peak_tflops
from tests.helpers import ROOT, cuda, random_choice_examples, write_corpus

# gpt-mini's shape with a realistic vocabulary and context: big enough for the kernels a GPU picks.
SHAPE = dict(vocab_size=8192, n_positions=128)


@cuda
@pytest.mark.parametrize("pre_ln", [False, True], ids=["gpt1", "gpt2"])
def test_cuda_logits_equal_transformers_in_fp32(pre_ln, exact_fp32):
    """OpenAIGPTLMHeadModel (post-LN) and GPT2LMHeadModel (pre-LN) on the same weights."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-mini", pre_ln=pre_ln, **SHAPE)).cuda().eval()
    hf = gpt.to_hf().cuda().eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (2, SHAPE["n_positions"]), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(gpt.lm_logits(gpt(ids)), hf(ids).logits, rtol=0, atol=1e-4)


@cuda
def test_cuda_bf16_mixed_loss_stays_within_one_percent_of_fp32(exact_fp32):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-mini", **SHAPE)).cuda().eval()
    ids = torch.randint(0, SHAPE["vocab_size"], (2, SHAPE["n_positions"]), device="cuda")
    targets = torch.roll(ids, -1, dims=1).flatten()
    with torch.no_grad():
        fp32 = F.cross_entropy(gpt.lm_logits(gpt(ids)).flatten(0, 1), targets).item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf16 = F.cross_entropy(gpt.lm_logits(gpt(ids)).flatten(0, 1).float(), targets).item()
    assert abs(bf16 - fp32) / fp32 <= 0.01, (bf16, fp32)


@cuda
def test_cuda_pretraining_and_right_padded_batches_train_on_a_fused_kernel():
    """A fused kernel (flash, cuDNN or memory-efficient: PyTorch picks cuDNN's on Hopper), never the
    math fallback."""
    from torch.profiler import ProfilerActivity, profile

    v = SHAPE["vocab_size"] - 4
    specials = SpecialTokenIds(start=v, delim=v + 1, extract=v + 2, pad=v + 3, eos=None)
    rows, task = random_choice_examples(specials, vocab=v, n=8)
    torch.manual_seed(0)
    module = GPTModule(
        preset="gpt-mini", overrides={"n_positions": 128}, vocab_size=SHAPE["vocab_size"], task=task
    )
    module.cuda().train()
    blocks = collate_blocks([(i, torch.randint(0, v, (129,))) for i in range(4)])
    for kind, batch, head in [
        ("pretraining", blocks, None),
        ("right-padded", collate(rows, specials.pad), module.head),
    ]:
        batch = batch.__class__(**{k: x.cuda() if torch.is_tensor(x) else x for k, x in vars(batch).items()})
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                terms = batch_terms(module.gpt, head, batch, lm=True)
                loss = terms["lm_sum"].sum() + (terms["logits"].float().sum() if "logits" in terms else 0)
            loss.backward()
        ops = {event.name for event in prof.events()}
        fused = {f"aten::_scaled_dot_product_{k}_attention" for k in ("flash", "cudnn", "efficient")}
        attention = sorted(o for o in ops if "attention" in o)
        assert ops & fused, f"{kind}: no fused attention among {attention}"
        assert "aten::_scaled_dot_product_attention_math" not in ops, kind
        module.zero_grad(set_to_none=True)


@cuda
def test_cuda_fit_logs_tokens_per_second_and_mfu(tmp_path, tokenizer_dir, monkeypatch):
    import csv

    monkeypatch.chdir(ROOT)
    corpus = write_corpus(tmp_path, n_files=6, lines=60)
    main(["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir,
          "--out_dir", str(tmp_path / "tokens"),
          "--validation_fraction", "0.2", "--piece_chars", "400"])  # fmt: skip
    peak = dense_peak_tflops(torch.cuda.get_device_name()) or 100.0  # any peak: MFU is then logged
    main(["fit", "--config", "configs/pretrain/cpu.yaml", "--config", "configs/trainer/gpu.yaml",
          f"--data.token_dir={tmp_path / 'tokens'}", "--data.block_size=32", "--data.batch_size=8",
          "--model.overrides={n_positions: 32, n_embd: 64, n_layer: 2, n_head: 2}", "--trainer.max_steps=40",
          "--trainer.limit_val_batches=0", "--trainer.callbacks+=gpt_ft.training.throughput.Throughput",
          "--trainer.callbacks.every_n_steps=10", f"--trainer.callbacks.peak_tflops={peak}",
          f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
          "--trainer.enable_progress_bar=false"])  # fmt: skip
    with open(next((tmp_path / "runs").rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    tokens_per_s = [float(r["perf/tokens_per_s"]) for r in rows if r.get("perf/tokens_per_s")]
    mfu = [float(r["perf/mfu"]) for r in rows if r.get("perf/mfu")]
    assert len(tokens_per_s) >= 3 and min(tokens_per_s) > 0
    assert len(mfu) == len(tokens_per_s) and all(0 < m < 1 for m in mfu)


class SyncsAreErrors:
    """Between logging windows, from the end of one step's batch transfer to the start of the next
    one's, any call that makes the host wait for the GPU raises (`torch.cuda.set_sync_debug_mode`):
    the step, the backward, the optimizer and every callback. Steps 0-2 (allocations) run free, and
    so does what follows an epoch's last batch (the epoch's end, the run's end and its teardown,
    which moves the model to the host), from the end of its `on_train_batch_end` hooks.
    `pinned`: whether each batch came from page-locked memory (its copy then waits for nothing)."""

    def __init__(self, monkeypatch, first: int = 3) -> None:
        import dataclasses

        from lightning.pytorch.strategies import Strategy

        from gpt_ft.training.module import GPTModule

        self.steps, self.pinned, transfer = [], [], Strategy.batch_to_device
        batch_end = GPTModule.on_train_batch_end  # the module's hook runs after every callback's

        def checked_batch_end(module, outputs, batch, batch_idx):
            batch_end(module, outputs, batch, batch_idx)
            trainer = module.trainer
            if batch_idx + 1 == trainer.num_training_batches or trainer.global_step >= trainer.max_steps:
                torch.cuda.set_sync_debug_mode(0)

        def checked_transfer(strategy, batch, *args, **kwargs):
            torch.cuda.set_sync_debug_mode(0)
            tensors = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
            self.pinned.append(all(t.is_pinned() for t in tensors if isinstance(t, torch.Tensor)))
            batch = transfer(strategy, batch, *args, **kwargs)
            step = strategy.lightning_module.trainer.global_step
            if step >= first:
                self.steps.append(step)
                torch.cuda.set_sync_debug_mode("error")
            return batch

        monkeypatch.setattr(Strategy, "batch_to_device", checked_transfer)
        monkeypatch.setattr(GPTModule, "on_train_batch_end", checked_batch_end)


@cuda
def test_cuda_fit_waits_for_the_host_on_no_step(tmp_path, tokenizer_dir, monkeypatch):
    """Fine-tuning under fused AdamW in bf16-mixed: 30 steps, no logging window among them (every
    50 steps), the progress bar off (it reads the loss back at each refresh)."""
    from tests.helpers import finetune_args, make_task

    card = make_task("single", tmp_path)
    window = SyncsAreErrors(monkeypatch)
    try:
        main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, tmp_path / "logs"), "--config",
              str(ROOT / "configs/trainer/gpu.yaml"), "--trainer.max_epochs=10", "--trainer.max_steps=30",
              "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=50",
              "--trainer.enable_checkpointing=false"])  # fmt: skip
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert window.steps == list(range(3, 30)) and all(window.pinned)


@cuda
def test_cuda_ddp_and_fsdp_on_one_gpu_equal_the_plain_run(tmp_path, tokenizer_dir):
    """NCCL DDP and FSDP with one device: the weights after 9 steps equal the plain run's (fp32)."""
    from tests.helpers import finetune_args, make_task

    card = make_task("pair", tmp_path)
    states = {}
    for strategy in ("auto", "ddp", "fsdp"):
        logs = tmp_path / strategy
        main(["fit", *finetune_args(card, tokenizer_dir, tmp_path, logs), "--trainer.accelerator=gpu",
              "--trainer.devices=1", f"--trainer.strategy={strategy}",
              "--trainer.precision=32-true"])  # fmt: skip
        ckpt = logs / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
        states[strategy] = torch.load(ckpt, map_location="cpu", weights_only=True)
    plain = states.pop("auto")
    for strategy, state in states.items():
        assert state["global_step"] == plain["global_step"] == 9, strategy
        assert state["state_dict"].keys() == plain["state_dict"].keys(), strategy
        for key, value in plain["state_dict"].items():
            got = state["state_dict"][key]
            torch.testing.assert_close(got, value, rtol=0, atol=1e-5, msg=f"{strategy}: {key}")


@cuda
def test_cuda_a_compiled_models_lm_loss_runs_compiled_and_equals_the_eager_one(exact_fp32):
    """The head's matmul and the cross-entropy in one compiled graph: losses and gradients of the
    eager ones (fp32), for a pretraining block and for packed positions of another length."""
    from gpt_ft.training import lm_loss

    torch.manual_seed(0)
    gpt = GPT(GPTConfig.from_name("gpt-mini", **SHAPE)).cuda()
    compiled = GPT(GPTConfig.from_name("gpt-mini", **SHAPE)).cuda()
    compiled.load_state_dict(gpt.state_dict())
    compiled.compile()
    for n in (256, 97):
        hidden = torch.randn(n, gpt.config.n_embd, device="cuda", requires_grad=True)
        targets = torch.randint(0, SHAPE["vocab_size"], (n,), device="cuda")
        targets[::7] = -100
        results = []
        for model in (gpt, compiled):
            losses = lm_loss.lm_losses(model, hidden, targets)
            results.append((losses.detach(), *torch.autograd.grad(losses.sum(), (hidden, model.wte.weight))))
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert lm_loss._compiled_plain is not None
