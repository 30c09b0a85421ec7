"""2-D meshes on 4 gloo processes (2 cores, tiny sizes): HSDP and FSDP2 x tensor parallel.

Each trains to the same weights as data parallelism over the same global batches (a single
process on the concatenated batch: DDP's averaged gradient), and only data-parallel ranks split
the data.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from _support.distributed import run_distributed
from _support.tp_models import TinyLM

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:Slicing a flattened")]

BATCH = 2
STEPS = 3


def _data() -> torch.Tensor:
    return torch.randint(0, 16, (24, 6), generator=torch.Generator().manual_seed(5))


def _train(sizes: dict[str, int] | None, batch_size: int) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.parallelism import ParallelismConfig

    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    if sizes is None:
        accelerator = Accelerator()
    else:
        accelerator = Accelerator(
            parallelism_config=ParallelismConfig(**sizes),
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        )
    loader = DataLoader(_data(), batch_size=batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen, norms = [], []
    for step, ids in enumerate(loader):
        if step == STEPS:
            break
        seen.append(ids[:, 0].tolist())
        loss = nn.functional.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
        optimizer.step()
        optimizer.zero_grad()
    weights = accelerator.get_state_dict(model)
    return {
        "seen": seen,
        "norms": norms,
        "weights": {k: v.tolist() for k, v in weights.items()},
        "strategy": repr(accelerator.strategy),
        "dp_rank": accelerator.data_parallel_rank if sizes else 0,
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param({"dp_replicate_size": 2, "dp_shard_size": 2}, id="hsdp"),
        pytest.param({"dp_shard_size": 2, "tp_size": 2}, id="fsdp2_x_tp"),
    ],
)
def test_2d_mesh_matches_data_parallel(sizes: dict[str, int]) -> None:
    from hasten.state._shared import reset_state

    dp = sizes.get("dp_replicate_size", 1) * sizes["dp_shard_size"]
    reference = _train(None, BATCH * dp)
    reset_state()
    ranks = run_distributed(_train, sizes, BATCH, world_size=4, timeout=200)
    for rank, result in enumerate(ranks):
        assert (
            "ComposableStrategy(mesh=(" in result["strategy"] and "fsdp=True" in result["strategy"]
        )
        assert ("tp=True" in result["strategy"]) == ("tp_size" in sizes)
        # data parallel rank r reads batches r, r+dp, ...: the reference's global batch, cut
        dp_rank = rank // sizes.get("tp_size", 1)
        assert result["dp_rank"] == dp_rank
        for step, first_tokens in enumerate(result["seen"]):
            global_batch = reference["seen"][step]
            assert first_tokens == global_batch[dp_rank * BATCH : (dp_rank + 1) * BATCH]
        assert result["norms"] == pytest.approx(reference["norms"], rel=1e-4)
    if "tp_size" in sizes:  # a tensor-parallel group reads the same batches
        assert ranks[0]["seen"] == ranks[1]["seen"] and ranks[0]["seen"] != ranks[2]["seen"]
    # full weights are gathered on the main process
    for name, value in reference["weights"].items():
        torch.testing.assert_close(
            torch.tensor(ranks[0]["weights"][name]), torch.tensor(value), rtol=1e-4, atol=1e-5
        )


def _resume(sizes: dict[str, int], folder: str, save: bool) -> float:
    """2-D (or 1-D) run: train 2 steps and save_state, or load_state; then one more step's loss."""
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.parallelism import ParallelismConfig

    torch.manual_seed(0 if save else 1)  # a loaded run starts from other weights
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    plugin = None
    if sizes.get("dp_shard_size", 1) > 1:
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, state_dict_type="SHARDED_STATE_DICT"
        )
    accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes), fsdp_plugin=plugin)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = _data()

    def step(ids: torch.Tensor) -> float:
        loss = nn.functional.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return float(loss)

    if save:
        step(data[:4])
        step(data[4:8])
        accelerator.save_state(folder)
    else:
        accelerator.load_state(folder)
    return step(data[8:12])  # the same batch on every process


@pytest.mark.timeout(300)
def test_2d_checkpoint_loads_on_a_1x2_mesh(tmp_path: Any) -> None:
    # (exact resume on the same mesh: test_tensor_parallel and the FSDP2 tests; 4-process runs
    # are kept to a minimum on 2 cores)
    folder = str(tmp_path / "ckpt")
    two_d = {"dp_shard_size": 2, "tp_size": 2}
    saved = run_distributed(_resume, two_d, folder, True, world_size=4, timeout=200)
    assert len(set(saved)) == 1  # every process computed the same batch
    tp_only = run_distributed(_resume, {"tp_size": 2}, folder, False, world_size=2, timeout=150)
    assert tp_only == pytest.approx(saved[:2], rel=1e-5)  # 2x2 -> 1x2
