"""GradientState: plugin settings, dataloader tracking through weak references."""

from __future__ import annotations

import gc

import pytest

from hasten.config.project import GradientAccumulationPlugin
from hasten.state import GradientState


class Loader:
    def __init__(self, end: bool = False, remainder: int = 0) -> None:
        self.end_of_dataloader = end
        self.remainder = remainder


class PlainLoader:
    """A loader that does not track its end itself."""


def test_defaults() -> None:
    state = GradientState()
    assert state.initialized and state.sync_gradients
    assert state.num_steps == 1 and state.adjust_scheduler and state.sync_with_dataloader
    assert not state.sync_each_batch and state.plugin_kwargs == {}
    assert state.active_dataloader is None and not state.in_dataloader
    assert state.end_of_dataloader is False and state.remainder == -1
    assert "Sync Gradients: True" in repr(state)


def test_plugin_settings_and_update() -> None:
    state = GradientState(GradientAccumulationPlugin(num_steps=4, sync_each_batch=True))
    assert state.num_steps == 4 and state.sync_each_batch
    assert GradientState().num_steps == 4  # shared
    GradientState(GradientAccumulationPlugin(num_steps=2, adjust_scheduler=False))
    assert state.num_steps == 2 and not state.adjust_scheduler and not state.sync_each_batch
    state.plugin_kwargs.update({"num_steps": 8})  # the Accelerator edits it in place
    assert state.num_steps == 8


def test_sync_flag() -> None:
    state = GradientState()
    state._set_sync_gradients(False)
    assert GradientState().sync_gradients is False


def test_dataloaders_nest_and_report_their_end() -> None:
    state = GradientState()
    outer, inner = Loader(), Loader(end=True, remainder=3)
    state._add_dataloader(outer)
    assert state.active_dataloader is outer and state.in_dataloader
    state._add_dataloader(inner)
    assert state.end_of_dataloader and state.remainder == 3
    assert state.dataloader_references == [None, outer, inner]
    state._remove_dataloader(inner)
    assert state.active_dataloader is outer and not state.end_of_dataloader
    state._remove_dataloader(outer)
    assert not state.in_dataloader and state.remainder == -1


def test_loader_without_own_flags_uses_recorded_values() -> None:
    state = GradientState()
    loader = PlainLoader()
    state._add_dataloader(loader)
    assert not state.end_of_dataloader and state.remainder == -1
    state._set_end_of_dataloader(True)
    state._set_remainder(2)
    assert state.end_of_dataloader and state.remainder == 2


def test_state_does_not_keep_dataloaders_alive() -> None:
    state = GradientState()
    loader = Loader()
    state._add_dataloader(loader)
    del loader
    gc.collect()
    assert not state.in_dataloader


def test_dataloader_references_setter() -> None:
    state = GradientState()
    loader = Loader()
    state.dataloader_references = [None, loader]
    assert state.active_dataloader is loader


def test_xla_sync_flag_is_always_true_under_fsdp(monkeypatch: pytest.MonkeyPatch) -> None:
    state = GradientState()
    assert not state.is_xla_gradients_synced
    state.is_xla_gradients_synced = True
    assert state.is_xla_gradients_synced
    GradientState._reset_state()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert GradientState().is_xla_gradients_synced
