from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hasten.commands.config import default
from hasten.commands.config.default import write_basic_config


def test_writes_a_cpu_config_on_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "default_config.yaml"
    assert write_basic_config("BF16", str(path)) == str(path)
    data = yaml.safe_load(path.read_text())
    assert data["mixed_precision"] == "bf16"
    assert data["compute_environment"] == "LOCAL_MACHINE"
    import torch

    if not torch.cuda.is_available():
        assert (data["distributed_type"], data["num_processes"], data["use_cpu"]) == ("NO", 1, True)


def test_multi_gpu_machine_gets_one_process_per_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = SimpleNamespace(name="cuda", device_count=lambda: 4, distributed_type="MULTI_GPU")
    monkeypatch.setattr("hasten.platforms.registry.current_platform", lambda: fake)
    path = tmp_path / "c.json"
    write_basic_config(save_location=str(path))
    data = json.loads(path.read_text())
    assert (data["distributed_type"], data["num_processes"], data["use_cpu"]) == (
        "MULTI_GPU",
        4,
        False,
    )


def test_existing_file_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("keep: me\n")
    assert write_basic_config(save_location=str(path)) is False
    assert path.read_text() == "keep: me\n"
    assert "already exists" in capsys.readouterr().out


def test_invalid_mixed_precision(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"Unknown mixed_precision 'fp32' \(from write_basic_config.*Choose one of \['no'",
    ):
        write_basic_config("fp32", str(tmp_path / "c.yaml"))


def test_documented_default_location_is_the_hf_cache() -> None:
    import inspect

    location = inspect.signature(write_basic_config).parameters["save_location"].default
    assert location.endswith(str(Path("accelerate") / "default_config.yaml"))
    assert default.write_basic_config is write_basic_config
