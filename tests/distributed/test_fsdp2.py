"""FSDP2 on 2 CPU processes over gloo: really sharded, same weights as DDP, exact resume."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.distributed import run_distributed
from _support.fsdp_models import TinyTransformer, prepared_and_trained, train

pytestmark = pytest.mark.distributed


def _accelerator(engine: str, steps: int = 1, mixed_precision: str = "no", **fsdp: Any) -> Any:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = None
    if engine != "ddp":
        version = 2 if engine == "fsdp2" else 1
        fsdp.setdefault("auto_wrap_policy", "transformer_based_wrap")
        plugin = FullyShardedDataParallelPlugin(fsdp_version=version, **fsdp)
    return Accelerator(
        fsdp_plugin=plugin, gradient_accumulation_steps=steps, mixed_precision=mixed_precision
    )


def _run(
    engine: str, steps: int, mixed_precision: str, folder: str | None = None, **fsdp: Any
) -> dict[str, Any]:
    accelerator = _accelerator(engine, steps, mixed_precision, **fsdp)
    torch.manual_seed(0)
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    local = sum(getattr(p, "_local_tensor", p).numel() for p in model.parameters())
    total = sum(p.numel() for p in TinyTransformer().parameters())
    losses = train(accelerator, model, optimizer, 6, clip=1.0)
    state = accelerator.get_state_dict(model)
    reloaded = None
    if folder is not None:  # save, change the weights, load: the saved weights come back
        accelerator.save_state(folder)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        accelerator.load_state(folder)
        again = accelerator.get_state_dict(model)
        reloaded = all(torch.equal(again[k], v) for k, v in state.items())
    return {
        "reloaded": reloaded,
        "losses": losses,
        "fraction": local / total,
        "state": {k: v.float().tolist() for k, v in state.items()},  # no shared memory
        "strategy": accelerator.strategy.name,
        "is_fsdp2": accelerator.is_fsdp2,
        "distributed_type": str(accelerator.distributed_type),
    }


@functools.cache
def _ddp(steps: int, mixed_precision: str) -> list[dict[str, Any]]:
    """The DDP reference of one setting, computed once per test session."""
    return run_distributed(_run, "ddp", steps, mixed_precision, world_size=2, timeout=90)


def _compare(
    engine: str, steps: int, mixed_precision: str, atol: float, folder: str | None = None, **kw: Any
) -> list[dict[str, Any]]:
    ddp = _ddp(steps, mixed_precision)
    sharded = run_distributed(
        functools.partial(_run, **kw),
        engine,
        steps,
        mixed_precision,
        folder,
        world_size=2,
        timeout=90,
    )
    assert sharded[0]["strategy"] == engine and sharded[0]["distributed_type"].endswith("FSDP")
    # each process holds about half of the parameters
    assert 0.4 < sharded[0]["fraction"] < 0.6 and 0.4 < sharded[1]["fraction"] < 0.6
    assert ddp[0]["fraction"] == 1.0
    if engine == "fsdp2":
        assert sharded[1]["state"] == {}  # full state dicts are gathered to the main process
    for key, value in ddp[0]["state"].items():
        got, want = torch.tensor(sharded[0]["state"][key]), torch.tensor(value)
        torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=key)
    assert sharded[0]["losses"] == pytest.approx(ddp[0]["losses"], abs=atol * 10)
    return sharded


@pytest.mark.timeout(200)
def test_fsdp2_matches_ddp_with_and_without_accumulation() -> None:
    _compare("fsdp2", 1, "no", atol=1e-5)
    _compare("fsdp2", 2, "no", atol=1e-5)


@pytest.mark.timeout(200)
def test_fsdp2_and_fsdp1_bf16_match_ddp_bf16_within_bf16_tolerance() -> None:
    _compare("fsdp2", 2, "bf16", atol=3e-2)
    _compare("fsdp1", 2, "bf16", atol=3e-2)  # the DDP reference is cached


def _resume(folder: str, phase: str) -> dict[str, Any]:
    accelerator = _accelerator("fsdp2")
    torch.manual_seed(0 if phase != "resume" else 99)  # resume starts from other weights
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    if phase == "full":
        return {"losses": train(accelerator, model, optimizer, 6, clip=1.0)}
    if phase == "save":
        train(accelerator, model, optimizer, 3, clip=1.0)
        accelerator.save_state(folder)
        state = accelerator.get_state_dict(model)
        mine = sorted(p.name for p in (Path(folder) / "pytorch_model_fsdp_0").iterdir())
        return {"state": {k: v.tolist() for k, v in state.items()}, "files": mine}
    accelerator.load_state(folder)
    return {"losses": train(accelerator, model, optimizer, 3, clip=1.0, start=3)}


def _load_damaged(folder: str) -> str:
    from hasten.checkpointing.storage.manifest import CorruptCheckpointError

    accelerator = _accelerator("fsdp2")
    model = TinyTransformer()
    model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    try:
        accelerator.load_state(folder)
    except CorruptCheckpointError as exc:
        return str(exc)
    return "loaded"


@pytest.mark.timeout(240)
def test_fsdp2_sharded_save_state_resumes_exactly_and_on_one_process(tmp_path: Path) -> None:
    folder = str(tmp_path / "ckpt")
    full = run_distributed(_resume, folder, "full", world_size=2, timeout=60)
    saved = run_distributed(_resume, folder, "save", world_size=2, timeout=60)
    assert saved[0]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    names = sorted(p.name for p in Path(folder).iterdir())
    assert "optimizer_0" in names and "hasten_manifest.json" in names
    assert "model.safetensors" not in names
    resumed = run_distributed(_resume, folder, "resume", world_size=2, timeout=60)
    assert resumed[0]["losses"] == full[0]["losses"][3:]  # bitwise
    assert resumed[1]["losses"] == full[1]["losses"][3:]
    # each process verifies half of the shards; a damaged one stops both
    import shutil

    damaged = tmp_path / "damaged2"
    shutil.copytree(folder, damaged)
    for part in (damaged / "optimizer_0").glob("__*_0.distcp"):
        data = bytearray(part.read_bytes())
        data[-1] ^= 0xFF
        part.write_bytes(bytes(data))
    errors = run_distributed(_load_damaged, str(damaged), world_size=2, timeout=60)
    assert all("is corrupted: block" in e for e in errors), errors
    # 2 -> 1: one process (no process group) loads the shards into a plain model
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(folder)
    for key, value in saved[0]["state"].items():
        assert torch.equal(model.state_dict()[key], torch.tensor(value)), key
    assert len(optimizer.state) == len(list(model.parameters()))
    x = torch.randn(2, 8)
    model(x).sum().backward()
    optimizer.step()  # the loaded optimizer state is usable
    _bad_checkpoints(Path(folder), accelerator, tmp_path)


def _bad_checkpoints(folder: Path, accelerator: Any, tmp_path: Path) -> None:
    """A missing shard and a checkpoint of another model are refused, naming the problem."""
    import shutil

    from hasten.checkpointing.storage.manifest import CorruptCheckpointError

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "pytorch_model_fsdp_0" / "__1_0.distcp").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"__1_0.distcp is listed in the manifest"):
        accelerator.load_state(str(broken))
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    part = damaged / "optimizer_0" / "__0_0.distcp"
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"__0_0.distcp is corrupted: block"):
        accelerator.load_state(str(damaged))
    _crafted_checkpoints(folder, accelerator, tmp_path)
    from hasten.state._shared import reset_state

    reset_state()
    from hasten import Accelerator

    other = Accelerator(cpu=True)
    wider = TinyTransformer(width=8)
    prepared = other.prepare(wider, torch.optim.AdamW(wider.parameters()))
    with pytest.raises(ValueError, match="model 0.*does not match the model given"):
        other.load_state(str(folder))
    assert prepared is not None


class _Payload:
    """Unpickling this runs a shell command that leaves ``marker`` behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return os.system, (f"touch {self.marker}",)


