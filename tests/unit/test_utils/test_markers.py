from __future__ import annotations

import unittest
from types import SimpleNamespace

import pytest

from hasten.test_utils import markers
from hasten.test_utils.markers import require_cpu, require_cuda, require_multi_device


@pytest.mark.parametrize(
    ("devices", "expected_skips"),
    [(0, {"cuda", "multi"}), (1, {"cpu", "multi"}), (2, {"cpu"})],
)
def test_markers_skip_by_device_count(
    devices: int, expected_skips: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    platform = SimpleNamespace(name="cpu" if devices == 0 else "cuda", device_count=lambda: devices)
    monkeypatch.setattr("hasten.platforms.registry.current_platform", lambda: platform)
    assert markers._device_count() == devices
    decorated = {
        "cpu": require_cpu(lambda: None),
        "cuda": require_cuda(lambda: None),
        "multi": require_multi_device(lambda: None),
    }
    skipped = {name for name, fn in decorated.items() if getattr(fn, "__unittest_skip__", False)}
    assert skipped == expected_skips


def test_skipped_test_raises_skiptest(monkeypatch: pytest.MonkeyPatch) -> None:
    platform = SimpleNamespace(name="cpu", device_count=lambda: 0)
    monkeypatch.setattr("hasten.platforms.registry.current_platform", lambda: platform)
    with pytest.raises(unittest.SkipTest, match="accelerator"):
        require_cuda(lambda: None)()
