"""Device checks: true answers on this CPU host, and faked accelerators."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from hasten.platforms import checks


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    checks.clear_caches()
    yield
    checks.clear_caches()


def test_answers_match_torch_on_this_host() -> None:
    assert checks.is_cuda_available() is torch.cuda.is_available()
    assert checks.is_mps_available() is (
        torch.backends.mps.is_available() and torch.backends.mps.is_built()
    )
    assert checks.is_npu_available() is False
    assert checks.is_torch_xla_available() is False
    assert checks.is_fp16_available() is True
    assert isinstance(checks.is_xccl_available(), bool)


def test_cuda_check_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: calls.append(1) or True)
    assert checks.is_cuda_available() and checks.is_cuda_available()
    assert len(calls) == 1


def test_bf16_follows_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    assert checks.is_bf16_available() is True  # plain CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    checks.clear_caches()
    assert checks.is_bf16_available() is False


def test_bf16_on_tpu_depends_on_ignore_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        checks, "is_torch_xla_available", lambda check_is_tpu=False, check_is_gpu=False: True
    )
    assert checks.is_bf16_available.__wrapped__(ignore_tpu=False) is True
    assert checks.is_bf16_available.__wrapped__(ignore_tpu=True) is False


def test_xla_rejects_two_device_kinds() -> None:
    with pytest.raises(ValueError, match="at most one of them"):
        checks.is_torch_xla_available(check_is_tpu=True, check_is_gpu=True)


def test_xla_can_be_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "is_package_available", lambda name, min_version=None: True)
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    assert checks.is_torch_xla_available() is False
    checks.clear_caches()
    monkeypatch.setenv("USE_TORCH_XLA", "1")
    assert checks.is_torch_xla_available() is True


def test_xpu_needs_recent_torch_and_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    assert checks.is_xpu_available() is True
    assert checks.is_xpu_available(check_device=True) is True

    def broken() -> int:
        raise RuntimeError("no device")

    monkeypatch.setattr(torch.xpu, "device_count", broken)
    checks.clear_caches()
    assert checks.is_xpu_available(check_device=True) is False
    monkeypatch.setattr(checks, "is_torch_version", lambda op, version: True)
    checks.clear_caches()
    assert checks.is_xpu_available() is False


def test_mps_min_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    assert checks.is_mps_available() is True
    assert checks.is_mps_available(min_version="99.0") is False


def test_vendor_device_checks_really_probe_and_answer_false_here() -> None:
    from hasten.platforms import checks

    checks.clear_caches()
    for check in (
        checks.is_mlu_available,
        checks.is_musa_available,
        checks.is_sdaa_available,
        checks.is_neuron_available,
    ):
        assert check() is False
        assert check(check_device=True) is False
    assert checks.is_hpu_available() is False
    assert checks.is_hpu_available(init_hccl=True) is False
    assert checks.is_habana_gaudi1() is False
    assert checks.is_rocm_available() is (
        torch.version.hip is not None and torch.cuda.is_available()
    )


def test_vendor_check_imports_the_extension_and_asks_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from hasten.platforms import checks

    class FakeDevice:
        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def device_count() -> int:
            raise RuntimeError("no device")

    monkeypatch.setattr(checks, "is_package_available", lambda name: name == "torch_mlu")
    monkeypatch.setitem(__import__("sys").modules, "torch_mlu", types.ModuleType("torch_mlu"))
    monkeypatch.setattr(torch, "mlu", FakeDevice, raising=False)
    checks.clear_caches()
    assert checks.is_mlu_available() is True
    assert checks.is_mlu_available(check_device=True) is False
    checks.clear_caches()
