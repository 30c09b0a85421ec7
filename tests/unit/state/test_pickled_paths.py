"""Files pickled by an older hasten still load: the classes they name keep their module paths.

``fixtures/states_36d1313.pkl`` was written by hasten at commit 36d1313 (``pickle.dumps`` of
``{"partial": PartialState(), "accelerator_state": AcceleratorState(), "gradient":
GradientState()}`` after ``Accelerator(cpu=True, mixed_precision="bf16",
gradient_accumulation_steps=4)``, protocol 4), as a ``training_args.bin`` holds them.
"""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path

import pytest
import torch

from hasten.config.enums import DistributedType
from hasten.state import AcceleratorState, GradientState, PartialState

FIXTURE = Path(__file__).parent / "fixtures" / "states_36d1313.pkl"

#: Every class that pickle file names, by the path it names it with. Moving one of these
#: classes must leave it importable under this path (a re-export), or old files stop loading.
PICKLED_PATHS = [
    "hasten.config.dynamo.TorchDynamoPlugin",
    "hasten.config.enums.DistributedType",
    "hasten.config.enums.DynamoBackend",
    "hasten.platforms.cpu.CpuPlatform",
    "hasten.state.accelerator_state.AcceleratorState",
    "hasten.state.detect.RunSpec",
    "hasten.state.engine.EngineChoice",
    "hasten.state.gradient.GradientState",
    "hasten.state.partial.PartialState",
]


class _Recorder(pickle.Unpickler):
    """An unpickler that notes the ``module.qualname`` of each class the file asks for."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.names: set[str] = set()

    def find_class(self, module: str, name: str) -> type:
        self.names.add(f"{module}.{name}")
        found: type = super().find_class(module, name)
        return found


def test_the_fixture_names_exactly_the_pinned_paths() -> None:
    recorder = _Recorder(FIXTURE.read_bytes())
    recorder.load()
    names = recorder.names
    hasten_names = {n for n in names if n.startswith("hasten.")}
    assert hasten_names == set(PICKLED_PATHS)


@pytest.mark.parametrize("path", PICKLED_PATHS)
def test_each_pickled_path_still_resolves(path: str) -> None:
    module, _, name = path.rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), name), type)


def test_a_state_pickled_by_36d1313_loads() -> None:
    loaded = pickle.loads(FIXTURE.read_bytes())
    partial, state, gradient = loaded["partial"], loaded["accelerator_state"], loaded["gradient"]
    assert type(partial) is PartialState
    assert partial.device == torch.device("cpu") and partial.num_processes == 1
    assert partial.distributed_type == DistributedType.NO and partial.is_main_process
    assert type(state) is AcceleratorState
    assert state.mixed_precision == "bf16"
    assert state.distributed_type == DistributedType.NO
    assert type(gradient) is GradientState
    assert gradient.num_steps == 4
