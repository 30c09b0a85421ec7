"""Accelerate's ``commands.*.main`` entry points run the real commands, as users start them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cli


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "SLURM_"))}
    env["HF_HOME"] = str(tmp_path / "hf")
    return env


def _run(*args: str, tmp_path: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(tmp_path),
        cwd=tmp_path,
    )


@pytest.mark.timeout(90)
def test_env_main_prints_the_report(tmp_path: Path) -> None:
    out = _run("-m", "hasten.commands.env", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "- PyTorch version:" in out.stdout
    assert "mixed_precision: no [default]" in out.stdout


@pytest.mark.timeout(90)
def test_accelerate_cli_main_is_the_hasten_command(tmp_path: Path) -> None:
    code = "import sys; from hasten.commands.accelerate_cli import main; sys.exit(main())"
    config = tmp_path / "c.yaml"
    out = _run("-c", code, "config", "default", "--config_file", str(config), tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(config.read_text())["mixed_precision"] == "no"


@pytest.mark.timeout(90)
def test_config_main_writes_defaults_and_updates(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    out = _run(
        "-m",
        "hasten.commands.config",
        "default",
        "--mixed-precision",  # Accelerate's dashed spelling works too
        "bf16",
        "--config_file",
        str(config),
        tmp_path=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(config.read_text())["mixed_precision"] == "bf16"
    out = _run(
        "-m", "hasten.commands.config", "update", "--config_file", str(config), tmp_path=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "Successfully updated" in out.stdout


@pytest.mark.timeout(90)
def test_questionnaire_main_asks_on_stdin(tmp_path: Path) -> None:
    config = tmp_path / "q.yaml"
    answers = "0\n1\n1\nno\nno\n2\n0\n"  # this machine, multi-CPU, 1 machine, no debug/compile
    out = subprocess.run(
        [sys.executable, "-m", "hasten.commands.config.config", "--config_file", str(config)],
        input=answers,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    data = yaml.safe_load(config.read_text())
    assert (data["distributed_type"], data["num_processes"], data["use_cpu"]) == (
        "MULTI_CPU",
        2,
        True,
    )


@pytest.mark.timeout(90)
def test_launch_main_runs_the_script_with_dashed_flags(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys\nprint('MP', os.environ['ACCELERATE_MIXED_PRECISION'], sys.argv[1:])\n"
    )
    out = _run(
        "-m",
        "hasten.commands.launch",
        "--cpu",
        "--num-processes",
        "1",
        "--mixed-precision",
        "bf16",
        str(script),
        "--x",
        "1",
        tmp_path=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "MP bf16 ['--x', '1']" in out.stdout


@pytest.mark.timeout(90)
def test_estimate_main_prints_the_table(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(100, 10)\n"
    )
    out = _run(
        "-m", "hasten.commands.estimate", "tiny:build", "--dtypes", "float32", tmp_path=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "Memory Usage for loading `tiny:build`" in out.stdout
    assert "3.95 KB" in out.stdout  # 1010 float32 parameters


@pytest.mark.timeout(90)
def test_tpu_config_main_prints_the_gcloud_command(tmp_path: Path) -> None:
    out = _run(
        "-m",
        "hasten.commands.tpu",
        "--tpu_name",
        "pod",
        "--tpu_zone",
        "us-central1-a",
        "--command",
        "echo hi",
        "--install_accelerate",
        "--debug",
        tmp_path=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "Running gcloud compute tpus tpu-vm ssh pod --zone us-central1-a --command "
        "cd /usr/share; pip install hasten -U; echo hi --worker all"
    )


@pytest.mark.timeout(90)
def test_merge_and_test_mains_report_bad_input(tmp_path: Path) -> None:
    out = _run("-m", "hasten.commands.merge", str(tmp_path), str(tmp_path / "o"), tmp_path=tmp_path)
    assert out.returncode != 0
    assert "not a complete sharded checkpoint" in out.stderr
    out = _run("-m", "hasten.commands.test", "--config_file", "missing.yaml", tmp_path=tmp_path)
    assert out.returncode != 0
    assert "missing.yaml" in out.stderr and "does not exist" in out.stderr
