"""Checkpoint speed and memory: hasten vs raw safetensors/torch.save (and HF Accelerate if present).

Workload: a model of ``--mb`` MB of fp32 weights (default 400, or HASTEN_BENCH_CKPT_MB) with
AdamW state (twice the weights: 1.2 GB in all at the default). Measured side by side, each the
median of ``--rounds`` runs into fresh folders (the page cache is warm for everyone):

- save_state / load_state vs raw ``safetensors.torch.save_file``/``load_file`` for the weights
  plus ``torch.save``/``torch.load`` for the optimizer; hasten includes its manifest (xxh3
  checksums of every block of every file) and fsync; raw is shown without and with fsync.
  Reloading in the same process: the model and optimizer already hold their tensors.
- async_save: how long ``save_state(async_save=True)`` blocks the training loop, as a share
  of the synchronous save, both timed in a fresh process holding only the training state
  (target <= 15%).
- save_model with shards (``--shard_mb``) vs one raw ``save_file``; peak extra memory.
- load_state into a fresh process, as when a job restarts: the model is new and the optimizer
  has no state yet, so every loaded byte lands in memory the process has never touched.
- peak RSS during load_state, in a fresh process: at most model + optimizer + one file.

Usage: python benchmarks/bench_checkpoint.py [--mb 400] [--rounds 3] [--shard_mb 100] [--dir D]
(``--dir /dev/shm`` leaves the disk out: its fsync times vary several-fold between runs here.)
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
from _reference import require_real_accelerate

LAYER = 1024  # Linear(1024, 1024): 4 MB of weights each


def _build(mb: int, stepped: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and AdamW; ``stepped`` gives the optimizer its state (a resumed run has none)."""
    torch.manual_seed(0)
    layers = max(1, mb // 4)
    model = torch.nn.Sequential(*[torch.nn.Linear(LAYER, LAYER, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if stepped:
        for p in model.parameters():  # one step creates AdamW's two moments per parameter
            p.grad = torch.ones_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


Case = Callable[[Path], Any]


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


def _raw_save_file(model: Any, folder: Path, fsync: bool) -> None:
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(folder / "model.safetensors"))
    if fsync:
        _fsync(folder / "model.safetensors")


def _raw_cases(mb: int) -> tuple[dict[str, Case], dict[str, tuple[Case, Case]]]:
    model, optimizer = _build(mb)
    saves: dict[str, Case] = {
        "raw save": lambda d: _raw_save(model, optimizer, d, False),
        "raw save + fsync": lambda d: _raw_save(model, optimizer, d, True),
        "raw save_file": lambda d: _raw_save_file(model, d, False),
        "raw save_file + fsync": lambda d: _raw_save_file(model, d, True),
    }
    loads = {"raw load": (saves["raw save"], lambda d: _raw_load(model, optimizer, d))}
    return saves, loads


def _hasten_cases(
    mb: int, shard_mb: int
) -> tuple[Any, dict[str, Case], dict[str, tuple[Case, Case]]]:
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model, _ = accelerator.prepare(*_build(mb))
    saves: dict[str, Case] = {
        "hasten save_state": lambda d: accelerator.save_state(str(d / "c")),
        "hasten save_model": lambda d: accelerator.save_model(
            model, str(d), max_shard_size=f"{shard_mb}MB"
        ),
    }
    loads = {
        "hasten load_state": (
            saves["hasten save_state"],
            lambda d: accelerator.load_state(str(d / "c")),
        )
    }
    return accelerator, saves, loads


def _accelerate_cases() -> Any:
    try:
        require_real_accelerate()
        from accelerate import Accelerator as HFAccelerator
    except ImportError:
        return None
    return HFAccelerator


def _accelerate_setup(cls: Any, mb: int) -> tuple[dict[str, Case], dict[str, tuple[Case, Case]]]:
    accelerator = cls(cpu=True)
    accelerator.prepare(*_build(mb))
    saves: dict[str, Case] = {
        "accelerate save_state": lambda d: accelerator.save_state(str(d / "c"))
    }
    loads = {
        "accelerate load_state": (
            saves["accelerate save_state"],
            lambda d: accelerator.load_state(str(d / "c")),
        )
    }
    return saves, loads


def _interleaved(
    saves: dict[str, Case], loads: dict[str, tuple[Case, Case]], root: Path, rounds: int
) -> dict[str, list[float]]:
    """Seconds of each case per round; every round runs every case once, so drift hits all alike."""
    sources: dict[str, Path] = {}
    for name, (save, _) in loads.items():
        sources[name] = root / f"source_{len(sources)}"
        sources[name].mkdir()
        save(sources[name])
    times: dict[str, list[float]] = {name: [] for name in [*saves, *loads]}
    for round_index in range(rounds):
        # Rotate the order each round: the first case after a big free pays for the allocator.
        shift = round_index % len(saves)
        for name in [*saves][shift:] + [*saves][:shift]:
            save = saves[name]
            folder = root / f"run_{time.monotonic_ns()}"
            folder.mkdir()
            os.sync()  # no dirty pages left by the previous case: each starts from the same state
            start = time.perf_counter()
            save(folder)
            times[name].append(time.perf_counter() - start)
            shutil.rmtree(folder)
        shift = round_index % len(loads)
        for name in [*loads][shift:] + [*loads][:shift]:
            load = loads[name][1]
            os.sync()
            start = time.perf_counter()
            load(sources[name])
            times[name].append(time.perf_counter() - start)
    for folder in sources.values():
        shutil.rmtree(folder)
    return times


def _async_child(mb: int, folder: str, rounds: int) -> None:
    """Time synchronous and asynchronous save_state in a process holding only the training state.

    The parent also holds the raw and Accelerate baselines (2.4 GB more), which slows this VM's
    memory copies by a third; a training job has only its own state. Each save is followed by a
    training step: after an async save that step may wait for the optimizer state's copy (see
    hasten.checkpointing.storage.writer.Snapshot), and the wait counts as blocked time. The step is also
    slower while the writer thread shares the cores; that is reported apart. The first round
    allocates the host buffers and is left out.
    """
    from _harness import record_snapshot_holds

    from hasten import Accelerator

    held, _ = record_snapshot_holds()
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(*_build(mb))
    batch = torch.randn(8, LAYER)
    times: dict[str, list[float]] = {"sync": [], "async": [], "sync step": [], "async step": []}
    times["held"] = []
    for i in range(rounds + 1):
        for kind in ("sync", "async"):
            held.clear()
            target = Path(folder) / f"{kind}_{i}"
            start = time.perf_counter()
            accelerator.save_state(str(target), async_save=kind == "async")
            stepped = time.perf_counter()
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            times[kind].append(stepped - start)
            times[f"{kind} step"].append(time.perf_counter() - stepped)
            if kind == "async":
                times["held"].append(sum(held))
            accelerator._checkpoints.wait()
            shutil.rmtree(target)
    print(json.dumps({kind: statistics.median(values[1:]) for kind, values in times.items()}))


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


def _resume_child(kind: str, mb: int, folder: str) -> None:
    """Time loading a checkpoint into a fresh model and an optimizer without state, as a resume."""
    model, optimizer = _build(mb, stepped=False)
    if kind == "raw":
        start = time.perf_counter()
        _raw_load(model, optimizer, Path(folder))
    else:
        if kind == "hasten":
            from hasten import Accelerator
        else:
            from accelerate import Accelerator  # type: ignore[no-redef]
        accelerator = Accelerator(cpu=True)
        accelerator.prepare(model, optimizer)
        start = time.perf_counter()
        accelerator.load_state(folder)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def _child(code: str) -> dict[str, Any]:
    here = str(Path(__file__).parent)
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); {code}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _resume_times(
    loads: dict[str, tuple[Case, Case]], mb: int, root: Path, rounds: int
) -> dict[str, list[float]]:
    """Load times in fresh processes (a restarted job), interleaved like `_interleaved`."""
    kinds = {"raw load": "raw", "hasten load_state": "hasten", "accelerate load_state": "hf"}
    sources = {}
    for name, kind in kinds.items():
        if name in loads:
            sources[kind] = root / f"resume_{kind}"
            sources[kind].mkdir()
            loads[name][0](sources[kind])
    times: dict[str, list[float]] = {kind: [] for kind in sources}
    for round_index in range(rounds):
        order = [*sources][round_index % len(sources) :] + [*sources][: round_index % len(sources)]
        for kind in order:
            folder = sources[kind] / "c" if kind != "raw" else sources[kind]
            code = f"import bench_checkpoint as b; b._resume_child({kind!r}, {mb}, {str(folder)!r})"
            times[kind].append(_child(code)["seconds"])
    for folder in sources.values():
        shutil.rmtree(folder)
    return times


def _memory(kind: str, mb: int, root: Path, shard_mb: int) -> dict[str, Any]:
    folder = root / f"mem_{kind}"
    result = _child(
        f"import bench_checkpoint as b; b._memory_child({kind!r}, {mb}, {str(folder)!r}, {shard_mb})"
    )
    shutil.rmtree(folder, ignore_errors=True)
    return result


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
    saves, loads = _raw_cases(args.mb)
    _, ours, our_loads = _hasten_cases(args.mb, args.shard_mb)
    saves.update(ours)
    loads.update(our_loads)
    hf = _accelerate_cases()
    if hf is not None:
        hf_saves, hf_loads = _accelerate_setup(hf, args.mb)
        saves.update(hf_saves)
        loads.update(hf_loads)
    runs = _interleaved(saves, loads, root, args.rounds)
    t = {name: statistics.median(values) for name, values in runs.items()}
    print("  case                         median  (min - max)          throughput")
    for name, seconds in t.items():
        size = args.mb if "save_file" in name or "save_model" in name else total
        spread = f"({min(runs[name]):.3f} - {max(runs[name]):.3f})"
        print(f"  {name:<28} {seconds:6.3f} s {spread:<17} {size / seconds:6.0f} MB/s")
    print("ratios of times, median (best of each): < 1.0 means hasten is faster")
    pairs = [
        ("hasten save_state", "raw save"),
        ("hasten save_state", "raw save + fsync"),
        ("hasten load_state", "raw load"),
        ("hasten save_state", "accelerate save_state"),
        ("hasten load_state", "accelerate load_state"),
        ("hasten save_model", "raw save_file"),
        ("hasten save_model", "raw save_file + fsync"),
    ]
    for ours_name, reference in pairs:
        if reference in t:
            best = min(runs[ours_name]) / min(runs[reference])
            print(
                f"  {ours_name} / {reference:<24} {t[ours_name] / t[reference]:.2f}x ({best:.2f}x)"
            )
    resume_runs = _resume_times(loads, args.mb, root, args.rounds)
    resume = {kind: statistics.median(values) for kind, values in resume_runs.items()}
    print("load into a fresh process (a restarted job): median (min - max)")
    for kind, seconds in resume.items():
        spread = f"({min(resume_runs[kind]):.3f} - {max(resume_runs[kind]):.3f})"
        print(f"  {kind:<10} {seconds:6.3f} s {spread:<17} {total / seconds:6.0f} MB/s")

    def ratio(kind: str) -> str:
        best = min(resume_runs["hasten"]) / min(resume_runs[kind])
        return f"{resume['hasten'] / resume[kind]:.2f}x ({best:.2f}x)"

    print(f"  hasten / raw {ratio('raw')}", end="")
    if "hf" in resume:
        print(f"   hasten / accelerate {ratio('hf')}", end="")
    print()
    folder = str(root / "async")
    saved = _child(
        f"import bench_checkpoint as b; b._async_child({args.mb}, {folder!r}, {args.rounds})"
    )
    blocked = saved["async"] + saved["held"]
    print(
        f"async_save blocks the loop {blocked:.3f} s (the call {saved['async']:.3f} s + the next "
        f"step held {saved['held']:.3f} s) = {blocked / saved['sync']:.0%} of the synchronous "
        f"save ({saved['sync']:.3f} s), in a process holding only the training state "
        "(target <= 15%)"
    )
    print(
        f"  while the writer shares the cores, the next training step takes "
        f"{saved['async step']:.3f} s instead of {saved['sync step']:.3f} s"
    )
    shards = _memory("save_model", args.mb, root, args.shard_mb)
    print(
        f"save_model peak extra memory {shards['extra_mb']:.0f} MB (one shard: "
        f"{max(shards['files'].values()) / 2**20:.0f} MB)"
    )
    loading = _memory("load_state", args.mb, root, args.shard_mb)
    largest = max(loading["files"].values()) / 2**20
    print(
        f"load_state peak RSS: process with model + optimizer {loading['base_mb']:.0f} MB, "
        f"+{loading['extra_mb']:.0f} MB while loading; largest file {largest:.0f} MB "
        "(target: extra <= one file)"
    )


if __name__ == "__main__":
    main()
