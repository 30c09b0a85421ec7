"""save_state on 2 processes: one folder both share vs a folder per process (no shared storage).

Workload: a model of ``--mb`` MB of fp32 weights (default 100) with AdamW state (twice the
weights), prepared on 2 CPU processes joined by gloo on loopback. Each round saves into a fresh
folder; the time is the slowest process's, from a common start (a barrier) to save_state's
return, median of ``--rounds`` after one untimed warm-up save per case.

- hasten ``save_state``: into one shared folder, and into one folder per process (the main
  process writes the model and optimizer, each process its RNG state; the processes agree on
  what was written over the process group, and each folder is published on its own).
- raw PyTorch, what Accelerate's save_state does without hasten's crash safety: the main process
  writes the weights (safetensors) and the optimizer (torch.save), every process its RNG file,
  each file fsynced, then a barrier.
- HF Accelerate's ``save_state`` when it is installed (the real one, not hasten's stand-in).

Usage: python benchmarks/bench_checkpoint_folders.py [--mb 100] [--rounds 3] [--dir D]
(``--dir /dev/shm`` leaves the disk out.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_checkpoint import LAYER, _build, _fsync  # the same model, AdamW and fsync

KINDS = ("shared", "per-process")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _step(model: Any, optimizer: Any, backward: Callable[[Any], None]) -> None:
    loss = model(torch.ones(2, LAYER)).square().mean()
    backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _folder(root: Path, kind: str, rank: int, index: int) -> Path:
    return root / ("shared" if kind == "shared" else f"rank{rank}") / f"round{index}"


def _timed(save: Callable[[Path], None], root: Path, rank: int, rounds: int) -> dict[str, float]:
    import torch.distributed as dist

    times: dict[str, float] = {}
    for kind in KINDS:
        save(_folder(root, kind, rank, -1))  # warm-up, not timed: first-use costs of each kind
        samples = []
        for index in range(rounds):
            folder = _folder(root, kind, rank, index)
            dist.barrier()
            start = time.perf_counter()
            save(folder)
            samples.append(time.perf_counter() - start)
        times[kind] = statistics.median(samples)
    return times


def _raw_worker(mb: int, root: Path, rounds: int) -> dict[str, float]:
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer = _build(mb, stepped=False)
    ddp = DistributedDataParallel(model)
    _step(ddp, optimizer, lambda loss: loss.backward())

    def save(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            save_file(model.state_dict(), str(folder / "model.safetensors"))
            torch.save(optimizer.state_dict(), folder / "optimizer.bin")
            _fsync(folder / "model.safetensors")
            _fsync(folder / "optimizer.bin")
        rng = {"torch": torch.get_rng_state()}
        torch.save(rng, folder / f"random_states_{rank}.pkl")
        _fsync(folder / f"random_states_{rank}.pkl")
        dist.barrier()

    times = _timed(save, root, rank, rounds)
    dist.destroy_process_group()
    return times


def _accelerator_worker(module: str, mb: int, root: Path, rounds: int) -> dict[str, float]:
    import importlib

    import torch.distributed as dist

    accelerator = importlib.import_module(module).Accelerator(cpu=True)
    model, optimizer = _build(mb, stepped=False)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(model, optimizer, accelerator.backward)

    def save(folder: Path) -> None:
        accelerator.save_state(str(folder))
        accelerator.wait_for_everyone()  # Accelerate's save_state has no barrier of its own

    times = _timed(save, root, dist.get_rank(), rounds)
    accelerator.end_training()
    return times


def _worker(kind: str, mb: int, root: str, rounds: int, out: str) -> None:
    torch.set_num_threads(1)
    if kind == "raw":
        times = _raw_worker(mb, Path(root), rounds)
    else:
        times = _accelerator_worker(kind, mb, Path(root), rounds)
    rank = int(os.environ["RANK"])
    Path(out, f"{rank}.json").write_text(json.dumps(times))


def _run(kind: str, mb: int, root: Path, rounds: int) -> dict[str, float]:
    """Run one implementation on 2 fresh processes (torchrun's variables); the slowest rank."""
    out = Path(tempfile.mkdtemp(prefix="bench_out_"))
    port = str(_free_port())
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "import bench_checkpoint_folders as b; "
        f"b._worker({kind!r}, {mb}, {str(root)!r}, {rounds}, {str(out)!r})"
    )
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        env.update(LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.update(OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env))
    for proc in procs:
        if proc.wait(timeout=1800) != 0:
            raise RuntimeError(f"{kind}: a worker exited with {proc.returncode}")
    ranks = [json.loads((out / f"{r}.json").read_text()) for r in (0, 1)]
    shutil.rmtree(out, ignore_errors=True)
    return {k: max(r[k] for r in ranks) for k in KINDS}


def _real_accelerate() -> bool:
    """Whether the installed ``accelerate`` is Hugging Face's (not hasten under that name)."""
    try:
        import accelerate
    except ImportError:
        return False
    return "hasten" not in str(getattr(accelerate, "__file__", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    kinds = ["hasten", "raw"] + (["accelerate"] if _real_accelerate() else [])
    base = Path(tempfile.mkdtemp(prefix="bench_ckpt_folders_", dir=args.dir))
    try:
        found = {}
        for kind in kinds:
            root = base / kind
            found[kind] = _run(kind, args.mb, root, args.rounds)
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    total = args.mb * 3
    print(
        f"save_state on 2 processes, {args.mb} MB weights + AdamW ({total} MB), median of "
        f"{args.rounds}, slowest process:"
    )
    for kind in KINDS:
        row = "  ".join(f"{name} {found[name][kind] * 1000:8.1f} ms" for name in kinds)
        ratio = found["hasten"][kind] / found["raw"][kind]
        print(f"  {kind:<12} {row}   hasten/raw {ratio:.2f}x")
    shared, own = found["hasten"]["shared"], found["hasten"]["per-process"]
    print(f"  hasten per-process / shared folder: {own / shared:.2f}x")


if __name__ == "__main__":
    main()
