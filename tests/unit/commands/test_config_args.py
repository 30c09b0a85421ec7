from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hasten.commands.config.config_args import (
    ClusterConfig,
    default_config_path,
    load_config_from_file,
)


def _write_yaml(path: Path, data: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_loads_accelerate_yaml_keys(tmp_path: Path) -> None:
    path = _write_yaml(
        tmp_path / "c.yaml",
        {
            "compute_environment": "LOCAL_MACHINE",
            "distributed_type": "MULTI_GPU",
            "mixed_precision": "BF16",
            "num_processes": 8,
            "num_machines": 2,
            "machine_rank": 1,
            "main_process_ip": "10.0.0.1",
            "main_process_port": 29501,
            "gpu_ids": 0,
            "dynamo_config": {"dynamo_backend": "inductor"},
            "fsdp_config": {"fsdp_version": 2},
        },
    )
    config = load_config_from_file(path)
    assert config.distributed_type == "MULTI_GPU"
    assert config.mixed_precision == "bf16"
    assert (config.num_processes, config.num_machines, config.machine_rank) == (8, 2, 1)
    assert config.gpu_ids == "0"
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR"}
    assert config.deepspeed_config == {}
    assert config.use_cpu is False


def test_json_round_trip_and_yaml_round_trip(tmp_path: Path) -> None:
    config = ClusterConfig("LOCAL_MACHINE", "MULTI_CPU", "no", True, False, num_processes=4)
    for name in ("c.json", "c.yaml"):
        path = config.save(str(tmp_path / name))
        again = load_config_from_file(path)
        assert again.to_dict() == config.to_dict()
    assert json.loads((tmp_path / "c.json").read_text())["distributed_type"] == "MULTI_CPU"
    # Empty sections and unset keys are left out of the file.
    assert "fsdp_config" not in config.to_dict()
    assert "main_process_ip" not in config.to_dict()


def test_legacy_keys_are_translated(tmp_path: Path) -> None:
    path = _write_yaml(
        tmp_path / "old.yaml", {"distributed_type": "NO", "fp16": True, "dynamo_backend": "EAGER"}
    )
    config = load_config_from_file(path)
    assert config.mixed_precision == "fp16"
    assert config.num_processes == 1
    assert config.dynamo_config == {"dynamo_backend": "EAGER"}


def test_unknown_keys_are_named_with_the_allowed_ones(tmp_path: Path) -> None:
    path = _write_yaml(tmp_path / "c.yaml", {"distributed_type": "NO", "num_gpus": 2})
    with pytest.raises(
        ValueError, match=r"Unknown key\(s\) \['num_gpus'\].*Allowed keys: \[.*'num_processes'"
    ):
        load_config_from_file(path)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"distributed_type": "MULTI_TPU"},
            r"Invalid value 'MULTI_TPU' for config key 'distributed_type'. Allowed values: \['NO'",
        ),
        (
            {"distributed_type": "NO", "mixed_precision": "fp32"},
            r"'fp32' \(from config key 'mixed_precision'\). Choose one of \['no', 'fp8', 'fp16', "
            r"'bf16'\] \(any case\): edit the config file",
        ),
        (
            {"distributed_type": "NO", "rdzv_backend": "zeus"},
            r"'rdzv_backend'. Allowed values: \['static', 'c10d'",
        ),
        (
            {"distributed_type": "NO", "dynamo_config": {"dynamo_backend": "fast"}},
            "dynamo_config.dynamo_backend",
        ),
        ({"distributed_type": "NO", "gpu_ids": "first"}, "'gpu_ids' must be 'all'"),
        (
            {"distributed_type": "NO", "num_machines": 2, "machine_rank": 2},
            "'machine_rank' must be in",
        ),
        ({"distributed_type": "NO", "num_machines": 0}, "'num_machines' must be >= 1"),
        ({"distributed_type": "NO", "num_processes": 0}, "'num_processes' must be >= 1"),
        ({"distributed_type": "NO", "main_process_port": 70000}, "'main_process_port' must be in"),
        ({"compute_environment": "MARS", "distributed_type": "NO"}, "'compute_environment'"),
        (
            {"compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "NO"},
            r"lacks the required key\(s\) \['ec2_instance_type', 'iam_role_name'\]",
        ),
        (
            {
                "compute_environment": "AMAZON_SAGEMAKER",
                "distributed_type": "MULTI_GPU",
                "ec2_instance_type": "ml.p3.2xlarge",
                "iam_role_name": "role",
            },
            "Invalid value 'MULTI_GPU' for config key 'distributed_type'",
        ),
        ({"num_processes": 2}, "no 'distributed_type' key"),
    ],
)
def test_invalid_values_name_the_key_and_allowed_values(
    tmp_path: Path, data: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        load_config_from_file(_write_yaml(tmp_path / "c.yaml", data))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"num_processes": "two"}, "'num_processes' must be an integer, got 'two'"),
        ({"use_cpu": "maybe"}, "'use_cpu' must be true or false"),
        ({"num_processes": True}, "'num_processes' must be an integer"),
        ({"fsdp_config": [1]}, "'fsdp_config' must be a mapping"),
    ],
)
def test_wrong_types_are_type_errors(tmp_path: Path, data: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        load_config_from_file(_write_yaml(tmp_path / "c.yaml", {"distributed_type": "NO", **data}))


def test_non_mapping_file_is_a_type_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(TypeError, match="must hold a mapping"):
        load_config_from_file(str(path))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config_from_file(str(tmp_path / "nope.yaml"))


def test_default_location_follows_hf_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert default_config_path() == str(tmp_path / "accelerate" / "default_config.yaml")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_config_path() == str(
        tmp_path / "xdg" / "huggingface" / "accelerate" / "default_config.yaml"
    )
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_config_path() == str(
        Path("~/.cache/huggingface/accelerate/default_config.yaml").expanduser()
    )


@pytest.mark.parametrize(
    ("section", "key", "guess"),
    [
        ("fsdp_config", "fsdp_sharding_stratgy", "fsdp_sharding_strategy"),
        ("fsdp_config", "sharding_strategy", "fsdp_sharding_strategy"),
        ("deepspeed_config", "zero_stag", "zero_stage"),
        ("deepspeed_config", "offload_optimiser_device", "offload_optimizer_device"),
    ],
)
def test_unknown_engine_section_keys_are_errors_with_a_guess(
    tmp_path: Path, section: str, key: str, guess: str
) -> None:
    data = {"distributed_type": "FSDP", section: {key: "x"}}
    with pytest.raises(
        ValueError, match=rf"Unknown key '{key}' in {section}.*Did you mean '{guess}'"
    ):
        load_config_from_file(_write_yaml(tmp_path / "c.yaml", data))


def test_accelerates_engine_section_keys_load(tmp_path: Path) -> None:
    fsdp = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_reshard_after_forward": True,
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": False,
        "fsdp_activation_checkpointing": False,
    }
    deepspeed = {
        "zero_stage": 3,
        "offload_optimizer_device": "none",
        "offload_param_device": "none",
        "zero3_init_flag": True,
        "zero3_save_16bit_model": True,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "deepspeed_multinode_launcher": "standard",
    }
    for section, values, kind in (
        ("fsdp_config", fsdp, "FSDP"),
        ("deepspeed_config", deepspeed, "DEEPSPEED"),
    ):
        path = _write_yaml(tmp_path / f"{kind}.yaml", {"distributed_type": kind, section: values})
        assert getattr(load_config_from_file(path), section) == values
