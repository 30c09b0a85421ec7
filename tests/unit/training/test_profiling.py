from __future__ import annotations

import json
from pathlib import Path

import torch

from hasten.config.kwargs import ProfileKwargs
from hasten.training.profiling import profile


def test_trace_written_per_process_then_barrier(tmp_path: Path) -> None:
    barriers: list[int] = []
    handler = ProfileKwargs(output_trace_dir=str(tmp_path))
    with profile(handler, 3, lambda: barriers.append(1)) as prof:
        torch.randn(8, 8) @ torch.randn(8, 8)
    assert prof is not None
    assert json.loads((tmp_path / "profile_3.json").read_text())["traceEvents"]
    assert barriers == [1]


def test_no_directory_no_file_no_barrier(tmp_path: Path) -> None:
    barriers: list[int] = []
    with profile(ProfileKwargs(), 0, lambda: barriers.append(1)):
        torch.ones(2).sum()
    assert barriers == []
    assert list(tmp_path.iterdir()) == []
