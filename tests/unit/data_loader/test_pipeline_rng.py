"""data_loader.pipeline_rng: what a resume needs to redraw the data pipeline's random numbers."""

from __future__ import annotations

import random

import pytest
import torch

from hasten.data_loader.base import DataLoaderAdapter
from hasten.data_loader.pipeline_rng import PipelineRng, capture_global_rng, restore_global_rng


def test_global_states_round_trip() -> None:
    saved = capture_global_rng()
    first = (torch.rand(2), random.random())
    restore_global_rng(saved)
    again = (torch.rand(2), random.random())
    assert torch.equal(first[0], again[0]) and first[1] == again[1]


def test_main_process_state_is_the_one_before_the_next_batch() -> None:
    pipeline = PipelineRng(num_workers=0)
    pipeline.begin(0)
    seen = []
    for _ in pipeline.indices([[0], [1], [2]], None):
        seen.append(torch.rand(1))  # the "transform" of this batch
    restore_global_rng(pipeline.state(1)["main"])  # handed out 1: batch 2 is next
    assert torch.equal(torch.rand(1), seen[1])


def test_worker_slots_follow_round_robin() -> None:
    pipeline = PipelineRng(num_workers=2)
    pipeline.begin(0)
    batches = iter([f"after {n}" for n in (1, 2, 3)])

    class Made:
        def __init__(self, name: str) -> None:
            self.batch, self.after = name, name

    fetch = pipeline.unwrap(lambda: Made(next(batches)))
    fetch(), fetch(), fetch()  # handed out 2, batch 3 read ahead
    assert pipeline.state(2)["workers"] == [("state", "after 1"), ("state", "after 2")]
    # after one batch, the next goes to worker 1, which made nothing yet, then worker 0 again
    assert pipeline.state(1)["workers"] == [("seed", 1), ("state", "after 1")]


def test_persistent_workers_are_not_restored_and_warn() -> None:
    loader = DataLoaderAdapter(list(range(4)), batch_size=2, num_workers=2, persistent_workers=True)
    assert loader.pipeline_state() is None
    with pytest.warns(RuntimeWarning, match="persistent_workers=False"):
        loader.load_pipeline_state({"position": 1, "workers": []})
