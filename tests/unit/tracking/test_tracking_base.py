from __future__ import annotations

from typing import Any

import pytest

from hasten.tracking.base import AbsentTracker, GeneralTracker, on_main_process


def test_subclass_missing_required_attributes_is_refused() -> None:
    class Incomplete(GeneralTracker):
        name = "incomplete"

    with pytest.raises(
        NotImplementedError, match=r"Incomplete does not define requires_logging_directory, tracker"
    ):
        Incomplete()


def test_blank_tracker_and_default_methods_are_no_ops() -> None:
    blank = GeneralTracker(_blank=True)
    blank.start()
    blank.store_init_configuration({"a": 1})
    blank.log({"a": 1}, step=3)
    blank.finish()
    assert GeneralTracker.main_process_only is True


def test_complete_subclass_builds() -> None:
    class Mine(GeneralTracker):
        name = "mine"
        requires_logging_directory = False

        @property
        def tracker(self) -> Any:
            return "handle"

    assert Mine().tracker == "handle"


def test_absent_tracker_swallows_any_call() -> None:
    absent = AbsentTracker("wandb")
    assert absent.requested_name == "wandb"
    assert absent.tracker is absent
    assert absent.log({"a": 1}, step=1) is None
    assert absent.log_artifact("file.txt", artifact_path="x") is None
    assert absent.tracker.alert(title="t") is None
    with pytest.raises(AttributeError):
        absent.__fake_dunder__  # noqa: B018


class _Decorated(GeneralTracker):
    name = "decorated"
    requires_logging_directory = False

    def __init__(self, main_only: bool) -> None:
        super().__init__()
        self.main_process_only = main_only  # type: ignore[misc]
        self.calls: list[str] = []

    @property
    def tracker(self) -> list[str]:
        return self.calls

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record the call."""
        self.calls.append(f"log {values} {step}")


class _FakeState:
    def __init__(self, main: bool) -> None:
        self.is_main_process = main


def test_on_main_process_runs_only_on_the_main_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.tracking import base

    assert _Decorated.log.__doc__ == "Record the call."
    tracker = _Decorated(main_only=True)
    monkeypatch.setattr(base, "PartialState", lambda: _FakeState(main=True))
    tracker.log({"a": 1}, step=1)
    monkeypatch.setattr(base, "PartialState", lambda: _FakeState(main=False))
    assert tracker.log({"a": 2}, step=2) is None
    assert tracker.calls == ["log {'a': 1} 1"]
    everywhere = _Decorated(main_only=False)
    everywhere.log({"a": 3})
    assert everywhere.calls == ["log {'a': 3} None"]


def test_on_main_process_with_the_real_state_in_one_process() -> None:
    tracker = _Decorated(main_only=True)
    tracker.log({"a": 1}, step=0)
    assert tracker.calls == ["log {'a': 1} 0"]
