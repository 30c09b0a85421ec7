"""The `Platform` protocol: what hasten needs to know about one hardware family.

A platform is chosen once per process (`hasten.platforms.registry.current_platform`) and then
asked, instead of branching on device names all over the code base.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from hasten.config.enums import DistributedType

__all__ = ["DevicePlatform", "Platform"]


@runtime_checkable
class Platform(Protocol):
    """One hardware family (cpu, cuda, xpu, npu, mps) as seen by the rest of hasten."""

    @property
    def name(self) -> str:
        """Family name, also the key in the registry (``"cuda"``)."""

    @property
    def device_type(self) -> str:
        """The torch device type (``torch.device(device_type)``)."""

    @property
    def dist_backend(self) -> str:
        """The torch.distributed backend that joins processes on this family."""

    @property
    def distributed_type(self) -> DistributedType:
        """The label of plain data parallelism on this family (MULTI_GPU, MULTI_CPU, ...)."""

    @property
    def visible_devices_env(self) -> str | None:
        """The variable that restricts which devices a process sees, if any."""

    @property
    def oom_messages(self) -> tuple[str, ...]:
        """Substrings of this family's out-of-memory error messages."""

    def is_available(self) -> bool:
        """Return whether this family has a usable device in this process."""

    def device_count(self) -> int:
        """Return how many devices of this family this process can see."""

    def device(self, local_index: int | None = None) -> torch.device:
        """Return the device a process with this local index should use (no index: the default)."""

    def set_device(self, device: torch.device) -> None:
        """Make `device` the current device of this process."""

    def empty_cache(self) -> None:
        """Release cached allocator memory back to the device."""

    def synchronize(self) -> None:
        """Wait for every queued kernel on the current device."""

    def get_rng_state(self, device: torch.device | None = None) -> torch.Tensor:
        """Return the random generator state of `device` (or the current one)."""

    def set_rng_state(self, state: torch.Tensor, device: torch.device | None = None) -> None:
        """Restore a random generator state taken with `get_rng_state`."""

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device of this family."""

    def is_bf16_supported(self) -> bool:
        """Return whether bfloat16 compute works here."""

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        """Return (free, total) bytes of device `index`."""

    def pci_bus_id(self, index: int) -> str | None:
        """Return the sysfs PCI address (``0000:3b:00.0``) of device `index`, or None if unknown."""


class DevicePlatform:
    """A platform backed by a ``torch.<module>`` namespace (``torch.cuda``, ``torch.xpu``, ...).

    Subclasses set the class attributes; every operation is forwarded to that torch module.
    """

    name: str = ""
    device_type: str = ""
    dist_backend: str = ""
    distributed_type: DistributedType = DistributedType.NO
    visible_devices_env: str | None = None
    oom_messages: tuple[str, ...] = (" out of memory.",)

    @property
    def module(self) -> Any:
        """The torch namespace of this family, e.g. ``torch.cuda``."""
        return getattr(torch, self.device_type)

    def is_available(self) -> bool:
        """Return whether the torch module exists and reports a device."""
        module = getattr(torch, self.device_type, None)
        return bool(module is not None and module.is_available())

    def device_count(self) -> int:
        """Return how many devices this process can see."""
        return int(self.module.device_count())

    def device(self, local_index: int | None = None) -> torch.device:
        """Return ``<type>:<local_index mod count>``, or the bare type when no index is given."""
        if local_index is None:
            return torch.device(self.device_type)
        count = max(self.device_count(), 1)
        return torch.device(self.device_type, local_index % count)

    def set_device(self, device: torch.device) -> None:
        """Make `device` current for this process."""
        self.module.set_device(device)

    def empty_cache(self) -> None:
        """Release cached allocator memory."""
        self.module.empty_cache()

    def synchronize(self) -> None:
        """Wait for the current device."""
        self.module.synchronize()

    def get_rng_state(self, device: torch.device | None = None) -> torch.Tensor:
        """Return the generator state of `device` (default: current device)."""
        if device is None:
            return self.module.get_rng_state()
        return self.module.get_rng_state(device)

    def set_rng_state(self, state: torch.Tensor, device: torch.device | None = None) -> None:
        """Restore the generator state of `device` (default: current device)."""
        if device is None:
            self.module.set_rng_state(state)
        else:
            self.module.set_rng_state(state, device)

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device of this family."""
        self.module.manual_seed_all(seed)

    def is_bf16_supported(self) -> bool:
        """Return what the torch module says about bfloat16."""
        check = getattr(self.module, "is_bf16_supported", None)
        return bool(check()) if check is not None else True

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        """Return (free, total) bytes of device `index`."""
        free, total = self.module.mem_get_info(index)
        return int(free), int(total)

    def pci_bus_id(self, index: int) -> str | None:
        """Return None: this family does not expose a PCI address through torch."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, backend={self.dist_backend!r})"
