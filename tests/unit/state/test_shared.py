"""The shared-state mechanism: one dict per class, per thread only under XLA, one reset."""

from __future__ import annotations

import threading

import pytest

from hasten.state import _shared
from hasten.state._shared import SharedState, reset_state


def test_subclasses_share_within_but_not_across_classes() -> None:
    class First(SharedState):
        def __init__(self) -> None:
            self.__dict__ = self._shared_state

    class Second(SharedState):
        def __init__(self) -> None:
            self.__dict__ = self._shared_state

    a, b, c = First(), First(), Second()
    a.value = 1  # type: ignore[attr-defined]
    assert b.value == 1  # type: ignore[attr-defined]
    assert not hasattr(c, "value")
    reset_state()
    assert First._shared_state == {} and not hasattr(b, "value")


def test_share_reports_whether_state_existed() -> None:
    class Thing(SharedState):
        pass

    thing = Thing()
    assert thing._share() is False
    thing.x = 1  # type: ignore[attr-defined]
    assert Thing()._share() is True


def test_thread_local_under_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shared, "is_torch_xla_available", lambda: True)

    class PerThread(SharedState):
        def __init__(self) -> None:
            self.__dict__ = self._shared_state

    PerThread().value = "main"  # type: ignore[attr-defined]
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(getattr(PerThread(), "value", None)))
    thread.start()
    thread.join()
    assert seen == [None] and PerThread().value == "main"  # type: ignore[attr-defined]
    reset_state()
    assert PerThread._shared_state == {}


def test_reset_hooks_run_once_each() -> None:
    calls: list[int] = []

    def hook() -> None:
        calls.append(1)

    _shared.register_reset_hook(hook)
    _shared.register_reset_hook(hook)
    try:
        reset_state()
        assert calls == [1]
    finally:
        _shared._RESET_HOOKS.remove(hook)
