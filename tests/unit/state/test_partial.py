"""PartialState in one process: detection results, shared state, helpers and their errors."""

from __future__ import annotations

import datetime
import os
import re

import pytest
import torch
import torch.distributed as dist

from _support.distributed import free_port
from hasten.config.enums import DistributedType
from hasten.core.imports import install_command
from hasten.state import PartialState, is_initialized, recorder, wait_for_everyone
from hasten.state import partial as partial_module
from hasten.state._shared import register_reset_hook, reset_state


def fake_multi(state: PartialState, index: int, num: int, local: int | None = None) -> None:
    """Make `state` look like process `index` of `num` (attributes are plain reads)."""
    state.num_processes = num
    state.process_index = index
    state.local_process_index = index if local is None else local
    state.distributed_type = DistributedType.MULTI_CPU


def test_single_process_defaults() -> None:
    state = PartialState()
    assert state.initialized
    assert state.distributed_type == DistributedType.NO
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.backend is None and not state.use_distributed
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert state.device == torch.device("cpu") and state.default_device == torch.device("cpu")
    assert state.process_group_timeout == datetime.timedelta(minutes=10)
    assert state.mixed_precision == "no" and state.debug is False and state.fork_launched is False
    assert not dist.is_initialized()


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "true")
    monkeypatch.setenv("FORK_LAUNCHED", "1")
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "meta")
    state = PartialState(timeout=datetime.timedelta(seconds=30))
    assert state.mixed_precision == "bf16" and state.debug and state.fork_launched
    assert state.device == torch.device("meta")
    assert state.process_group_timeout == datetime.timedelta(seconds=30)


def test_every_instance_shares_one_state() -> None:
    first, second = PartialState(), PartialState(cpu=True)
    assert first is not second and first.__dict__ is second.__dict__
    first.custom = 3  # type: ignore[attr-defined]
    assert second.custom == 3  # type: ignore[attr-defined]


def test_reset_forgets_and_explains(monkeypatch: pytest.MonkeyPatch) -> None:
    state = PartialState()
    calls = []
    register_reset_hook(lambda: calls.append(1))
    reset_state()
    assert calls and not state.initialized
    with pytest.raises(
        AttributeError,
        match=r"^`PartialState` object has no attribute `device`\. This happens if "
        r"`PartialState\._reset_state\(\)` was called .* Create PartialState\(\)",
    ):
        _ = state.device
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        _ = state.nonsense
    PartialState._reset_state()
    assert PartialState().initialized


def test_failed_setup_leaves_no_half_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="rank=5 and world size=2"):
        PartialState()
    assert PartialState._shared_state == {}