def _crafted_checkpoints(folder: Path, accelerator: Any, tmp_path: Path) -> None:
    """A part index or a bytes entry that would run code is refused by load_state, unrun.

    strict=False skips the manifest, as a crafted manifest would let them through its checks.
    """
    import pickle
    import shutil

    import torch.distributed.checkpoint as dcp

    from hasten.checkpointing.layouts.dcp_parts import sharded_state_dicts
    from hasten.checkpointing.storage.io import UnsafeCheckpointError

    marker = tmp_path / "ran"
    crafted = tmp_path / "crafted_index"
    shutil.copytree(folder, crafted)
    index = crafted / "optimizer_0" / ".metadata"
    metadata = pickle.loads(index.read_bytes())  # noqa: S301 - our own fresh save
    metadata.storage_meta.save_id = _Payload(marker)
    index.write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpointError, match=r"optimizer_0/\.metadata.*posix\.system"):
        accelerator.load_state(str(crafted), strict=False)
    crafted = tmp_path / "crafted_entry"
    shutil.copytree(folder, crafted)
    shutil.rmtree(crafted / "optimizer_0")
    model, optimizer = accelerator._models[0], accelerator._optimizers[0]
    part = sharded_state_dicts(accelerator.strategy, [model], [optimizer])["optimizer_0"]
    part["param_groups"][0]["lr"] = _Payload(marker)
    dcp.save(part, checkpoint_id=crafted / "optimizer_0", no_dist=True)
    with pytest.raises(UnsafeCheckpointError, match=r"param_groups\.0\.lr.*could run code"):
        accelerator.load_state(str(crafted), strict=False)
    assert not marker.exists()


