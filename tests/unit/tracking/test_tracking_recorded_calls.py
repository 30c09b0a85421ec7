"""Each library tracker against a recording fake of its library: the exact calls it makes.

These run whether or not the libraries are installed (CI without the extras still checks every
tracker's wiring); the real-library tests beside this file check what the libraries store.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch

from hasten.core.imports import is_package_available
from hasten.tracking.aim import AimTracker
from hasten.tracking.clearml import ClearMLTracker
from hasten.tracking.comet_ml import CometMLTracker
from hasten.tracking.dvclive import DVCLiveTracker
from hasten.tracking.swanlab import SwanLabTracker
from hasten.tracking.trackio import TrackioTracker
from hasten.tracking.wandb import WandBTracker


@pytest.fixture
def fake_library(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install a MagicMock as the named top-level package; return it."""

    def install(name: str) -> mock.MagicMock:
        module = mock.MagicMock(name=name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
        is_package_available.cache_clear()
        return module

    yield install
    is_package_available.cache_clear()


def test_wandb_calls(fake_library: Any) -> None:
    wandb = fake_library("wandb")
    run = wandb.init.return_value
    tracker = WandBTracker("proj", mode="offline", tags=["a"])
    tracker.start()
    wandb.init.assert_called_once_with(project="proj", mode="offline", tags=["a"])
    assert tracker.tracker is run
    tracker.store_init_configuration({"lr": 0.1, "opt": {"name": "adam"}})
    run.config.update.assert_called_once_with(
        {"lr": 0.1, "opt": {"name": "adam"}}, allow_val_change=True
    )
    media = object()
    tracker.log({"loss": 0.5, "flag": True, "media": media}, step=3, commit=False)
    run.log.assert_called_with({"loss": 0.5, "flag": True, "media": media}, step=3, commit=False)
    tracker.log_images({"samples": ["img0", "img1"]}, step=4)
    assert wandb.Image.call_args_list == [mock.call("img0"), mock.call("img1")]
    run.log.assert_called_with({"samples": [wandb.Image.return_value] * 2}, step=4)
    tracker.log_table("preds", columns=["x"], data=[[1]], step=5)
    wandb.Table.assert_called_once_with(columns=["x"], data=[[1]], dataframe=None)
    run.log.assert_called_with({"preds": wandb.Table.return_value}, step=5)
    tracker.finish()
    run.finish.assert_called_once_with()


def test_wandb_skips_what_it_cannot_serialise(fake_library: Any) -> None:
    wandb = fake_library("wandb")
    run = wandb.init.return_value
    run.log.side_effect = [TypeError("Object of type object is not JSON serializable"), None]
    tracker = WandBTracker("proj")
    tracker.start()
    bad = object()
    with pytest.warns(UserWarning, match=r"wandb tracker skipped 'bad'"):
        tracker.log({"loss": 0.5, "bad": bad, "hist": [1, 2]}, step=1)
    assert run.log.call_args_list == [
        mock.call({"loss": 0.5, "bad": bad, "hist": [1, 2]}, step=1),
        mock.call({"loss": 0.5, "hist": [1, 2]}, step=1),
    ]
    run.log.side_effect = TypeError("something else")
    with pytest.raises(TypeError, match="something else"):
        tracker.log({"loss": 0.5}, step=2)  # nothing to drop: W&B's own error stands


def test_comet_calls(fake_library: Any) -> None:
    comet_ml = fake_library("comet_ml")
    experiment = comet_ml.start.return_value
    tracker = CometMLTracker("proj", online=False)
    tracker.start()
    comet_ml.start.assert_called_once_with(project_name="proj", online=False)
    tracker.store_init_configuration({"lr": 0.1})
    experiment.log_parameters.assert_called_once_with({"lr": 0.1})
    with pytest.warns(UserWarning, match="comet_ml tracker skipped 'bad'"):
        tracker.log(
            {"loss": 0.5, "phase": "train", "eval": {"acc": torch.tensor(1.0)}, "bad": {"x": [1]}},
            step=2,
        )
    assert experiment.mock_calls[1:] == [
        mock.call.set_step(2),
        mock.call.log_metric("loss", 0.5, step=2),
        mock.call.log_other("phase", "train"),
        mock.call.log_metrics({"acc": 1.0}, step=2, prefix="eval"),
    ]
    tracker.log_table("t.csv", columns=["a"], data=[[1]])
    experiment.log_table.assert_called_once_with("t.csv", tabular_data=[[1]], headers=["a"])
    tracker.finish()
    experiment.end.assert_called_once_with()


def test_clearml_calls(fake_library: Any) -> None:
    clearml = fake_library("clearml")
    clearml.Task.current_task.return_value = None
    task = clearml.Task.init.return_value
    logger = task.get_logger.return_value
    tracker = ClearMLTracker("proj", output_uri=False)
    tracker.start()
    clearml.Task.init.assert_called_once_with(
        output_uri=False, project_name="proj", task_name="proj"
    )
    tracker.store_init_configuration({"lr": 0.1})
    task.connect_configuration.assert_called_once_with({"lr": 0.1})
    tracker.log({"eval_loss": 0.5, "loss": 0.25}, step=1)
    tracker.log({"final": 2.0})
    assert logger.mock_calls == [
        mock.call.report_scalar(title="loss", series="eval", value=0.5, iteration=1),
        mock.call.report_scalar(title="loss", series="train", value=0.25, iteration=1),
        mock.call.report_single_value(name="final", value=2.0),
    ]
    tracker.log_table("test_table", columns=["a"], data=[[1]], step=3)
    logger.report_table.assert_called_once_with(
        title="table", series="test", table_plot=[["a"], [1]], iteration=3
    )
    with pytest.raises(ValueError, match=r"log_table\('t'\) got neither data nor dataframe"):
        tracker.log_table("t")
    tracker.finish()
    task.close.assert_called_once_with()


def test_clearml_reuses_and_leaves_open_an_existing_task(fake_library: Any) -> None:
    clearml = fake_library("clearml")
    existing = clearml.Task.current_task.return_value
    tracker = ClearMLTracker("proj")
    tracker.start()
    assert tracker.tracker is existing
    clearml.Task.init.assert_not_called()
    tracker.finish()
    existing.close.assert_not_called()


def test_dvclive_calls(fake_library: Any) -> None:
    dvclive = fake_library("dvclive")
    live = dvclive.Live.return_value
    tracker = DVCLiveTracker("proj", dir="out")
    tracker.start()
    dvclive.Live.assert_called_once_with(dir="out")
    tracker.store_init_configuration({"lr": 0.1})
    tracker.log({"loss": 0.5}, step=7)
    assert live.step == 7
    assert live.mock_calls == [
        mock.call.log_params({"lr": 0.1}),
        mock.call.log_metric("loss", 0.5),
        mock.call.next_step(),
    ]
    tracker.finish()
    live.end.assert_called_once_with()


def test_aim_calls(fake_library: Any) -> None:
    aim = fake_library("aim")
    run = aim.Run.return_value
    tracker = AimTracker("proj", "/logs", experiment="e")
    tracker.start()
    aim.Run.assert_called_once_with(repo="/logs", experiment="e")
    assert run.name == "proj"
    tracker.store_init_configuration({"lr": 0.1})
    run.__setitem__.assert_called_once_with("hparams", {"lr": 0.1})
    tracker.log({"loss": 0.5}, step=2, context={"subset": "train"})
    run.track.assert_called_once_with(0.5, name="loss", step=2, context={"subset": "train"})
    tracker.log_images({"img": ("pixels", "a cat")}, step=3)
    aim.Image.assert_called_once_with("pixels", caption="a cat")
    run.track.assert_called_with(aim.Image.return_value, name="img", step=3)
    tracker.finish()
    run.close.assert_called_once_with()


def test_trackio_calls(fake_library: Any) -> None:
    trackio = fake_library("trackio")
    run = trackio.init.return_value
    tracker = TrackioTracker("proj", embed=False)
    tracker.start()
    trackio.init.assert_called_once_with(project="proj", embed=False)
    tracker.store_init_configuration({"lr": 0.1})
    run.config.update.assert_called_once_with({"lr": 0.1})
    tracker.log({"loss": 0.5, "phase": "train"}, step=4)
    run.log.assert_called_once_with({"loss": 0.5, "phase": "train"}, step=4)
    tracker.finish()
    run.finish.assert_called_once_with()


def test_swanlab_calls(fake_library: Any) -> None:
    swanlab = fake_library("swanlab")
    run = swanlab.init.return_value
    tracker = SwanLabTracker("proj", mode="offline")
    tracker.start()
    swanlab.init.assert_called_once_with(project="proj", mode="offline")
    tracker.store_init_configuration({"lr": 0.1})
    swanlab.config.update.assert_called_once_with({"lr": 0.1})
    tracker.log({"loss": 0.5}, step=4)
    run.log.assert_called_once_with({"loss": 0.5}, step=4)
    tracker.log_images({"img": "pixels"}, step=5)
    swanlab.Image.assert_called_once_with("pixels")
    run.log.assert_called_with({"img": [swanlab.Image.return_value]}, step=5)
    tracker.finish()
    run.finish.assert_called_once_with()


def test_missing_library_error_names_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "comet_ml", None)
    is_package_available.cache_clear()
    try:
        with pytest.raises(
            ImportError, match=r"The Comet tracker requires 'comet_ml'.*pip install 'comet-ml'"
        ):
            CometMLTracker("proj").start()
    finally:
        is_package_available.cache_clear()
