"""Cost of the config layer: KwargsHandler.to_kwargs() and reading settings from the environment.

Runs the same calls through hasten and (if importable) HF Accelerate and prints the ratios.
Accelerate's to_kwargs() builds a default instance under clear_environment() on every call;
hasten compares against class defaults computed once.
"""

from __future__ import annotations

import os
import timeit

from _reference import require_real_accelerate


def _best(stmt, number: int = 20000) -> float:  # type: ignore[no-untyped-def]
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number


def main() -> None:
    from hasten.config.envvars import read_flag
    from hasten.config.kwargs import DistributedDataParallelKwargs, GradScalerKwargs

    os.environ.setdefault("ACCELERATE_DEBUG_MODE", "0")
    hasten_ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    hasten_scaler = GradScalerKwargs(init_scale=1024.0)
    rows = [
        ("DDPKwargs.to_kwargs", _best(hasten_ddp.to_kwargs)),
        ("GradScalerKwargs.to_kwargs", _best(hasten_scaler.to_kwargs)),
        ("read_flag(ACCELERATE_DEBUG_MODE)", _best(lambda: read_flag("ACCELERATE_DEBUG_MODE"))),
    ]
    reference: dict[str, float] = {}
    try:
        require_real_accelerate()
        from accelerate.utils import DistributedDataParallelKwargs as AccDDP
        from accelerate.utils import GradScalerKwargs as AccScaler
        from accelerate.utils import parse_flag_from_env

        acc_ddp = AccDDP(find_unused_parameters=True)
        acc_scaler = AccScaler(init_scale=1024.0)
        reference = {
            "DDPKwargs.to_kwargs": _best(acc_ddp.to_kwargs, 2000),
            "GradScalerKwargs.to_kwargs": _best(acc_scaler.to_kwargs, 2000),
            "read_flag(ACCELERATE_DEBUG_MODE)": _best(
                lambda: parse_flag_from_env("ACCELERATE_DEBUG_MODE")
            ),
        }
    except ImportError:
        pass
    print(f"{'operation':36} {'hasten':>10} {'accelerate':>11} {'hasten/acc':>10}")
    for name, seconds in rows:
        acc = reference.get(name)
        acc_text = f"{acc * 1e6:9.2f}us" if acc else "        n/a"
        ratio = f"{seconds / acc:10.3f}" if acc else "       n/a"
        print(f"{name:36} {seconds * 1e6:8.2f}us {acc_text} {ratio}")


if __name__ == "__main__":
    main()
