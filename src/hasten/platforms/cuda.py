"""NVIDIA (and ROCm, which torch exposes as ``cuda``) GPUs, joined by nccl."""

from __future__ import annotations

import torch

from hasten.config.enums import DistributedType
from hasten.platforms.base import DevicePlatform

__all__ = ["CudaPlatform"]


class CudaPlatform(DevicePlatform):
    """CUDA/ROCm GPUs through ``torch.cuda``."""

    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    distributed_type = DistributedType.MULTI_GPU
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    oom_messages = (
        " out of memory.",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    )

    def is_available(self) -> bool:
        """Return whether a GPU is visible, without initialising CUDA in this process.

        The NVML-based check lets a parent process look before forking workers (a CUDA context
        does not survive a fork).
        """
        from hasten.platforms.checks import is_cuda_available

        return is_cuda_available()

    def pci_bus_id(self, index: int) -> str | None:
        """Return the sysfs PCI address of GPU `index`, e.g. ``0000:3b:00.0``."""
        props = torch.cuda.get_device_properties(index)
        bus = getattr(props, "pci_bus_id", None)
        if bus is None:
            return None
        domain = int(getattr(props, "pci_domain_id", 0))
        dev = int(getattr(props, "pci_device_id", 0))
        return f"{domain:04x}:{int(bus):02x}:{dev:02x}.0"
