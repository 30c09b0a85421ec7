from __future__ import annotations

from typing import Any

import pytest

from hasten.launchers.plan import (
    SETTINGS,
    LaunchPlan,
    Resolved,
    build_plan,
    resolve_settings,
)


def _resolve(
    flags: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> dict[str, Resolved]:
    return resolve_settings(flags or {}, config, environ or {})


def test_every_setting_resolves_to_its_default_without_sources() -> None:
    resolved = _resolve()
    assert set(resolved) == {spec.name for spec in SETTINGS}
    for spec in SETTINGS:
        assert resolved[spec.name] == Resolved(spec.default, "default")


def test_precedence_flag_beats_env_beats_config_beats_default() -> None:
    config = {"mixed_precision": "fp16"}
    env = {"ACCELERATE_MIXED_PRECISION": "bf16"}
    assert _resolve(config=config)["mixed_precision"] == Resolved("fp16", "config file")
    assert _resolve(config=config, environ=env)["mixed_precision"] == Resolved(
        "bf16", "environment ACCELERATE_MIXED_PRECISION"
    )
    flags = {"mixed_precision": "no"}
    got = _resolve(flags, config, env)["mixed_precision"]
    assert got == Resolved("no", "flag --mixed_precision")


def test_boolean_env_is_parsed_and_cpu_flag_is_named_as_typed() -> None:
    assert _resolve(environ={"ACCELERATE_USE_CPU": "yes"})["use_cpu"].value is True
    assert _resolve({"use_cpu": True})["use_cpu"].source == "flag --cpu"
    # An empty variable counts as unset.
    assert _resolve(environ={"ACCELERATE_DEBUG_MODE": ""})["debug"].source == "default"


def test_dynamo_settings_come_from_the_nested_config_section() -> None:
    config = {"dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_use_fullgraph": True}}
    resolved = _resolve(config=config)
    assert resolved["dynamo_backend"] == Resolved("INDUCTOR", "config file")
    assert resolved["dynamo_use_fullgraph"].value is True


def test_config_minus_one_processes_means_decide_at_launch() -> None:
    assert _resolve(config={"num_processes": -1})["num_processes"].source == "default"


def test_slurm_beats_config_but_not_flags() -> None:
    environ = {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "gpu[3-4]",
    }
    resolved = _resolve({"machine_rank": 0}, {"num_machines": 1}, environ)
    assert resolved["num_machines"] == Resolved(2, "SLURM")
    assert resolved["main_process_ip"] == Resolved("gpu3", "SLURM")
    assert resolved["machine_rank"] == Resolved(0, "flag --machine_rank")


def test_build_plan_defaults_to_one_process_per_device_or_one_on_cpu() -> None:
    plan = build_plan(_resolve(), "train.py", count_devices=lambda: 4)
    assert plan.num_processes == 4
    assert plan.sources["num_processes"] == "default (4 devices)"
    cpu = build_plan(_resolve({"use_cpu": True}), "train.py", count_devices=lambda: 4)
    assert cpu.num_processes == 1
    assert cpu.is_single_process


def test_build_plan_normalises_and_derives() -> None:
    resolved = _resolve(
        {"num_processes": 4, "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.0.0.1"},
        {"mixed_precision": "BF16", "dynamo_config": {"dynamo_backend": "inductor"}},
    )
    plan = build_plan(resolved, "t.py", ["--lr", "1"], extra_env={"A": "1"}, rdzv_id="job9")
    assert plan.mixed_precision == "bf16"
    assert plan.dynamo_backend == "INDUCTOR"
    assert plan.nproc_per_node == 2
    assert plan.rdzv_endpoint == "10.0.0.1:29500"
    assert plan.script_args == ("--lr", "1")
    assert plan.extra_env == (("A", "1"),)
    assert plan.rdzv_id == "job9"
    assert not plan.is_single_process


def test_restarts_need_the_elastic_path_even_for_one_process() -> None:
    assert not LaunchPlan("t.py", max_restarts=1).is_single_process


def test_multi_machine_without_main_ip_is_an_error() -> None:
    with pytest.raises(ValueError, match="--main_process_ip"):
        build_plan(_resolve({"num_machines": 2, "num_processes": 2}), "t.py")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"script": ""}, "No training script"),
        ({"module": True, "no_python": True}, "cannot be used together"),
        ({"num_processes": 0}, "num_processes must be >= 1"),
        ({"num_machines": 0}, "num_machines must be >= 1"),
        ({"num_processes": 3, "num_machines": 2}, "must be a multiple of num_machines"),
        ({"num_processes": 2, "num_machines": 2, "machine_rank": 2}, "machine_rank must be in"),
        ({"main_process_port": 70000}, "main_process_port must be in"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"monitor_interval": 0}, "monitor_interval must be > 0"),
        ({"num_cpu_threads_per_process": 0}, "num_cpu_threads_per_process must be >= 1"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be >= 1"),
        ({"mixed_precision": "fp32"}, "Unknown mixed_precision 'fp32'"),
        ({"dynamo_backend": "FAST"}, "Unknown dynamo_backend 'FAST'"),
        ({"rdzv_backend": "zeus"}, "Unknown rdzv_backend 'zeus'"),
    ],
)
def test_invalid_plans_are_clear_errors(kwargs: dict[str, Any], match: str) -> None:
    kwargs = {"script": "t.py", **kwargs}
    with pytest.raises(ValueError, match=match):
        LaunchPlan(**kwargs)


def test_deepspeed_section_gives_accumulation_steps() -> None:
    config = {"deepspeed_config": {"gradient_accumulation_steps": 8}}
    assert _resolve(config=config)["gradient_accumulation_steps"] == Resolved(8, "config file")
    env = {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2"}
    assert _resolve(config=config, environ=env)["gradient_accumulation_steps"].value == 2


def test_a_bad_mixed_precision_names_the_source_it_came_from() -> None:
    resolved = _resolve(config={"mixed_precision": "half"})
    with pytest.raises(
        ValueError,
        match=r"'half' \(from config file\)\. Choose one of \['no', 'fp8'.*change the config file",
    ):
        build_plan(resolved, "train.py")
    assert build_plan(_resolve(flags={"mixed_precision": "BF16"}), "t.py").mixed_precision == "bf16"


def test_more_processes_than_visible_accelerators_is_an_error_naming_both() -> None:
    with pytest.raises(ValueError, match=r"num_processes=2 .*only 1 accelerator\(s\).*--cpu"):
        build_plan(_resolve({"num_processes": 2}), "train.py", count_devices=lambda: 1)
    with pytest.raises(ValueError, match=r"3 processes on this machine, but only 2 accelerator"):
        build_plan(
            _resolve({"num_processes": 3, "gpu_ids": "0,1"}), "train.py", count_devices=lambda: 8
        )


def test_processes_within_the_devices_or_on_cpu_are_fine() -> None:
    assert (
        build_plan(_resolve({"num_processes": 2}), "t.py", count_devices=lambda: 2).num_processes
        == 2
    )
    cpu = _resolve({"num_processes": 4, "use_cpu": True})
    assert build_plan(cpu, "t.py", count_devices=lambda: 1).num_processes == 4
    none = _resolve({"num_processes": 4})
    assert build_plan(none, "t.py", count_devices=lambda: 0).num_processes == 4  # no accelerator
    nodes = _resolve({"num_processes": 4, "num_machines": 2, "main_process_ip": "10.0.0.1"})
    assert build_plan(nodes, "t.py", count_devices=lambda: 2).nproc_per_node == 2