def test_torchrun_single_process_creates_a_gloo_group(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(name, value)
    state = PartialState(timeout=datetime.timedelta(seconds=42))
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert state.distributed_type == DistributedType.MULTI_CPU and state.backend == "gloo"
        assert state.num_processes == 1 and not state.use_distributed
        assert state.process_group_timeout == datetime.timedelta(seconds=42)
        state.wait_for_everyone()  # one process: no barrier needed
    finally:
        state.destroy_process_group()
    assert not dist.is_initialized()


def test_cpu_threads_split_between_local_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        partial_module._set_cpu_threads(2)
        assert torch.get_num_threads() == before
        monkeypatch.delenv("OMP_NUM_THREADS")
        partial_module._set_cpu_threads(10_000)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cpu_affinity_flag_pins_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned: list[int] = []
    monkeypatch.setattr(partial_module, "set_numa_affinity", pinned.append)
    PartialState()
    assert pinned == []
    reset_state()
    monkeypatch.setenv("ACCELERATE_CPU_AFFINITY", "1")
    PartialState()
    assert pinned == [0]


def test_split_between_processes_single_process_is_identity() -> None:
    data = ["a", "b", "c"]
    with PartialState().split_between_processes(data, apply_padding=True) as share:
        assert share is data


def test_split_between_processes_uses_this_process_share() -> None:
    state = PartialState()
    fake_multi(state, 1, 2)
    with state.split_between_processes(["a", "b", "c"], apply_padding=True) as share:
        assert share == ["c", "c"]


def test_wait_for_everyone_goes_through_the_recorder() -> None:
    state = PartialState()
    calls: list[int] = []
    state._barrier = lambda: calls.append(1)
    before = recorder.sequence_number()
    state.wait_for_everyone()
    wait_for_everyone()
    assert calls == [1, 1] and recorder.sequence_number() == before + 2


def test_wait_for_everyone_timeout_is_explained() -> None:
    state = PartialState()

    def stuck() -> None:
        raise RuntimeError("[gloo] Timed out waiting 1000ms for recv operation to complete")

    state._barrier = stuck
    with pytest.raises(recorder.CollectiveTimeoutError, match="wait_for_everyone"):
        state.wait_for_everyone()


def test_main_process_first_orders_around_barriers() -> None:
    state = PartialState()
    events: list[str] = []
    state._barrier = lambda: events.append("barrier")
    with state.main_process_first():
        events.append("work")
    assert events == ["work", "barrier"]
    events.clear()
    fake_multi(state, 1, 2)
    with state.main_process_first():
        events.append("work")
    assert events == ["barrier", "work"]
    events.clear()
    with state.local_main_process_first():
        events.append("work")
    assert events == ["barrier", "work"]


def test_decorators_in_a_single_process_always_run() -> None:
    state = PartialState()

    def f() -> int:
        return 1

    assert state.on_main_process(f) is f
    assert state.on_main_process()(f) is f
    assert state.on_local_main_process()(f) is f
    assert state.on_local_main_process(f) is f
    assert state.on_last_process(f) is f
    assert state.on_process(f, process_index=3) is f
    assert state.on_process(process_index=3)(f) is f
    assert state.on_local_process(local_process_index=3)(f) is f


@pytest.mark.parametrize(
    ("index", "local", "runs"),
    [
        (0, 0, {"main", "local_main", "p0", "l0"}),
        (1, 1, {"last", "p1", "l1"}),
        (2, 0, {"local_main", "l0"}),
    ],
)
def test_decorators_choose_processes(index: int, local: int, runs: set[str]) -> None:
    state = PartialState()
    fake_multi(state, index, 4 if index == 2 else 2, local=local)
    ran: set[str] = set()

    def mark(name: str):  # type: ignore[no-untyped-def]
        def f() -> str:
            ran.add(name)
            return name

        f.__name__ = f"f_{name}"
        return f

    wrapped = [
        state.on_main_process(mark("main")),
        state.on_local_main_process(mark("local_main")),
        state.on_last_process(mark("last")),
        state.on_process(process_index=0)(mark("p0")),
        state.on_process(mark("p1"), process_index=1),
        state.on_local_process(local_process_index=0)(mark("l0")),
        state.on_local_process(mark("l1"), local_process_index=1),
    ]
    for function in wrapped:
        function()
    assert ran == runs
    assert wrapped[0].__name__ == "f_main"  # skipped functions keep their names


def test_on_main_process_needs_a_state() -> None:
    state = PartialState()
    reset_state()
    with pytest.raises(ValueError, match=r"before the state was set up.*PartialState\(\)"):
        state.on_main_process(print)


def test_megatron_makes_the_last_process_main() -> None:
    state = PartialState()
    fake_multi(state, 1, 2, local=1)
    state.distributed_type = DistributedType.MEGATRON_LM
    assert state.is_main_process and state.is_local_main_process and state.is_last_process


def test_print_only_on_local_main(capsys: pytest.CaptureFixture[str]) -> None:
    state = PartialState()
    state.print("hello", 1)
    fake_multi(state, 1, 2)
    state.print("hidden")
    assert capsys.readouterr().out == "hello 1\n"


def test_destroy_process_group_respects_fork_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    destroyed: list[object] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", destroyed.append)
    state = PartialState()
    state.fork_launched = True
    state.destroy_process_group()
    assert destroyed == []
    state.destroy_process_group(group="g")
    state.fork_launched = False
    state.destroy_process_group()
    assert destroyed == ["g", None]


def test_set_device_is_idempotent_and_repr() -> None:
    state = PartialState()
    device = state.device
    state.set_device()
    assert state.device is device
    assert "Distributed environment: DistributedType.NO" in repr(state) and "Device: cpu" in repr(
        state
    )


def test_is_initialized_reflects_accelerator_state() -> None:
    PartialState()
    assert not is_initialized()
    assert "RANK" not in os.environ


def test_gpu_launch_initialises_nccl_with_the_users_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.config.kwargs import InitProcessGroupKwargs
    from hasten.platforms.registry import get_platform

    cuda = get_platform("cuda")
    selected: list[torch.device] = []
    monkeypatch.setattr(type(cuda), "device_count", lambda self: 2)
    monkeypatch.setattr(type(cuda), "set_device", lambda self, device: selected.append(device))
    monkeypatch.setattr(partial_module, "current_platform", lambda cpu=False: cuda)
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    barriers: list[object] = []
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: barriers.append(kwargs))
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    kwargs = InitProcessGroupKwargs(init_method="tcp://10.0.0.1:23456").to_kwargs()
    state = PartialState(**kwargs)
    assert calls == [
        {
            "backend": "nccl",
            "init_method": "tcp://10.0.0.1:23456",
            "timeout": datetime.timedelta(minutes=10),
            "rank": 3,
            "world_size": 4,
        }
    ]
    assert state.distributed_type == DistributedType.MULTI_GPU and state.backend == "nccl"
    assert state.device == torch.device("cuda", 1) and selected == [torch.device("cuda", 1)]
    assert (state.process_index, state.local_process_index, state.num_processes) == (3, 1, 4)
    assert not state.is_main_process and state.is_last_process and not state.is_local_main_process
    state.wait_for_everyone()
    assert barriers == [{"device_ids": [1]}]


def test_gpu_host_with_cpu_flag_stays_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.platforms.registry import get_platform

    monkeypatch.setattr(
        partial_module,
        "current_platform",
        lambda cpu=False: get_platform("cpu") if cpu else get_platform("cuda"),
    )
    state = PartialState(cpu=True)
    assert state.device == torch.device("cpu") and state.default_device == torch.device("cpu")


def test_deepspeed_launch_goes_through_deepspeed_comm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    from hasten.platforms.registry import get_platform

    monkeypatch.setattr(partial_module, "current_platform", lambda cpu=False: get_platform("cuda"))
    monkeypatch.setattr(type(get_platform("cuda")), "set_device", lambda self, device: None)
    monkeypatch.setattr(type(get_platform("cuda")), "device_count", lambda self: 1)
    import hasten.core.imports as imports

    monkeypatch.setattr(imports, "is_package_available", lambda name, min_version=None: False)
    with pytest.raises(ImportError, match=re.escape(install_command("deepspeed", "deepspeed"))):
        PartialState()
    assert PartialState._shared_state == {}
