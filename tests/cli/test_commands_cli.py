"""End-to-end ``hasten env`` and ``hasten test`` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cli


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "SLURM_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), **extra)
    return env


def _hasten(
    *args: str, env: dict[str, str], timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hasten.commands.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.timeout(90)
def test_env_reports_settings_and_their_sources(tmp_path: Path) -> None:
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text(yaml.safe_dump({"distributed_type": "NO", "mixed_precision": "fp16"}))
    out = _hasten("env", env=_env(tmp_path, ACCELERATE_DEBUG_MODE="1"))
    assert out.returncode == 0, out.stderr
    assert "- PyTorch version:" in out.stdout and "- Python version:" in out.stdout
    assert f"- Config file: {default}" in out.stdout
    assert "mixed_precision: fp16 [config file]" in out.stdout
    assert "debug: True [environment ACCELERATE_DEBUG_MODE]" in out.stdout
    assert "max_restarts: 0 [default]" in out.stdout


@pytest.mark.timeout(150)
def test_self_check_passes_on_two_cpu_processes(tmp_path: Path) -> None:
    config = tmp_path / "cpu2.yaml"
    config.write_text(
        yaml.safe_dump({"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True})
    )
    out = _hasten("test", "--config_file", str(config), env=_env(tmp_path), timeout=140)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASS ") == 6
    assert "Test is a success" in out.stdout
