"""ZeRO checkpoints saved on N processes load on M != N through DeepSpeed's universal checkpoint.

Each run trains on fixed global batches of 8 samples (each process takes its share) so that a
run at 1 process and one at 2 follow the same math. The saving run records the consolidated
fp32 weights and Adam moments by parameter name (DeepSpeed's ``safe_get_full_*``), saves, and
trains on; the resumed run loads at the other size, records the same, and trains the same
steps: the state is bitwise equal and the losses agree within float reduction order.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _support.distributed import DistributedTestError, run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.usefixtures("deepspeed_ops"),
    pytest.mark.timeout(600),  # the first DeepSpeed test of a fresh machine builds its op
]

GLOBAL_BATCH, STEPS_BEFORE, STEPS_AFTER = 8, 2, 2
# one process sums the global batch, two all-reduce halves: float32 rounding apart
RTOL = 1e-5


def _setup(stage: int, offload: bool, hidden: int = 32) -> tuple[Any, Any, Any]:
    from hasten import Accelerator
    from hasten.utils import DeepSpeedPlugin, set_seed

    set_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 2)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    plugin = DeepSpeedPlugin(
        hf_ds_config={
            "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "zero_optimization": zero,
            "zero_force_ds_cpu_optimizer": False,
        }
    )
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=generator)
    y = torch.randn(GLOBAL_BATCH, 2, generator=generator)
    share = GLOBAL_BATCH // world
    return x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]


def _steps(accelerator: Any, model: Any, optimizer: Any, steps: range) -> list[float]:
    """Train ``steps``; the global mean loss of each (the mean of the processes' equal shares)."""
    losses = []
    for step in steps:
        x, y = _batch(step, accelerator.process_index, accelerator.num_processes)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.gather(loss.detach()[None]).mean()))
    return losses


def _state(model: Any) -> dict[str, np.ndarray]:
    """Consolidated fp32 weights and Adam moments by parameter name (collective)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    found = {}
    for name, param in model.module.named_parameters():
        found[f"{name}/fp32"] = safe_get_full_fp32_param(param).numpy().copy()
        for key in ("exp_avg", "exp_avg_sq"):
            found[f"{name}/{key}"] = safe_get_full_optimizer_state(param, key).numpy().copy()
    return found


def _save_run(stage: int, offload: bool, folder: str) -> dict[str, Any]:
    accelerator, model, optimizer = _setup(stage, offload)
    _steps(accelerator, model, optimizer, range(STEPS_BEFORE))
    saved = _state(model)
    accelerator.save_state(folder)
    after = _steps(accelerator, model, optimizer, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    return {"saved": saved, "losses": after}


def _load_run(stage: int, offload: bool, folder: str, strict: bool = True) -> dict[str, Any]:
    accelerator, model, optimizer = _setup(stage, offload)
    accelerator.load_state(folder, strict=strict)
    loaded = _state(model)
    after = _steps(accelerator, model, optimizer, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    leftovers = sorted(p.name for p in Path(os.environ["TMPDIR"]).glob("hasten-zero-universal-*"))
    return {"loaded": loaded, "losses": after, "leftovers": leftovers}


def _check(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
    saved, loaded = first[0]["saved"], second[0]["loaded"]
    assert sorted(saved) == sorted(loaded)
    for key, value in saved.items():
        assert np.array_equal(loaded[key], value), key  # bitwise
    for result in second:
        assert all(np.isfinite(result["losses"]))
        np.testing.assert_allclose(result["losses"], first[0]["losses"], rtol=RTOL)
        assert result["leftovers"] == []  # the converted files are removed


def _reshard(tmp_path: Path, stage: int, offload: bool, saving: int, loading: int) -> None:
    folder = str(tmp_path / "ckpt")
    env = {"TMPDIR": str(tmp_path)}
    first = run_distributed(
        _save_run, stage, offload, folder, world_size=saving, timeout=240, env=env
    )
    second = run_distributed(
        _load_run, stage, offload, folder, world_size=loading, timeout=240, env=env
    )
    _check(first, second)


def test_zero2_saved_on_two_processes_loads_on_one(tmp_path: Path) -> None:
    _reshard(tmp_path, 2, False, saving=2, loading=1)


def test_zero3_saved_on_one_process_loads_on_two(tmp_path: Path) -> None:
    _reshard(tmp_path, 3, False, saving=1, loading=2)


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True], ids=["", "offload"])
@pytest.mark.parametrize(("saving", "loading"), [(2, 1), (1, 2)], ids=["2to1", "1to2"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_reshard_matrix(
    tmp_path: Path, stage: int, saving: int, loading: int, offload: bool
) -> None:
    _reshard(tmp_path, stage, offload, saving, loading)
