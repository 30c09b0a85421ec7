from __future__ import annotations

from typing import Any

import pytest

from hasten.tracking.base import AbsentTracker, GeneralTracker


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
