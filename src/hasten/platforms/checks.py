"""Cheap questions about the hardware in this process (is CUDA there? does bf16 work?).

Answers are cached for the life of the process: hardware does not appear mid-run, and these
checks sit on paths (precision selection, device placement) that are asked often. Tests that
fake the hardware call `clear_caches()`.
"""

from __future__ import annotations

import functools
import importlib

import torch

from hasten.core.environment import parse_flag_from_env, patch_environment
from hasten.core.imports import is_package_available
from hasten.core.versions import is_torch_version

__all__ = [
    "USE_TORCH_XLA",
    "check_cuda_fp8_capability",
    "clear_caches",
    "is_bf16_available",
    "is_cuda_available",
    "is_fp16_available",
    "is_habana_gaudi1",
    "is_hpu_available",
    "is_mlu_available",
    "is_mps_available",
    "is_musa_available",
    "is_neuron_available",
    "is_npu_available",
    "is_rocm_available",
    "is_sdaa_available",
    "is_torch_xla_available",
    "is_xccl_available",
    "is_xpu_available",
]


@functools.cache
def is_cuda_available() -> bool:
    """Return whether a CUDA/ROCm GPU is visible, asking NVML so CUDA stays uninitialised.

    A CUDA context cannot survive `fork`, so a launcher must be able to look without creating
    one (https://github.com/pytorch/pytorch/pull/84879 added the NVML-based check).
    """
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return bool(torch.cuda.is_available())


# Accelerate's import-time reading of USE_TORCH_XLA (is_torch_xla_available rereads it).
USE_TORCH_XLA: bool = parse_flag_from_env("USE_TORCH_XLA", True)


@functools.cache
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Return whether `torch_xla` is installed (and, optionally, runs on a TPU or a GPU).

    Setting ``USE_TORCH_XLA=0`` hides an installed torch_xla so a plain PyTorch job can run.

    Raises:
        ValueError: both `check_is_tpu` and `check_is_gpu` are True.
    """
    if check_is_tpu and check_is_gpu:
        raise ValueError(
            "is_torch_xla_available(check_is_tpu=True, check_is_gpu=True) asks for two device "
            "kinds at once; pass at most one of them as True."
        )
    if not parse_flag_from_env("USE_TORCH_XLA", True) or not is_package_available("torch_xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    runtime = importlib.import_module("torch_xla.runtime")  # optional: torch_xla
    device_type = runtime.device_type()
    return device_type == "TPU" if check_is_tpu else device_type in ("GPU", "CUDA")


@functools.cache
def is_npu_available(check_device: bool = False) -> bool:
    """Return whether `torch_npu` imports and reports an NPU (probing the device if asked)."""
    if not is_package_available("torch_npu"):
        return False
    try:
        importlib.import_module("torch_npu")  # optional: torch_npu (registers torch.npu)
    except Exception:  # noqa: BLE001 - a torch_npu wheel on a host without CANN fails variously
        return False
    npu = getattr(torch, "npu", None)
    if npu is None:
        return False
    if check_device:
        try:
            npu.device_count()
        except RuntimeError:
            return False
    return bool(npu.is_available())


def _vendor_device_available(package: str, device: str, check_device: bool) -> bool:
    """Whether vendor extension `package` imports and registers ``torch.<device>`` with a device.

    With `check_device`, ``device_count()`` is asked first: it raises when the driver finds no
    device, where ``is_available()`` alone may answer from the build.
    """
    if not is_package_available(package):
        return False
    try:
        importlib.import_module(package)  # optional: the vendor's torch extension
    except Exception:  # noqa: BLE001 - a vendor wheel on a host without its driver fails variously
        return False
    module = getattr(torch, device, None)
    if module is None:
        return False
    if check_device:
        try:
            module.device_count()
        except RuntimeError:
            return False
    return bool(module.is_available())


@functools.cache
def is_mlu_available(check_device: bool = False) -> bool:
    """Return whether Cambricon's `torch_mlu` imports and reports an MLU."""
    return _vendor_device_available("torch_mlu", "mlu", check_device)


