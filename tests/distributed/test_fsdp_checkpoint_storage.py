"""Sharded save_state on 2 FSDP2 processes: asynchronous saves, plain-DCP parts, in-read checks."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed
from _support.fsdp_models import prepared_and_trained, train

pytestmark = pytest.mark.distributed


def _flat(state: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(state, dict):
        out: dict[str, Any] = {}
        for key, value in state.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    if isinstance(state, (list, tuple)):
        return _flat(dict(enumerate(state)), prefix)
    return {prefix: state.tolist() if isinstance(state, torch.Tensor) else state}


def _trained(**plugin_options: Any) -> tuple[Any, Any, Any, Any]:
    """An Accelerator with an FSDP plugin of ``plugin_options``, a prepared model and AdamW
    trained 2 steps: ``(accelerator, plugin, model, optimizer)``."""
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", **plugin_options
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    model, optimizer = prepared_and_trained(accelerator, 2)
    return accelerator, plugin, model, optimizer


def _checks(folder: str) -> dict[str, Any]:
    from hasten.checkpointing.storage.manifest import CorruptCheckpointError

    accelerator, _, model, optimizer = _trained(fsdp_version=2)
    strategy = accelerator.strategy
    saved = accelerator.get_state_dict(model)
    saved_opt = _flat(strategy.optimizer_state_dict(model, optimizer, full=True))
    target = str(Path(folder) / "async")
    accelerator.save_state(target, async_save=True)
    # training goes on while the shards are written: optimizer.step() waits for the state copy
    went_on = train(accelerator, model, optimizer, 2, start=2)
    moved = accelerator.get_state_dict(model)
    changed = any(not torch.equal(moved[k], v) for k, v in saved.items())
    accelerator.load_state(target)  # waits for the pending save first
    again = accelerator.get_state_dict(model)
    same = all(torch.equal(again[k], v) for k, v in saved.items())
    same_opt = _flat(strategy.optimizer_state_dict(model, optimizer, full=True)) == saved_opt
    resumed = train(accelerator, model, optimizer, 2, start=2)
    # only process 1's shard is damaged: both refuse, process 0's weights stay as they were
    damaged = Path(folder) / "damaged"
    if accelerator.is_main_process:
        shutil.copytree(target, damaged)
        shard = damaged / "pytorch_model_fsdp_0" / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    accelerator.wait_for_everyone()
    before = accelerator.get_state_dict(model)
    try:
        accelerator.load_state(str(damaged))
        error = "loaded"
    except CorruptCheckpointError as exc:
        error = str(exc)
    after = accelerator.get_state_dict(model)
    untouched = all(torch.equal(after[k], v) for k, v in before.items())
    return {
        "changed": changed,
        "same": same,
        "same_opt": same_opt,
        "bitwise": resumed == went_on,
        "error": error,
        "untouched": untouched,
        "saved": {k: v.tolist() for k, v in saved.items()},
    }


@pytest.mark.timeout(180)
def test_async_sharded_save_is_the_state_at_the_call_and_parts_are_plain_dcp(
    tmp_path: Path,
) -> None:
    results = run_distributed(_checks, str(tmp_path), world_size=2, timeout=120)
    main = results[0]
    assert main["changed"], "training after save_state must change the weights"
    assert main["same"] and main["same_opt"] and main["bitwise"]
    assert all("__1_0.distcp is corrupted: block" in r["error"] for r in results), results
    assert main["untouched"]
    saved = {k: torch.tensor(v) for k, v in main["saved"].items()}
    # each part folder is a plain DCP checkpoint: dcp.load and merge-weights read it alone
    import torch.distributed.checkpoint as dcp

    from hasten.checkpointing.merge import load_merged_state_dict

    part = tmp_path / "async" / "pytorch_model_fsdp_0"
    template = {k: torch.zeros_like(v) for k, v in saved.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(template, checkpoint_id=part, no_dist=True)
    assert all(torch.equal(template[k], v) for k, v in saved.items())
    merged = load_merged_state_dict(part)
    assert sorted(merged) == sorted(saved)
    assert all(torch.equal(merged[k], v) for k, v in saved.items())


def _local_state_dict(folder: str) -> dict[str, Any]:
    from hasten.checkpointing.fsdp_utils import (
        load_fsdp_model,
        load_fsdp_optimizer,
        save_fsdp_model,
        save_fsdp_optimizer,
    )

    accelerator, plugin, model, optimizer = _trained(
        fsdp_version=1, state_dict_type="LOCAL_STATE_DICT"
    )
    strategy = accelerator.strategy
    before = accelerator.get_state_dict(model)
    before_opt = _flat(strategy.optimizer_state_dict(model, optimizer, full=True))
    save_fsdp_model(plugin, accelerator, model, folder)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
    accelerator.wait_for_everyone()
    train(accelerator, model, optimizer, 1, start=2)  # weights and optimizer state move on
    moved = accelerator.get_state_dict(model)
    load_fsdp_model(plugin, accelerator, model, folder)
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
    after = accelerator.get_state_dict(model)
    try:
        load_fsdp_model(plugin, accelerator, model, str(Path(folder) / "nowhere"))
        missing = "loaded"
    except FileNotFoundError as exc:
        missing = str(exc)
    return {
        "moved": any(not torch.equal(moved[k], v) for k, v in before.items()),
        "same": all(torch.equal(after[k], v) for k, v in before.items()),
        "same_opt": _flat(strategy.optimizer_state_dict(model, optimizer, full=True)) == before_opt,
        "missing": missing,
    }


@pytest.mark.timeout(180)
def test_fsdp1_local_state_dict_helpers_round_trip_each_process_file(tmp_path: Path) -> None:
    results = run_distributed(_local_state_dict, str(tmp_path), world_size=2, timeout=120)
    assert results[0]["moved"] and results[0]["same"] and results[0]["same_opt"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["optimizer_0", "pytorch_model_fsdp_rank0.bin", "pytorch_model_fsdp_rank1.bin"]
    assert (tmp_path / "optimizer_0" / ".metadata").is_file()
    for r in range(2):  # plain tensors: loadable without unpickling any class
        state = torch.load(tmp_path / f"pytorch_model_fsdp_rank{r}.bin", weights_only=True)
        assert all(type(v) is torch.Tensor for v in state.values())
    assert all(
        "load only on the number of processes that saved them" in r["missing"] for r in results
    )
