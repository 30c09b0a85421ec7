"""Peak host memory (RSS) of FSDP2 ``prepare`` and ``save_model`` on 2 processes, vs raw torch.

``python benchmarks/bench_fsdp_memory.py [--mb 300] [--rounds 2] [--shard-mb 40]`` runs every
case in a fresh 2-process ``torchrun`` job (rounds alternate the case order), so no case sees
another's allocator state. glibc is told to ``mmap`` every large block
(``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the RSS at once and the peak RSS tracks
live memory. Each process reports its peak RSS increase over the phase (model creation +
``prepare``, or one ``save_model``): the larger of a 0.5 ms sampler reading
``/proc/self/statm`` and ``ru_maxrss`` when it grew during the phase. Printed as multiples of
the fp32 model's size (or of the shard size for saving), with each hasten case's ratio to the
raw torch case doing the same work; "raw control" repeats the raw efficient case (its ratio is
the noise floor).

Cases (each row: rank 0 and rank 1 peak / model size):

- ``raw efficient`` / ``raw control``: rank 0 builds the model, rank 1 builds it on meta;
  ``fully_shard`` on meta, ``to_empty``, ``set_model_state_dict(broadcast_from_rank0=True)``.
- ``hasten efficient``: ``cpu_ram_efficient_loading=True``, rank 1 builds under
  ``init_empty_weights()`` (what an Accelerate user does for a plain model; transformers'
  ``from_pretrained`` does it by itself when ``FSDP_CPU_RAM_EFFICIENT_LOADING`` is set).
- ``hasten efficient all-build``: the same plugin, but every rank builds the real model.
- ``raw full`` / ``hasten full``: every rank builds the model; plain ``fully_shard`` / prepare.
- ``raw save`` / ``hasten save_model``: after sharding, the full state dict written as
  safetensors shards of ``--shard-mb`` from rank 0 (raw: ``get_model_state_dict`` full, then
  ``safetensors.torch.save_file`` per shard; hasten: ``save_model``).
- ``raw save fsdp1`` / ``hasten save_model fsdp1``: the same with FSDP1 (each ``Block`` one
  unit, every rank builds the model; raw: a full state dict without CPU offload, which
  segfaults on a CPU-only run).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _models import BlockModel
from torch import nn

WIDTH = 1024
CASES = [
    "raw efficient",
    "hasten efficient",
    "hasten efficient all-build",
    "raw control",
    "raw full",
    "hasten full",
    "raw save",
    "hasten save_model",
    "raw save fsdp1",
    "hasten save_model fsdp1",
]
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextlib.contextmanager
def peak_increase(out: dict[str, int]) -> Iterator[None]:
    """Record in ``out["peak"]`` the peak RSS increase (bytes) over the ``with`` block."""
    gc.collect()
    start, max_start = _rss(), _maxrss()
    peak = [start]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        high = max(peak[0], _rss())
        if _maxrss() > max_start:  # the high-water mark moved during the block: it is exact
            high = max(high, _maxrss())
        out["peak"] = high - start


def _build(depth: int, real: bool) -> BlockModel:
    torch.manual_seed(0)
    if real:
        return BlockModel(WIDTH, depth)
    with torch.device("meta"):
        return BlockModel(WIDTH, depth)


def _raw_shard(model: BlockModel) -> BlockModel:
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def raw_efficient(depth: int) -> BlockModel:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = _build(depth, real=dist.get_rank() == 0)
    full = {k: v.detach() for k, v in model.state_dict().items()} if dist.get_rank() == 0 else {}
    model.to("meta")
    _raw_shard(model)
    model.to_empty(device="cpu")
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    del full
    return model


def _raw_fsdp1(model: BlockModel) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({type(model.layers[0])})
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=torch.device("cpu"))


def _accelerator(efficient: bool, version: int = 2) -> Any:
    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version,
        auto_wrap_policy="transformer_based_wrap",
        cpu_ram_efficient_loading=efficient,
    )
    return Accelerator(cpu=True, fsdp_plugin=plugin)


def hasten_efficient(accelerator: Any, depth: int, all_build: bool) -> BlockModel:
    from hasten import init_empty_weights

    torch.manual_seed(0)
    empty = init_empty_weights() if dist.get_rank() != 0 and not all_build else None
    with empty or contextlib.nullcontext():
        model = BlockModel(WIDTH, depth)
    return accelerator.prepare(model)


def _warm_up(accelerator: Any, fsdp1: bool) -> None:
    """Run the case's code once on a tiny model: the modules it imports are not counted."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    tiny: nn.Module = BlockModel(8, 2)
    folder = Path(tempfile.gettempdir()) / f"hasten_bench_fsdp_memory_warm_{os.getppid()}"
    if accelerator is None:
        tiny = _raw_fsdp1(tiny) if fsdp1 else _raw_shard(tiny)  # type: ignore[arg-type]
        options = StateDictOptions(full_state_dict=True, cpu_offload=not fsdp1)
        get_model_state_dict(tiny, options=options)
    else:
        accelerator.save_model(accelerator.prepare(tiny), str(folder))
    import safetensors.torch  # noqa: F401

    dist.barrier()
    shutil.rmtree(folder, ignore_errors=True)


