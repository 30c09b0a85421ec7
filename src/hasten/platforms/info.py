"""What hardware and OS this machine has, asked without initialising any device.

`nvidia-smi` answers the GPU questions, so a process that forks workers later has not touched
CUDA yet; the device-type probe uses the vendor checks of `hasten.platforms.checks`.
"""

from __future__ import annotations

import logging
import platform
import re
import shutil
import subprocess

from hasten.core.versions import compare_versions
from hasten.platforms.checks import (
    is_hpu_available,
    is_mlu_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_sdaa_available,
    is_xpu_available,
)

__all__ = [
    "check_cuda_p2p_ib_support",
    "check_os_kernel",
    "get_current_device_type",
    "get_driver_version",
    "get_gpu_info",
]

logger = logging.getLogger(__name__)

# Consumer GPUs whose P2P/InfiniBand transfers hang with drivers older than the fixed one.
_P2P_BROKEN_FAMILIES = ("RTX 40",)
_P2P_FIXED_DRIVER = "550.40.07"
_MIN_KERNEL = "5.5.0"


def get_current_device_type() -> tuple[str, str]:
    """Return ``(device type, distributed type)`` of the accelerator present, e.g. ``("cuda", "MULTI_GPU")``.

    Probes vendor extensions in Accelerate's order (MLU, SDAA, MUSA, NPU, HPU, XPU, Neuron)
    without initialising a device, and answers CUDA when none is there.
    """
    probes = (
        (is_mlu_available, "mlu", "MULTI_MLU"),
        (is_sdaa_available, "sdaa", "MULTI_SDAA"),
        (is_musa_available, "musa", "MULTI_MUSA"),
        (is_npu_available, "npu", "MULTI_NPU"),
        (is_hpu_available, "hpu", "MULTI_HPU"),
        (is_xpu_available, "xpu", "MULTI_XPU"),
        (is_neuron_available, "neuron", "MULTI_NEURON"),
    )
    for available, device_type, distributed_type in probes:
        if available():
            return device_type, distributed_type
    return "cuda", "MULTI_GPU"


def _nvidia_smi(*query: str) -> list[str]:
    """Run ``nvidia-smi`` with `query` and return its non-empty output lines.

    Raises:
        FileNotFoundError: ``nvidia-smi`` is not on PATH (no NVIDIA driver here).
        subprocess.CalledProcessError: it ran and failed.
    """
    command = shutil.which("nvidia-smi")
    if command is None:
        raise FileNotFoundError(
            "nvidia-smi is not on PATH: this machine has no NVIDIA driver installed "
            "(or PATH lacks its directory)"
        )
    output = subprocess.check_output([command, *query], text=True, timeout=60)
    return [line.strip() for line in output.strip().splitlines() if line.strip()]


def get_gpu_info() -> tuple[list[str], int]:
    """Return the NVIDIA GPUs' names and their count, from ``nvidia-smi`` (CUDA stays untouched)."""
    lines = _nvidia_smi("--query-gpu=count,name", "--format=csv,noheader")
    names = [line.split(",", 1)[1].strip() for line in lines]
    return names, len(names)


def get_driver_version() -> str:
    """Return the NVIDIA driver version (of the first GPU), from ``nvidia-smi``."""
    return _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")[0]


def check_cuda_p2p_ib_support() -> bool:
    """Return False when several consumer GPUs known to hang on P2P/IB run an old driver.

    Anything that cannot be asked (no driver, no nvidia-smi) counts as supported, as in Accelerate.
    """
    try:
        names, count = get_gpu_info()
        if count > 1 and any(family in name for name in names for family in _P2P_BROKEN_FAMILIES):
            return compare_versions(get_driver_version(), ">=", _P2P_FIXED_DRIVER)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        pass
    return True


def check_os_kernel() -> None:
    """Warn when the Linux kernel is older than 5.5.0, where distributed runs can hang."""
    info = platform.uname()
    if info.system != "Linux":
        return
    match = re.search(r"\d+\.\d+\.\d+", info.release)
    if match is None:
        return
    version = match.group(0)
    if compare_versions(version, "<", _MIN_KERNEL):
        # formatted here: Accelerate's test reads the versions from the record's msg
        logger.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of "
            f"{_MIN_KERNEL}; this can cause the process to hang. It is recommended to upgrade "
            "the kernel to the minimum version or higher."
        )
