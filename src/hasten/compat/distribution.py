"""The ``accelerate`` distribution that is hasten: build it, install it, remove it, report it.

transformers, trl, peft and diffusers find Accelerate through installed package metadata named
``accelerate`` (transformers requires ``accelerate>=1.1.0`` while it is imported) and compare
``accelerate.__version__``, so a module alias alone is not enough. The distribution is:

- named ``accelerate``, versioned ``1.15.0+hasten.<hasten version>`` (the Accelerate API hasten
  implements, then hasten's own version as a local label), requiring ``hasten`` at exactly that
  version;
- one module, ``accelerate/__init__.py``, which hands every ``accelerate.x`` to hasten
  (`hasten.compat.alias`);
- Accelerate's console scripts (``accelerate``, ``accelerate-launch``, ``accelerate-config``,
  ``accelerate-estimate-memory``, ``accelerate-merge-weights``) running hasten's CLI.

The wheel is written here (a zip with a ``.dist-info``; no build backend, nothing downloaded)
and installed with pip.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from hasten._version import __version__ as hasten_version
from hasten.compat.alias import ACCELERATE_API_VERSION

__all__ = [
    "AccelerateAliasError",
    "CONSOLE_SCRIPTS",
    "InstalledAccelerate",
    "alias_version",
    "build_wheel",
    "conflicting_requirements",
    "install",
    "installed_accelerate",
    "status_lines",
    "uninstall",
]

#: Accelerate's console scripts and the hasten entry point each one runs.
CONSOLE_SCRIPTS = {
    "accelerate": "hasten.commands.accelerate_cli:main",
    "accelerate-config": "hasten.commands.config:main",
    "accelerate-estimate-memory": "hasten.commands.estimate:main",
    "accelerate-launch": "hasten.commands.launch:main",
    "accelerate-merge-weights": "hasten.commands.merge:main",
}

_NAME = "accelerate"
_INIT = '''"""hasten, installed under the name accelerate: Accelerate {api}'s API, run by hasten {hasten}.

Written by ``hasten accelerate install`` (``hasten accelerate uninstall`` removes it). Every
``accelerate.x`` module is hasten's ``hasten.x`` module object; see hasten.compat.alias.
"""

from hasten.compat.alias import install as _install

__version__ = "{api}"

_install(__name__)
'''

Runner = Callable[..., subprocess.CompletedProcess[str]]


class AccelerateAliasError(RuntimeError):
    """``hasten accelerate install`` / ``uninstall`` cannot do what was asked; says why and how."""


def alias_version(version: str = hasten_version) -> str:
    """The distribution's version: ``1.15.0+hasten.<version>`` (a valid local version label)."""
    label = re.sub(r"[^A-Za-z0-9.]+", ".", version).strip(".")
    return f"{ACCELERATE_API_VERSION}+hasten.{label}"


@dataclasses.dataclass(frozen=True)
class InstalledAccelerate:
    """The ``accelerate`` distribution found in this environment.

    Attributes:
        version: its version (``1.15.0+hasten.0.1.0`` for hasten's alias).
        location: where it is installed (its site-packages folder).
        is_hasten: it is hasten's alias, not Hugging Face Accelerate.
    """

    version: str
    location: str
    is_hasten: bool

    def describe(self) -> str:
        """One line for messages and ``hasten env``."""
        if self.is_hasten:
            return (
                f"hasten's alias (accelerate {self.version}: Accelerate {ACCELERATE_API_VERSION}'s "
                f"API run by hasten) in {self.location}"
            )
        return f"Hugging Face Accelerate {self.version} in {self.location}"


def _is_hasten_version(version: str) -> bool:
    try:
        local = Version(version).local
    except InvalidVersion:
        return False
    return local is not None and local.startswith("hasten")


def installed_accelerate() -> InstalledAccelerate | None:
    """The ``accelerate`` distribution Python finds first on ``sys.path``, or None."""
    try:
        dist = importlib.metadata.distribution(_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None
    version = dist.version
    return InstalledAccelerate(version, str(dist.locate_file("")), _is_hasten_version(version))


def conflicting_requirements(version: str | None = None) -> list[str]:
    """Installed packages that require an ``accelerate`` the alias does not satisfy.

    Each entry names the package and its requirement, e.g. ``"trl 2.1.0 requires
    accelerate>=1.16"``. Requirements behind an extra are not counted (pip checks those only
    when the extra is installed).
    """
    provided = Version(version or alias_version())
    found: list[str] = []
    for dist in importlib.metadata.distributions():
        for line in dist.requires or ():
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if canonicalize_name(requirement.name) != _NAME:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            if not requirement.specifier.contains(provided, prereleases=True):
                name = dist.metadata["Name"]
                found.append(f"{name} {dist.version} requires {requirement}")
    return sorted(set(found))


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _wheel_files(version: str, hasten: str) -> dict[str, bytes]:
    dist_info = f"{_NAME}-{version}.dist-info"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            f"Name: {_NAME}",
            f"Version: {version}",
            f"Summary: hasten installed under the name accelerate: Accelerate "
            f"{ACCELERATE_API_VERSION}'s API, run by hasten {hasten}",
            "License: Apache-2.0",
            "Requires-Python: >=3.10",
            f"Requires-Dist: hasten=={hasten}",
            "",
        ]
    )
    scripts = "".join(f"{name} = {target}\n" for name, target in sorted(CONSOLE_SCRIPTS.items()))
    return {
        f"{_NAME}/__init__.py": _INIT.format(api=ACCELERATE_API_VERSION, hasten=hasten).encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: hasten\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist_info}/entry_points.txt": f"[console_scripts]\n{scripts}".encode(),
        f"{dist_info}/top_level.txt": f"{_NAME}\n".encode(),
    }


