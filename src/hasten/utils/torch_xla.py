"""Compatibility path for ``accelerate.utils.torch_xla``; the installer lives in `hasten.launchers`."""

from hasten.launchers.install import install_xla

__all__ = ["install_xla"]
