"""Checkpoint I/O against the storage's own limit, measured in the same run (issue 31).

For each folder given (default: /dev/shm, a tmpfs, and a temporary folder on the disk that holds
the system's temp dir), on the same file system and in one run:

- the device: sequential write of the checkpoint's size in 8 MiB blocks followed by fsync, and
  a sequential read of that file after its pages were dropped from the cache;
- ``save_state`` (synchronous) and ``save_model(max_shard_size=...)`` of a replicated model +
  AdamW (``--mb`` MB of weights, three times that with the moments: 1.2 GB at the default), as
  bytes on disk per second and as a fraction of the device's write bandwidth;
- ``load_state`` in a fresh process (a restarted job) on a cold cache, as a fraction of the
  device's read bandwidth;
- peak host RSS above the training state during save_state and load_state (fresh processes);
- with ``--fsdp``: FSDP2 on 2 processes, ``save_state``/``load_state`` against raw ``dcp.save``/
  ``dcp.load`` of the same state dicts, and the sharded save as a fraction of the write bandwidth.

The cache is dropped per file with ``posix_fadvise(POSIX_FADV_DONTNEED)`` after an fsync (no root
needed; it evicts clean pages of that file only). On tmpfs nothing can be dropped: the pages are
the storage, so "cold" reads there are memory reads. Each case runs ``--rounds`` times, the cases
interleaved, and the median with min-max is printed.

Usage: python benchmarks/bench_io_limit.py [--mb 400] [--rounds 5] [--dir D ...] [--fsdp]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

BLOCK = 8 << 20
LAYER = 1024  # Linear(1024, 1024, bias=False): 4 MiB of fp32 weights each


def _build(mb: int, stepped: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of Linear layers holding ``mb`` MB of weights, with AdamW (stepped: moments exist)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(LAYER, LAYER, bias=False) for _ in range(max(1, mb // 4))]
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if stepped:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _drop_cache(folder: Path) -> None:
    """Evict the clean cached pages of every file under ``folder`` (a no-op on tmpfs)."""
    for path in [folder] if folder.is_file() else folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _filesystem(folder: Path) -> str:
    """The mount (device, type) holding ``folder``, from /proc/mounts: which storage was measured."""
    best = ("?", "?", "")
    resolved = str(folder.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) and len(mount) > len(
            best[2]
        ):
            best = (device, kind, mount)
    return f"{best[0]} ({best[1]} on {best[2]})"


def _libc_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), to start writeback early as a fast writer would."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _device_write(path: Path, size: int, early: bool = False) -> float:
    """Seconds to write ``size`` bytes sequentially in 8 MiB blocks and fsync them.

    With ``early``, writeback of each 32 MiB starts as soon as it is written (sync_file_range),
    so the disk works while later blocks are produced: the best a sequential writer can do.
    """
    block = os.urandom(BLOCK)
    start_writeback = _libc_sync_file_range() if early else None
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = synced = 0
        while written < size:
            written += os.write(fd, block[: min(BLOCK, size - written)])
            if start_writeback is not None and written - synced >= 32 << 20:
                start_writeback(fd, synced, written - synced, 2)  # SYNC_FILE_RANGE_WRITE
                synced = written
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _device_write_streams(folder: Path, size: int, streams: int) -> float:
    """Seconds for ``streams`` threads to write ``size`` bytes in all (one file each) and fsync."""
    from concurrent.futures import ThreadPoolExecutor

    paths = [folder / f"stream_{i}.bin" for i in range(streams)]
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda path: _device_write(path, size // streams), paths))
    seconds = time.perf_counter() - start
    for path in paths:
        path.unlink()
    return seconds


def _device_read(path: Path) -> float:
    """Seconds to read ``path`` sequentially in 8 MiB blocks from a cold cache."""
    _drop_cache(path)
    buffer = bytearray(BLOCK)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass
    return time.perf_counter() - start


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _child_json(code: str, timeout: float = 900) -> dict[str, float]:
    here = str(Path(__file__).parent)
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); {code}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_save(mb: int, folder: str) -> None:
    """Fresh process: time save_state and report the peak RSS it added above the training state."""
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(*_build(mb))
    base = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the current RSS
    start = time.perf_counter()
    accelerator.save_state(folder)
    seconds = time.perf_counter() - start
    extra = (_rss_kb("VmHWM") - base) / 1024
    print(json.dumps({"seconds": seconds, "extra_mb": extra, "base_mb": base / 1024}))


def child_load(mb: int, folder: str) -> None:
    """Fresh process (a restarted job): time load_state from a cold cache, and its peak extra RSS."""
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    _, optimizer = accelerator.prepare(*_build(mb, stepped=False))
    _drop_cache(Path(folder))
    base = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    start = time.perf_counter()
    accelerator.load_state(folder)
    seconds = time.perf_counter() - start
    created = sum(  # a restarted job's optimizer has no state yet: loading creates it
        t.numel() * t.element_size()
        for per_param in optimizer.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor)
    )
    extra = (_rss_kb("VmHWM") - base - created / 1024) / 1024
    print(json.dumps({"seconds": seconds, "extra_mb": extra, "base_mb": base / 1024}))


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s ({min(values):.3f} - {max(values):.3f})"


def _fraction(size: int, seconds: list[float], limit: list[float]) -> str:
    """Throughput as a fraction of the device's, median (and the spread of the per-round ratio)."""
    ours = [size / s for s in seconds]
    device = [size / s for s in limit]
    med = statistics.median(ours) / statistics.median(device)
    per_round = [o / d for o, d in zip(ours, device, strict=False)]
    return f"{med:5.0%} (rounds {min(per_round):.0%} - {max(per_round):.0%})"


