"""``hasten tpu-config``: run setup commands on every worker of a TPU pod through ``gcloud``.

Builds ``gcloud compute tpus tpu-vm ssh NAME --zone ZONE --command "cd /usr/share; [pip
install hasten;] COMMANDS" --worker all`` (Accelerate's documented command) from flags or the
config file (``tpu_name``, ``tpu_zone``, ``commands``, ``command_file``); ``--debug`` prints it
instead of running it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from hasten.commands.config.config_args import default_config_path, load_config_from_file
from hasten.commands.utils import CustomArgumentParser
from hasten.launchers.xla_pod import gcloud_ssh_command

__all__ = ["main", "register", "remote_command", "tpu_command_launcher", "tpu_command_parser"]

_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d*)?$")


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Return the ``hasten tpu-config`` parser (added to `subparsers` when given)."""
    description = "Run commands on every worker of a TPU pod (e.g. install packages)."
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", help=description, description=description)
    else:
        parser = CustomArgumentParser("hasten tpu-config", description=description)
    config = parser.add_argument_group("Config Arguments")
    config.add_argument("--config_file", default=None, help="Config file with the pod's defaults.")
    config.add_argument("--tpu_name", default=None, help="Name of the TPU (default: config).")
    config.add_argument("--tpu_zone", default=None, help="Zone of the TPU (default: config).")
    pod = parser.add_argument_group("TPU Arguments")
    pod.add_argument("--use_alpha", action="store_true", help="Use `gcloud alpha`.")
    pod.add_argument("--command_file", default=None, help="File with one command per line.")
    pod.add_argument(
        "--command",
        action="append",
        nargs="+",
        help="A command to run on each worker (repeatable).",
    )
    pod.add_argument(
        "--install_accelerate",
        action="store_true",
        help="pip install hasten on each worker first.",
    )
    pod.add_argument(
        "--accelerate_version",
        default="latest",
        help="hasten to install: 'latest', a version like '0.3.0', or any pip requirement.",
    )
    pod.add_argument(
        "--debug", action="store_true", help="Print the gcloud command instead of running it."
    )
    parser.set_defaults(func=tpu_command_launcher)
    return parser


def _install_requirement(version: str) -> str:
    if version == "latest":
        return "hasten -U"
    if version == "dev":
        raise ValueError(
            "--accelerate_version dev: hasten has no public development branch to install from; "
            "pass a pip requirement instead (a version, a wheel path or a VCS URL)."
        )
    return f"hasten=={version}" if _VERSION.match(version) else version


def _fill_from_config(args: argparse.Namespace) -> None:
    path = args.config_file or default_config_path()
    if args.config_file is None and not Path(path).is_file():
        return
    config = load_config_from_file(path)
    if not args.command_file and not args.command and config.command_file is not None:
        args.command_file = config.command_file
    if not args.command and config.commands:
        args.command = [list(config.commands)]
    args.tpu_name = args.tpu_name or config.tpu_name
    args.tpu_zone = args.tpu_zone or config.tpu_zone


def remote_command(args: argparse.Namespace) -> str:
    """Return the shell line each worker runs: ``cd /usr/share; [pip install ...;] commands``.

    Raises:
        ValueError: neither ``--command`` nor ``--command_file`` (nor the config) gives one.
    """
    lines: list[str] = []
    if args.command_file:
        lines = Path(args.command_file).read_text(encoding="utf-8").splitlines()
    elif args.command:
        for command in args.command:
            lines.extend(command if isinstance(command, list) else [command])
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError(
            "No command to run on the pod: pass --command 'CMD' (repeatable) or "
            "--command_file FILE, or set commands/command_file in the config file."
        )
    steps = ["cd /usr/share"]
    if args.install_accelerate:
        steps.append(f"pip install {_install_requirement(args.accelerate_version)}")
    return "; ".join([*steps, *lines])


def tpu_command_launcher(args: argparse.Namespace) -> int:
    """Run ``hasten tpu-config``: build the gcloud command, then print (``--debug``) or run it."""
    _fill_from_config(args)
    command = gcloud_ssh_command(
        args.tpu_name or "", args.tpu_zone or "", remote_command(args), use_alpha=args.use_alpha
    )
    if args.debug:
        print(f"Running {' '.join(command)}")
        return 0
    subprocess.run(command, check=True)
    print("Successfully setup pod.")
    return 0


def register(subparsers: Any) -> None:
    """Add ``hasten tpu-config`` to the ``hasten`` command table."""
    tpu_command_parser(subparsers)


def main() -> int:
    """Run ``hasten tpu-config`` with the command line (``python -m hasten.commands.tpu``)."""
    return tpu_command_launcher(tpu_command_parser().parse_args())


if __name__ == "__main__":
    sys.exit(main())
