"""Launch cost: start a 2-process CPU job that joins a gloo process group and exits.

Runs the same tiny script through ``hasten launch --cpu --num_processes 2``,
``torchrun --nproc_per_node 2`` and, when installed, ``accelerate launch --multi_gpu
--num_processes 2`` (Accelerate's only way to start 2 processes on a CPU machine without MPI;
its ``--cpu`` path starts a single process). Launchers are interleaved, each run is checked to
have really started 2 ranks, and medians are compared. Target: hasten <= 1.1x torchrun.

Usage: python benchmarks/bench_launch.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("joined", dist.get_rank(), flush=True)
dist.destroy_process_group()
"""


def _bin(name: str) -> str | None:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name)


def _commands(script: str) -> dict[str, list[str]]:
    commands = {
        "hasten": [
            sys.executable,
            "-m",
            "hasten.commands.cli",
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            script,
        ],
        "torchrun": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            script,
        ],
    }
    hasten_bin, accelerate_bin = _bin("hasten"), _bin("accelerate")
    if hasten_bin:
        commands["hasten"] = [hasten_bin, *commands["hasten"][3:]]
    torchrun_bin = _bin("torchrun")
    if torchrun_bin:
        commands["torchrun"] = [torchrun_bin, *commands["torchrun"][3:]]
    if accelerate_bin:
        commands["accelerate"] = [
            accelerate_bin,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            script,
        ]
    return commands


def _time_once(command: list[str], env: dict[str, str]) -> float | None:
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    elapsed = time.perf_counter() - start
    if out.returncode != 0 or out.stdout.count("joined") != 2:
        print(f"  ! {command[0]} failed (rc={out.returncode}): {out.stderr[-300:]}")
        return None
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env["OMP_NUM_THREADS"] = "1"  # same threads everywhere (torchrun would set it anyway)
    with tempfile.TemporaryDirectory() as folder:
        script = str(Path(folder, "join.py"))
        Path(script).write_text(SCRIPT)
        env["HF_HOME"] = folder  # no user config file for hasten/accelerate
        commands = _commands(script)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for name, command in commands.items():  # warm the page cache once
            if _time_once(command, env) is None:
                times.pop(name)
        for rep in range(reps):
            for name in list(times):
                took = _time_once(commands[name], env)
                if took is not None:
                    times[name].append(took)
            print(
                f"rep {rep + 1}/{reps}: "
                + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items() if t)
            )
    medians = {name: statistics.median(values) for name, values in times.items() if values}
    base = medians.get("torchrun")
    print(f"\n2-process CPU launch, median of {reps} (lower is better):")
    for name, median in medians.items():
        ratio = f"{median / base:.2f}x torchrun" if base else "n/a"
        print(f"  {name:<10} {median:6.2f}s  {ratio}")


if __name__ == "__main__":
    main()
