"""Import cost: `import hasten` / `from hasten import Accelerator` over `import torch`.

Each measurement is a fresh interpreter (median of N runs), so caches of one run do not help the
next. Target: hasten adds at most 75 ms over torch (HF Accelerate adds ~190 ms here).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time

RUNS = 7
SNIPPETS = {
    "torch": "import torch",
    "hasten": "import torch; import hasten",
    "hasten.Accelerator": "import torch; from hasten import Accelerator",
    "accelerate.Accelerator": "import torch; from accelerate import Accelerator",
}


def _time(code: str) -> float:
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    results = {}
    for name, code in SNIPPETS.items():
        if name.startswith("accelerate") and importlib.util.find_spec("accelerate") is None:
            continue
        results[name] = _time(code)
    base = results["torch"]
    print(f"{'what':<26}{'median s':>10}{'over torch ms':>15}{'ratio':>8}")
    for name, seconds in results.items():
        print(f"{name:<26}{seconds:>10.3f}{(seconds - base) * 1e3:>15.1f}{seconds / base:>8.3f}")


if __name__ == "__main__":
    main()
