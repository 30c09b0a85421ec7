"""Checkpoint speed and memory: hasten vs raw safetensors/torch.save (and HF Accelerate if present).

Workload: a model of ``--mb`` MB of fp32 weights (default 400, or HASTEN_BENCH_CKPT_MB) with
AdamW state (twice the weights: 1.2 GB in all at the default). Measured side by side, each the
median of ``--rounds`` runs into fresh folders (the page cache is warm for everyone):

- save_state / load_state vs raw ``safetensors.torch.save_file``/``load_file`` for the weights
  plus ``torch.save``/``torch.load`` for the optimizer; hasten includes its manifest (CRC32 of
  every file) and fsync; raw is shown without and with fsync.
- async_save: how long ``save_state(async_save=True)`` blocks the training loop, as a share
  of the synchronous save (target <= 15%).
- save_model with shards (``--shard_mb``) vs one raw ``save_file``; peak extra memory.
- peak RSS during load_state, in a fresh process: at most model + optimizer + one file.

Usage: python benchmarks/bench_checkpoint.py [--mb 400] [--rounds 3] [--shard_mb 100]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LAYER = 1024  # Linear(1024, 1024): 4 MB of weights each


def _build(mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = max(1, mb // 4)
    model = torch.nn.Sequential(*[torch.nn.Linear(LAYER, LAYER, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # one step creates AdamW's two moments per parameter
        p.grad = torch.ones_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _median(fn: Callable[[Path], Any], root: Path, rounds: int) -> float:
    times = []
    for i in range(rounds):
        folder = root / f"run_{time.monotonic_ns()}_{i}"
        folder.mkdir()
        start = time.perf_counter()
        fn(folder)
        times.append(time.perf_counter() - start)
        shutil.rmtree(folder)
    return statistics.median(times)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_save(model: Any, optimizer: Any, folder: Path, fsync: bool) -> None:
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    if fsync:
        _fsync(folder / "model.safetensors")
        _fsync(folder / "optimizer.bin")


def _raw_load(model: Any, optimizer: Any, folder: Path) -> None:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    optimizer.load_state_dict(torch.load(folder / "optimizer.bin", weights_only=True))


def _timed_load(
    load: Callable[[Path], Any], save: Callable[[Path], Any], root: Path, rounds: int
) -> float:
    folder = root / "load_source"
    folder.mkdir(exist_ok=True)
    save(folder)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        load(folder)
        times.append(time.perf_counter() - start)
    shutil.rmtree(folder)
    return statistics.median(times)


def _hasten(mb: int, root: Path, rounds: int, shard_mb: int) -> dict[str, float]:
    from hasten import Accelerator
    from hasten.state._shared import reset_state

    reset_state()
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(*_build(mb))
    results = {
        "save_state": _median(lambda d: accelerator.save_state(str(d / "c")), root, rounds),
    }

    def async_blocked(folder: Path) -> None:
        accelerator.save_state(str(folder / "c"), async_save=True)

    blocked = []
    for i in range(rounds):
        folder = root / f"async_{i}"
        start = time.perf_counter()
        async_blocked(folder)
        blocked.append(time.perf_counter() - start)
        accelerator._checkpoints.wait()
        shutil.rmtree(folder)
    results["async_blocked"] = statistics.median(blocked)
    results["load_state"] = _timed_load(
        lambda d: accelerator.load_state(str(d / "c")),
        lambda d: accelerator.save_state(str(d / "c")),
        root,
        rounds,
    )
    results["save_model"] = _median(
        lambda d: accelerator.save_model(model, str(d), max_shard_size=f"{shard_mb}MB"),
        root,
        rounds,
    )
    reset_state()
    return results


def _raw(mb: int, root: Path, rounds: int) -> dict[str, float]:
    from safetensors.torch import save_file

    model, optimizer = _build(mb)
    return {
        "save": _median(lambda d: _raw_save(model, optimizer, d, False), root, rounds),
        "save_fsync": _median(lambda d: _raw_save(model, optimizer, d, True), root, rounds),
        "load": _timed_load(
            lambda d: _raw_load(model, optimizer, d),
            lambda d: _raw_save(model, optimizer, d, False),
            root,
            rounds,
        ),
        "save_file": _median(
            lambda d: save_file(model.state_dict(), str(d / "model.safetensors")), root, rounds
        ),
    }


def _accelerate(mb: int, root: Path, rounds: int) -> dict[str, float] | None:
    try:
        from accelerate import Accelerator as HFAccelerator
    except ImportError:
        return None
    accelerator = HFAccelerator(cpu=True)
    model, optimizer = accelerator.prepare(*_build(mb))
    return {
        "save_state": _median(lambda d: accelerator.save_state(str(d / "c")), root, rounds),
        "load_state": _timed_load(
            lambda d: accelerator.load_state(str(d / "c")),
            lambda d: accelerator.save_state(str(d / "c")),
            root,
            rounds,
        ),
    }


# -- memory, measured in fresh processes ----------------------------------------------------


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _memory_child(kind: str, mb: int, folder: str, shard_mb: int) -> None:
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(*_build(mb))
    if kind == "load_state":
        accelerator.save_state(folder)
    base = _rss_kb("VmRSS")
    _reset_peak()
    if kind == "load_state":
        accelerator.load_state(folder)
    else:
        accelerator.save_model(model, folder, max_shard_size=f"{shard_mb}MB")
    peak = _rss_kb("VmHWM")
    files = {p.name: p.stat().st_size for p in Path(folder).iterdir()}
    print(json.dumps({"base_mb": base / 1024, "extra_mb": (peak - base) / 1024, "files": files}))


def _memory(kind: str, mb: int, root: Path, shard_mb: int) -> dict[str, Any]:
    folder = root / f"mem_{kind}"
    here = str(Path(__file__).parent)
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import bench_checkpoint as b; "
        f"b._memory_child({kind!r}, {mb}, {str(folder)!r}, {shard_mb})"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=True
    )
    shutil.rmtree(folder, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default_mb = int(os.environ.get("HASTEN_BENCH_CKPT_MB", "400"))
    parser.add_argument("--mb", type=int, default=default_mb)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard_mb", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir))
    try:
        _report(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _report(args: argparse.Namespace, root: Path) -> None:
    total = args.mb * 3
    print(f"model {args.mb} MB + AdamW state: {total} MB in all; {args.rounds} rounds, median")
    raw = _raw(args.mb, root, args.rounds)
    ours = _hasten(args.mb, root, args.rounds, args.shard_mb)
    theirs = _accelerate(args.mb, root, args.rounds)
    rows = [
        ("raw save (no fsync)", raw["save"]),
        ("raw save + fsync", raw["save_fsync"]),
        ("hasten save_state (manifest, fsync)", ours["save_state"]),
        ("raw load", raw["load"]),
        ("hasten load_state (verified)", ours["load_state"]),
    ]
    if theirs is not None:
        rows += [("accelerate save_state", theirs["save_state"])]
        rows += [("accelerate load_state", theirs["load_state"])]
    for name, seconds in rows:
        print(f"  {name:<40} {seconds:7.3f} s  {total / seconds:8.0f} MB/s")
    print("ratios (time, lower is better for hasten; < 1.0 = faster than the reference):")
    print(f"  save_state / raw save (no fsync)   {ours['save_state'] / raw['save']:.2f}x")
    print(f"  save_state / raw save + fsync      {ours['save_state'] / raw['save_fsync']:.2f}x")
    print(f"  load_state / raw load              {ours['load_state'] / raw['load']:.2f}x")
    if theirs is not None:
        print(
            f"  save_state / accelerate            {ours['save_state'] / theirs['save_state']:.2f}x"
        )
        print(
            f"  load_state / accelerate            {ours['load_state'] / theirs['load_state']:.2f}x"
        )
    share = ours["async_blocked"] / ours["save_state"]
    print(
        f"async_save blocks the loop {ours['async_blocked']:.3f} s = {share:.0%} of the "
        f"synchronous save (target <= 15%)"
    )
    print(
        f"save_model ({args.shard_mb} MB shards) {ours['save_model']:.3f} s vs raw save_file "
        f"{raw['save_file']:.3f} s: {ours['save_model'] / raw['save_file']:.2f}x (target <= 1.2x)"
    )
    shards = _memory("save_model", args.mb, root, args.shard_mb)
    print(
        f"save_model peak extra memory {shards['extra_mb']:.0f} MB (one shard: "
        f"{max(shards['files'].values()) / 2**20:.0f} MB)"
    )
    loading = _memory("load_state", args.mb, root, args.shard_mb)
    largest = max(loading["files"].values()) / 2**20
    print(
        f"load_state peak RSS: model + optimizer {loading['base_mb']:.0f} MB (process) + "
        f"{loading['extra_mb']:.0f} MB extra; largest file {largest:.0f} MB (target: extra <= "
        "one file)"
    )


if __name__ == "__main__":
    main()
