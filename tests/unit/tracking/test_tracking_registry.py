from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hasten.config.enums import LoggerType
from hasten.tracking import registry
from hasten.tracking.base import GeneralTracker
from hasten.tracking.jsonl import JSONLTracker
from hasten.tracking.registry import (
    filter_trackers,
    get_available_trackers,
    known_tracker_names,
    register_tracker_class,
    tracker_class,
)


@pytest.fixture
def only_installed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Pretend exactly the given packages are installed."""

    def install(*packages: str) -> None:
        monkeypatch.setattr(registry, "is_package_available", lambda name: name in packages)

    return install


@pytest.fixture(autouse=True)
def _clean_custom_registry() -> Iterator[None]:
    before, hidden = dict(registry._CUSTOM), set(registry._HIDDEN)
    yield
    registry._CUSTOM.clear()
    registry._CUSTOM.update(before)
    registry._HIDDEN.clear()
    registry._HIDDEN.update(hidden)


class MyTracker(GeneralTracker):
    name = "my_tracker"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()

    @property
    def tracker(self) -> None:
        return None


def test_every_logger_type_has_a_tracker_class() -> None:
    for value in LoggerType.list():
        if value == "all":
            continue
        cls = tracker_class(value)
        assert cls.name == value


def test_none_means_no_trackers() -> None:
    assert filter_trackers(None) == []


def test_names_are_normalised_and_deduplicated(tmp_path: Path, only_installed: Any) -> None:
    only_installed("tensorboard", "wandb")
    chosen = filter_trackers(
        ["TensorBoard", LoggerType.TENSORBOARD, "wandb", "jsonl", "wandb"], tmp_path
    )
    assert chosen == ["tensorboard", "wandb", "jsonl"]


def test_single_string_and_instances_keep_order(tmp_path: Path) -> None:
    tracker = JSONLTracker("p", tmp_path)
    assert filter_trackers("jsonl", tmp_path) == ["jsonl"]
    assert filter_trackers([tracker, "jsonl"], tmp_path) == [tracker, "jsonl"]
    assert filter_trackers(tracker) == [tracker]


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"Unknown tracker 'tensorbored' in log_with\. Valid names: \['all', 'aim'"
    ):
        filter_trackers(["tensorbored"])


def test_wrong_entry_types_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"got the class JSONLTracker; pass an instance"):
        filter_trackers([JSONLTracker])
    with pytest.raises(TypeError, match=r"log_with entries must be tracker names .* got 3 \(int\)"):
        filter_trackers([3])  # type: ignore[list-item]


def test_missing_library_names_the_pip_package(only_installed: Any) -> None:
    only_installed()
    with pytest.raises(
        ImportError, match=r"log_with='comet_ml' needs the 'comet_ml' package.*pip install comet-ml"
    ):
        filter_trackers("comet_ml")
    with pytest.raises(ImportError, match=r"pip install tensorboard"):
        filter_trackers("tensorboard", "/tmp")


def test_tensorboardx_alone_counts_as_tensorboard(only_installed: Any) -> None:
    only_installed("tensorboardX")
    assert filter_trackers("tensorboard", "/logs") == ["tensorboard"]


def test_tracker_needing_a_directory_without_one_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Logging with `jsonl` requires a `logging_dir` to be passed in\. \(hasten: .*project_dir",
    ):
        filter_trackers("jsonl")


def test_all_picks_installed_trackers_plus_builtin(tmp_path: Path, only_installed: Any) -> None:
    only_installed("wandb", "tensorboard")
    assert get_available_trackers() == ["jsonl", "tensorboard", "wandb"]
    assert filter_trackers("all", tmp_path) == ["jsonl", "tensorboard", "wandb"]
    custom = JSONLTracker("x", tmp_path)
    assert filter_trackers([LoggerType.ALL, custom], tmp_path) == [
        "jsonl",
        "tensorboard",
        "wandb",
        custom,
    ]


def test_all_without_directory_leaves_out_file_trackers(only_installed: Any) -> None:
    only_installed("wandb", "tensorboard")
    with pytest.warns(UserWarning, match=r"leaves out \['jsonl', 'tensorboard'\]"):
        assert filter_trackers("all") == ["wandb"]


def test_register_tracker_class_makes_name_usable() -> None:
    register_tracker_class(MyTracker)
    assert "my_tracker" in known_tracker_names()
    assert filter_trackers("my_tracker") == ["my_tracker"]
    assert tracker_class("my_tracker") is MyTracker


def test_register_tracker_class_rejects_bad_classes() -> None:
    with pytest.raises(TypeError, match="takes a subclass of hasten.tracking.GeneralTracker"):
        register_tracker_class(object)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes a subclass"):  # Accelerate's type too
        register_tracker_class(dict)  # type: ignore[arg-type]

    class NoName(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(ValueError, match=r"NoName.name is None"):
        register_tracker_class(NoName)

    class NoDir(GeneralTracker):
        name = "nodir"

    with pytest.raises(ValueError, match="has no `requires_logging_directory`"):
        register_tracker_class(NoDir)


def test_register_over_existing_name_warns() -> None:
    class Shadow(MyTracker):
        name = "wandb"

    with pytest.warns(UserWarning, match="'wandb' was already a tracker name"):
        register_tracker_class(Shadow)
    assert tracker_class("wandb") is Shadow


def test_tracker_class_unknown_name() -> None:
    with pytest.raises(ValueError, match="Unknown tracker 'nope'"):
        tracker_class("nope")


def test_logger_type_to_class_maps_names_to_tracker_classes() -> None:
    from hasten.tracking import LOGGER_TYPE_TO_CLASS, WandBTracker, register_tracker_class
    from hasten.tracking.base import GeneralTracker

    assert LOGGER_TYPE_TO_CLASS["wandb"] is WandBTracker
    assert {"aim", "comet_ml", "mlflow", "tensorboard", "wandb", "clearml", "dvclive"} <= set(
        LOGGER_TYPE_TO_CLASS
    )
    with pytest.raises(KeyError):
        LOGGER_TYPE_TO_CLASS["no_such_tracker"]

    class Custom(GeneralTracker):
        name = "custom_table_tracker"
        requires_logging_directory = False

    register_tracker_class(Custom)
    assert LOGGER_TYPE_TO_CLASS["custom_table_tracker"] is Custom


def test_logger_type_to_class_is_edited_like_a_dict() -> None:
    # Accelerate's tests snapshot it, clear() it and update() it back
    from hasten.tracking import LOGGER_TYPE_TO_CLASS, TensorBoardTracker

    snapshot = dict(LOGGER_TYPE_TO_CLASS)
    assert snapshot["tensorboard"] is TensorBoardTracker
    LOGGER_TYPE_TO_CLASS.clear()
    assert len(LOGGER_TYPE_TO_CLASS) == 0 and "tensorboard" not in known_tracker_names()
    with pytest.raises(ValueError, match="Unknown tracker 'tensorboard'"):
        filter_trackers("tensorboard", "/logs")
    LOGGER_TYPE_TO_CLASS["my_tracker"] = MyTracker
    assert list(LOGGER_TYPE_TO_CLASS) == ["my_tracker"]
    LOGGER_TYPE_TO_CLASS.update(snapshot)
    assert dict(LOGGER_TYPE_TO_CLASS) == {**snapshot, "my_tracker": MyTracker}
    del LOGGER_TYPE_TO_CLASS["my_tracker"], LOGGER_TYPE_TO_CLASS["wandb"]
    assert "wandb" not in LOGGER_TYPE_TO_CLASS and "my_tracker" not in LOGGER_TYPE_TO_CLASS
    with pytest.raises(KeyError):
        del LOGGER_TYPE_TO_CLASS["wandb"]