def build_wheel(directory: str | Path, hasten: str = hasten_version) -> Path:
    """Write the ``accelerate`` wheel for hasten version ``hasten`` into ``directory``.

    Returns:
        The wheel's path (``accelerate-1.15.0+hasten.<version>-py3-none-any.whl``).
    """
    version = alias_version(hasten)
    files = _wheel_files(version, hasten)
    record = f"{_NAME}-{version}.dist-info/RECORD"
    lines = [_record_line(path, data) for path, data in files.items()] + [f"{record},,"]
    files[record] = ("\n".join(lines) + "\n").encode()
    path = Path(directory) / f"{_NAME}-{version}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return path


def _pip(runner: Runner, python: str, args: Sequence[str]) -> None:
    command = [python, "-m", "pip", *args]
    done = runner(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = (done.stderr or done.stdout or "").strip().splitlines()[-8:]
        raise AccelerateAliasError(
            f"`{' '.join(command)}` failed (exit code {done.returncode}):\n" + "\n".join(output)
        )


def _refuse_conflicts(conflicts: list[str]) -> None:
    if not conflicts:
        return
    raise AccelerateAliasError(
        f"Installed packages need a newer Accelerate than the {ACCELERATE_API_VERSION} whose API "
        f"hasten implements (the alias would be accelerate {alias_version()}):\n  "
        + "\n  ".join(conflicts)
        + "\nInstall releases of them that accept accelerate "
        f"{ACCELERATE_API_VERSION} (for example `pip install 'NAME<VERSION'`), or keep Hugging "
        "Face Accelerate in this environment."
    )


def install(
    replace: bool = False, python: str = sys.executable, runner: Runner = subprocess.run
) -> str:
    """Install the alias with pip into the environment of ``python``; return what was done.

    Args:
        replace: replace a Hugging Face Accelerate installed here (refused otherwise).
        python: the interpreter whose environment gets it (this one by default).
        runner: runs pip (tests pass a fake).

    Raises:
        AccelerateAliasError: Hugging Face Accelerate is installed and ``replace`` is False, an
            installed package needs a newer Accelerate, or pip failed.
    """
    current = installed_accelerate()
    if current is not None and not current.is_hasten and not replace:
        raise AccelerateAliasError(
            f"{current.describe()} is installed in this environment ({sys.prefix}); installing "
            "hasten's alias would replace it. Run `hasten accelerate install --replace` to "
            f"replace it (`pip install accelerate=={current.version}` brings it back), or use "
            "another virtual environment."
        )
    _refuse_conflicts(conflicting_requirements())
    wanted = alias_version()
    if current is not None and current.is_hasten and current.version == wanted:
        return f"Already installed: {current.describe()}."
    with tempfile.TemporaryDirectory(prefix="hasten-accelerate-") as folder:
        wheel = build_wheel(folder)
        # The wheel only: hasten (its one requirement) is the hasten running this.
        _pip(
            runner,
            python,
            ["install", "--no-index", "--no-deps", "--force-reinstall", "-q", str(wheel)],
        )
    replaced = f" (replacing {current.describe()})" if current and not current.is_hasten else ""
    return (
        f"Installed accelerate {wanted}{replaced}: `import accelerate` and the accelerate "
        "commands now run hasten. `hasten accelerate uninstall` removes it."
    )


def uninstall(python: str = sys.executable, runner: Runner = subprocess.run) -> str:
    """Remove the alias with pip; return what was done.

    Raises:
        AccelerateAliasError: the alias is not installed (nothing, or Hugging Face Accelerate
            is), or pip failed.
    """
    current = installed_accelerate()
    if current is None:
        raise AccelerateAliasError(
            f"hasten's accelerate alias is not installed in this environment ({sys.prefix}), so "
            "there is nothing to uninstall. `hasten accelerate status` shows what is installed."
        )
    if not current.is_hasten:
        raise AccelerateAliasError(
            f"The accelerate installed here is {current.describe()}, not hasten's alias; "
            "`hasten accelerate uninstall` removes only the alias. Use `pip uninstall accelerate` "
            "to remove Hugging Face Accelerate."
        )
    _pip(runner, python, ["uninstall", "-y", "-q", _NAME])
    return f"Uninstalled accelerate {current.version}: `import accelerate` no longer runs hasten."


def _active_module() -> str:
    """What ``import accelerate`` gives in this process (without importing it if not done)."""
    from hasten.compat.alias import is_alias

    module: Any = sys.modules.get(_NAME)
    if module is None:
        spec = importlib.util.find_spec(_NAME)
        if spec is None:
            return "no module named accelerate"
        return f"the accelerate package in {spec.origin}"
    return "hasten" if is_alias(module) else f"Hugging Face Accelerate ({module.__file__})"


def status_lines() -> list[str]:
    """What ``hasten accelerate status`` prints: the distribution, the module, any conflict."""
    current = installed_accelerate()
    if current is None:
        lines = [
            "accelerate: not installed. `hasten accelerate install` makes hasten the accelerate "
            "that transformers, trl, peft and diffusers use."
        ]
    else:
        lines = [f"accelerate: {current.describe()}"]
    lines.append(f"import accelerate: {_active_module()}")
    conflicts = conflicting_requirements()
    if conflicts:
        installed_alias = current is not None and current.is_hasten
        lines.append(
            f"needs a newer Accelerate than the {ACCELERATE_API_VERSION} hasten implements"
            + (":" if installed_alias else " (the alias cannot be installed while they are):")
        )
        lines += [f"  {item}" for item in conflicts]
    return lines
