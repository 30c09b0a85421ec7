"""FSDP end to end through ``hasten launch``: flags and config keys reach the workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file as load_safetensors_file

from hasten.commands.merge import merge_command, merge_command_parser

pytestmark = pytest.mark.cli

HERE = Path(__file__).parent
SCRIPT = HERE / "fsdp_script.py"
HASTEN = Path(sys.executable).parent / "hasten"


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(HASTEN), *command], capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.timeout(200)
def test_launch_flags_shard_save_and_merge(tmp_path: Path) -> None:
    flags = [
        "--use_fsdp",
        "--fsdp_version",
        "2",
        "--fsdp_auto_wrap_policy",
        "transformer_based_wrap",
        "--fsdp_reshard_after_forward",
        "false",
        "--fsdp_state_dict_type",
        "SHARDED_STATE_DICT",
    ]
    _run("launch", "--cpu", "--num_processes", "2", *flags, str(SCRIPT), str(tmp_path))
    results = [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in (0, 1)]
    assert results[0]["strategy"] == "fsdp2" and results[0]["layout"] == "ShardedLayout"
    assert results[0]["reshard_after_forward"] is False
    assert all(0.4 < r["fraction"] < 0.6 for r in results)
    # merge-weights of the sharded checkpoint equals the gathered save_model output (the
    # command runs here: tests/distributed/test_merge_weights.py runs it as a subprocess)
    args = [str(tmp_path / "ckpt" / "pytorch_model_fsdp_0"), str(tmp_path / "merged")]
    assert merge_command(merge_command_parser().parse_args(args)) == 0
    merged = load_safetensors_file(tmp_path / "merged" / "model.safetensors")
    saved = load_safetensors_file(tmp_path / "model" / "model.safetensors")
    assert set(merged) == set(saved) and len(saved) == 16
    for key, value in saved.items():
        assert torch.equal(merged[key], value), key
