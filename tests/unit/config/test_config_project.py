"""config.project: ProjectConfiguration, DataLoaderConfiguration, GradientAccumulationPlugin."""

from __future__ import annotations

import numpy as np
import pytest

from hasten.config.project import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)


def test_project_defaults_and_logging_dir_follows_project_dir() -> None:
    config = ProjectConfiguration()
    assert (config.project_dir, config.logging_dir, config.total_limit, config.iteration) == (
        None,
        None,
        None,
        0,
    )
    config = ProjectConfiguration(project_dir="runs/a")
    assert config.logging_dir == "runs/a"
    config = ProjectConfiguration(project_dir="runs/a", logging_dir="logs")
    assert config.logging_dir == "logs"


def test_set_directories_keeps_an_explicit_logging_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = ProjectConfiguration()
    config.set_directories(tmp_path)  # type: ignore[arg-type]
    assert config.project_dir == str(tmp_path)
    assert config.logging_dir == str(tmp_path)
    config.set_directories("elsewhere")
    assert config.project_dir == "elsewhere"
    assert config.logging_dir == str(tmp_path)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"total_limit": 0}, ValueError, r"total_limit=0\) must be >= 1"),
        ({"total_limit": -2}, ValueError, r"total_limit=-2\) must be >= 1"),
        ({"total_limit": "3"}, TypeError, r"total_limit='3'\) must be an int or None"),
        ({"total_limit": True}, TypeError, r"total_limit=True\) must be an int"),
        ({"iteration": -1}, ValueError, r"iteration=-1\) must be >= 0"),
        ({"iteration": 1.5}, TypeError, r"iteration=1.5\) must be an int"),
    ],
)
def test_project_validation(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ProjectConfiguration(**options)


def test_project_accepts_valid_limits() -> None:
    config = ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2, iteration=5)
    assert (config.total_limit, config.iteration) == (2, 5)


def test_data_loader_configuration_defaults_and_validation() -> None:
    config = DataLoaderConfiguration()
    assert config.split_batches is False
    assert config.dispatch_batches is None
    assert config.even_batches is True
    assert DataLoaderConfiguration(data_seed=3).data_seed == 3
    with pytest.raises(TypeError, match=r"data_seed='3'\) must be an int or None"):
        DataLoaderConfiguration(data_seed="3")  # type: ignore[arg-type]


def test_gradient_accumulation_plugin() -> None:
    plugin = GradientAccumulationPlugin(num_steps=4, sync_each_batch=True)
    assert plugin.to_kwargs() == {"num_steps": 4, "sync_each_batch": True}
    assert GradientAccumulationPlugin().to_kwargs() == {}


@pytest.mark.parametrize(
    ("steps", "error", "match"),
    [
        (0, ValueError, r"num_steps=0\) must be >= 1"),
        (-3, ValueError, r"num_steps=-3\) must be >= 1"),
        (2.5, TypeError, r"num_steps=2.5\) must be an int"),
        (True, TypeError, r"num_steps=True\) must be an int"),
    ],
)
def test_gradient_accumulation_validation(steps: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        GradientAccumulationPlugin(num_steps=steps)  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [np.int64(2), 2.0, np.float32(2.0)])
def test_whole_numbers_of_any_type_are_counts(steps: object) -> None:
    # Accelerate stores them as given; hasten keeps plain ints.
    plugin = GradientAccumulationPlugin(num_steps=steps)  # type: ignore[arg-type]
    assert plugin.num_steps == 2 and type(plugin.num_steps) is int
    config = ProjectConfiguration(total_limit=np.int64(3), iteration=np.int32(1))  # type: ignore[arg-type]
    assert (config.total_limit, config.iteration) == (3, 1)
    assert type(config.total_limit) is int
    assert DataLoaderConfiguration(data_seed=np.int64(7)).data_seed == 7  # type: ignore[arg-type]