@pytest.mark.timeout(200)
def test_fsdp1_matches_ddp_and_round_trips_a_full_state_dict_checkpoint(tmp_path: Path) -> None:
    # FULL_STATE_DICT on CPU: gathered without offload_to_cpu (which segfaults in torch)
    sharded = _compare(
        "fsdp1", 2, "no", atol=1e-5, folder=str(tmp_path / "full"), use_orig_params=False
    )
    assert sharded[0]["reloaded"] and sharded[1]["reloaded"]
    names = sorted(p.name for p in (tmp_path / "full").iterdir())
    assert "model.safetensors" in names and "optimizer.bin" in names


def _killed_during_save(folder: str) -> None:
    import os
    import signal

    import hasten.checkpointing.storage.dcp as sharded_state

    accelerator = _accelerator("fsdp2")
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    train(accelerator, model, optimizer, 1)

    def die(*_: Any) -> None:  # every process is killed after DCP wrote its shards
        os.kill(os.getpid(), signal.SIGKILL)

    sharded_state._written = die  # type: ignore[assignment]
    accelerator.save_state(folder)


@pytest.mark.timeout(120)
def test_kill_9_during_a_sharded_save_leaves_nothing_loadable(tmp_path: Path) -> None:
    from _support.distributed import DistributedTestError
    from hasten.checkpointing.storage import paths

    folder = tmp_path / "checkpoints" / "checkpoint_0"
    with pytest.raises(DistributedTestError):
        run_distributed(_killed_during_save, str(folder), world_size=2, timeout=60)
    assert not folder.exists()  # only the hidden staging folder is left
    (staging,) = folder.parent.glob(".checkpoint_0.*.partial")  # named after the save
    assert (staging / "pytorch_model_fsdp_0" / "__0_0.distcp").exists()
    assert paths.newest_complete_checkpoint(tmp_path) is None


