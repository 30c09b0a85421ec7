"""save/load of a whole training state in one process: round trip, async, verification, errors."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hasten.checkpointing import (
    CheckpointContents,
    CheckpointManager,
    CorruptCheckpointError,
    check_checkpointable,
)
from hasten.checkpointing.state import load_contents, save_contents
from hasten.checkpointing.storage.manifest import MANIFEST_NAME
from hasten.checkpointing.storage.writer import PendingSave
from hasten.config.project import ProjectConfiguration


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.body = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.emb(x))))


def _setup(seed: int) -> tuple[Tied, torch.optim.Optimizer, object, Counter]:
    torch.manual_seed(seed)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched, Counter()


def _train(model: Tied, opt: torch.optim.Optimizer, sched: object, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 11, (4, 3))
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        opt.step()
        sched.step()  # type: ignore[attr-defined]
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _contents(model: Tied, opt: object, sched: object, counter: Counter) -> CheckpointContents:
    return CheckpointContents(
        model_states=[model.state_dict()],
        models=[model],
        optimizers=[opt],
        schedulers=[sched],
        custom_objects=[counter],
    )


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("safe", [True, False])
def test_round_trip_resumes_exactly(tmp_path: Path, async_save: bool, safe: bool) -> None:
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 3)
    counter.value = 7
    result = save_contents(
        tmp_path / "ckpt",
        _contents(model, opt, sched, counter),
        step=3,
        safe_serialization=safe,
        async_save=async_save,
    )
    if async_save:
        assert isinstance(result, PendingSave)
        result.wait()
    expected = _train(model, opt, sched, 3)
    random.random(), np.random.rand()  # disturb every RNG before loading

    fresh, fresh_opt, fresh_sched, fresh_counter = _setup(1)
    attrs = load_contents(
        tmp_path / "ckpt", _contents(fresh, fresh_opt, fresh_sched, fresh_counter)
    )
    assert attrs == {"step": 3}
    assert fresh_counter.value == 7
    assert fresh.head.weight is fresh.emb.weight  # tying survives
    assert _train(fresh, fresh_opt, fresh_sched, 3) == expected
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def test_async_save_is_isolated_from_later_training(tmp_path: Path) -> None:
    model, opt, sched, counter = _setup(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pending = save_contents(
        tmp_path / "ckpt", _contents(model, opt, sched, counter), async_save=True
    )
    _train(model, opt, sched, 2)  # mutates the live weights while the thread writes
    assert isinstance(pending, PendingSave)
    pending.wait()
    fresh, fresh_opt, fresh_sched, fresh_counter = _setup(5)
    load_contents(tmp_path / "ckpt", _contents(fresh, fresh_opt, fresh_sched, fresh_counter))
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, before[key])


def test_tied_weights_are_stored_once(tmp_path: Path) -> None:
    from safetensors import safe_open

    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    with safe_open(str(tmp_path / "c" / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["body.bias", "body.weight", "emb.weight"]


def test_a_different_model_names_the_mismatching_keys(tmp_path: Path) -> None:
    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    other = torch.nn.Sequential(torch.nn.Linear(6, 3))
    other_opt = torch.optim.AdamW(other.parameters())
    contents = CheckpointContents(
        models=[other],
        optimizers=[other_opt],
        schedulers=[torch.optim.lr_scheduler.StepLR(other_opt, 1)],
        custom_objects=[Counter()],
    )
    with pytest.raises(ValueError, match=r"missing \(first: 0\.weight.*unexpected"):
        load_contents(tmp_path / "c", contents)


def test_a_strict_mismatch_leaves_the_model_untouched_when_read_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.checkpointing.storage import reader

    monkeypatch.setattr(reader, "_SMALL_BYTES", 0)  # the weights would be read into place
    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", CheckpointContents(model_states=[model.state_dict()]))
    bigger = Tied()
    bigger.extra = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in bigger.state_dict().items()}
    with pytest.raises(ValueError, match=r"missing \(first: extra\.weight"):
        load_contents(tmp_path / "c", CheckpointContents(models=[bigger]))
    assert all(torch.equal(before[k], v) for k, v in bigger.state_dict().items())


def test_non_strict_loads_matching_keys_and_warns(tmp_path: Path) -> None:
    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", CheckpointContents(model_states=[model.state_dict()]))
    bigger = Tied()
    bigger.extra = torch.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match="matching keys only"):
        load_contents(tmp_path / "c", CheckpointContents(models=[bigger]), strict=False)
    assert torch.equal(bigger.body.weight, model.body.weight)


def test_different_number_of_registered_objects(tmp_path: Path) -> None:
    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    contents = _contents(*_setup(0))
    contents.custom_objects.append(Counter())
    with pytest.raises(ValueError, match="holds 1 custom objects but 2 were"):
        load_contents(tmp_path / "c", contents)


def test_missing_folder_and_partial_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="No checkpoint folder"):
        load_contents(tmp_path / "nope", CheckpointContents())
    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    (tmp_path / "c" / MANIFEST_NAME).unlink()
    with pytest.raises(CorruptCheckpointError, match="missing"):
        load_contents(tmp_path / "c", _contents(*_setup(0)))
    with pytest.warns(RuntimeWarning, match="without verification"):
        load_contents(tmp_path / "c", _contents(*_setup(0)), strict=False)


def test_corrupted_optimizer_file_is_named(tmp_path: Path) -> None:
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 1)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    path = tmp_path / "c" / "optimizer.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.bin is corrupted"):
        load_contents(tmp_path / "c", _contents(*_setup(0)))


def test_failing_part_is_named_or_warned(tmp_path: Path) -> None:
    class Fragile(Counter):
        def load_state_dict(self, state: dict[str, int]) -> None:
            raise KeyError("schema changed")

    model, opt, sched, counter = _setup(0)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    contents = dataclasses.replace(_contents(*_setup(0)), custom_objects=[Fragile()])
    with pytest.raises(RuntimeError, match="custom object 0"):
        load_contents(tmp_path / "c", contents)
    with pytest.warns(RuntimeWarning, match="custom object 0"):
        load_contents(tmp_path / "c", contents, strict=False)


def test_check_checkpointable_names_bad_objects() -> None:
    check_checkpointable([Counter()])
    with pytest.raises(ValueError) as info:  # also a TypeError
        check_checkpointable([Counter(), 3, "x"])
    message = str(info.value)
    assert isinstance(info.value, TypeError)
    assert message.startswith("All `objects` must include a `state_dict` and `load_state_dict`")
    assert "Item at index 1, `int`" in message and "Item at index 2, `str`" in message
    assert "Item at index 0" not in message


def test_manager_automatic_naming_total_limit_and_newest(tmp_path: Path) -> None:
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2
    )
    manager = CheckpointManager(config)
    model, opt, sched, counter = _setup(0)
    seen: list[str] = []
    handle = manager.register_save_state_pre_hook(lambda m, w, d: seen.append(d))
    for value in range(3):
        counter.value = value
        manager.save_state(None, _contents(model, opt, sched, counter), [model], step=value)
    handle.remove()
    manager.save_state(None, _contents(model, opt, sched, counter), [model], step=3)
    # the hooks write into the checkpoint's staging folder, published with it
    # (a staging folder named after the checkpoint and the save: .checkpoint_<i>.<save>.partial)
    names = [Path(d).name for d in seen]
    assert [n.split(".")[1] for n in names] == [f"checkpoint_{i}" for i in range(3)]
    assert all(n.startswith(".") and n.endswith(".partial") for n in names)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_2", "checkpoint_3"]

    config2 = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    loader = CheckpointManager(config2)
    fresh = _contents(*_setup(1))
    assert loader.load_state(None, fresh) == {"step": 3}
    assert config2.iteration == 4  # the next save goes after the loaded checkpoint


def test_save_hooks_files_are_published_with_the_checkpoint(tmp_path: Path) -> None:
    import json

    manager = CheckpointManager(ProjectConfiguration())
    model, opt, sched, counter = _setup(0)

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        Path(output_dir, "data.json").write_text(json.dumps({"name": type(models[0]).__name__}))
        Path(output_dir, "sub").mkdir()
        Path(output_dir, "sub", "extra.bin").write_bytes(b"x")
        weights.pop()  # the hook saved the model itself (diffusers' scripts do this)

    seen: list[str] = []
    manager.register_save_state_pre_hook(save_hook)

    def load_hook(models: list, input_dir: str) -> None:
        seen.append(input_dir)
        models.pop()  # and loads it itself

    manager.register_load_state_pre_hook(load_hook)
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "stale.txt").write_text("from an earlier save")  # replaced, not merged
    manager.save_state(target, _contents(model, opt, sched, counter), [model], step=0)
    assert json.loads((target / "data.json").read_text()) == {"name": "Tied"}
    assert (target / "sub" / "extra.bin").read_bytes() == b"x"
    assert not (target / "stale.txt").exists()
    assert not any(p.name.startswith("model") for p in target.iterdir())  # popped: not saved
    listed = (target / MANIFEST_NAME).read_text()
    assert "data.json" in listed and "extra.bin" in listed  # verified on load like the rest
    manager.load_state(target, _contents(*_setup(1)))
    assert seen == [str(target)]


def test_manager_errors(tmp_path: Path) -> None:
    manager = CheckpointManager(ProjectConfiguration())
    with pytest.raises(ValueError, match="needs an output_dir"):
        manager.save_state(None, CheckpointContents(), [], step=0)
    with pytest.raises(ValueError, match="without input_dir"):
        manager.load_state(None, CheckpointContents())
    auto = CheckpointManager(
        ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    )
    with pytest.raises(FileNotFoundError, match="No complete checkpoint"):
        auto.load_state(None, CheckpointContents())
    (tmp_path / "checkpoints" / "checkpoint_0").mkdir(parents=True)
    with pytest.raises(ValueError, match="already exists"):
        auto.save_state(None, CheckpointContents(), [], step=0)
    auto.project_config.total_limit = 0  # changed after the configuration was validated
    with pytest.raises(ValueError, match=r"total_limit=0 would delete every checkpoint"):
        auto.save_state(None, CheckpointContents(), [], step=0)
    assert not (tmp_path / "checkpoints" / "checkpoint_1").exists()


def test_accumulated_gradients_round_trip_per_process(tmp_path: Path) -> None:
    model, opt, sched, counter = _setup(0)
    model(torch.randint(0, 11, (4, 3))).sum().backward()  # mid-accumulation: grads pending
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    contents = CheckpointContents(model_states=[model.state_dict()], models=[model])
    save_contents(tmp_path / "ckpt", contents)
    assert (tmp_path / "ckpt" / "gradients_0_0.safetensors").is_file()
    fresh, *_ = _setup(1)
    load_contents(tmp_path / "ckpt", CheckpointContents(models=[fresh]))
    grads = {n: p.grad for n, p in fresh.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys()
    for name, grad in expected.items():
        assert torch.equal(grads[name], grad)
    model.zero_grad(set_to_none=True)  # after an optimizer step: nothing to save
    save_contents(tmp_path / "clean", CheckpointContents([model.state_dict()], [model]))
    assert not list((tmp_path / "clean").glob("gradients_*"))


def test_multi_block_files_are_read_in_parallel_and_verified_before_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.checkpointing.storage import checksum, reader

    monkeypatch.setattr(checksum, "BLOCK_BYTES", 4096)  # every file spans several blocks
    monkeypatch.setattr(reader, "_SMALL_BYTES", 0)  # and is read into place
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 2)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    expected = _train(model, opt, sched, 2)
    fresh, fresh_opt, fresh_sched, fresh_counter = _setup(3)
    load_contents(tmp_path / "c", _contents(fresh, fresh_opt, fresh_sched, fresh_counter))
    assert _train(fresh, fresh_opt, fresh_sched, 2) == expected
    target = tmp_path / "c" / "optimizer.bin"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    target.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.bin is corrupted"):
        load_contents(tmp_path / "c", _contents(*_setup(4)))
    data[:4] = b"JUNK"  # unpickling now fails too: the checksum error is what is reported
    target.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.bin is corrupted"):
        load_contents(tmp_path / "c", _contents(*_setup(4)))


def test_async_saves_reuse_host_buffers_and_keep_ties(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.writer import HostBuffers

    model, opt, sched, counter = _setup(0)
    buffers = HostBuffers()
    first = save_contents(
        tmp_path / "a", _contents(model, opt, sched, counter), async_save=True, host_buffers=buffers
    )
    assert isinstance(first, PendingSave)
    first.wait()
    kept = [b.data_ptr() for b in buffers._buffers]
    _train(model, opt, sched, 1)
    second = save_contents(
        tmp_path / "b", _contents(model, opt, sched, counter), async_save=True, host_buffers=buffers
    )
    assert isinstance(second, PendingSave)
    second.wait()
    assert [b.data_ptr() for b in buffers._buffers][: len(kept)] == kept  # no new allocation
    fresh, fresh_opt, fresh_sched, fresh_counter = _setup(1)
    load_contents(tmp_path / "b", _contents(fresh, fresh_opt, fresh_sched, fresh_counter))
    assert fresh.head.weight is fresh.emb.weight
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value)


def test_reloading_in_process_reuses_the_live_tensors_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.checkpointing.storage import checksum, reader

    monkeypatch.setattr(checksum, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(reader, "_SMALL_BYTES", 0)  # every file is read into place
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 2)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    expected = _train(model, opt, sched, 3)  # moves the weights and optimizer state on
    params = {name: id(p) for name, p in model.named_parameters()}
    moments = {id(t) for state in opt.state.values() for t in state.values()}
    load_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    assert {name: id(p) for name, p in model.named_parameters()} == params
    assert {id(t) for state in opt.state.values() for t in state.values()} == moments
    assert _train(model, opt, sched, 3) == expected


def test_an_optimizer_without_a_cheap_state_dict_is_loaded_into_fresh_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hasten.checkpointing.storage import reader

    monkeypatch.setattr(reader, "_SMALL_BYTES", 0)
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 2)
    save_contents(tmp_path / "c", _contents(model, opt, sched, counter))
    expected = _train(model, opt, sched, 2)
    fresh, fresh_opt, fresh_sched, fresh_counter = _setup(1)
    _train(fresh, fresh_opt, fresh_sched, 1)  # has state, but will not hand it out

    def refuse() -> dict:
        raise RuntimeError("consolidate_state_dict() first")

    monkeypatch.setattr(fresh_opt, "state_dict", refuse)
    load_contents(tmp_path / "c", _contents(fresh, fresh_opt, fresh_sched, fresh_counter))
    assert _train(fresh, fresh_opt, fresh_sched, 2) == expected


def test_async_save_holds_the_next_optimizer_step_until_its_state_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from hasten.checkpointing.storage import writer

    take = writer.Snapshot.take

    def slow_take(self: writer.Snapshot) -> None:
        time.sleep(0.3)  # the copy is still running when the loop reaches its next step
        take(self)

    monkeypatch.setattr(writer.Snapshot, "take", slow_take)
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 2)
    saved = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    pending = save_contents(tmp_path / "c", _contents(model, opt, sched, counter), async_save=True)
    start = time.perf_counter()
    _train(model, opt, sched, 1)  # its step waits for the copy, then changes the state
    assert time.perf_counter() - start >= 0.25
    pending.wait()  # type: ignore[union-attr]
    assert not opt._optimizer_step_pre_hooks  # released with the save
    fresh, fresh_opt, fresh_sched, fresh_counter = _setup(1)
    load_contents(tmp_path / "c", _contents(fresh, fresh_opt, fresh_sched, fresh_counter))
    loaded = fresh_opt.state_dict()["state"][0]
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())
    assert not torch.equal(opt.state_dict()["state"][0]["exp_avg"], saved["exp_avg"])


def test_a_failed_deferred_copy_releases_the_optimizer_and_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from hasten.checkpointing.storage import writer

    copy = writer.HostBuffers.copy

    def fail_on_the_writer_thread(self: writer.HostBuffers, obj: object) -> object:
        if threading.current_thread().name == "hasten-async-save":
            raise MemoryError("no room for the host copy")
        return copy(self, obj)

    monkeypatch.setattr(writer.HostBuffers, "copy", fail_on_the_writer_thread)
    model, opt, sched, counter = _setup(0)
    _train(model, opt, sched, 1)
    pending = save_contents(tmp_path / "c", _contents(model, opt, sched, counter), async_save=True)
    _train(model, opt, sched, 1)  # the step is released, not held forever
    with pytest.raises(RuntimeError, match="no room for the host copy"):
        pending.wait()  # type: ignore[union-attr]
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c*"))
