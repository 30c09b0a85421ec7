"""Intel GPUs through stock PyTorch's ``torch.xpu`` (torch >= 2.7), joined by xccl."""

from __future__ import annotations

import torch

from hasten.config.enums import DistributedType
from hasten.platforms.base import DevicePlatform

__all__ = ["XpuPlatform"]


class XpuPlatform(DevicePlatform):
    """Intel XPUs."""

    name = "xpu"
    device_type = "xpu"
    dist_backend = "xccl"
    distributed_type = DistributedType.MULTI_XPU
    visible_devices_env = "ZE_AFFINITY_MASK"
    oom_messages = (" out of memory.", "XPU out of memory")

    def is_available(self) -> bool:
        """Return whether torch has XPU support and sees a device."""
        from hasten.platforms.checks import is_xpu_available

        return is_xpu_available()

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        """Return (free, total) bytes, falling back to total - reserved on older torch."""
        if hasattr(torch.xpu, "mem_get_info"):
            free, total = torch.xpu.mem_get_info(index)
            return int(free), int(total)
        total = int(torch.xpu.get_device_properties(index).total_memory)
        return total - int(torch.xpu.memory_reserved(index)), total
