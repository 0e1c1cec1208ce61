"""The collectives over ranks are the identity in one process (2 processes: test_distributed.py)."""

import torch

from gpt_ft.training.ranks import finite_everywhere, gather, mean_over_ranks


def test_one_process_collectives_are_the_identity():
    value = torch.tensor(3, requires_grad=False)
    mean = mean_over_ranks(value, world_size=1)
    assert mean.dtype == torch.float32 and float(mean) == 3.0
    loss = torch.tensor(2.0, requires_grad=True) * 2
    assert not mean_over_ranks(loss, world_size=2).requires_grad  # no process group: itself, detached
    assert finite_everywhere(loss, 1) == 1 and finite_everywhere(torch.tensor(float("nan")), 1) == 0
    assert finite_everywhere(torch.tensor(float("inf")), 2) == 0
    values = torch.tensor([[1, 2], [3, 4]])
    assert torch.equal(gather(values, 1, torch.device("cpu")), values)
