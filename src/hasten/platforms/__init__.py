"""Hardware families (cpu, cuda, xpu, npu, mps) as objects chosen once per process."""

from hasten.platforms.base import Platform
from hasten.platforms.registry import current_platform, get_platform

__all__ = ["Platform", "current_platform", "get_platform"]