def _helpers(folder: str, use_dcp: bool) -> dict[str, Any]:
    from hasten.checkpointing.fsdp_utils import (
        load_fsdp_model,
        load_fsdp_optimizer,
        save_fsdp_model,
        save_fsdp_optimizer,
    )

    accelerator = _accelerator("fsdp2")
    plugin = accelerator.state.fsdp_plugin
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    train(accelerator, model, optimizer, 2)
    before = accelerator.get_state_dict(model)
    if not use_dcp:  # full files: one torch file gathered on rank 0
        plugin.set_state_dict_type("FULL_STATE_DICT")
    save_fsdp_model(plugin, accelerator, model, folder, use_dcp=use_dcp)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder, use_dcp=use_dcp)
    accelerator.wait_for_everyone()  # full files are written by rank 0 only
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    load_fsdp_model(plugin, accelerator, model, folder, use_dcp=use_dcp)
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, folder, use_dcp=use_dcp)
    after = accelerator.get_state_dict(model)
    same = all(torch.equal(after[k], v) for k, v in before.items())
    if not use_dcp:
        return {"same": same}
    # a sharded folder is verified against its manifest: process 1's damaged shard is refused
    # on both processes, before any tensor is filled
    from hasten.checkpointing.storage.manifest import CorruptCheckpointError

    if accelerator.is_main_process:
        shard = Path(folder) / "pytorch_model_fsdp_0" / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    accelerator.wait_for_everyone()
    try:
        load_fsdp_model(plugin, accelerator, model, folder)
        refused = "loaded"
    except CorruptCheckpointError as exc:
        refused = str(exc)
    return {"same": same, "refused": refused}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("use_dcp", [True, False])
def test_save_and_load_fsdp_model_helpers(tmp_path: Path, use_dcp: bool) -> None:
    result = run_distributed(_helpers, str(tmp_path), use_dcp, world_size=2, timeout=60)
    assert [r["same"] for r in result] == [True, True]
    if use_dcp:
        from hasten.checkpointing.storage.manifest import MANIFEST_NAME

        for part in ("pytorch_model_fsdp_0", "optimizer_0"):  # published whole, with a manifest
            assert (tmp_path / part / ".metadata").is_file()
            assert (tmp_path / part / MANIFEST_NAME).is_file()
        assert all("__1_0.distcp is corrupted: block" in r["refused"] for r in result), result
        assert list(tmp_path.glob(".*")) == []  # no staging folder left
    else:
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "optimizer.bin",
            "pytorch_model_fsdp.bin",
        ]


