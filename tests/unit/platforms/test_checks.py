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
