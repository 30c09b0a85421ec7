"""The C restricted unpickler: plain data, tensors and numpy RNG states load; anything else refused."""

from __future__ import annotations

import io
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hasten.checkpointing.storage.io import UnsafeCheckpointError
from hasten.checkpointing.storage.plain_pickle import PLAIN_PICKLE, RestrictedUnpickler


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _saved(value: Any) -> bytearray:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return bytearray(buffer.getvalue())


def _rng_state() -> dict[str, Any]:
    return {
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
        "step": 3,
        "groups": [{"lr": 0.1, "betas": (0.9, 0.99), "names": {"a", "b"}}],
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
    }


def test_rng_states_and_plain_data_load_through_the_c_unpickler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hasten.checkpointing.storage import reader

    state = _rng_state()
    picklers: list[Any] = []
    decode = reader.in_place_loader()
    assert decode is not None

    def spy(view: Any, storage: Any, map_location: Any, pickler: Any) -> Any:
        picklers.append(pickler)
        return decode(view, storage, map_location, pickler)

    monkeypatch.setattr(reader, "in_place_loader", lambda: spy)
    loaded = reader.unpickle_buffer(_saved(state), "cpu")
    assert picklers == [PLAIN_PICKLE]  # torch's Python weights_only unpickler never ran
    assert loaded["random_state"] == state["random_state"]
    numpy_saved, numpy_loaded = state["numpy_random_seed"], loaded["numpy_random_seed"]
    assert numpy_loaded[0] == numpy_saved[0] and np.array_equal(numpy_loaded[1], numpy_saved[1])
    assert numpy_loaded[2:] == numpy_saved[2:]
    assert torch.equal(loaded["torch_manual_seed"], state["torch_manual_seed"])
    assert {k: loaded[k] for k in ("step", "groups", "dtype", "size")} == {
        k: state[k] for k in ("step", "groups", "dtype", "size")
    }


def test_what_the_c_unpickler_refuses_goes_to_torchs_weights_only_loader() -> None:
    from hasten.checkpointing.storage.reader import unpickle_buffer

    value = {"p": torch.nn.Parameter(torch.ones(2)), "device": torch.device("cpu")}
    with pytest.raises(UnsafeCheckpointError, match="torch.device"):
        RestrictedUnpickler(io.BytesIO(pickle.dumps(torch.device("cpu")))).load()
    loaded = unpickle_buffer(_saved(value), "cpu")  # weights_only allows both
    assert isinstance(loaded["p"], torch.nn.Parameter) and loaded["device"] == torch.device("cpu")


def test_a_payload_is_refused_by_both_without_running(tmp_path: Path) -> None:
    from hasten.checkpointing.storage.reader import unpickle_buffer

    marker = tmp_path / "ran"
    data = _saved({"ok": 1, "x": _Payload(marker)})
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        torch.load(io.BytesIO(data), weights_only=False, pickle_module=PLAIN_PICKLE)
    with pytest.raises(UnsafeCheckpointError, match="Refused to load"):
        unpickle_buffer(data, "cpu", source="payload.pkl")
    assert not marker.exists()


def test_a_type_appended_to_the_safe_globals_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.checkpointing.storage import io as checkpoint_io

    data = pickle.dumps(Path("a/b"))
    with pytest.raises(UnsafeCheckpointError, match="pathlib"):
        RestrictedUnpickler(io.BytesIO(data)).load()
    allowed = [*checkpoint_io.safe_globals(), type(Path("a"))]
    monkeypatch.setattr(checkpoint_io, "_SAFE_GLOBALS", allowed)
    import hasten.checkpointing.storage.plain_pickle as plain_pickle

    monkeypatch.setattr(plain_pickle, "safe_globals", lambda: allowed)
    assert RestrictedUnpickler(io.BytesIO(data)).load() == Path("a/b")
