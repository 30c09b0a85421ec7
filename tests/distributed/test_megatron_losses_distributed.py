"""Megatron-LM loss averaging and gathering over two CPU processes (no model parallelism)."""

from __future__ import annotations

import pytest
import torch

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed


def _average_and_gather() -> tuple[list[float], list[int]]:
    from hasten.state import PartialState
    from hasten.strategies.megatron.engine import (
        avg_losses_across_data_parallel_group,
        gather_across_data_parallel_groups,
    )

    rank = PartialState().process_index
    averaged = avg_losses_across_data_parallel_group([torch.tensor(float(rank)), torch.tensor(2.0)])
    gathered = gather_across_data_parallel_groups({"x": torch.tensor([rank])})
    return averaged.tolist(), gathered["x"].tolist()


def test_loss_averaging_and_gathering_across_two_processes() -> None:
    results = run_distributed(_average_and_gather, world_size=2, timeout=60)
    assert results == [([0.5, 2.0], [0, 1]), ([0.5, 2.0], [0, 1])]
