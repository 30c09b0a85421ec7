"""Helpers of the ecosystem tests (tests/ecosystem): hasten installed as ``accelerate``.

`make install` installs hasten's ``accelerate`` distribution and then transformers, trl, peft
and diffusers; these helpers skip a test with the fix when that is not the case, run the
scripts of tests/ecosystem (directly or through ``accelerate launch``) and read their results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "SCRIPTS",
    "launch_config",
    "read_weights",
    "require_alias",
    "run_script",
    "run_script_results",
]

#: Where the ecosystem scripts (trainer_script.py, tiny.py, ...) live.
SCRIPTS = Path(__file__).resolve().parents[1] / "ecosystem"
_BIN = Path(sys.executable).parent


def require_alias() -> None:
    """Skip unless ``accelerate`` here is hasten's alias (``hasten accelerate install``)."""
    from hasten.compat.distribution import installed_accelerate

    current = installed_accelerate()
    if current is None or not current.is_hasten:
        found = "no accelerate" if current is None else current.describe()
        pytest.skip(
            f"needs hasten installed as accelerate (found {found}); `make install` does it, or "
            "run `hasten accelerate install`"
        )


def launch_config(folder: Path, distributed_type: str, **extra: Any) -> Path:
    """Write an ``accelerate launch`` config for CPU processes (2 unless ``num_processes=``);
    return its path."""
    import yaml

    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed_type,
        "num_processes": 2,
        "num_machines": 1,
        "machine_rank": 0,
        "mixed_precision": "no",
        "use_cpu": True,
        "main_training_function": "main",
    }
    config.update(extra)
    path = folder / f"{distributed_type.lower()}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_script(
    script: str, args: list[str], config: Path | None = None, timeout: float = 600
) -> dict[str, Any]:
    """Run ``tests/ecosystem/<script>`` (under ``accelerate launch --config_file`` when a
    config is given); return the JSON its main process printed last after ``RESULT``."""
    return run_script_results(script, args, config, timeout)[-1]


def run_script_results(
    script: str, args: list[str], config: Path | None = None, timeout: float = 600
) -> list[dict[str, Any]]:
    """`run_script`, returning every ``RESULT`` line's JSON, in order."""
    path = str(SCRIPTS / script)
    if config is None:
        command = [sys.executable, path, *args]
    else:
        launcher = str(_BIN / "accelerate")
        command = [launcher, "launch", "--config_file", str(config), path, *args]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"{' '.join(command)} exited with {done.returncode}:\n{done.stdout[-3000:]}\n"
        f"{done.stderr[-5000:]}"
    )
    return [dict(json.loads(line[len("RESULT ") :])) for line in lines]


def read_weights(path: Path) -> dict[str, Any]:
    """The tensors of a safetensors file."""
    from safetensors.torch import load_file

    return dict(load_file(str(path)))
