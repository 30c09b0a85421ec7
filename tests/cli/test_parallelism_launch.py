"""N-D parallelism through ``hasten launch``: flags and config keys build the workers' mesh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

SCRIPT = Path(__file__).parent / "parallelism_script.py"
HASTEN = Path(sys.executable).parent / "hasten"


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HASTEN), "launch", "--cpu", *args], capture_output=True, text=True, timeout=150
    )


@pytest.mark.timeout(200)
def test_tp_size_flag_reaches_the_workers(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    # the config file asks for tp 1; the flag wins (flags > config file)
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
        "parallelism_config:\n  parallelism_config_tp_size: 1\n"
    )
    done = _launch(
        "--config_file",
        str(config),
        "--parallelism_config_tp_size",
        "2",
        str(SCRIPT),
        str(tmp_path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(results):
        assert result["dims"] == ["tp"]
        assert (result["tp_rank"], result["dp_rank"]) == (rank, 0)
        assert result["strategy"] == "tensor_parallel"
        assert result["local_rows"] == 4
    assert results[0]["firsts"] == results[1]["firsts"] == [0.0, 4.0, 8.0, 12.0]


@pytest.mark.timeout(60)
def test_sizes_that_do_not_fit_the_processes_are_refused(tmp_path: Path) -> None:
    done = _launch(
        "--num_processes",
        "2",
        "--parallelism_config_dp_shard_size",
        "2",
        "--parallelism_config_tp_size",
        "2",
        str(SCRIPT),
        str(tmp_path),
    )
    assert done.returncode != 0
    assert "multiply to 4 (dp_shard_size=2 x tp_size=2)" in done.stderr
    assert "starts 2 process(es)" in done.stderr
