"""FSDP1 SHARDED_STATE_DICT save_state -> fresh processes -> load_state resumes exactly.

FSDP1's sharded state dicts are ShardedTensors cut in row chunks; a parameter with fewer rows
than processes (a one-output head) has no chunk on the last process. DCP drops such entries
from that process's load plan, and its pre-2.4 compatibility check took the gap for an old
checkpoint layout: the load failed with ``Missing key in checkpoint state_dict:
optimizer_0.param_groups``. `hasten.checkpointing.dcp_safe.SafeLoadPlanner` keeps that check
away from versioned indexes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from _support.distributed import run_distributed
from _support.fsdp_models import TinyTransformer, batches

pytestmark = pytest.mark.distributed


class OneOutput(TinyTransformer):
    """TinyTransformer with a one-row head: no chunk of it on process 1 of 2."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 1)


def _steps(accelerator: Any, model: Any, optimizer: Any, start: int, stop: int) -> list[float]:
    losses = []
    data = batches(accelerator.process_index, accelerator.num_processes, stop)
    for x, y in data[start:]:
        loss = torch.nn.functional.mse_loss(model(x), y[:, :1])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _phase(folder: str, phase: str, use_orig_params: bool) -> dict[str, Any]:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=1,
        state_dict_type="SHARDED_STATE_DICT",
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        use_orig_params=use_orig_params,
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    torch.manual_seed(0 if phase != "resume" else 99)  # resume starts from other weights
    model = OneOutput()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    if phase == "full":
        return {"losses": _steps(accelerator, model, optimizer, 0, 6)}
    if phase == "save":
        _steps(accelerator, model, optimizer, 0, 3)
        accelerator.save_state(folder)
        held = accelerator.strategy.model_state_dict(model, full=False)["head.weight"]
        return {"head_chunks": len(held.local_shards())}
    accelerator.load_state(folder)
    return {"losses": _steps(accelerator, model, optimizer, 3, 6)}


@pytest.mark.timeout(240)
def test_fsdp1_sharded_checkpoint_with_a_chunkless_parameter_resumes_exactly(
    tmp_path: Path,
) -> None:
    # the case (default use_orig_params=False); use_orig_params=True, the other engines
    # and resharding run through `hasten launch` in tests/cli/test_resume_matrix.py
    folder, use_orig_params = str(tmp_path / "ckpt"), False
    full = run_distributed(_phase, folder, "full", use_orig_params, world_size=2, timeout=90)
    saved = run_distributed(_phase, folder, "save", use_orig_params, world_size=2, timeout=90)
    assert [s["head_chunks"] for s in saved] == [1, 0]  # the case that failed to load
    resumed = run_distributed(_phase, folder, "resume", use_orig_params, world_size=2, timeout=90)
    for rank in (0, 1):
        assert resumed[rank]["losses"] == full[rank]["losses"][3:]  # bitwise
