"""Unit tests for hasten.state.recorder (single process; the 2-process report is in tests/distributed)."""

from __future__ import annotations

import pytest
import torch

from hasten.state import recorder
from hasten.state.recorder import (
    CollectiveTimeoutError,
    describe,
    guarded,
    is_peer_lost_error,
    is_timeout_error,
)


def test_guarded_returns_result_and_counts() -> None:
    recorder.reset()
    assert guarded("gather", lambda: 41 + 1) == 42
    assert guarded("reduce", lambda: None) is None
    assert recorder.sequence_number() == 2
    recorder.reset()
    assert recorder.sequence_number() == 0


def test_guarded_passes_other_errors_through() -> None:
    def boom() -> None:
        raise RuntimeError("size mismatch")

    with pytest.raises(RuntimeError, match="size mismatch"):
        guarded("gather", boom)
    with pytest.raises(KeyError):
        guarded("gather", lambda: {}["k"])


def test_guarded_explains_a_timeout_with_this_call_site() -> None:
    recorder.reset()

    def hang() -> None:
        raise RuntimeError(
            "[gloo/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation"
        )

    with pytest.raises(CollectiveTimeoutError) as info:
        guarded("gather", hang, shapes=torch.ones(4, 3))
    message = str(info.value)
    assert "Collective `gather` timed out on rank 0" in message
    assert "rank | operation | shapes" in message
    assert "tensor[4, 3]" in message
    assert "test_recorder.py:" in message
    assert "InitProcessGroupKwargs(timeout=...)" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_is_timeout_error() -> None:
    assert is_timeout_error(RuntimeError("Timed out waiting 2000ms for send operation to complete"))
    assert is_timeout_error(RuntimeError("Watchdog caught collective operation timeout: WorkNCCL"))
    assert not is_timeout_error(RuntimeError("Connection closed by peer"))
    assert not is_timeout_error(CollectiveTimeoutError("timed out"))


def test_is_peer_lost_error() -> None:
    assert is_peer_lost_error(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1"))
    assert not is_peer_lost_error(RuntimeError("Timed out waiting 2000ms"))
    assert not is_peer_lost_error(CollectiveTimeoutError("Connection closed by peer"))


def test_guarded_explains_a_lost_peer() -> None:
    def closed() -> None:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:5")

    with pytest.raises(
        CollectiveTimeoutError, match=r"`reduce` failed: a peer closed its connection"
    ):
        guarded("reduce", closed)


def test_describe() -> None:
    assert describe(None) == "-"
    assert describe("custom") == "custom"
    assert describe({"a": torch.ones(2), "b": [torch.ones(1, dtype=torch.long)]}) == (
        "{a: tensor[2], b: [tensor[1] int64]}"
    )
    assert describe((torch.ones(1), 3)) == "(tensor[1], int)"
    long = describe([torch.ones(1)] * 50, limit=20)
    assert len(long) == 20
    assert long.endswith("...")
