from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from hasten.launchers import install
from hasten.launchers.install import install_xla, torch_xla_requirement


@pytest.fixture
def pip_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_run(command: list[str], check: bool = False, **kwargs: Any) -> Any:
        calls.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    monkeypatch.setattr(install.sys, "platform", "linux")
    monkeypatch.setattr(install, "_torch_version", lambda: "2.6.1+cpu")
    monkeypatch.setattr(install, "_on_tpu", lambda: False)
    return calls


@pytest.mark.parametrize(
    ("version", "tpu", "requirement"),
    [
        ("2.6.1+cpu", False, "torch_xla~=2.6.0"),
        ("2.13.0", True, "torch_xla[tpu]~=2.13.0"),
        ("2.5", False, "torch_xla~=2.5.0"),
    ],
)
def test_requirement_matches_torch_series(version: str, tpu: bool, requirement: str) -> None:
    assert torch_xla_requirement(version, tpu=tpu) == requirement


def test_requirement_rejects_unreadable_versions() -> None:
    with pytest.raises(ValueError, match="Cannot read a torch version from 'nightly'"):
        torch_xla_requirement("nightly")


def test_installs_matching_wheel_with_pip(pip_calls: list[list[str]]) -> None:
    install_xla()
    assert pip_calls == [[sys.executable, "-m", "pip", "install", "torch_xla~=2.6.0"]]


def test_upgrade_upgrades_torch_first_and_tpu_adds_extra(
    pip_calls: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(install, "_on_tpu", lambda: True)
    install_xla(upgrade=True)
    assert [call[4:] for call in pip_calls] == [["--upgrade", "torch"], ["torch_xla[tpu]~=2.6.0"]]


def test_pip_failure_is_a_clear_error(
    pip_calls: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(command: list[str], check: bool = False, **kwargs: Any) -> Any:
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(install.subprocess, "run", failing)
    with pytest.raises(RuntimeError, match="failed with exit code 1"):
        install_xla()


def test_non_linux_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install.sys, "platform", "darwin")
    with pytest.raises(RuntimeError, match="install_xla needs Linux"):
        install_xla()


def test_tpu_detected_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert install._on_tpu() is True


def test_reads_installed_torch_version() -> None:
    import torch

    assert install._torch_version().split("+")[0] == torch.__version__.split("+")[0]
