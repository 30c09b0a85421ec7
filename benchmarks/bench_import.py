"""Import cost: `import hasten` / `from hasten import Accelerator` over `import torch`.

Each measurement is a fresh interpreter (median of N runs), so caches of one run do not help the
next. Target: hasten adds at most 75 ms over torch (HF Accelerate adds ~190 ms here).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from _reference import real_accelerate_installed

RUNS = 7
SNIPPETS = {
    "torch": "import torch",
    "hasten": "import torch; import hasten",
    "hasten.Accelerator": "import torch; from hasten import Accelerator",
    "accelerate.Accelerator": "import torch; from accelerate import Accelerator",
}


def _time_interleaved(snippets: dict[str, str]) -> dict[str, float]:
    """Median wall time of each snippet in fresh interpreters, the snippets taking turns in each
    round, so a load change on a shared machine hits every snippet alike."""
    samples: dict[str, list[float]] = {name: [] for name in snippets}
    for _ in range(RUNS):
        for name, code in snippets.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def _modules_loaded(stmt: str) -> int:
    """How many modules ``stmt`` loads after torch (the test pins the list itself)."""
    code = f"import sys, torch\nbefore = set(sys.modules)\n{stmt}\nprint(len(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout)


def _importtime_ms(code: str, package: str) -> float:
    """Cumulative import time of ``package`` (its top-level entry) after torch is loaded.

    ``-X importtime`` attributes time per module, so this is robust to a busy machine in a way
    that wall-clock differences of two interpreters are not.
    """
    samples = []
    for _ in range(RUNS):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            check=True,
            capture_output=True,
            text=True,
        ).stderr
        total = 0
        for line in out.splitlines():
            parts = line.split("|")
            # Top-level entries (no indentation) of the package: the lazy namespace resolves
            # `Accelerator` as a separate top-level import of `<package>.accelerator`.
            if len(parts) == 3 and parts[2].startswith(f" {package}") and parts[2][1] != " ":
                total += int(parts[1].strip())
        samples.append(total / 1e3)
    return statistics.median(samples)


_OWN_COST = (
    "import gc, time, torch\n"
    "gc.collect()  # settle torch's own garbage first, so its collection is not billed to us\n"
    "t = time.perf_counter()\n"
    "{stmt}\n"
    "print(time.perf_counter() - t)\n"
)


def _own_cost_ms(stmt: str) -> float:
    """In-process time of ``stmt`` right after torch, once torch's pending garbage is collected.

    Importing anything sizable right after torch triggers a full GC pass over torch's objects
    (~70 ms here); that pass is torch's garbage, billed to whoever imports next.
    """
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", _OWN_COST.format(stmt=stmt)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        for _ in range(RUNS)
    ]
    return statistics.median(samples) * 1e3


def _gc_pass_ms() -> float:
    """One full garbage collection right after ``import torch`` (median): the pass over torch's
    objects that the first ~3,300 allocations after torch trigger, whoever makes them."""
    code = "import gc, time, torch\nt = time.perf_counter()\ngc.collect()\nprint(time.perf_counter() - t)"
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            ).stdout
        )
        for _ in range(RUNS)
    ]
    return statistics.median(samples) * 1e3


def main() -> None:
    snippets = {
        name: code
        for name, code in SNIPPETS.items()
        if not name.startswith("accelerate") or real_accelerate_installed()
    }
    results = _time_interleaved(snippets)
    modules = _modules_loaded("from hasten import Accelerator")
    print(f"modules loaded by `from hasten import Accelerator` after torch: {modules}")
    print(
        f"one full GC pass over torch's objects (part of any first import after torch): "
        f"{_gc_pass_ms():.1f} ms"
    )
    print("own import cost after torch, torch's garbage collected first (median):")
    print(
        f"  from hasten import Accelerator: {_own_cost_ms('from hasten import Accelerator'):.1f} ms"
    )
    if "accelerate.Accelerator" in results:
        ms = _own_cost_ms("from accelerate import Accelerator")
        print(f"  from accelerate import Accelerator: {ms:.1f} ms")
    print("cumulative import time after torch (-X importtime, median):")
    print(
        f"  hasten + Accelerator: {_importtime_ms(SNIPPETS['hasten.Accelerator'], 'hasten'):.1f} ms"
    )
    if "accelerate.Accelerator" in results:
        ms = _importtime_ms(SNIPPETS["accelerate.Accelerator"], "accelerate")
        print(f"  accelerate + Accelerator: {ms:.1f} ms")
    base = results["torch"]
    print(f"fresh interpreters, interleaved (median of {RUNS}):")
    print(f"{'what':<26}{'median s':>10}{'over torch ms':>15}{'ratio':>8}")
    for name, seconds in results.items():
        print(f"{name:<26}{seconds:>10.3f}{(seconds - base) * 1e3:>15.1f}{seconds / base:>8.3f}")


if __name__ == "__main__":
    main()
