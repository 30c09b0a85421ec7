"""The `accelerate` distribution that is hasten: the wheel, install/uninstall/status decisions.

pip itself is faked here (the commands it would run are checked); `make install` runs the real
`hasten accelerate install` and tests/ecosystem/test_alias_install.py checks the result.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hasten._version import __version__ as hasten_version
from hasten.commands import cli
from hasten.commands.env import collect_report, format_report
from hasten.compat import distribution
from hasten.compat.distribution import (
    AccelerateAliasError,
    InstalledAccelerate,
    alias_version,
    build_wheel,
    conflicting_requirements,
)

REAL = InstalledAccelerate("1.15.0", "/venv/site-packages", is_hasten=False)
OURS = InstalledAccelerate(alias_version(), "/venv/site-packages", is_hasten=True)


class FakePip:
    """Records the pip commands `install`/`uninstall` run; succeeds unless told to fail."""

    def __init__(self, returncode: int = 0, stderr: str = "") -> None:
        self.commands: list[list[str]] = []
        self.returncode, self.stderr = returncode, stderr

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        if command[3] == "install":
            assert Path(command[-1]).is_file(), "the wheel exists while pip installs it"
        return subprocess.CompletedProcess(command, self.returncode, "", self.stderr)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set what `installed_accelerate()` finds; no conflicting requirements."""

    def set_installed(value: InstalledAccelerate | None) -> None:
        monkeypatch.setattr(distribution, "installed_accelerate", lambda: value)

    monkeypatch.setattr(distribution, "conflicting_requirements", lambda version=None: [])
    return set_installed


def test_alias_version_is_the_api_version_with_hasten_as_local_label() -> None:
    assert alias_version("0.1.0") == "1.15.0+hasten.0.1.0"
    assert alias_version("0.2.0.dev3+g1234") == "1.15.0+hasten.0.2.0.dev3.g1234"
    assert alias_version() == f"1.15.0+hasten.{hasten_version}"


def test_the_wheel_names_accelerate_requires_this_hasten_and_has_the_console_scripts(
    tmp_path: Path,
) -> None:
    wheel = build_wheel(tmp_path, hasten="0.1.0")
    assert wheel.name == "accelerate-1.15.0+hasten.0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    info = "accelerate-1.15.0+hasten.0.1.0.dist-info"
    metadata = files[f"{info}/METADATA"].decode()
    assert "Name: accelerate\n" in metadata
    assert "Version: 1.15.0+hasten.0.1.0\n" in metadata
    assert "Requires-Dist: hasten==0.1.0\n" in metadata
    scripts = files[f"{info}/entry_points.txt"].decode()
    for name in (
        "accelerate",
        "accelerate-launch",
        "accelerate-config",
        "accelerate-estimate-memory",
        "accelerate-merge-weights",
    ):
        assert f"\n{name} = hasten.commands." in scripts
    init = files["accelerate/__init__.py"].decode()
    assert '__version__ = "1.15.0"' in init and "hasten.compat.alias" in init
    compile(init, "accelerate/__init__.py", "exec")
    # RECORD lists every other file with its sha256 and size, as pip verifies.
    for line in files[f"{info}/RECORD"].decode().splitlines():
        path, digest, size = line.split(",")
        if path.endswith("RECORD"):
            continue
        data = files[path]
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        assert digest == "sha256=" + expected.decode() and int(size) == len(data)
    assert build_wheel(tmp_path, hasten="0.1.0").read_bytes() == wheel.read_bytes()  # reproducible


def test_install_runs_pip_on_the_wheel_only(installed: Any) -> None:
    installed(None)
    pip = FakePip()
    message = distribution.install(runner=pip)
    (command,) = pip.commands
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert {"--no-index", "--no-deps", "--force-reinstall"} <= set(command)
    assert command[-1].endswith(f"accelerate-{alias_version()}-py3-none-any.whl")
    assert f"Installed accelerate {alias_version()}" in message and "uninstall" in message


def test_install_over_hugging_face_accelerate_is_refused_unless_replace(installed: Any) -> None:
    installed(REAL)
    pip = FakePip()
    with pytest.raises(AccelerateAliasError) as info:
        distribution.install(runner=pip)
    message = str(info.value)
    assert "Hugging Face Accelerate 1.15.0 in /venv/site-packages is installed" in message
    assert "hasten accelerate install --replace" in message
    assert "pip install accelerate==1.15.0" in message
    assert pip.commands == []
    message = distribution.install(replace=True, runner=pip)
    assert len(pip.commands) == 1 and "replacing Hugging Face Accelerate 1.15.0" in message


