import csv

import pytest

from gpt_ft import GPT, GPTConfig
from gpt_ft.cli import main
from gpt_ft.training.throughput import counted_parameters, dense_peak_tflops, flops_per_token, head_parameters
from tests.helpers import ROOT, write_corpus


def test_dense_peaks_not_sparse_ones():
    assert dense_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert dense_peak_tflops("NVIDIA H100 NVL") == 835.0
    assert dense_peak_tflops("NVIDIA H200") == 989.0
    assert dense_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert dense_peak_tflops("Some CPU") is None
    assert dense_peak_tflops("NVIDIA RTX A1000 Laptop GPU") is None  # no A100, whose name it holds
    assert dense_peak_tflops("NVIDIA GH200 480GB") == 989.0


def test_a_step_without_lm_logits_is_not_charged_the_lm_head():
    """Reward models, rankers and embeddings (lm_coef 0) never run the LM head: 6·V·d a token less."""
    from types import SimpleNamespace

    from gpt_ft.training.throughput import Throughput

    gpt = GPT(GPTConfig.from_name("gpt-micro", vocab_size=128))
    charged = {}
    for lm_coef in (0.5, 0.0):
        callback = Throughput()
        callback.setup(None, SimpleNamespace(gpt=gpt, head=object(), lm_coef=lm_coef), "fit")
        charged[lm_coef] = callback._n_params
    assert charged[0.5] == counted_parameters(gpt) and charged[0.5] - charged[0.0] == 128 * gpt.config.n_embd
    pretraining = Throughput()
    pretraining.setup(None, SimpleNamespace(gpt=gpt, head=None, lm_coef=0.0), "fit")
    assert pretraining._n_params == counted_parameters(gpt)


def test_nanogpt_flop_count_for_gpt1():
    import torch

    with torch.device("meta"):
        gpt = GPT(GPTConfig.from_name("gpt1"))
    n = counted_parameters(gpt)
    assert n == 116_534_784 - 512 * 768
    # 6N + 12 * L * H * Q * T at T = 512
    assert flops_per_token(gpt.config, n, 512) == pytest.approx(6 * n + 12 * 12 * 12 * 64 * 512)
    assert flops_per_token(gpt.config, n, 512) == 753_472_512


def test_the_flop_count_leaves_out_lookups_windows_and_frozen_gradients():
    """An untied token embedding is a lookup (the head is the matmul); a sliding-window layer
    attends over its window at most; a frozen weight (LoRA's base) takes 4 FLOPs a token, not 6."""

    from gpt_ft.model.lora import LoRA, add_lora

    tied = GPT(GPTConfig.from_name("llama-micro", vocab_size=128))
    untied = GPT(GPTConfig.from_name("llama-micro", vocab_size=128, tie_embeddings=False))
    assert counted_parameters(untied) == counted_parameters(tied) == tied.num_parameters()
    layers = ["sliding_attention", "full_attention"]
    c = GPTConfig.from_name("llama-micro", vocab_size=128, sliding_window=6, layer_types=layers)
    attention = 12 * c.n_head * c.head_dim
    assert flops_per_token(c, 0, 64) == attention * (6 + 64) and flops_per_token(c, 0, 4) == attention * 8
    for tie in (True, False):  # 100 tokens in 128 rows: the padding rows (frozen too) count nowhere
        base = GPT(GPTConfig.from_name("llama-micro", vocab_size=100, tie_embeddings=tie))
        adapted = add_lora(base, LoRA(rank=2), new_tokens_from=96)
        counted = {True: 0, False: 0}  # trained, frozen; an untied embedding is a lookup, its rows out
        for name, p in adapted.named_parameters():
            if not name.endswith("unused_rows") and (tie or not name.startswith("wte.")):
                counted[p.requires_grad] += p.numel()
        assert 0 < counted[True] < counted[False]
        assert counted_parameters(adapted) == pytest.approx(counted[True] + counted[False] * 2 / 3)
        # the head a step with no LM loss never runs: its 96 frozen rows at 2/3, 4 new ones whole
        assert head_parameters(adapted) == pytest.approx((96 * 2 / 3 + 4) * c.n_embd)
    assert dense_peak_tflops("NVIDIA H200 NVL") == 835.0