def measure_folder(root: Path, mb: int, rounds: int, shard_mb: int) -> None:
    """Every replicated case on the file system holding ``root``, interleaved round by round."""
    from hasten import Accelerator

    print(f"\n== {root}: {_filesystem(root)}")
    accelerator = Accelerator(cpu=True)
    model, _ = accelerator.prepare(*_build(mb))
    probe = root / "probe_state"
    accelerator.save_state(str(probe))
    size = _bytes_under(probe)
    model_size = sum(p.numel() * p.element_size() for p in model.parameters())
    shutil.rmtree(probe)
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "device write+fsync",
            "device write+fsync, 2 streams",
            "device write+fsync, early writeback",
            "device read (cold)",
            "device write (model size)",
            "save_state",
            "save_model",
            "load_state (fresh process, cold)",
        )
    }
    rss: dict[str, list[float]] = {"save_state": [], "load_state": []}
    saved = root / "saved_state"
    blob, model_blob = root / "device.bin", root / "device_model.bin"
    for r in range(rounds):
        cases: list[tuple[str, Callable[[], object]]] = []
        cases.append(("device write+fsync", lambda: _device_write(blob, size)))
        cases.append(
            ("device write+fsync, 2 streams", lambda: _device_write_streams(root, size, 2))
        )
        cases.append(
            ("device write+fsync, early writeback", lambda: _device_write(blob, size, True))
        )
        cases.append(("device write (model size)", lambda: _device_write(model_blob, model_size)))
        cases.append(("save_state", lambda: accelerator.save_state(str(root / "s"))))
        cases.append(
            (
                "save_model",
                lambda: accelerator.save_model(
                    model, str(root / "m"), max_shard_size=f"{shard_mb}MB"
                ),
            )
        )
        shift = r % len(cases)
        for name, run in cases[shift:] + cases[:shift]:
            os.sync()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        times["device read (cold)"].append(_device_read(blob))
        for leftover in (blob, model_blob):
            leftover.unlink()
        shutil.rmtree(root / "s")
        shutil.rmtree(root / "m")
        os.sync()
        saved_run = _child_json(f"import bench_io_limit as b; b.child_save({mb}, {str(saved)!r})")
        rss["save_state"].append(saved_run["extra_mb"])
        loaded = _child_json(f"import bench_io_limit as b; b.child_load({mb}, {str(saved)!r})")
        times["load_state (fresh process, cold)"].append(loaded["seconds"])
        rss["load_state"].append(loaded["extra_mb"])
        shutil.rmtree(saved)
    print(
        f"state {size / 2**20:.0f} MiB on disk (model {model_size / 2**20:.0f} MiB + AdamW), "
        f"{rounds} rounds, median (min - max)"
    )
    for name, values in times.items():
        moved = model_size if name in ("save_model", "device write (model size)") else size
        print(
            f"  {name:<34} {_stats(values)}  {moved / statistics.median(values) / 2**20:7.0f} MiB/s"
        )
    # The device's limit: the fastest of the three ways of writing, round by round.
    write = [
        min(ways)
        for ways in zip(
            times["device write+fsync"],
            times["device write+fsync, 2 streams"],
            times["device write+fsync, early writeback"],
            strict=True,
        )
    ]
    read = times["device read (cold)"]
    print("fractions of the device's bandwidth (write: the fastest way; target >= 80%):")
    print(f"  save_state / write+fsync           {_fraction(size, times['save_state'], write)}")
    print(
        "  save_model / write+fsync           "
        f"{_fraction(model_size, times['save_model'], times['device write (model size)'])}"
    )
    print(
        "  load_state / cold read             "
        f"{_fraction(size, times['load_state (fresh process, cold)'], read)}"
    )
    for name, values in rss.items():
        print(
            f"  peak RSS above the training state during {name} (the optimizer state a load "
            "creates left out): median "
            f"{statistics.median(values):.0f} MiB (max {max(values):.0f}); state {size / 2**20:.0f} MiB"
        )


