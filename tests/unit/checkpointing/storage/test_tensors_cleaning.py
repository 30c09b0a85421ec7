"""checkpointing.storage.tensors.clean_state_dict_for_safetensors and io.TORCH_SAFE_GLOBALS."""

from __future__ import annotations

import logging

import pytest
import torch

from hasten.checkpointing.storage import io
from hasten.checkpointing.storage.tensors import clean_state_dict_for_safetensors, id_tensor_storage


def test_clean_state_dict_drops_aliases_and_makes_tensors_contiguous(
    caplog: pytest.LogCaptureFixture,
) -> None:
    weight = torch.arange(6.0).reshape(2, 3)
    state = {"embed": weight, "head": weight, "t": weight.t(), "meta": "bnb-metadata"}
    with caplog.at_level(logging.WARNING):
        cleaned = clean_state_dict_for_safetensors(state)
    assert set(cleaned) == {"embed", "meta"}
    assert "head" not in state, "aliases are removed from the dict passed in"
    assert cleaned["meta"] == "bnb-metadata"
    assert "Removed shared tensor" in caplog.text and "head" in caplog.text
    assert clean_state_dict_for_safetensors({"x": weight.t()})["x"].is_contiguous()


def test_torch_safe_globals_is_the_list_load_allows() -> None:
    import numpy as np

    assert io.TORCH_SAFE_GLOBALS is io.safe_globals()
    assert np.ndarray in io.TORCH_SAFE_GLOBALS
    with pytest.raises(AttributeError, match="no attribute 'NOT_THERE'"):
        io.NOT_THERE  # noqa: B018


def test_id_tensor_storage_identifies_shared_memory() -> None:
    base = torch.zeros(4, 4)
    assert id_tensor_storage(base) == id_tensor_storage(base[1])
    assert id_tensor_storage(base) != id_tensor_storage(base.clone())
    assert id_tensor_storage(base)[2] == 64
    meta = torch.empty(3, device="meta")
    assert id_tensor_storage(meta) == (torch.device("meta"), 0, 12)
