"""hasten installed as ``accelerate`` by `make install`, as a user installs it.

`make install` runs ``hasten accelerate install`` and then installs trl, peft, diffusers and
datasets (the ``ecosystem`` extra): pip must keep the alias for them, ``pip check`` must be clean
and Accelerate's console scripts must run hasten. The round trip through pip (uninstall, a real
Accelerate installed over it, the refusal and ``--replace``) changes the environment for a moment
and is marked ``ecosystem``.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
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