def _efficient_loading() -> dict[str, Any]:
    from hasten import init_empty_weights
    from hasten.config import envvars
    from hasten.strategies import parallelize

    accelerator = _accelerator("fsdp2", cpu_ram_efficient_loading=True)
    at_shard: list[bool] = []  # whether every parameter was on meta when fully_shard ran
    shard = parallelize.apply_fsdp

    def spy(module: torch.nn.Module, plugin: Any, mesh: Any) -> torch.nn.Module:
        at_shard.append(all(p.is_meta for p in module.parameters()))
        return shard(module, plugin, mesh)

    parallelize.apply_fsdp = spy  # forked worker: no undo needed
    torch.manual_seed(0)
    if accelerator.process_index == 0:
        model = TinyTransformer()
    else:  # other ranks never allocate the weights, as an Accelerate user writes it
        with init_empty_weights():
            model = TinyTransformer()
    built_on_meta = all(p.is_meta for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    torch.manual_seed(accelerator.process_index)  # rank 1's own weights: rank 0's must win
    other = accelerator.prepare(TinyTransformer())
    shards = {n: p.to_local().tolist() for n, p in model.named_parameters()}
    on_meta = any(p.is_meta for p in model.parameters())
    state = accelerator.get_state_dict(model)
    other_state = accelerator.get_state_dict(other)
    train(accelerator, model, optimizer, 2)
    return {
        "built_on_meta": built_on_meta,
        "at_shard": at_shard,
        "meta": on_meta,
        "shards": shards,
        "state": {k: v.tolist() for k, v in state.items()},
        "other": {k: v.tolist() for k, v in other_state.items()},
        "use_fsdp": envvars.setting("ACCELERATE_USE_FSDP"),
    }


@pytest.mark.timeout(120)
def test_cpu_ram_efficient_loading_broadcasts_rank0_weights() -> None:
    results = run_distributed(_efficient_loading, world_size=2, timeout=60)
    assert [r["built_on_meta"] for r in results] == [False, True]
    # no process holds a full copy while sharding: every rank shards an empty (meta) model
    assert results[0]["at_shard"] == results[1]["at_shard"] == [True, True]
    assert not results[0]["meta"] and not results[1]["meta"]
    assert results[0]["use_fsdp"] is True  # transformers' from_pretrained reads it
    torch.manual_seed(0)
    expected = TinyTransformer().state_dict()
    for key, value in expected.items():
        assert torch.equal(torch.tensor(results[0]["state"][key]), value), key
        assert torch.equal(torch.tensor(results[0]["other"][key]), value), key
    for rank, result in enumerate(results):  # each rank's shard is its chunk of rank 0's tensor
        for name, local in result["shards"].items():
            want = torch.chunk(expected[name], 2, dim=0)[rank]
            assert torch.equal(torch.tensor(local).reshape(want.shape), want), (rank, name)


def _load_from_one_process(folder: str) -> dict[str, Any]:
    accelerator = _accelerator("fsdp2")
    torch.manual_seed(5)  # other weights than the checkpoint's
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    # one process saved one RNG file: process 1 has none to restore (strict=False warns)
    accelerator.load_state(folder, strict=accelerator.process_index == 0)
    state = accelerator.get_state_dict(model)
    steps = {int(s["step"]) for s in optimizer.state.values()}
    train(accelerator, model, optimizer, 1)  # the loaded optimizer state steps
    return {"state": {k: v.tolist() for k, v in state.items()}, "steps": sorted(steps)}


@pytest.mark.timeout(120)
def test_one_process_checkpoint_resumes_on_two_fsdp2_processes(tmp_path: Path) -> None:
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model, _ = prepared_and_trained(accelerator, 3)
    accelerator.save_state(str(tmp_path / "one"))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    results = run_distributed(
        _load_from_one_process, str(tmp_path / "one"), world_size=2, timeout=60
    )
    for key, value in expected.items():
        assert torch.equal(torch.tensor(results[0]["state"][key]), value), key
    assert results[0]["steps"] == [3] and results[1]["steps"] == [3]


def _save_model_both_ways(folder: str, engine: str) -> dict[str, Any]:
    from hasten.checkpointing.model import save_model_weights

    fsdp1 = {"use_orig_params": True} if engine == "fsdp1" else {}
    accelerator = _accelerator(engine, **fsdp1)
    torch.manual_seed(0)
    model = TinyTransformer()
    model.tied = torch.nn.Linear(16, 4)  # a root-level tied weight and a plain buffer
    model.tied.weight = model.head.weight
    model.register_buffer("scale", torch.arange(3.0))
    model = accelerator.prepare(model)
    for size in ("1KB", "10GB"):
        for safe in (True, False):
            tag = f"{size}_{safe}"
            accelerator.save_model(model, f"{folder}/new_{tag}", size, safe_serialization=safe)
            state = accelerator.get_state_dict(model)  # the whole model gathered, as before
            if accelerator.is_main_process:  # tied again, as in the unsharded model
                state["tied.weight"] = state["head.weight"]
                save_model_weights(state, f"{folder}/old_{tag}", size, safe_serialization=safe)
    return {"keys": sorted(accelerator.get_state_dict(model))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1"])
def test_save_model_gathers_shard_by_shard_with_the_same_output(
    tmp_path: Path, engine: str
) -> None:
    from safetensors.torch import load_file

    keys = run_distributed(_save_model_both_ways, str(tmp_path), engine, world_size=2, timeout=60)[
        0
    ]
    assert "tied.weight" in keys["keys"] and "scale" in keys["keys"]
    for size in ("1KB", "10GB"):
        for safe in (True, False):
            new, old = tmp_path / f"new_{size}_{safe}", tmp_path / f"old_{size}_{safe}"
            names = sorted(p.name for p in old.iterdir())
            assert sorted(p.name for p in new.iterdir()) == names
            assert (len(names) > 2) == (size == "1KB")  # several shards plus an index
            for name in names:
                if safe or name.endswith(".json"):  # byte for byte
                    assert (new / name).read_bytes() == (old / name).read_bytes(), name
                    continue
                got, want = torch.load(new / name), torch.load(old / name)
                assert got.keys() == want.keys()
                assert all(torch.equal(got[k], want[k]) for k in want), name
            if safe and size == "10GB":
                saved = load_file(str(new / "model.safetensors"))
                assert sorted(saved) == [k for k in keys["keys"] if k != "tied.weight"]
