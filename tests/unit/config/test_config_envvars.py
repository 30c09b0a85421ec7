"""config.envvars: the table, typed readers, write/remove/snapshot, field metadata helpers."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from hasten.config import envvars
from hasten.config.enums import PrecisionType
from hasten.config.envvars import (
    ENV_VARS,
    EnvVar,
    env,
    fill_from_env,
    read,
    read_flag,
    read_int,
    read_prefixed,
    remove,
    setting,
    snapshot,
    write,
)


def test_table_rows_are_complete() -> None:
    for name, row in ENV_VARS.items():
        assert isinstance(row, EnvVar)
        assert row.name == name
        assert callable(row.parse)
        assert row.doc and row.doc.endswith("."), name


def test_table_covers_every_launcher_variable() -> None:
    required = {
        "ACCELERATE_MIXED_PRECISION",
        "ACCELERATE_USE_CPU",
        "ACCELERATE_DEBUG_MODE",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        "ACCELERATE_DYNAMO_BACKEND",
        "ACCELERATE_DYNAMO_MODE",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH",
        "ACCELERATE_DYNAMO_USE_DYNAMIC",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
        "ACCELERATE_USE_DEEPSPEED",
        "ACCELERATE_USE_FSDP",
        "ACCELERATE_USE_MEGATRON_LM",
        "ACCELERATE_CONFIG_DS_FIELDS",
        "ACCELERATE_NUM_PROCESSES",
        "ACCELERATE_LOG_LEVEL",
        "FSDP_VERSION",
        "FSDP_SHARDING_STRATEGY",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE",
        "MEGATRON_LM_TP_DEGREE",
        "PARALLELISM_CONFIG_TP_SIZE",
    }
    assert required <= set(ENV_VARS)


def test_every_variable_read_in_config_is_in_the_table() -> None:
    source = "\n".join(
        path.read_text()
        for path in Path(envvars.__file__).parent.glob("*.py")
        if path.name != "envvars.py"
    )
    used = set(re.findall(r'"((?:ACCELERATE|FSDP|PARALLELISM_CONFIG)_[A-Z0-9_]+)"', source))
    assert used - set(ENV_VARS) == set()


def test_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_LOG_LEVEL", raising=False)
    assert read("ACCELERATE_LOG_LEVEL") is None
    assert read("ACCELERATE_LOG_LEVEL", "INFO") == "INFO"
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
    assert read("ACCELERATE_LOG_LEVEL") == "debug"


def test_read_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    assert read_flag("ACCELERATE_USE_CPU") is False
    assert read_flag("ACCELERATE_USE_CPU", True) is True
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    assert read_flag("ACCELERATE_USE_CPU") is True
    monkeypatch.setenv("ACCELERATE_USE_CPU", "maybe")
    with pytest.raises(ValueError, match=r"ACCELERATE_USE_CPU='maybe' could not be parsed"):
        read_flag("ACCELERATE_USE_CPU")


def test_read_int(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert read_int("WORLD_SIZE") is None
    assert read_int("WORLD_SIZE", 1) == 1
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert read_int("WORLD_SIZE") == 4
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match=r"WORLD_SIZE='four' could not be parsed"):
        read_int("WORLD_SIZE")


def test_read_prefixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASTEN_TPFX_A", "1")
    monkeypatch.setenv("HASTEN_TPFX_B", "2")
    assert read_prefixed("HASTEN_TPFX_") == {"HASTEN_TPFX_A": "1", "HASTEN_TPFX_B": "2"}


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("ACCELERATE_MIXED_PRECISION", "BF16", "bf16"),
        ("ACCELERATE_DYNAMO_BACKEND", "inductor", "INDUCTOR"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4", 4),
        ("ACCELERATE_GRADIENT_CLIPPING", "0.5", 0.5),
        ("ACCELERATE_DEBUG_MODE", "yes", True),
        ("FSDP_VERSION", "2", 2),
    ],
)
def test_setting_parses_with_the_row(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str, expected: object
) -> None:
    monkeypatch.setenv(name, raw)
    assert setting(name) == expected


def test_setting_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ACCELERATE_MIXED_PRECISION", "FSDP_SHARDING_STRATEGY", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    assert setting("ACCELERATE_MIXED_PRECISION") == "no"
    assert setting("FSDP_SHARDING_STRATEGY") == "FULL_SHARD"
    assert setting("ACCELERATE_USE_CPU") is False
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "")
    assert setting("ACCELERATE_MIXED_PRECISION") == "no"  # empty means unset


def test_setting_from_a_mapping() -> None:
    assert setting("FSDP_VERSION", {"FSDP_VERSION": "2"}) == 2
    assert setting("FSDP_VERSION", {}) == 1


def test_setting_unknown_name_suggests_close_ones() -> None:
    with pytest.raises(
        ValueError, match=r"'ACCELERATE_USE_CPUS' is not in hasten's.*ACCELERATE_USE_CPU"
    ):
        setting("ACCELERATE_USE_CPUS")


def test_write_formats_values_and_remove() -> None:
    write("HASTEN_TW_BOOL", True)
    write("HASTEN_TW_ENUM", PrecisionType.FP16)
    write("HASTEN_TW_LIST", ["A", "B"])
    write("HASTEN_TW_INT", 3)
    assert os.environ["HASTEN_TW_BOOL"] == "true"
    assert os.environ["HASTEN_TW_ENUM"] == "fp16"
    assert os.environ["HASTEN_TW_LIST"] == "A,B"
    assert os.environ["HASTEN_TW_INT"] == "3"
    for name in ("HASTEN_TW_BOOL", "HASTEN_TW_ENUM", "HASTEN_TW_LIST", "HASTEN_TW_INT"):
        remove(name)
        assert name not in os.environ
    remove("HASTEN_TW_BOOL")  # removing twice is fine


def test_snapshot_is_a_detached_copy() -> None:
    copy = snapshot()
    assert copy == dict(os.environ)
    copy["HASTEN_TSNAP"] = "x"
    assert "HASTEN_TSNAP" not in os.environ


def test_parsers() -> None:
    assert envvars.parse_bool("On") is True
    assert envvars.parse_lower(" FP16 ") == "fp16"
    assert envvars.parse_upper("no_wrap") == "NO_WRAP"
    assert envvars.parse_csv("A, B,,C ") == ["A", "B", "C"]


def test_duplicate_rows_are_refused() -> None:
    row = EnvVar("X", str, None, "x.")
    with pytest.raises(ValueError, match="'X' is listed twice"):
        envvars._table(row, row)


@dataclasses.dataclass
class _Plugin:
    version: int | None = dataclasses.field(default=None, metadata=env("FSDP_VERSION"))
    cpu: bool | None = dataclasses.field(default=None, metadata=env("ACCELERATE_USE_CPU"))
    plain: str = "x"


def test_fill_from_env_only_fills_unset_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    plugin = _Plugin(cpu=True)
    fill_from_env(plugin)
    assert (plugin.version, plugin.cpu, plugin.plain) == (2, True, "x")


def test_fill_from_env_reads_a_given_mapping() -> None:
    plugin = _Plugin()
    fill_from_env(plugin, {"FSDP_VERSION": "2", "ACCELERATE_USE_CPU": "1"})
    assert (plugin.version, plugin.cpu, plugin.plain) == (2, True, "x")


def test_env_metadata_refuses_unknown_variables() -> None:
    with pytest.raises(ValueError, match="not in hasten's environment-variable table"):
        env("FSDP_VERSON")


def test_env_name_reads_field_metadata() -> None:
    fields = {field.name: field for field in dataclasses.fields(_Plugin)}
    assert envvars.env_name(fields["version"]) == "FSDP_VERSION"
    assert envvars.env_name(fields["plain"]) is None
