"""The CPU platform: always available, joined by gloo when several processes run."""

from __future__ import annotations

import torch

from hasten.config.enums import DistributedType

__all__ = ["CpuPlatform"]


class CpuPlatform:
    """Plain CPU execution; the fallback when no accelerator is present or ``cpu=True``."""

    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    distributed_type = DistributedType.MULTI_CPU
    visible_devices_env: str | None = None
    oom_messages: tuple[str, ...] = ("DefaultCPUAllocator: can't allocate memory",)

    def is_available(self) -> bool:
        """Return True: a CPU is always there."""
        return True

    def device_count(self) -> int:
        """Return 1: torch exposes the CPU as a single device."""
        return 1

    def device(self, local_index: int | None = None) -> torch.device:
        """Return ``cpu`` whatever the local index (every process shares the host)."""
        return torch.device("cpu")

    def set_device(self, device: torch.device) -> None:
        """Do nothing: there is no current-device notion on CPU."""

    def empty_cache(self) -> None:
        """Do nothing: the CPU allocator keeps no device cache."""

    def synchronize(self) -> None:
        """Do nothing: CPU kernels run synchronously."""

    def get_rng_state(self, device: torch.device | None = None) -> torch.Tensor:
        """Return torch's global CPU generator state."""
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: torch.device | None = None) -> None:
        """Restore torch's global CPU generator state."""
        torch.set_rng_state(state)

    def manual_seed_all(self, seed: int) -> None:
        """Seed the CPU generator."""
        torch.manual_seed(seed)

    def is_bf16_supported(self) -> bool:
        """Return True: bfloat16 autocast works on every CPU torch supports."""
        return True

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        """Return (available, total) bytes of host memory."""
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    def pci_bus_id(self, index: int) -> str | None:
        """Return None: the CPU is not a PCI device."""
        return None

    def __repr__(self) -> str:
        return "CpuPlatform(name='cpu', backend='gloo')"
