"""ZeRO-3 helpers: gather partitioned parameters, consolidate weights, release engines in order."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from hasten.core.imports import require

__all__ = [
    "GatheredParameters",
    "consolidated_state_dict",
    "is_zero3_partitioned",
    "release_engines",
]


def is_zero3_partitioned(params: Any) -> bool:
    """Whether any of ``params`` (a tensor or an iterable of them) is a ZeRO-3 partition."""
    if isinstance(params, torch.Tensor):
        params = [params]
    return any(hasattr(p, "ds_id") for p in params)


def GatheredParameters(  # noqa: N802 - Accelerate's name
    params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True
) -> AbstractContextManager[Any]:
    """Context giving every process the full ZeRO-3 parameters ``params``.

    With ``modifier_rank``, changes that process makes inside are scattered back to the
    partitions on exit. Parameters that are not ZeRO-3 partitions (any other engine) need no
    gathering: the context does nothing.
    """
    params = list(params) if not isinstance(params, torch.Tensor) else [params]
    if not enabled or not is_zero3_partitioned(params):
        return contextlib.nullcontext()
    # optional: deepspeed
    zero = require("deepspeed.runtime.zero", feature="GatheredParameters", pip_name="deepspeed")
    return zero.GatheredParameters(
        params, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled
    )


def consolidated_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """The full ZeRO-3 weights on the main process, in the module's dtype (``{}`` elsewhere).

    Gathered one layer at a time, so no process holds more than one layer beyond its shard.
    Every process must call it.
    """
    state = engine._zero3_consolidated_16bit_state_dict()
    return dict(state) if state is not None else {}


def release_engines(engines: Iterable[Any]) -> None:
    """Tear engines down while the process group and the interpreter are still whole.

    ZeRO-3 keeps forward/backward hooks and parameter-coordinator state holding native
    resources; destroying them before the process group (and before interpreter shutdown
    collects them in arbitrary order) is what keeps the exit clean.
    """
    for engine in engines:
        destroy = getattr(engine, "destroy", None)
        if callable(destroy):
            destroy()
    gc.collect()
