"""`load_checkpoint_in_model(broadcast_from_rank0=True)`: only rank 0 reads, all ranks match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from _support.distributed import run_distributed

pytestmark = pytest.mark.distributed


def _load_on_every_rank(checkpoint: str) -> list[float]:
    import torch.distributed as dist

    from hasten.big_modeling import init_empty_weights
    from hasten.big_modeling.loading import load_checkpoint_in_model

    dist.init_process_group("gloo")
    # only rank 0 can see the file: the others must receive every tensor
    path = checkpoint if dist.get_rank() == 0 else checkpoint + ".absent"
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    load_checkpoint_in_model(model, path, broadcast_from_rank0=True)
    return [float(p.detach().double().sum()) for p in model.parameters()]


@pytest.mark.timeout(90)
def test_broadcast_from_rank0_gives_every_rank_the_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    save_file(source.state_dict(), tmp_path / "model.safetensors")
    results = run_distributed(
        _load_on_every_rank, str(tmp_path / "model.safetensors"), world_size=2, timeout=60
    )
    want = [float(p.detach().double().sum()) for p in source.parameters()]
    assert results[0] == results[1] == want
