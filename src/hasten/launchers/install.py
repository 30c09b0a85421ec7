"""Install the PyTorch/XLA wheel that matches the installed torch (Colab/Kaggle TPU helper)."""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

from hasten.config import envvars

__all__ = ["install_xla", "torch_xla_requirement"]


def _torch_version() -> str:
    importlib.invalidate_caches()  # pick up a torch that pip just upgraded
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            "torch is not installed, so there is no version to match torch_xla to. "
            "Install torch first (pip install torch), then call install_xla()."
        ) from None


def _on_tpu() -> bool:
    """True on a TPU host (Colab/Kaggle TPU runtime or a Cloud TPU VM)."""
    if envvars.read("COLAB_TPU_ADDR") or envvars.read("TPU_NAME"):
        return True
    if (envvars.read("PJRT_DEVICE") or "").upper() == "TPU":
        return True
    return any(Path("/dev").glob("accel*")) or Path("/dev/vfio").is_dir()


def torch_xla_requirement(torch_version: str, tpu: bool = False) -> str:
    """Return the pip requirement of the torch_xla release matching `torch_version`.

    torch_xla is released in lockstep with torch (torch 2.6.x <-> torch_xla 2.6.x), so the
    requirement pins the same major.minor series, e.g. ``torch_xla[tpu]~=2.6.0``.

    Raises:
        ValueError: `torch_version` is not of the form ``MAJOR.MINOR[.PATCH][+local]``.
    """
    public = torch_version.split("+", 1)[0]
    parts = public.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(
            f"Cannot read a torch version from {torch_version!r}: expected e.g. '2.6.0+cpu'."
        )
    extra = "[tpu]" if tpu else ""
    return f"torch_xla{extra}~={parts[0]}.{parts[1]}.0"


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "install", *args]
    try:
        subprocess.run(command, check=True)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(
            f"`{' '.join(command)}` failed with exit code {err.returncode}; see pip's output "
            "above. Check your network and that a torch_xla wheel exists for this Python."
        ) from err


def install_xla(upgrade: bool = False) -> None:
    """Install the torch_xla wheel matching the installed torch, with pip.

    On a TPU runtime (Google Colab, Kaggle, Cloud TPU VM) the ``[tpu]`` extra is added so
    libtpu comes too; elsewhere plain torch_xla is installed (usable on CPU or for tracing).

    Args:
        upgrade: first upgrade torch to the latest release, then match torch_xla to it.

    Raises:
        RuntimeError: not Linux (torch_xla ships Linux wheels only), torch missing, or pip failed.

    Example:
        >>> from hasten.utils import install_xla
        >>> install_xla(upgrade=True)  # doctest: +SKIP
    """
    if sys.platform != "linux":
        raise RuntimeError(
            f"install_xla needs Linux: torch_xla publishes Linux wheels only, and this is "
            f"{sys.platform!r} ({platform.machine()}). Run it on a Colab/Kaggle TPU runtime or "
            "a Cloud TPU VM."
        )
    if upgrade:
        _pip("--upgrade", "torch")
    requirement = torch_xla_requirement(_torch_version(), tpu=_on_tpu())
    _pip(requirement)
