"""Single-process strategy: the model lives on one device; no communication at all."""

from __future__ import annotations

from hasten.strategies.base import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """One process, one device (CPU, one GPU, MPS, ...): the base behaviour, named."""

    name = "single_device"
