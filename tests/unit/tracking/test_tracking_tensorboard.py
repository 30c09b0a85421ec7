"""TensorBoard against the real library: write through the tracker, read the event files back."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hasten.core.imports import is_package_available
from hasten.tracking.manager import TrackerManager
from hasten.tracking.tensorboard import TensorBoardTracker

pytestmark = pytest.mark.skipif(
    not is_package_available("tensorboard"), reason="tensorboard is an optional extra"
)


def _load(run_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    return acc


def test_every_scalar_and_step_is_in_the_event_file(tmp_path: Path) -> None:
    manager = TrackerManager("tensorboard", tmp_path, is_main_process=True)
    manager.init("proj", config={"lr": 0.01, "opt": {"name": "adam", "betas": [0.9, 0.99]}})
    expected = {}
    for step in range(0, 50, 10):
        loss = 1.0 / (step + 1)
        manager.log({"loss": torch.tensor(loss), "acc": step / 100, "epoch": step // 10}, step=step)
        expected[step] = loss
    manager.log({"note": "hello", "pair": {"a": 1.0, "b": 2.0}}, step=60)
    writer = manager.get("tensorboard", unwrap=True)
    assert type(writer).__name__ == "SummaryWriter"
    manager.finish()

    acc = _load(tmp_path / "proj")
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == list(expected)
    assert [e.value for e in loss] == pytest.approx(list(expected.values()))
    acc_events = acc.Scalars("acc")
    assert [e.step for e in acc_events] == list(expected)
    assert [e.value for e in acc_events] == pytest.approx([s / 100 for s in expected])
    assert [e.value for e in acc.Scalars("epoch")] == [0, 1, 2, 3, 4]
    tags = acc.Tags()
    assert "note/text_summary" in tags["tensors"]
    # add_scalars writes each member in its own sub-run folder; the config, a stamped one
    folders = sorted(p.name for p in (tmp_path / "proj").iterdir() if p.is_dir())
    assert folders[1:] == ["pair_a", "pair_b"] and float(folders[0]) > 0


def test_hparams_are_flattened_into_the_same_run(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("proj", tmp_path)
    tracker.start()
    tracker.store_init_configuration({"lr": 0.01, "opt": {"name": "adam", "betas": [0.9, 0.99]}})
    tracker.finish()
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = _load(tmp_path / "proj")
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    hparams = {
        key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
        for key, value in info.hparams.items()
    }
    assert hparams == {"lr": pytest.approx(0.01), "opt/name": "adam", "opt/betas": "[0.9, 0.99]"}


def test_hparams_yml_and_events_in_a_sub_folder_as_accelerate(tmp_path: Path) -> None:
    import yaml

    tracker = TensorBoardTracker("proj", tmp_path)
    tracker.start()
    config = {"lr": 0.01, "opt": {"name": "adam", "betas": [0.9, 0.99]}}
    tracker.store_init_configuration(config)
    tracker.finish()
    (sub,) = [path for path in (tmp_path / "proj").iterdir() if path.is_dir()]
    float(sub.name)  # a time.time() stamp, as Accelerate names it
    assert yaml.safe_load((sub / "hparams.yml").read_text()) == config
    assert any(path.name.startswith("events.out.tfevents") for path in sub.iterdir())


def test_non_scalars_are_skipped_with_one_warning(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("proj", tmp_path)
    tracker.start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            tracker.log({"weights": torch.ones(4), "loss": 0.5}, step=step)
    (only,) = caught
    assert "tensorboard tracker skipped 'weights': got a Tensor" in str(only.message)
    tracker.finish()
    assert [e.step for e in _load(tmp_path / "proj").Scalars("loss")] == [0, 1, 2]


def test_log_images(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("proj", tmp_path)
    tracker.start()
    images = np.random.default_rng(0).random((2, 3, 8, 8)).astype(np.float32)
    tracker.log_images({"samples": images}, step=4)
    tracker.finish()
    acc = _load(tmp_path / "proj")
    assert acc.Tags()["images"] == ["samples"]
    events = acc.Images("samples")
    assert [e.step for e in events] == [4]
    assert (events[0].width, events[0].height) == (16, 8)  # the batch of 2 is tiled side by side


def test_log_table_is_markdown_text(tmp_path: Path) -> None:
    tracker = TensorBoardTracker("proj", tmp_path)
    tracker.start()
    tracker.log_table("preds", columns=["x", "y"], data=[[1, "a"], [2, "b"]], step=3)
    with pytest.raises(ValueError, match=r"log_table\('empty'\) got neither data nor dataframe"):
        tracker.log_table("empty")
    tracker.finish()
    (event,) = _load(tmp_path / "proj").Tensors("preds/text_summary")
    assert event.step == 3
    text = event.tensor_proto.string_val[0].decode()
    assert text.splitlines() == ["| x | y |", "|---|---|", "| 1 | a |", "| 2 | b |"]
