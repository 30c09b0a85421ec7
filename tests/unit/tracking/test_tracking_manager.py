from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hasten.tracking.base import AbsentTracker
from hasten.tracking.jsonl import JSONLTracker
from hasten.tracking.manager import TrackerManager
from unit.tracking._tracking_fakes import RecordingTracker


def test_init_builds_starts_and_configures_in_order(
    tmp_path: Path, recording: RecordingTracker
) -> None:
    manager = TrackerManager([recording, "jsonl"], tmp_path, is_main_process=True)
    assert not manager.initialized
    manager.init("proj", config={"lr": 0.1}, init_kwargs={"jsonl": {"fsync": True}})
    assert manager.initialized
    assert [t.name for t in manager.trackers] == ["recording", "jsonl"]
    jsonl = manager.trackers[1]
    assert isinstance(jsonl, JSONLTracker)
    assert jsonl.fsync is True
    assert jsonl.run_dir == tmp_path / "proj"
    assert recording.calls == [("start", "custom"), ("config", {"lr": 0.1})]
    assert (tmp_path / "proj" / "config.json").exists()


def test_log_passes_values_step_and_per_tracker_kwargs(recording: RecordingTracker) -> None:
    manager = TrackerManager(recording)
    manager.init("proj")
    manager.log(
        {"loss": 1.5}, step=7, log_kwargs={"recording": {"commit": False}, "other": {"x": 1}}
    )
    manager.log({"loss": 1.0})
    assert recording.calls[1:] == [
        ("log", ({"loss": 1.5}, 7, {"commit": False})),
        ("log", ({"loss": 1.0}, None, {})),
    ]


def test_log_before_init_is_an_error(recording: RecordingTracker) -> None:
    manager = TrackerManager(recording)
    with pytest.raises(
        RuntimeError, match=r"log\(\) was called before init_trackers\(\).*\['recording'\]"
    ):
        manager.log({"loss": 1.0})
    assert recording.calls == []


def test_log_after_finish_is_an_error(recording: RecordingTracker) -> None:
    manager = TrackerManager(recording)
    manager.init("proj")
    manager.finish()
    with pytest.raises(RuntimeError, match="after end_training"):
        manager.log({"loss": 1.0})


def test_without_trackers_log_is_a_no_op() -> None:
    manager = TrackerManager(None)
    manager.log({"loss": 1.0})  # nothing chosen: like Accelerate, nothing happens
    manager.init("proj")
    manager.log({"loss": 1.0})
    assert manager.trackers == []


def test_log_rejects_non_mapping(recording: RecordingTracker) -> None:
    manager = TrackerManager(recording)
    manager.init("proj")
    with pytest.raises(TypeError, match=r"log\(\) takes a dict of metric name -> value, got list"):
        manager.log([1.0])  # type: ignore[arg-type]


def test_init_twice_and_bad_arguments(recording: RecordingTracker) -> None:
    named = TrackerManager(["jsonl"], "/tmp/unused")
    with pytest.raises(ValueError, match=r"non-empty project name string, got '': .*\['jsonl'\]"):
        named.init("")
    unnamed = TrackerManager(RecordingTracker())
    unnamed.init(None)  # type: ignore[arg-type]  # objects already named: Accelerate allows None
    unnamed.finish()
    manager = TrackerManager(recording)
    with pytest.raises(TypeError, match="init_kwargs must map tracker names"):
        manager.init("proj", init_kwargs=[("wandb", {})])  # type: ignore[arg-type]
    manager.init("proj")
    with pytest.raises(
        RuntimeError, match=r"init_trackers\('again'\) called while the trackers of 'proj' are open"
    ):
        manager.init("again")
    manager.finish()
    manager.init("again")  # allowed after finish
    assert recording.calls.count(("start", "custom")) == 2


def test_get_returns_wrapper_or_library_object(recording: RecordingTracker) -> None:
    manager = TrackerManager(recording)
    manager.init("proj")
    assert manager.get("recording") is recording
    assert manager.get("recording", unwrap=True) is recording.calls
    with pytest.raises(
        ValueError,
        match=r"get_tracker\('wandb'\): no such tracker is running \(running: \['recording'\]\)",
    ):
        manager.get("wandb")


def test_finish_closes_every_tracker_even_if_one_fails(recording: RecordingTracker) -> None:
    class Broken(RecordingTracker):
        name = "broken"

        def finish(self) -> None:
            raise OSError("disk gone")

    manager = TrackerManager([Broken(), recording])
    manager.init("proj")
    with pytest.raises(OSError, match="disk gone"):
        manager.finish()
    assert recording.calls[-1] == ("finish", None)
    assert not manager.initialized and len(manager.trackers) == 2  # closed, still listed


def test_non_main_process_creates_nothing_and_imports_nothing(
    tmp_path: Path, recording: RecordingTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hasten.tracking.wandb as wandb_tracker

    def forbidden() -> None:
        raise AssertionError("a non-main process imported wandb")

    monkeypatch.setattr(wandb_tracker, "_wandb", forbidden)
    manager = TrackerManager([recording, "jsonl", "wandb"], tmp_path, is_main_process=False)
    manager.init("proj", config={"a": 1})
    assert manager.trackers == []
    assert recording.calls == []
    assert not (tmp_path / "proj").exists()
    manager.log({"loss": 1.0}, step=1)  # free: nothing runs here
    absent = manager.get("wandb", unwrap=True)
    assert isinstance(absent, AbsentTracker)
    absent.log({"x": 1})


def test_tracker_opting_out_of_main_process_only_runs_everywhere() -> None:
    class Everywhere(RecordingTracker):
        name = "everywhere"
        main_process_only = False

    tracker = Everywhere("p")
    manager = TrackerManager(tracker, is_main_process=False)
    manager.init("proj")
    manager.log({"loss": 2.0}, step=1)
    assert manager.get("everywhere") is tracker
    assert tracker.calls[-1] == ("log", ({"loss": 2.0}, 1, {}))


def test_registered_class_is_built_with_project_name(recording: Any) -> None:
    from hasten.tracking import registry

    class Registered(RecordingTracker):
        name = "registered"

    registry.register_tracker_class(Registered)
    try:
        manager = TrackerManager("registered")
        manager.init("proj", init_kwargs={"registered": {"tag": "x"}})
        built = manager.get("registered")
        assert isinstance(built, Registered)
        assert (built.run_name, built.init_kwargs) == ("proj", {"tag": "x"})
    finally:
        registry._CUSTOM.pop("registered", None)


def test_finished_trackers_stay_listed_but_take_no_logs(recording: RecordingTracker) -> None:
    # Accelerate's tests read accelerator.trackers[0] after end_training()
    manager = TrackerManager(recording)
    manager.init("proj")
    manager.finish()
    manager.finish()  # once only
    assert manager.trackers == [recording] and recording.calls.count(("finish", None)) == 1
    assert manager.get("recording") is recording
    with pytest.raises(RuntimeError, match=r"before init_trackers\(\) \(or after end_training"):
        manager.log({"loss": 1.0})
    manager.init("again")  # a new run starts new trackers
    assert manager.initialized
