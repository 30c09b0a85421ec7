"""PrepareForLaunch, env_var_path_add and test_launch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hasten import launchers
from hasten.launchers import PrepareForLaunch
from hasten.launchers.prepare import env_var_path_add


def test_multi_process_types_publish_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPROC", "4")
    monkeypatch.setenv("NODE_RANK", "1")
    seen: list[Any] = []
    wrapped = PrepareForLaunch(
        lambda *args: seen.append((args, os.environ["RANK"])) or 7, "MULTI_GPU"
    )
    assert wrapped(2, "a") == 7
    assert seen == [(("a",), "6")]  # 4 x node 1 + index 2
    assert os.environ["LOCAL_RANK"] == "2" and os.environ["FORK_LAUNCHED"] == "1"


def test_no_distribution_leaves_ranks_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    PrepareForLaunch(lambda: None)(3)
    assert "RANK" not in os.environ
    with pytest.raises(ValueError):
        PrepareForLaunch(print, "SIDEWAYS")


def test_debug_needs_its_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_DEBUG_RDV_FILE", raising=False)
    with pytest.raises(RuntimeError, match="ACCELERATE_DEBUG_RDV_FILE"):
        PrepareForLaunch(print, debug=True)(0)


def test_debug_joins_a_one_process_file_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("ACCELERATE_DEBUG_RDV_FILE", str(tmp_path / "rdv"))
    try:
        assert PrepareForLaunch(dist.get_world_size, debug=True)(0) == 1
    finally:
        dist.destroy_process_group()


def test_env_var_path_add(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_PATH", "/a::/b")
    assert env_var_path_add("MY_PATH", "/c") == "/a:/b:/c"
    assert os.environ["MY_PATH"] == "/a::/b"  # unchanged
    monkeypatch.delenv("MY_PATH")
    assert env_var_path_add("MY_PATH", Path("/x")) == "/x"  # type: ignore[arg-type]


def test_test_launch_builds_the_state() -> None:
    from hasten.state import PartialState

    launchers.test_launch()
    assert PartialState().num_processes == 1
