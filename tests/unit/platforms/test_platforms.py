"""Platform objects and the registry (CPU for real, device families through fakes)."""

from __future__ import annotations

import types

import pytest
import torch

from hasten.config.enums import DistributedType
from hasten.platforms import Platform, current_platform, get_platform
from hasten.platforms.base import DevicePlatform
from hasten.platforms.cpu import CpuPlatform
from hasten.platforms.registry import PLATFORMS


class FakeModule:
    """Stands in for torch.cuda & co: records calls."""

    def __init__(self, count: int = 4) -> None:
        self.count = count
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __getattr__(self, name: str) -> object:
        def record(*args: object) -> object:
            self.calls.append((name, args))
            return {
                "device_count": self.count,
                "is_available": True,
                "mem_get_info": (1, 2),
                "is_bf16_supported": False,
                "get_rng_state": torch.tensor([7]),
            }.get(name)

        return record


class FakePlatform(DevicePlatform):
    name = "fake"
    device_type = "meta"
    dist_backend = "fakeccl"
    distributed_type = DistributedType.MULTI_GPU


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeModule:
    module = FakeModule()
    monkeypatch.setattr(torch, "meta", module, raising=False)
    return module


def test_every_registered_platform_satisfies_the_protocol() -> None:
    for name in PLATFORMS:
        platform = get_platform(name)
        assert isinstance(platform, Platform)
        assert platform.name == name
        assert platform.oom_messages


def test_cpu_platform() -> None:
    cpu = CpuPlatform()
    assert cpu.is_available() and cpu.device_count() == 1
    assert cpu.device(5) == torch.device("cpu")
    assert cpu.dist_backend == "gloo" and cpu.distributed_type == DistributedType.MULTI_CPU
    free, total = cpu.mem_get_info()
    assert 0 < free <= total
    cpu.manual_seed_all(3)
    state = cpu.get_rng_state()
    first = torch.rand(1)
    cpu.set_rng_state(state)
    assert torch.equal(torch.rand(1), first)
    assert cpu.pci_bus_id(0) is None and cpu.is_bf16_supported()
    cpu.set_device(torch.device("cpu"))
    cpu.empty_cache()
    cpu.synchronize()


def test_device_platform_forwards_to_its_torch_module(fake: FakeModule) -> None:
    platform = FakePlatform()
    assert platform.is_available() and platform.device_count() == 4
    assert platform.device(5) == torch.device("meta", 1)
    assert platform.device() == torch.device("meta")
    platform.set_device(torch.device("meta", 1))
    platform.empty_cache()
    platform.synchronize()
    platform.manual_seed_all(3)
    platform.set_rng_state(torch.tensor([1]))
    platform.set_rng_state(torch.tensor([1]), torch.device("meta", 0))
    assert platform.get_rng_state().tolist() == [7]
    assert platform.mem_get_info(2) == (1, 2)
    assert platform.is_bf16_supported() is False
    names = [name for name, _ in fake.calls]
    for expected in (
        "set_device",
        "empty_cache",
        "synchronize",
        "manual_seed_all",
        "set_rng_state",
    ):
        assert expected in names
    assert platform.pci_bus_id(0) is None
    assert "fakeccl" in repr(platform)


def test_device_platform_without_torch_module_is_unavailable() -> None:
    assert not FakePlatform().is_available()


def test_current_platform_on_this_host_is_cpu() -> None:
    current_platform.cache_clear()
    assert current_platform().name == "cpu"
    assert current_platform(cpu=True).name == "cpu"


def test_current_platform_picks_first_available(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = get_platform("cuda")
    monkeypatch.setattr(type(cuda), "is_available", lambda self: True)
    current_platform.cache_clear()
    try:
        assert current_platform().name == "cuda"
        assert current_platform(cpu=True).name == "cpu"
    finally:
        current_platform.cache_clear()


def test_get_platform_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"Unknown platform 'tpu'.*'cpu'"):
        get_platform("tpu")


def test_cuda_pci_bus_id_formats_the_sysfs_address(monkeypatch: pytest.MonkeyPatch) -> None:
    props = types.SimpleNamespace(pci_bus_id=0x3B, pci_domain_id=0, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert get_platform("cuda").pci_bus_id(0) == "0000:3b:00.0"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: object())
    assert get_platform("cuda").pci_bus_id(0) is None