def fsdp_child(folder: str, rounds: int, mb: int) -> None:
    """Under torchrun, 2 processes: FSDP2 save_state/load_state vs raw dcp.save/dcp.load."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")  # raw rounds
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    net, _ = _build(mb, stepped=False)
    model, optimizer = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-4))
    model(torch.randn(2, LAYER)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    root = Path(folder)

    def raw_save() -> None:
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=root / "raw")

    def raw_load() -> None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=root / "raw")
        set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)

    def block_write() -> None:
        _device_write(root / f"device_{dist.get_rank()}.bin", shard_bytes)
        (root / f"device_{dist.get_rank()}.bin").unlink()

    raw_save()
    shard_bytes = _bytes_under(root / "raw") // dist.get_world_size()
    loops: dict[str, Callable[[], None]] = {
        "device write+fsync (each rank its shard)": block_write,
        "raw dcp.save": raw_save,
        "save_state": lambda: accelerator.save_state(str(root / "hasten")),
    }
    loads: dict[str, Callable[[], None]] = {
        "raw dcp.load": raw_load,
        "load_state": lambda: accelerator.load_state(str(root / "hasten")),
    }
    times: dict[str, list[float]] = {name: [] for name in [*loops, *loads]}
    for r in range(rounds):
        for group in (loops, loads):
            names = list(group)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                dist.barrier()
                if dist.get_rank() == 0:
                    os.sync()
                dist.barrier()
                start = time.perf_counter()
                group[name]()
                dist.barrier()
                times[name].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        size = _bytes_under(root / "hasten")
        print(f"FSDP2, 2 processes, {size / 2**20:.0f} MiB of sharded state, {rounds} rounds")
        for name, values in times.items():
            print(f"  {name:<42} {_stats(values)}")
        med = {name: statistics.median(values) for name, values in times.items()}
        print(
            f"  save_state / raw dcp.save   {med['save_state'] / med['raw dcp.save']:.2f}x (target <= 1.05)"
        )
        print(
            f"  load_state / raw dcp.load   {med['load_state'] / med['raw dcp.load']:.2f}x (target <= 1.0)"
        )
        device = med["device write+fsync (each rank its shard)"]
        print(f"  sharded save_state / device write+fsync: {device / med['save_state']:.0%}")
    dist.destroy_process_group()


def measure_fsdp(root: Path, rounds: int, mb: int) -> None:
    """Run `fsdp_child` on 2 processes under torchrun, with its output shown here."""
    print(f"\n== FSDP2 in {root}: {_filesystem(root)}")
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    here = str(Path(__file__).parent)
    code = f"import bench_io_limit as b; b.fsdp_child({str(root)!r}, {rounds}, {mb})"
    script = root / "fsdp_entry.py"
    script.write_text(f"import sys\nsys.path.insert(0, {here!r})\n{code}\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [torchrun, "--nproc_per_node", "2", "--standalone", str(script)]
    subprocess.run(cmd, env=env, timeout=1800, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=400, help="MB of fp32 weights (state is 3x)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shard_mb", type=int, default=100)
    parser.add_argument(
        "--dir", action="append", default=None, help="folder to measure in (repeat)"
    )
    parser.add_argument("--fsdp", action="store_true", help="also FSDP2 on 2 processes vs raw DCP")
    args = parser.parse_args()
    folders = args.dir or ["/dev/shm", tempfile.gettempdir()]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, threads {torch.get_num_threads()}, "
        f"python {sys.version.split()[0]}"
    )
    for folder in folders:
        if not Path(folder).is_dir():
            print(f"\n== {folder}: not a folder here, skipped")
            continue
        root = Path(tempfile.mkdtemp(prefix="bench_io_", dir=folder))
        try:
            measure_folder(root, args.mb, args.rounds, args.shard_mb)
            if args.fsdp:
                measure_fsdp(root, args.rounds, args.mb)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
