"""Exception types match Accelerate 1.15's for the errors scripts and tests catch.

Where hasten's natural type differs (a missing folder is a FileNotFoundError), the error is
both: Accelerate's ``except ValueError`` and the precise ``except FileNotFoundError`` work.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from hasten import Accelerator
from hasten.state import PartialState
from hasten.state._shared import reset_state
from hasten.tracking.base import AbsentTracker
from hasten.utils import (
    GradientAccumulationPlugin,
    ProjectConfiguration,
    convert_file_size_to_int,
    find_executable_batch_size,
    recursively_apply,
    write_basic_config,
)


def test_register_for_checkpointing_without_state_dict_is_a_value_error() -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(
        ValueError, match=r"(?s)`state_dict` and `load_state_dict` function.*Item at index 0"
    ):
        acc.register_for_checkpointing(object())
    with pytest.raises(TypeError):  # hasten's earlier type keeps working
        acc.register_for_checkpointing(torch.nn.Linear(1, 1), 3)


def test_load_state_of_a_missing_folder(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="No checkpoint folder") as info:
        acc.load_state(str(tmp_path / "missing"))
    assert isinstance(info.value, FileNotFoundError)
    named = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=str(tmp_path), automatic_checkpoint_naming=True
        ),
    )
    with pytest.raises(ValueError, match="No complete checkpoint") as info:
        named.load_state()
    assert isinstance(info.value, FileNotFoundError)


def test_automatic_naming_onto_an_existing_folder(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    acc = Accelerator(cpu=True, project_config=config)
    os.makedirs(tmp_path / "checkpoints" / "checkpoint_0")
    with pytest.raises(ValueError, match="already exists") as info:
        acc.save_state()
    assert isinstance(info.value, FileExistsError)


def test_on_main_process_before_setup() -> None:
    reset_state()
    state = object.__new__(PartialState)
    state.__dict__ = PartialState._shared_state
    with pytest.raises(ValueError, match="before the state was set up") as info:
        state.on_main_process(lambda: None)
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        # Accelerator(...) argument checks: ValueError, as in Accelerate.
        (
            lambda: Accelerator(
                cpu=True,
                gradient_accumulation_steps=2,
                gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2),
            ),
            ValueError,
        ),
        (lambda: Accelerator(cpu=True, mixed_precision="fp64"), ValueError),
        (lambda: Accelerator(cpu=True, log_with="not-a-tracker"), ValueError),
        (lambda: write_basic_config("fp64", save_location="/nonexistent/c.yaml"), ValueError),
        (lambda: convert_file_size_to_int("lots"), ValueError),
        # recursively_apply(error_on_other_type=True): TypeError.
        (lambda: recursively_apply(lambda t: t, {"a": 1}, error_on_other_type=True), TypeError),
        # find_executable_batch_size: the batch size passed by hand is a TypeError.
        (lambda: find_executable_batch_size(lambda bs: bs, starting_batch_size=4)(3), TypeError),
    ],
    ids=["both-ga", "mixed-precision", "log-with", "basic-config", "size", "apply", "batch-arg"],
)
def test_common_errors_have_accelerates_types(call: Any, kind: type[BaseException]) -> None:
    with pytest.raises(kind):
        call()


def test_no_executable_batch_size_is_a_runtime_error() -> None:
    @find_executable_batch_size(starting_batch_size=2)
    def always_oom(batch_size: int) -> None:
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="No executable batch size found"):
        always_oom()


def test_state_cannot_change_mixed_precision() -> None:
    Accelerator(cpu=True, mixed_precision="bf16")
    with pytest.raises(ValueError, match="mixed_precision"):
        Accelerator(cpu=True, mixed_precision="no")


def test_get_tracker_without_trackers_returns_a_blank_one() -> None:
    # Accelerate returns GeneralTracker(_blank=True) when no tracker runs on this process.
    acc = Accelerator(cpu=True)
    tracker = acc.get_tracker("wandb")
    assert isinstance(tracker, AbsentTracker)
    tracker.log({"x": 1.0})


def test_get_tracker_with_an_unknown_name_raises(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, log_with="jsonl", project_dir=str(tmp_path))
    acc.init_trackers("run")
    with pytest.raises(ValueError, match=r"get_tracker\('wandb'\)"):
        acc.get_tracker("wandb")
    acc.end_training()


def test_prepare_passes_unknown_objects_through() -> None:
    assert Accelerator(cpu=True).prepare(3) == 3
