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


def test_shared_dict_is_a_plain_dict_without_xla() -> None:
    from hasten.state import PartialState, SharedDict

    assert SharedDict is dict
    assert type(PartialState._shared_state) is dict


def test_thread_local_shared_dict_gives_each_thread_its_own_dict() -> None:
    import threading

    from hasten.state import ThreadLocalSharedDict

    class Holder:
        _shared_state = ThreadLocalSharedDict()

    Holder._shared_state["main"] = 1
    seen: dict[str, object] = {}

    def worker() -> None:
        seen["before"] = dict(Holder._shared_state)
        Holder()._shared_state = {"thread": 2}
        seen["after"] = dict(Holder._shared_state)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=30)
    assert seen == {"before": {}, "after": {"thread": 2}}
    assert Holder._shared_state == {"main": 1}


def test_do_nothing_accepts_anything() -> None:
    from hasten.state import do_nothing

    assert do_nothing(1, 2, key="value") is None