def _phase(case: str, depth: int, shard_mb: int, out: dict[str, int]) -> None:
    fsdp1 = case.endswith("fsdp1")
    efficient = "efficient" in case or ("save" in case and not fsdp1)
    accelerator = _accelerator(efficient, 1 if fsdp1 else 2) if "hasten" in case else None
    _warm_up(accelerator, fsdp1)
    if fsdp1:
        model = _build(depth, real=True)
        model = accelerator.prepare(model) if accelerator else _raw_fsdp1(model)
        _save(case, accelerator, model, shard_mb, out)
        return
    if case in ("raw save", "hasten save_model"):
        model = hasten_efficient(accelerator, depth, False) if accelerator else raw_efficient(depth)
        _save(case, accelerator, model, shard_mb, out)
        return
    run: Callable[[], BlockModel]
    if case in ("raw efficient", "raw control"):
        run = lambda: raw_efficient(depth)  # noqa: E731
    elif case == "raw full":
        run = lambda: _raw_shard(_build(depth, real=True))  # noqa: E731
    elif case == "hasten full":
        run = lambda: accelerator.prepare(_build(depth, real=True))  # noqa: E731
    else:
        run = lambda: hasten_efficient(accelerator, depth, "all-build" in case)  # noqa: E731
    with peak_increase(out):
        model = run()
    _check_sharded(model)


def _check_sharded(model: nn.Module) -> None:
    local = sum(getattr(p, "_local_tensor", p).numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    if not 0.4 < local / total < 0.6:
        raise RuntimeError(f"not sharded: this process holds {local / total:.2f} of the model")


def _save(
    case: str, accelerator: Any, model: nn.Module, shard_mb: int, out: dict[str, int]
) -> None:
    folder = Path(tempfile.gettempdir()) / f"hasten_bench_fsdp_memory_{os.getppid()}"
    if dist.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.barrier()
    with peak_increase(out):
        if accelerator is not None:
            accelerator.save_model(model, str(folder), max_shard_size=f"{shard_mb}MB")
        else:
            _raw_save(model, folder, shard_mb * 10**6, offload=not case.endswith("fsdp1"))
    dist.barrier()
    if dist.get_rank() == 0:
        out["files"] = len(list(folder.iterdir()))
        shutil.rmtree(folder, ignore_errors=True)


def _raw_save(model: nn.Module, folder: Path, max_bytes: int, offload: bool) -> None:
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=offload)
    state = get_model_state_dict(model, options=options)
    if dist.get_rank() != 0:
        return
    folder.mkdir(parents=True)
    shard: dict[str, torch.Tensor] = {}
    size, index = 0, 0
    for name, tensor in [*state.items(), ("", None)]:
        nbytes = 0 if tensor is None else tensor.numel() * tensor.element_size()
        if shard and (tensor is None or size + nbytes > max_bytes):
            index += 1
            save_file(shard, str(folder / f"model-{index:05d}.safetensors"))
            shard, size = {}, 0
        if tensor is not None:
            shard[name] = tensor
            size += nbytes


def worker(case: str, depth: int, shard_mb: int, result: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out: dict[str, int] = {}
    _phase(case, depth, shard_mb, out)
    peaks: list[Any] = [None, None]
    dist.all_gather_object(peaks, out)
    if dist.get_rank() == 0:
        Path(result).write_text(json.dumps(peaks))
    dist.barrier()
    dist.destroy_process_group()


def _run_case(case: str, depth: int, shard_mb: int) -> list[dict[str, int]]:
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [torchrun, "--nproc_per_node", "2", "--standalone", __file__, "--worker", case]
        cmd += ["--depth", str(depth), "--shard-mb", str(shard_mb), "--result", result]
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            MALLOC_MMAP_THRESHOLD_="1048576",  # large blocks mmapped: freed memory leaves RSS
            MALLOC_TRIM_THRESHOLD_="1048576",
        )
        subprocess.run(cmd, env=env, timeout=600, check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(result).read_text())  # type: ignore[no-any-return]


def _print(results: dict[str, list[list[dict[str, int]]]], model_bytes: int, shard: int) -> None:
    print(f"model {model_bytes / 1e6:.0f} MB fp32, shard {shard / 1e6:.0f} MB, 2 processes, gloo")
    print(f"{'case':32s} {'rank0/model':>12s} {'rank1/model':>12s} {'rank0 MB':>9s}")
    medians: dict[str, list[float]] = {}
    for case, runs in results.items():
        medians[case] = [statistics.median(run[r]["peak"] for run in runs) for r in (0, 1)]
        r0, r1 = medians[case]
        print(f"{case:32s} {r0 / model_bytes:12.2f} {r1 / model_bytes:12.2f} {r0 / 1e6:9.0f}")
    pairs = [
        ("hasten efficient", "raw efficient"),
        ("raw control", "raw efficient"),
        ("hasten full", "raw full"),
        ("hasten save_model", "raw save"),
        ("hasten save_model fsdp1", "raw save fsdp1"),
    ]
    for mine, raw in pairs:
        if mine not in medians or raw not in medians:
            continue
        ratios = [medians[mine][r] / max(medians[raw][r], 1) for r in (0, 1)]
        print(f"ratio {mine} / {raw}: rank0 {ratios[0]:.2f}, rank1 {ratios[1]:.2f}")
    for case in ("raw save", "hasten save_model", "raw save fsdp1", "hasten save_model fsdp1"):
        if case not in medians:
            continue
        r0 = medians[case][0]
        print(
            f"{case}: rank0 peak increase = {r0 / shard:.2f} shards ({r0 / model_bytes:.2f} models)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=300, help="model size in MB (fp32)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shard-mb", type=int, default=40)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--depth", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.depth, args.shard_mb, args.result)
        return
    block_bytes = 4 * (2 * 4 * WIDTH * WIDTH + 5 * WIDTH)
    depth = max(2, round(args.mb * 1e6 / block_bytes))
    cases = args.cases.split(",")
    results: dict[str, list[list[dict[str, int]]]] = {case: [] for case in cases}
    for round_index in range(args.rounds):
        for case in cases if round_index % 2 == 0 else reversed(cases):
            results[case].append(_run_case(case, depth, args.shard_mb))
    _print(results, depth * block_bytes, args.shard_mb * 10**6)


if __name__ == "__main__":
    main()