def test_every_window_reaches_the_logger_whatever_log_every_n_steps(tmp_path, tokenizer_dir, monkeypatch):
    """Throughput(every_n_steps=10) over 40 steps writes 4 rows, though the trainer's logger
    cadence (configs/pretrain/cpu.yaml: 20) alone would keep 2."""
    monkeypatch.chdir(ROOT)
    corpus = write_corpus(tmp_path, n_files=6, lines=60)
    main(["prepare", "--inputs", str(corpus), "--tokenizer", tokenizer_dir,
          "--out_dir", str(tmp_path / "tokens"), "--validation_fraction", "0.2",
          "--piece_chars", "400"])  # fmt: skip
    main(["fit", "--config", "configs/pretrain/cpu.yaml", "--trainer.accelerator=cpu",
          f"--data.token_dir={tmp_path / 'tokens'}", "--data.block_size=32", "--data.batch_size=8",
          "--model.overrides={n_positions: 32, n_embd: 64, n_layer: 2, n_head: 2}", "--trainer.max_steps=40",
          "--trainer.limit_val_batches=0", "--trainer.callbacks+=gpt_ft.training.throughput.Throughput",
          "--trainer.callbacks.every_n_steps=10", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
          "--trainer.enable_progress_bar=false"])  # fmt: skip
    with open(next((tmp_path / "runs").rglob("metrics.csv"))) as f:
        rows = [r for r in csv.DictReader(f) if r.get("perf/tokens_per_s")]
    assert [int(r["step"]) for r in rows] == [9, 19, 29, 39]  # at optimizer steps 10, ..., 40
    assert all(r["epoch"] != "" for r in rows)  # (a grouping by epoch dropped them)
    with open(next((tmp_path / "runs").rglob("metrics.csv"))) as f:
        losses = [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert losses == [19, 39]  # the same steps' losses (every 20), on the same axis
    assert all(float(r["perf/tokens_per_s"]) > 0 and float(r["perf/padding"]) == 0 for r in rows)


def test_evaluation_and_checkpointing_are_not_training_time(monkeypatch):
    """The clock stops from a validation's start to the next training batch: 2 steps of 1 s each,
    a 10 s validation between them, make 2 s."""
    from types import SimpleNamespace

    import torch

    from gpt_ft.data.batches import collate_blocks
    from gpt_ft.training import throughput

    now = [0.0]
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: now[0])
    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    trainer = SimpleNamespace(
        global_step=0, world_size=1, is_global_zero=True, loggers=[logger], current_epoch=0
    )
    gpt = GPT(GPTConfig(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    module = SimpleNamespace(gpt=gpt, log=lambda *args, **kwargs: None)
    batch = collate_blocks([(0, torch.arange(9)), (1, torch.arange(9))])  # 16 tokens
    callback = throughput.Throughput(every_n_steps=2)
    callback.on_train_start(trainer, module)
    for seconds_before in (0.0, 10.0):  # the second step after a validation of 10 s
        callback.on_train_batch_start(trainer, module, batch, 0)
        now[0] += 1.0
        trainer.global_step += 1
        callback.on_train_batch_end(trainer, module, None, batch, 0)
        if not seconds_before:
            callback.on_validation_start(trainer, module)
            now[0] += 10.0
    ((step, metrics),) = logged
    assert step == 1 and metrics["perf/tokens_per_s"] == 32 / 2.0


def test_the_metrics_line_shows_a_throughput_window_once(capsys):
    """The trainer keeps a window's figures until the next window's: a later validation's line
    would print them again, as if new. The objective's two terms are the logger's (the line keeps
    the objective, validation/loss)."""
    from types import SimpleNamespace

    import torch

    from gpt_ft.training.callbacks import PrintMetrics

    metrics = {"validation/loss": torch.tensor(2.0), "perf/tokens_per_s": torch.tensor(100.0)}
    metrics |= {"validation/task_loss": torch.tensor(0.5), "validation/lm_loss": torch.tensor(3.0)}
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, callback_metrics=metrics,
                              current_epoch=0, global_step=5, progress_bar_callback=None,
                              state=SimpleNamespace(fn="fit"))  # fmt: skip
    line = PrintMetrics()
    line.on_validation_end(trainer, None)
    metrics["validation/loss"] = torch.tensor(1.5)
    line.on_validation_end(trainer, None)
    metrics["perf/tokens_per_s"] = torch.tensor(120.0)
    metrics["lr-AdamW"] = torch.tensor(6.8e-6)  # (LearningRateMonitor's, late in a schedule: not 0.0000)
    line.on_validation_end(trainer, None)
    assert capsys.readouterr().out.splitlines() == [
        "epoch 0 step 5: perf/tokens_per_s 100.0000, validation/loss 2.0000",
        "epoch 0 step 5: validation/loss 1.5000",
        "epoch 0 step 5: lr-AdamW 6.800e-06, perf/tokens_per_s 120.0000, validation/loss 1.5000",
    ]


def test_the_parameters_are_counted_before_the_strategy_wraps_the_model():
    """FSDP leaves each rank the parameters of its shard: the count is taken at setup, before."""
    from types import SimpleNamespace

    from gpt_ft.training.throughput import Throughput

    gpt, callback = GPT(GPTConfig.from_name("gpt-micro", vocab_size=64)), Throughput()
    callback.setup(None, SimpleNamespace(gpt=gpt), "fit")
    assert callback._n_params == counted_parameters(gpt) > 0


def test_a_packed_token_attends_over_its_own_example_not_the_row():
    """The attention term's span for packed rows is the longest example (host metadata), not the row."""
    from gpt_ft.data.batches import collate_packed
    from gpt_ft.training.throughput import batch_tokens

    examples = [{"input_ids": [list(range(1, n + 1))], "extract_index": [n - 1], "label": 0, "index": i}
                for i, n in enumerate([5, 9, 3, 30, 7, 2])]  # fmt: skip
    batch = collate_packed(examples, pad_id=0)
    tokens, positions, span = batch_tokens(batch)
    assert (tokens, positions, span) == (56, 56, 30)  # one row of 56: the longest example's 30
