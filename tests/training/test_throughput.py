import csv

import pytest

from gpt_ft import GPT, GPTConfig
from gpt_ft.cli import main
from gpt_ft.training.throughput import counted_parameters, dense_peak_tflops, flops_per_token
from tests.helpers import ROOT, write_corpus


def test_dense_peaks_not_sparse_ones():
    assert dense_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert dense_peak_tflops("NVIDIA H100 NVL") == 835.0
    assert dense_peak_tflops("NVIDIA H200") == 989.0
    assert dense_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert dense_peak_tflops("Some CPU") is None


def test_nanogpt_flop_count_for_gpt1():
    import torch

    with torch.device("meta"):
        gpt = GPT(GPTConfig.from_name("gpt1"))
    n = counted_parameters(gpt)
    assert n == 116_534_784 - 512 * 768
    # 6N + 12 * L * H * Q * T at T = 512
    assert flops_per_token(gpt.config, n, 512) == pytest.approx(6 * n + 12 * 12 * 12 * 64 * 512)
    assert flops_per_token(gpt.config, n, 512) == 753_472_512


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
    assert [int(r["step"]) for r in rows] == [10, 20, 30, 40]
    assert all(float(r["perf/tokens_per_s"]) > 0 and float(r["perf/padding"]) == 0 for r in rows)
