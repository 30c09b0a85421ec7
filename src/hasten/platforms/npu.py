"""Huawei Ascend NPUs through the ``torch_npu`` extension, joined by hccl."""

from __future__ import annotations

from hasten.config.enums import DistributedType
from hasten.platforms.base import DevicePlatform

__all__ = ["NpuPlatform"]


class NpuPlatform(DevicePlatform):
    """Ascend NPUs (``torch.npu`` exists once ``torch_npu`` is imported)."""

    name = "npu"
    device_type = "npu"
    dist_backend = "hccl"
    distributed_type = DistributedType.MULTI_NPU
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    oom_messages = (" out of memory.", "NPU out of memory")

    def is_available(self) -> bool:
        """Return whether ``torch_npu`` imports and reports a device."""
        from hasten.platforms.checks import is_npu_available

        return is_npu_available()
