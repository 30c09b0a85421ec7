"""Accelerate's ``commands.config`` paths: formatter, backends, default/update commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from hasten.commands.config import get_config_parser
from hasten.commands.config.cluster import get_cluster_input
from hasten.commands.config.config_utils import DYNAMO_BACKENDS, SubcommandHelpFormatter
from hasten.commands.config.default import default_config_command
from hasten.commands.config.questionnaire import get_cluster_input as questionnaire_input
from hasten.commands.config.update import update_config, update_config_command
from hasten.config.enums import DynamoBackend


def test_cluster_path_is_the_questionnaire() -> None:
    assert get_cluster_input is questionnaire_input


def test_dynamo_backends_are_every_backend_but_no() -> None:
    assert "NO" not in DYNAMO_BACKENDS and "INDUCTOR" in DYNAMO_BACKENDS
    assert len(DYNAMO_BACKENDS) == len(DynamoBackend.list()) - 1


def test_subcommand_formatter_drops_the_command_placeholder() -> None:
    parser = argparse.ArgumentParser(
        "hasten config",
        usage="hasten <command> [<args>] extra",
        formatter_class=SubcommandHelpFormatter,
    )
    assert parser.format_usage() == "usage: hasten extra\n"
    assert "usage: hasten config [-h]" in get_config_parser().format_usage()


def test_default_and_update_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    args = argparse.Namespace(config_file=str(path), mixed_precision="fp16")
    assert default_config_command(args) == 0
    assert json.loads(path.read_text())["mixed_precision"] == "fp16"
    legacy = tmp_path / "old.yaml"
    legacy.write_text(yaml.safe_dump({"distributed_type": "NO", "fp16": True}))
    assert update_config_command(argparse.Namespace(config_file=str(legacy))) == 0
    assert yaml.safe_load(legacy.read_text())["mixed_precision"] == "fp16"
    assert update_config(str(legacy)) == str(legacy)  # a path works too
    with pytest.raises(FileNotFoundError, match="does not exist"):
        update_config(argparse.Namespace(config_file=str(tmp_path / "none.yaml")))
    assert "Successfully updated" in capsys.readouterr().out
