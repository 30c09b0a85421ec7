"""Apple silicon GPUs through ``torch.mps`` (single process only)."""

from __future__ import annotations

import torch

from hasten.config.enums import DistributedType
from hasten.platforms.base import DevicePlatform

__all__ = ["MpsPlatform"]


class MpsPlatform(DevicePlatform):
    """Apple MPS.

    torch has no collective backend for MPS tensors, so a multi-process job on a Mac runs as
    MULTI_CPU over gloo (see `hasten.state.detect`); `dist_backend` says gloo for that reason.
    """

    name = "mps"
    device_type = "mps"
    dist_backend = "gloo"
    distributed_type = DistributedType.MULTI_CPU
    visible_devices_env = None
    oom_messages = ("MPS backend out of memory",)

    def is_available(self) -> bool:
        """Return whether the MPS backend is built and usable."""
        from hasten.platforms.checks import is_mps_available

        return is_mps_available()

    def device_count(self) -> int:
        """Return 1: a Mac exposes one MPS device."""
        return 1

    def device(self, local_index: int | None = None) -> torch.device:
        """Return ``mps`` (there is only one)."""
        return torch.device("mps")

    def set_device(self, device: torch.device) -> None:
        """Do nothing: there is a single MPS device."""

    def get_rng_state(self, device: torch.device | None = None) -> torch.Tensor:
        """Return the MPS generator state."""
        return torch.mps.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: torch.device | None = None) -> None:
        """Restore the MPS generator state."""
        torch.mps.set_rng_state(state)

    def manual_seed_all(self, seed: int) -> None:
        """Seed the MPS generator."""
        torch.mps.manual_seed(seed)

    def is_bf16_supported(self) -> bool:
        """Return whether macOS is recent enough (14+) for bfloat16 on MPS."""
        check = getattr(torch.backends.mps, "is_macos_or_newer", None)
        return bool(check(14, 0)) if check is not None else False

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        """Return (free, total) as the recommended working set minus what torch holds."""
        total = int(torch.mps.recommended_max_memory())
        return total - int(torch.mps.driver_allocated_memory()), total
