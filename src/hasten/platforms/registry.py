"""Pick the platform of this process once: the first available family in priority order."""

from __future__ import annotations

import functools
from collections.abc import Callable

from hasten.platforms.base import Platform
from hasten.platforms.cpu import CpuPlatform
from hasten.platforms.cuda import CudaPlatform
from hasten.platforms.mps import MpsPlatform
from hasten.platforms.npu import NpuPlatform
from hasten.platforms.xpu import XpuPlatform

__all__ = ["PLATFORMS", "current_platform", "get_platform"]

# NPU before CUDA: torch_npu's `transfer_to_npu` makes torch.cuda answer for the NPU
# (https://github.com/huggingface/accelerate/issues/3020).
PLATFORMS: dict[str, Callable[[], Platform]] = {
    "npu": NpuPlatform,
    "cuda": CudaPlatform,
    "xpu": XpuPlatform,
    "mps": MpsPlatform,
    "cpu": CpuPlatform,
}


@functools.cache
def get_platform(name: str) -> Platform:
    """Return the platform object for family `name` (``"cuda"``, ``"cpu"``, ...).

    Raises:
        ValueError: `name` is not a known family.
    """
    try:
        return PLATFORMS[name]()
    except KeyError:
        raise ValueError(
            f"Unknown platform {name!r}; expected one of {sorted(PLATFORMS)}. "
            "Pass the torch device type, e.g. 'cuda' or 'cpu'."
        ) from None


@functools.cache
def current_platform(cpu: bool = False) -> Platform:
    """Return the platform this process computes on: the CPU if `cpu`, else the first available."""
    if cpu:
        return get_platform("cpu")
    for name in PLATFORMS:
        platform = get_platform(name)
        if platform.is_available():
            return platform
    return get_platform("cpu")
