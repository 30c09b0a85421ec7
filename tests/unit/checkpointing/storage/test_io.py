"""save/load: atomic, safetensors when asked, and nothing that can run code on load."""

from __future__ import annotations

import io
import os
import pickle
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from hasten.checkpointing.storage.io import (
    UnsafeCheckpointError,
    atomic_write,
    is_safetensors_file,
    load,
    save,
)


class _Exploit:
    """Unpickling this runs a shell command: the classic malicious checkpoint."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_save_and_load_pickle_round_trip(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 7, "name": "x", "lr": [0.1, 0.01]}
    save(state, tmp_path / "state.bin")
    loaded = load(tmp_path / "state.bin")
    assert torch.equal(loaded["w"], state["w"])
    assert loaded["step"] == 7 and loaded["name"] == "x" and loaded["lr"] == [0.1, 0.01]


def test_save_safetensors_round_trip(tmp_path: Path) -> None:
    state = {"a": torch.randn(3, 4), "b": torch.ones(2, dtype=torch.bfloat16)}
    target = tmp_path / "weights.bin"  # safetensors detected by content, not only by suffix
    save(state, target, safe_serialization=True)
    assert is_safetensors_file(target)
    loaded = load(target)
    assert set(loaded) == {"a", "b"}
    assert torch.equal(loaded["a"], state["a"]) and loaded["b"].dtype == torch.bfloat16


def test_save_safetensors_stores_tied_weights_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layer = torch.nn.Linear(4, 4)
    model = torch.nn.ModuleDict({"a": layer, "b": layer})  # one module under two names
    state = model.state_dict()
    with caplog.at_level("WARNING"):
        save(state, tmp_path / "m.safetensors", safe_serialization=True)
    assert len(caplog.records) == 1 and "Removed shared tensor" in caplog.records[0].getMessage()
    assert set(state) == {"a.weight", "a.bias", "b.weight", "b.bias"}  # the caller's dict is kept
    loaded = load(tmp_path / "m.safetensors")
    assert set(loaded) == {"a.weight", "a.bias"} and torch.equal(loaded["a.weight"], layer.weight)


def test_safe_serialization_rejects_non_tensor_dicts(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="flat dict of tensors"):
        save({"step": 3}, tmp_path / "x.safetensors", safe_serialization=True)


def test_rng_states_load_with_weights_only(tmp_path: Path) -> None:
    states = {
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    save(states, tmp_path / "rng.pkl")
    loaded = load(tmp_path / "rng.pkl")
    np.random.set_state(loaded["numpy_random_seed"])
    random.setstate(loaded["random_state"])
    assert np.array_equal(loaded["numpy_random_seed"][1], states["numpy_random_seed"][1])


def test_rng_states_load_on_several_threads_at_once(tmp_path: Path) -> None:
    # torch's allow-list is process-wide: one thread's load ending must not end another's.
    save({"numpy_random_seed": np.random.get_state()}, tmp_path / "rng.pkl")
    blob = (tmp_path / "rng.pkl").read_bytes()
    start = threading.Barrier(4)

    def load_many(_: int) -> int:
        start.wait()
        for _ in range(150):
            load(io.BytesIO(blob))
        return 150

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(load_many, range(4))) == 600


def test_malicious_pickle_is_refused_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "evil.bin", "wb") as handle:
        pickle.dump({"w": _Exploit()}, handle, protocol=2)
    with pytest.raises(UnsafeCheckpointError, match=r"weights_only=False"):
        load(tmp_path / "evil.bin")
    assert not (tmp_path / "PWNED").exists()


def test_opting_out_of_weights_only_warns(tmp_path: Path) -> None:
    torch.save({"obj": Path("somewhere")}, tmp_path / "path.bin")
    with pytest.raises(UnsafeCheckpointError):
        load(tmp_path / "path.bin")
    with pytest.warns(UserWarning, match="arbitrary code"):
        assert load(tmp_path / "path.bin", weights_only=False)["obj"] == Path("somewhere")


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_write(target) as handle:
        handle.write(b"half-written")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temporary left behind


def test_streamed_safetensors_match_the_library(tmp_path: Path) -> None:
    import io as stdio

    from safetensors.torch import load_file

    from hasten.checkpointing.storage.tensors import tensors_from_safetensors, write_safetensors

    shared = torch.randn(3, 5)
    state = {
        "a": torch.arange(7, dtype=torch.int64),
        "b": torch.randn(2, 3).to(torch.bfloat16),
        "c": torch.randn(4, 4).t(),  # non-contiguous
        "empty": torch.empty(0, 3),
        "flag": torch.tensor([True, False]),
        "tied": shared,
        "tied_again": shared,
    }
    out = stdio.BytesIO()
    write_safetensors(out, state)
    (tmp_path / "x.safetensors").write_bytes(out.getvalue())
    library = load_file(str(tmp_path / "x.safetensors"))  # the reference reader accepts it
    assert "tied_again" not in library  # stored once
    ours = tensors_from_safetensors(bytearray(out.getvalue()))
    assert ours["tied_again"] is ours["tied"]
    for name, value in state.items():
        assert torch.equal(ours[name], value), name
        if name in library:
            assert torch.equal(library[name], value), name
    header_len = int.from_bytes(out.getvalue()[:8], "little")
    assert (8 + header_len) % 8 == 0  # data aligned as the format asks


def test_early_writeback_starts_disk_writes_every_32_mib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from hasten.checkpointing.storage import io as io_module

    if sys.platform.startswith("linux"):
        assert io_module._sync_file_range() is not None  # the real libc call resolves
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        io_module,
        "_sync_file_range",
        lambda: lambda fd, start, size, flags: calls.append((start, size, flags)) or 0,
    )
    monkeypatch.setattr(io_module, "_WRITEBACK_BYTES", 100)
    with open(tmp_path / "f", "wb") as handle:
        writer = io_module.EarlyWriteback(handle)
        for piece in (b"a" * 60, b"b" * 60, b"c" * 30, b"d" * 120):
            assert writer.write(piece) == len(piece)
        writer.flush()
        assert writer.fileno() == handle.fileno()
    assert (tmp_path / "f").read_bytes() == b"a" * 60 + b"b" * 60 + b"c" * 30 + b"d" * 120
    assert calls == [(0, 120, 2), (120, 150, 2)]
    monkeypatch.setattr(io_module, "_sync_file_range", lambda: None)  # other systems: pass through
    with open(tmp_path / "g", "wb") as handle:
        io_module.EarlyWriteback(handle).write(b"x" * 500)
    assert (tmp_path / "g").read_bytes() == b"x" * 500