def test_install_when_installed_does_nothing(installed: Any) -> None:
    installed(OURS)
    pip = FakePip()
    assert distribution.install(runner=pip).startswith("Already installed: hasten's alias")
    assert pip.commands == []
    installed(InstalledAccelerate("1.15.0+hasten.0.0.9", "/venv", is_hasten=True))
    distribution.install(runner=pip)  # another hasten version's alias: reinstalled
    assert len(pip.commands) == 1


def test_install_refuses_when_a_package_needs_a_newer_accelerate(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed(None)
    monkeypatch.setattr(
        distribution,
        "conflicting_requirements",
        lambda version=None: ["trl 9.0.0 requires accelerate>=1.16.0"],
    )
    with pytest.raises(AccelerateAliasError) as info:
        distribution.install(runner=FakePip())
    message = str(info.value)
    assert "trl 9.0.0 requires accelerate>=1.16.0" in message  # the library's version
    assert "1.15.0 whose API hasten implements" in message  # and ours
    assert f"accelerate {alias_version()}" in message


def test_a_pip_failure_is_reported_with_its_output(installed: Any) -> None:
    installed(None)
    with pytest.raises(AccelerateAliasError, match=r"failed \(exit code 1\):\nno space left"):
        distribution.install(runner=FakePip(returncode=1, stderr="no space left"))


def test_uninstall(installed: Any) -> None:
    installed(OURS)
    pip = FakePip()
    assert "Uninstalled accelerate" in distribution.uninstall(runner=pip)
    assert pip.commands == [[sys.executable, "-m", "pip", "uninstall", "-y", "-q", "accelerate"]]


@pytest.mark.parametrize(
    ("current", "match"),
    [
        (None, r"alias is not installed in this environment .* nothing to uninstall"),
        (REAL, r"is Hugging Face Accelerate 1.15.0 .*, not hasten's alias.*pip uninstall"),
    ],
)
def test_uninstall_without_the_alias_is_a_clear_error(
    installed: Any, current: InstalledAccelerate | None, match: str
) -> None:
    installed(current)
    pip = FakePip()
    with pytest.raises(AccelerateAliasError, match=match):
        distribution.uninstall(runner=pip)
    assert pip.commands == []


def test_the_cli_prints_the_error_and_exits_2(
    installed: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    installed(None)
    assert cli.main(["accelerate", "uninstall"]) == 2
    assert "hasten accelerate: error: hasten's accelerate alias is not installed" in (
        capsys.readouterr().err
    )


def _fake_distribution(root: Path, name: str, version: str, requires: list[str]) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_conflicting_requirements_name_the_package_and_its_requirement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, "needs_new", "2.0", ["accelerate>=1.16"])
    _fake_distribution(tmp_path, "needs_old", "1.0", ["accelerate<1.15"])
    _fake_distribution(tmp_path, "fine", "1.0", ["accelerate>=1.10.1", "Accelerate==1.15.0"])
    _fake_distribution(tmp_path, "extra_only", "1.0", ['accelerate>=2; extra == "big"'])
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [c for c in conflicting_requirements() if c.startswith(("needs_", "fine", "extra"))]
    assert found == [
        "needs_new 2.0 requires accelerate>=1.16",
        "needs_old 1.0 requires accelerate<1.15",
    ]


def test_status_and_env_say_which_accelerate_is_active(installed: Any) -> None:
    installed(OURS)
    lines = distribution.status_lines()
    assert lines[0].startswith("accelerate: hasten's alias (accelerate 1.15.0+hasten.")
    assert lines[1].startswith("import accelerate: ")
    report = format_report(collect_report())
    assert "- accelerate: hasten's alias" in report
    installed(REAL)
    assert "- accelerate: Hugging Face Accelerate 1.15.0" in format_report(collect_report())
    installed(None)
    assert distribution.status_lines()[0].startswith("accelerate: not installed.")


def test_status_names_a_package_that_needs_a_newer_accelerate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Installed after the alias without pip replacing it (e.g. `pip install --no-deps`).
    _fake_distribution(tmp_path, "needs_new", "2.0", ["accelerate>=1.16"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(distribution, "installed_accelerate", lambda: OURS)
    lines = distribution.status_lines()
    assert "needs a newer Accelerate than the 1.15.0 hasten implements:" in lines
    assert "  needs_new 2.0 requires accelerate>=1.16" in lines
    monkeypatch.setattr(distribution, "installed_accelerate", lambda: None)
    before = distribution.status_lines()
    assert before[2].endswith("(the alias cannot be installed while they are):")
    assert "  needs_new 2.0 requires accelerate>=1.16" in before
