"""The state objects and the Accelerator pickle as Accelerate's do.

transformers saves ``torch.save(self.args, "training_args.bin")`` with every checkpoint, and
`TrainingArguments.distributed_state` is a `PartialState`; Accelerate's own
``test_can_pickle_dataloader`` pickles a whole Accelerator. An unpickled state is a detached
record of the saved one (as in Accelerate): it shares nothing with the live state.
"""

from __future__ import annotations

import copy
import copyreg
import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, PartialState
from hasten.config.enums import DistributedType
from hasten.config.project import DataLoaderConfiguration
from hasten.data_loader import DataLoaderDispatcher, DataLoaderShard, skip_first_batches
from hasten.state import AcceleratorState, GradientState


class _Written:
    """Pickles as an instance of ``cls`` whose attributes are ``state``: the same stream as
    another writer's object of that class (NEWOBJ of the class, then BUILD with the dict)."""

    def __init__(self, cls: type, state: Any) -> None:
        self.cls, self.state = cls, state

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # pickle checks that NEWOBJ's class is the object's
        return self.cls

    def __reduce__(self) -> tuple[Any, ...]:
        return copyreg.__newobj__, (self.cls,), self.state


# The attributes Accelerate 1.15's PartialState / AcceleratorState / GradientState pickle
# (read from a file written by `torch.save(TrainingArguments(...))` under accelerate 1.15).
def _accelerate_partial(**changes: Any) -> dict[str, Any]:
    attributes = {
        "_cpu": True,
        "backend": None,
        "device": torch.device("cpu"),
        "debug": False,
        "distributed_type": DistributedType.NO,
        "num_processes": 1,
        "process_index": 0,
        "local_process_index": 0,
        "fork_launched": False,
    }
    attributes.update(changes)
    return attributes


def test_partial_state_round_trip_is_a_detached_record() -> None:
    live = PartialState(cpu=True)
    loaded = pickle.loads(pickle.dumps(live))
    assert type(loaded) is PartialState
    assert loaded.__dict__ is not live.__dict__
    for name in ("device", "num_processes", "process_index", "distributed_type", "backend"):
        assert getattr(loaded, name) == getattr(live, name)
    assert loaded.is_main_process and not loaded.use_distributed
    loaded.wait_for_everyone()  # one process: nothing to wait for
    loaded.num_processes = 8
    assert PartialState().num_processes == 1  # the live state is untouched
    assert copy.deepcopy(live).device == live.device  # TrainingArguments deep-copies it too


def test_accelerator_state_and_gradient_state_round_trip() -> None:
    Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=4)
    state = pickle.loads(pickle.dumps(AcceleratorState()))
    assert state.mixed_precision == "bf16"
    assert state.distributed_type == DistributedType.NO
    assert state.is_main_process and state._partial.__dict__ is not PartialState().__dict__
    loader = DataLoader(TensorDataset(torch.arange(4)), batch_size=2)
    gradient = GradientState()
    gradient._add_dataloader(loader)  # weakly referenced while it iterates
    restored = pickle.loads(pickle.dumps(gradient))
    assert restored.num_steps == 4
    assert restored.dataloader_references == [None] and not restored.in_dataloader
    assert GradientState().in_dataloader  # the live one still iterates


@pytest.mark.parametrize("dispatch_batches", [True, False])
def test_can_pickle_an_accelerator_with_prepared_dataloaders(dispatch_batches: bool) -> None:
    # Accelerate's test_can_pickle_dataloader.
    data = DataLoader(TensorDataset(torch.arange(10)))
    skipping = skip_first_batches(data, 2)
    config = DataLoaderConfiguration(dispatch_batches=dispatch_batches)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    model = torch.nn.Linear(1, 1)
    prepared, prepared_skip, _ = accelerator.prepare(data, skipping, model)
    kind = DataLoaderDispatcher if dispatch_batches else DataLoaderShard
    loaded = pickle.loads(pickle.dumps(accelerator))
    assert len(loaded._dataloaders) == 2 and len(loaded._models) == 1
    assert isinstance(loaded._dataloaders[0], kind)
    assert list(loaded._dataloaders[0]) == list(prepared)
    assert list(loaded._dataloaders[1]) == list(prepared_skip)
    # What prepare returned before the pickle is handed back by the loaded Accelerator.
    assert loaded.prepare(loaded._models[0]) is loaded._models[0]


def test_a_partial_state_written_by_accelerate_reads_back() -> None:
    written = _Written(PartialState, _accelerate_partial())
    loaded = pickle.loads(pickle.dumps(written))
    assert type(loaded) is PartialState
    assert loaded.distributed_type == DistributedType.NO
    assert loaded.device == torch.device("cpu") and loaded.num_processes == 1
    assert loaded.is_main_process and loaded.is_local_main_process and not loaded.use_distributed
    assert loaded.default_device == torch.device("cpu")
    assert "Num processes: 1" in repr(loaded)
    # And it pickles again as hasten's.
    assert pickle.loads(pickle.dumps(loaded)).process_index == 0


def test_a_two_process_state_written_by_accelerate_reads_back() -> None:
    attributes = _accelerate_partial(
        backend="gloo",
        distributed_type=DistributedType.MULTI_CPU,
        num_processes=2,
        process_index=1,
        local_process_index=1,
    )
    loaded = pickle.loads(pickle.dumps(_Written(PartialState, attributes)))
    assert loaded.distributed_type == DistributedType.MULTI_CPU and loaded.backend == "gloo"
    assert loaded.use_distributed and loaded.is_last_process and not loaded.is_main_process


def test_accelerate_accelerator_and_gradient_states_read_back() -> None:
    attributes = _accelerate_partial(
        _mixed_precision="bf16",
        deepspeed_plugins=None,
        device_mesh=None,
        dynamo_plugin=None,
        parallelism_config=None,
        torch_tp_plugin=None,
    )
    state = pickle.loads(pickle.dumps(_Written(AcceleratorState, attributes)))
    assert state.mixed_precision == "bf16" and state.distributed_type == DistributedType.NO
    assert state.fsdp_plugin is None and not state.is_fsdp2 and state.is_main_process
    gradient_attributes = {
        "_dataloader_references_ref": [None],
        "_is_xla_gradients_synced": False,
        "plugin_kwargs": {"num_steps": 2},
        "sync_gradients": True,
    }
    gradient = pickle.loads(pickle.dumps(_Written(GradientState, gradient_attributes)))
    assert gradient.num_steps == 2 and not gradient.end_of_dataloader and gradient.remainder == -1


@pytest.mark.parametrize(
    ("cls", "state", "why"),
    [
        (PartialState, {"device": torch.device("cpu")}, "has no distributed_type"),
        (PartialState, ["not", "a", "dict"], "holds a list"),
        (PartialState, _accelerate_partial(distributed_type="NOT_A_TYPE"), "is invalid"),
        (PartialState, {"_spec": None}, "has no _distributed_type"),
        (AcceleratorState, {"_partial": None}, "has no engine, _mixed_precision"),
    ],
)
def test_an_unreadable_pickled_state_is_a_clear_error(cls: type, state: Any, why: str) -> None:
    data = pickle.dumps(_Written(cls, state))
    with pytest.raises(pickle.UnpicklingError, match=why) as info:
        pickle.loads(data)
    message = str(info.value)
    assert f"Cannot read a pickled {cls.__name__}" in message
    assert "training_args.bin" in message and "build the TrainingArguments" in message
