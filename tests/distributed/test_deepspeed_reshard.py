"""ZeRO checkpoints saved on N processes load on M != N through DeepSpeed's universal checkpoint.

Each run trains on fixed global batches of 8 samples (each process takes its share) so that a
run at 1 process and one at 2 follow the same math. The saving run records the consolidated
fp32 weights and Adam moments by parameter name (DeepSpeed's ``safe_get_full_*``), saves, and
trains on; the resumed run loads at the other size, records the same, and trains the same
steps: the state is bitwise equal and the losses agree within float reduction order. ZeRO-2
2 -> 1 and ZeRO-3 1 -> 2 run in ``make test``; every stage, both directions, with and without
the optimizer offloaded to the CPU, behind the ``matrix`` marker (``make test-matrix``).
"""

from __future__ import annotations

import os
import signal
import tempfile
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

    tempfile.tempdir = None  # the forked worker finds the test's TMPDIR, not the parent's choice
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


@pytest.mark.matrix
@pytest.mark.parametrize("offload", [False, True], ids=["", "offload"])
@pytest.mark.parametrize(("saving", "loading"), [(2, 1), (1, 2)], ids=["2to1", "1to2"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_reshard_matrix(
    tmp_path: Path, stage: int, saving: int, loading: int, offload: bool
) -> None:
    _reshard(tmp_path, stage, offload, saving, loading)


def _accelerate_layout_run(stage: int, folder: str) -> dict[str, Any]:
    """What Accelerate 1.15's save_state writes for DeepSpeed: ``engine.save_checkpoint(folder,
    "pytorch_model")`` (the engine's ``latest`` and zero_to_fp32.py beside it), no manifest."""
    accelerator, model, optimizer = _setup(stage, False)
    _steps(accelerator, model, optimizer, range(STEPS_BEFORE))
    saved = _state(model)
    model.save_checkpoint(folder, "pytorch_model")
    after = _steps(accelerator, model, optimizer, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    return {"saved": saved, "losses": after}


@pytest.mark.parametrize(("stage", "saving", "loading"), [(2, 2, 1), (3, 2, 2)])
def test_a_checkpoint_laid_out_by_accelerate_loads(
    tmp_path: Path, stage: int, saving: int, loading: int
) -> None:
    folder, env = str(tmp_path / "ckpt"), {"TMPDIR": str(tmp_path)}
    first = run_distributed(
        _accelerate_layout_run, stage, folder, world_size=saving, timeout=240, env=env
    )
    assert (tmp_path / "ckpt" / "latest").read_text() == "pytorch_model"
    assert not (tmp_path / "ckpt" / "hasten_manifest.json").exists()
    # no hasten manifest: strict=False loads it unverified, as for any folder hasten did not write
    second = run_distributed(
        _load_run, stage, False, folder, False, world_size=loading, timeout=240, env=env
    )
    _check(first, second)


def _load_error(stage: int, folder: str, strict: bool, hidden: int = 32) -> str:
    accelerator, model, optimizer = _setup(stage, False, hidden)
    try:
        accelerator.load_state(folder, strict=strict)
    except (ValueError, FileNotFoundError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "loaded"


def test_a_checkpoint_missing_some_ranks_files_names_them(tmp_path: Path) -> None:
    folder, env = str(tmp_path / "ckpt"), {"TMPDIR": str(tmp_path)}
    run_distributed(_accelerate_layout_run, 2, folder, world_size=2, timeout=240, env=env)
    for lost in (tmp_path / "ckpt" / "pytorch_model").glob("*zero_pp_rank_1_*"):
        lost.unlink()
    (error,) = run_distributed(_load_error, 2, folder, False, world_size=1, timeout=240, env=env)
    assert error.startswith("FileNotFoundError")
    assert "saved by 2 data-parallel process(es)" in error
    assert "rank(s) [1] are missing" in error
    assert "Copy those files from the saving run" in error


def test_a_checkpoint_of_another_model_is_refused_before_converting(tmp_path: Path) -> None:
    folder, env = str(tmp_path / "ckpt"), {"TMPDIR": str(tmp_path)}
    run_distributed(_save_run, 3, False, folder, world_size=2, timeout=240, env=env)
    (error,) = run_distributed(_load_error, 3, folder, True, 16, world_size=1, timeout=240, env=env)
    assert error.startswith("ValueError")
    assert "is a checkpoint of another model" in error
    assert "different shapes: ['0.bias: saved (32,), model (16,)'" in error
    assert "Load it into the model that saved it" in error
    assert not list(tmp_path.glob("hasten-zero-universal-*"))  # nothing converted


def _killed_conversion(folder: str) -> None:
    """Load at 1 process and die (SIGKILL) in the middle of DeepSpeed's conversion."""
    from deepspeed.checkpoint import ds_to_universal

    def die(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    ds_to_universal._save_optimizer_state = die  # after the fragments are written
    accelerator, _, _ = _setup(2, False)
    accelerator.load_state(folder)


def test_a_kill_during_the_conversion_does_not_break_the_next_load(tmp_path: Path) -> None:
    folder, env = str(tmp_path / "ckpt"), {"TMPDIR": str(tmp_path)}
    first = run_distributed(_save_run, 2, False, folder, world_size=2, timeout=240, env=env)
    with pytest.raises(DistributedTestError) as killed:
        run_distributed(_killed_conversion, folder, world_size=1, timeout=240, env=env)
    assert "exit code -9" in str(killed.value)
    (left,) = tmp_path.glob("hasten-zero-universal-*")  # the killed attempt's half conversion
    assert (left / "pytorch_model" / "zero").is_dir()
    second = run_distributed(_load_run, 2, False, folder, world_size=1, timeout=240, env=env)
    _check(first, second)  # loads, and the dead attempt's folder is gone
