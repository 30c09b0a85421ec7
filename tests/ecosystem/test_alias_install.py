"""hasten installed as ``accelerate`` by `make install`, as a user installs it.

`make install` runs ``hasten accelerate install`` and then installs trl, peft, diffusers and
datasets (the ``ecosystem`` extra): pip must keep the alias for them, ``pip check`` must be clean
and Accelerate's console scripts must run hasten. pip's resolver, asked offline with stand-in
wheels (``--dry-run``), keeps the alias for such libraries and replaces it only with a newer
Accelerate. The round trip through pip (uninstall, a real Accelerate installed over it, the
refusal and ``--replace``) changes the environment for a moment and is marked ``ecosystem``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from _support.ecosystem import require_alias
from hasten.compat.distribution import CONSOLE_SCRIPTS, alias_version, installed_accelerate

_BIN = Path(sys.executable).parent


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def test_the_alias_is_installed_and_the_libraries_kept_it() -> None:
    require_alias()
    current = installed_accelerate()
    assert current is not None and current.version == alias_version()
    requirements = {
        name: [r for r in importlib.metadata.requires(name) or () if r.startswith("accelerate")]
        for name in ("trl", "peft")
        if _installed(name)
    }
    if not requirements:
        pytest.skip("trl and peft are not installed (`make install` installs them)")
    for name, needs in requirements.items():
        assert needs, f"{name} requires accelerate"  # and pip kept the alias for it
    done = _run(sys.executable, "-m", "pip", "check")
    assert "No broken requirements found." in done.stdout


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """Write a minimal wheel of ``name`` (one empty module) requiring ``requires``."""
    stem = f"{name.replace('-', '_')}-{version}"  # a wheel's file name spells - as _
    info = f"{stem}.dist-info"
    metadata = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    files = {
        f"{name.replace('-', '_')}_stand_in.py": "",
        f"{info}/METADATA": "\n".join(metadata) + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def _pip_would_install(*args: str) -> list[tuple[str, str]]:
    """What ``pip install ARGS`` would install here, offline (``--dry-run``: nothing changes)."""
    # No pip configuration (this machine's adds find-links and indexes): only ARGS count.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-q"]
    done = subprocess.run(
        [*command, "--report", "-", *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, f"pip install {args} failed:\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout)
    return sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"])


def test_pip_keeps_the_alias_for_libraries_and_replaces_it_only_for_a_newer_accelerate(
    tmp_path: Path,
) -> None:
    # Offline stand-ins from local wheels: a library like trl or peft (accelerate>=1.1), the
    # Hugging Face Accelerate release the alias stands for, and a newer one with a library
    # that needs it. docs/accelerate-compat.md ("What pip does with it afterwards") says this.
    require_alias()
    index, newer = tmp_path / "index", tmp_path / "newer"
    _wheel(index, "needs-accelerate", "1.0", ["accelerate>=1.1"])
    _wheel(index, "accelerate", "1.15.0", [])
    _wheel(newer, "accelerate", "1.16.0", [])
    _wheel(newer, "needs-newer-accelerate", "1.0", ["accelerate>=1.16"])
    kept = _pip_would_install(
        "--find-links", str(index), "--upgrade", "--upgrade-strategy", "eager",
        "needs-accelerate", "accelerate",
    )  # fmt: skip
    assert kept == [("needs-accelerate", "1.0")]  # the alias satisfies it and stays
    assert _pip_would_install("--find-links", str(index), "accelerate==1.15.0") == []
    replaced = _pip_would_install(
        "--find-links", str(index), "--find-links", str(newer), "needs-newer-accelerate"
    )
    assert replaced == [("accelerate", "1.16.0"), ("needs-newer-accelerate", "1.0")]


def test_accelerates_console_scripts_run_hasten() -> None:
    require_alias()
    for script in CONSOLE_SCRIPTS:
        assert (_BIN / script).is_file(), f"{script} was not installed"
    env = _run(str(_BIN / "accelerate"), "env").stdout
    assert "- accelerate: hasten's alias (accelerate 1.15.0+hasten." in env
    assert "- hasten version:" in env
    help_text = _run(str(_BIN / "accelerate-launch"), "--help").stdout
    assert "hasten launch" in help_text and "--num_processes" in help_text
    assert "accelerate: hasten's alias" in _run(str(_BIN / "hasten"), "accelerate", "status").stdout


@pytest.mark.ecosystem
@pytest.mark.timeout(600)
def test_round_trip_through_pip_uninstall_refuse_replace() -> None:
    require_alias()
    hasten = str(_BIN / "hasten")
    pip = [sys.executable, "-m", "pip"]
    try:
        assert "Uninstalled accelerate" in _run(hasten, "accelerate", "uninstall").stdout
        assert installed_accelerate() is None
        again = _run(hasten, "accelerate", "uninstall", check=False)
        assert again.returncode == 2 and "nothing to uninstall" in again.stderr
        # Hugging Face Accelerate from the package index, where the alias was.
        _run(*pip, "install", "-q", "--no-deps", "accelerate==1.15.0")
        refused = _run(hasten, "accelerate", "install", check=False)
        assert refused.returncode == 2
        assert "Hugging Face Accelerate 1.15.0 in " in refused.stderr
        assert "hasten accelerate install --replace" in refused.stderr
        wrong = _run(hasten, "accelerate", "uninstall", check=False)
        assert wrong.returncode == 2 and "not hasten's alias" in wrong.stderr
        replaced = _run(hasten, "accelerate", "install", "--replace").stdout
        assert "replacing Hugging Face Accelerate 1.15.0" in replaced
    finally:
        current = installed_accelerate()
        if current is None or not current.is_hasten:
            _run(hasten, "accelerate", "install", "--replace")
    assert installed_accelerate() is not None and installed_accelerate().is_hasten  # type: ignore[union-attr]
    assert "No broken requirements found." in _run(*pip, "check").stdout
