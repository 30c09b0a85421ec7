"""platforms.info: device-type probe, nvidia-smi questions, P2P/IB check, kernel warning."""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
from typing import Any

import pytest

from hasten.platforms import info


def test_current_device_type_defaults_to_cuda_without_vendor_devices() -> None:
    # This machine has no MLU/SDAA/MUSA/NPU/HPU/XPU/Neuron: Accelerate answers CUDA then.
    assert info.get_current_device_type() == ("cuda", "MULTI_GPU")


def test_current_device_type_follows_the_vendor_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(info, "is_npu_available", lambda: True)
    monkeypatch.setattr(info, "is_xpu_available", lambda: True)
    assert info.get_current_device_type() == ("npu", "MULTI_NPU")


def _fake_smi(monkeypatch: pytest.MonkeyPatch, outputs: dict[str, str]) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def check_output(command: list[str], **kwargs: Any) -> str:
        return outputs[command[1]]

    monkeypatch.setattr(subprocess, "check_output", check_output)


def test_gpu_info_and_driver_version_parse_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(
        monkeypatch,
        {
            "--query-gpu=count,name": "2, NVIDIA H100 80GB HBM3\n2, NVIDIA H100 80GB HBM3\n",
            "--query-gpu=driver_version": "550.54.15\n550.54.15\n",
        },
    )
    assert info.get_gpu_info() == (["NVIDIA H100 80GB HBM3"] * 2, 2)
    assert info.get_driver_version() == "550.54.15"


@pytest.mark.parametrize(
    ("names", "driver", "supported"),
    [
        ("2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090", "535.0.0", False),
        ("2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090", "550.40.07", True),
        ("1, NVIDIA GeForce RTX 4090", "535.0.0", True),
        ("2, NVIDIA A100\n2, NVIDIA A100", "470.0.0", True),
    ],
)
def test_p2p_ib_support(
    monkeypatch: pytest.MonkeyPatch, names: str, driver: str, supported: bool
) -> None:
    _fake_smi(
        monkeypatch,
        {"--query-gpu=count,name": names, "--query-gpu=driver_version": driver},
    )
    assert info.check_cuda_p2p_ib_support() is supported


def test_without_nvidia_smi_gpu_info_raises_and_p2p_counts_as_supported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="nvidia-smi is not on PATH"):
        info.get_gpu_info()
    assert info.check_cuda_p2p_ib_support() is True


@pytest.mark.parametrize(("release", "warns"), [("4.19.0-25-amd64", True), ("6.8.0-45", False)])
def test_check_os_kernel_warns_below_5_5(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, release: str, warns: bool
) -> None:
    real = platform.uname()
    monkeypatch.setattr(platform, "uname", lambda: real._replace(system="Linux", release=release))
    with caplog.at_level(logging.WARNING, logger="hasten.platforms.info"):
        info.check_os_kernel()
    assert ("below the recommended minimum of 5.5.0" in caplog.text) is warns
    # the versions are in the record's own message, not only in its arguments
    assert all("4.19.0" in r.msg for r in caplog.records) and len(caplog.records) == int(warns)