@functools.cache
def is_musa_available(check_device: bool = False) -> bool:
    """Return whether Moore Threads' `torch_musa` imports and reports a MUSA device."""
    return _vendor_device_available("torch_musa", "musa", check_device)


@functools.cache
def is_sdaa_available(check_device: bool = False) -> bool:
    """Return whether Tecorigin's `torch_sdaa` imports and reports an SDAA device."""
    return _vendor_device_available("torch_sdaa", "sdaa", check_device)


@functools.cache
def is_neuron_available(check_device: bool = False) -> bool:
    """Return whether AWS's `torch_neuronx` imports and reports a Neuron device."""
    return _vendor_device_available("torch_neuronx", "neuron", check_device)


@functools.cache
def is_hpu_available(init_hccl: bool = False) -> bool:
    """Return whether Habana's `habana_frameworks.torch` imports and reports an HPU.

    `init_hccl` also imports the HCCL collective backend, which registers ``hccl`` with
    torch.distributed.
    """
    if not _vendor_device_available("habana_frameworks.torch", "hpu", check_device=False):
        return False
    if init_hccl:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")  # optional: habana
    return True


def is_habana_gaudi1() -> bool:
    """Return whether the HPU present is a first-generation Gaudi (which lacks some dtypes)."""
    if not is_hpu_available():
        return False
    experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
    return bool(experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi)


def is_rocm_available() -> bool:
    """Return whether this torch is a ROCm (HIP) build and sees an AMD GPU."""
    return torch.version.hip is not None and torch.cuda.is_available()


@functools.cache
def is_xpu_available(check_device: bool = False) -> bool:
    """Return whether stock PyTorch (>= 2.7) has XPU support and sees an XPU."""
    if is_torch_version("<", "2.7"):
        return False
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return False
    if check_device:
        try:
            xpu.device_count()
        except RuntimeError:
            return False
    return bool(xpu.is_available())


def is_xccl_available() -> bool:
    """Return whether torch.distributed was built with Intel's xccl backend."""
    check = getattr(torch.distributed, "is_xccl_available", None)
    return bool(check()) if check is not None else False


@functools.cache
def is_mps_available(min_version: str = "1.12") -> bool:
    """Return whether Apple's MPS backend is built and usable with torch >= `min_version`."""
    mps = torch.backends.mps
    return is_torch_version(">=", min_version) and mps.is_available() and mps.is_built()


@functools.cache
def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Return whether bfloat16 compute works on the accelerator in use (True on plain CPU).

    Args:
        ignore_tpu: report False on a TPU, where bf16 is always on and needs no autocast.
    """
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_npu_available():
        return bool(torch.npu.is_bf16_supported())  # type: ignore[attr-defined]
    if is_xpu_available():
        return bool(torch.xpu.is_bf16_supported())
    if is_mps_available():
        check = getattr(torch.backends.mps, "is_macos_or_newer", None)
        return bool(check(14, 0)) if check is not None else False
    return True


def check_cuda_fp8_capability() -> bool:
    """Return whether the current CUDA GPU has fp8 matmuls (compute capability 8.9+).

    False when CUDA is not available (Accelerate's version fails there instead).
    """
    if not is_cuda_available():
        return False
    return tuple(torch.cuda.get_device_capability()) >= (8, 9)


def is_fp16_available() -> bool:
    """Return whether float16 autocast can be used (every platform torch 2.4+ supports)."""
    return True


def clear_caches() -> None:
    """Forget every cached answer (for tests that fake the hardware)."""
    for check in (
        is_cuda_available,
        is_torch_xla_available,
        is_npu_available,
        is_xpu_available,
        is_mps_available,
        is_bf16_available,
        is_mlu_available,
        is_musa_available,
        is_sdaa_available,
        is_neuron_available,
        is_hpu_available,
    ):
        check.cache_clear()
