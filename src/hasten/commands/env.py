"""``hasten env``: versions, hardware, the config in use and every effective launch setting.

The output is meant to be pasted into a bug report as is.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from shutil import which
from typing import Any

from hasten.commands.config.config_args import default_config_path, load_config_from_file
from hasten.commands.utils import CustomArgumentParser
from hasten.config import envvars
from hasten.launchers.plan import resolve_settings

__all__ = [
    "collect_report",
    "env_command",
    "env_command_parser",
    "format_report",
    "main",
    "register",
]


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found: dict[str, str] = {
        "Platform": platform.platform(),
        "Python version": sys.version.split()[0],
    }
    for label, dist in (("hasten", "hasten"), ("PyTorch", "torch"), ("NumPy", "numpy")):
        try:
            found[f"{label} version"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[f"{label} version"] = "not installed"
    found["accelerate"] = _accelerate()
    return found


def _accelerate() -> str:
    """Which accelerate is active: hasten's alias, Hugging Face Accelerate, or none."""
    from hasten.compat.distribution import installed_accelerate

    current = installed_accelerate()
    if current is None:
        return "not installed (`hasten accelerate install` makes hasten the accelerate)"
    return current.describe()


def _hardware() -> dict[str, str]:
    found = {"CPU cores (logical)": str(os.cpu_count())}
    try:
        import psutil  # a core dependency, imported here to keep the CLI start cheap

        found["System RAM"] = f"{psutil.virtual_memory().total / 2**30:.2f} GB"
    except ImportError:
        found["System RAM"] = "unknown (psutil missing)"
    try:
        from hasten.platforms.registry import current_platform  # deferred: imports torch

        current = current_platform()
        count = 0 if current.name == "cpu" else int(current.device_count())
        found["Accelerator"] = f"{current.name} ({count} device(s))" if count else "none (CPU)"
    except ImportError as err:
        found["Accelerator"] = f"unknown ({err})"
    return found


def collect_report(config_file: str | None = None) -> dict[str, Any]:
    """Gather the report: versions, hardware, config file and each setting with its source."""
    path = config_file or default_config_path()
    config: dict[str, Any] | None = None
    if Path(path).is_file():
        config = load_config_from_file(path).to_dict()
    elif config_file is not None:
        raise FileNotFoundError(f"Config file {config_file!r} does not exist.")
    environ = envvars.snapshot()
    settings = resolve_settings({}, config, environ)
    return {
        "versions": _versions(),
        "hardware": _hardware(),
        "config_file": path if config is not None else None,
        "config": config,
        "settings": {name: (item.value, item.source) for name, item in settings.items()},
        "accelerate_env": {k: v for k, v in sorted(environ.items()) if k.startswith("ACCELERATE_")},
    }


def format_report(report: dict[str, Any]) -> str:
    """Render `collect_report`'s result as Markdown for an issue."""
    lines = ["Copy-and-paste the text below in your GitHub issue", ""]
    lines += [f"- {key}: {value}" for key, value in report["versions"].items()]
    lines += [f"- {key}: {value}" for key, value in report["hardware"].items()]
    lines.append(f"- Config file: {report['config_file'] or 'none (defaults)'}")
    for key, value in (report["config"] or {}).items():
        lines.append(f"\t- {key}: {value}")
    lines.append("- Effective launch settings (value, source):")
    for name, (value, source) in report["settings"].items():
        shown = "(decided at launch)" if value is None else value
        lines.append(f"\t- {name}: {shown} [{source}]")
    if report["accelerate_env"]:
        lines.append("- ACCELERATE_* variables set:")
        lines += [f"\t- {key}={value}" for key, value in report["accelerate_env"].items()]
    return "\n".join(lines)


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten env`` parser (added to `subparsers` when given)."""
    description = "Print versions, hardware, config and effective settings for a bug report."
    if subparsers is not None:
        parser = subparsers.add_parser("env", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten env", description=description)
    parser.add_argument("--config_file", default=None, help="Config file to report on.")
    parser.set_defaults(func=_env_from_cli)
    return parser


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print the ``hasten env`` report; return its main facts under Accelerate's keys.

    As Accelerate's ``env_command``, which scripts and its tests call in-process.
    """
    report = collect_report(args.config_file)
    print(format_report(report))
    versions, hardware = report["versions"], report["hardware"]
    return {
        "`Accelerate` version": f"hasten {versions['hasten version']}",
        "Platform": versions["Platform"],
        "`accelerate` bash location": which("accelerate") or "Not found",
        "Python version": versions["Python version"],
        "Numpy version": versions["NumPy version"],
        "PyTorch version": versions["PyTorch version"],
        "PyTorch accelerator": hardware["Accelerator"],
        "System RAM": hardware["System RAM"],
        "`Accelerate` configs": report["config"] or "Not found",
    }


def _env_from_cli(args: argparse.Namespace) -> int:
    env_command(args)
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten env`` to the ``hasten`` command table."""
    env_command_parser(subparsers)


def main() -> int:
    """Run ``hasten env`` with the command line (``python -m hasten.commands.env``)."""
    return _env_from_cli(env_command_parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())
