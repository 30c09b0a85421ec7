"""The generated references (docs/_ext/hasten_generated.py) list everything the code has."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import hasten_generated  # noqa: E402


def test_every_environment_variable_is_listed() -> None:
    from hasten.config.envvars import ENV_VARS

    text = hasten_generated.envvars_markdown()
    missing = [name for name in ENV_VARS if f"| `{name}` |" not in text]
    assert not missing and len(ENV_VARS) > 50, missing


def test_every_flag_of_every_command_is_listed() -> None:
    from hasten.commands.cli import COMMANDS, build_parser

    text = hasten_generated.cli_markdown()
    parser = build_parser()
    assert all(f"### `hasten {name}`" in text for name in COMMANDS)
    launch = hasten_generated._subparsers(parser)["launch"]
    flags = [o for a in launch._actions for o in a.option_strings if a.help != argparse.SUPPRESS]
    assert len(flags) > 50
    missing = [flag for flag in flags if flag not in text]
    assert not missing, missing


def test_every_config_key_is_listed() -> None:
    from hasten.commands.config.config_args import ClusterConfig
    from hasten.launchers.env import section_keys

    text = hasten_generated.config_markdown()
    keys = [field.name for field in dataclasses.fields(ClusterConfig)]
    keys += section_keys("fsdp_config") + section_keys("deepspeed_config")
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, missing


def test_the_reference_page_uses_each_table_once() -> None:
    page = (DOCS / "reference" / "generated.md").read_text()
    for which in ("envvars", "cli", "config"):
        assert page.count(f"```{{hasten-generated}} {which}") == 1
