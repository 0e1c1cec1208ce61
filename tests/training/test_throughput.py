import pytest

from gpt_ft import GPT, GPTConfig
from gpt_ft.training.throughput import counted_parameters, dense_peak_tflops, flops_per_token


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
