from __future__ import annotations

import os

import pytest

from hasten.config import envvars
from hasten.launchers.env import apply_worker_env, plugin_env, worker_env
from hasten.launchers.plan import LaunchPlan


def test_worker_env_carries_every_setting_under_the_state_names() -> None:
    plan = LaunchPlan(
        "t.py",
        num_processes=2,
        use_cpu=True,
        mixed_precision="bf16",
        gradient_accumulation_steps=4,
        dynamo_backend="INDUCTOR",
        dynamo_mode="max-autotune",
        dynamo_use_fullgraph=True,
        debug=True,
        enable_cpu_affinity=True,
    )
    env = worker_env(plan, environ={})
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_USE_CPU"] == "true"
    assert env["ACCELERATE_DEBUG_MODE"] == "true"
    assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert env["ACCELERATE_DYNAMO_MODE"] == "max-autotune"
    assert env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] == "true"
    assert env["ACCELERATE_DYNAMO_USE_DYNAMIC"] == "false"
    assert env["ACCELERATE_CPU_AFFINITY"] == "1"
    # Every name is one the state reads through the env table, parsed back to the same value.
    for name, value in env.items():
        if name in envvars.ENV_VARS and name != "OMP_NUM_THREADS":
            envvars.setting(name, {name: value})
    assert envvars.setting("ACCELERATE_USE_CPU", env) is True
    assert envvars.setting("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", env) == 4


def test_threads_split_the_cores_unless_the_user_chose() -> None:
    plan = LaunchPlan("t.py", num_processes=2)
    expected = str(max(1, (os.cpu_count() or 1) // 2))
    assert worker_env(plan, environ={})["OMP_NUM_THREADS"] == expected
    assert "OMP_NUM_THREADS" not in worker_env(plan, environ={"OMP_NUM_THREADS": "3"})
    explicit = LaunchPlan("t.py", num_processes=2, num_cpu_threads_per_process=5)
    assert worker_env(explicit, environ={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "5"
    assert "OMP_NUM_THREADS" not in worker_env(LaunchPlan("t.py"), environ={})


def test_gpu_ids_and_user_env_come_last() -> None:
    plan = LaunchPlan(
        "t.py",
        gpu_ids="0,2",
        extra_env=(("ACCELERATE_MIXED_PRECISION", "fp16"), ("NCCL_DEBUG", "INFO")),
    )
    env = worker_env(plan, environ={}, plugin_values={"ACCELERATE_USE_FSDP": "true"})
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"  # --env wins over the plan
    assert env["ACCELERATE_USE_FSDP"] == "true"


def test_plugin_env_maps_engine_sections() -> None:
    config = {
        "distributed_type": "FSDP",
        "fsdp_config": {
            "fsdp_sharding_strategy": "SHARD_GRAD_OP",
            "fsdp_offload_params": True,
            "fsdp_transformer_layer_cls_to_wrap": ["Block", "Head"],
            "fsdp_unknown_key": 1,
        },
        "deepspeed_config": {"zero_stage": 3, "zero3_init_flag": False},
    }
    env = plugin_env(config)
    assert env == {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
        "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block,Head",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false",
    }
    assert plugin_env({"distributed_type": "MULTI_GPU"}) == {}


def test_apply_worker_env_writes_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    apply_worker_env({"ACCELERATE_MIXED_PRECISION": "fp16"})
    assert envvars.read("ACCELERATE_MIXED_PRECISION") == "fp16"


def test_fp8_config_section_becomes_fp8_variables() -> None:
    config = {
        "fp8_config": {
            "backend": "TE",
            "fp8_format": "E4M3",
            "amax_history_len": 16,
            "override_linear_precision": [False, False, True],
            "opt_level": "O1",
            "not_a_setting": 3,
        }
    }
    assert plugin_env(config) == {
        "ACCELERATE_FP8_BACKEND": "TE",
        "ACCELERATE_FP8_FORMAT": "E4M3",
        "ACCELERATE_FP8_AMAX_HISTORY_LEN": "16",
        "ACCELERATE_FP8_OVERRIDE_FPROP": "False",
        "ACCELERATE_FP8_OVERRIDE_DGRAD": "False",
        "ACCELERATE_FP8_OVERRIDE_WGRAD": "True",
        "ACCELERATE_FP8_OPT_LEVEL": "O1",
    }


def test_setup_fp8_env_sets_only_given_flags() -> None:
    import argparse

    from hasten.launchers.env import setup_fp8_env

    args = argparse.Namespace(
        fp8_backend="ao",
        fp8_margin=None,
        fp8_format="E5M2",
        fp8_use_autocast_during_eval=True,
        fp8_override_linear_precision="false,true,false",
        mixed_precision="fp8",
    )
    env = setup_fp8_env(args, {"KEEP": "1"})
    assert env == {
        "KEEP": "1",
        "ACCELERATE_FP8_BACKEND": "AO",
        "ACCELERATE_FP8_FORMAT": "E5M2",
        "ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL": "true",
        "ACCELERATE_FP8_OVERRIDE_FPROP": "false",
        "ACCELERATE_FP8_OVERRIDE_DGRAD": "true",
        "ACCELERATE_FP8_OVERRIDE_WGRAD": "false",
    }
    with pytest.raises(ValueError, match=r"must be three booleans"):
        setup_fp8_env(argparse.Namespace(fp8_override_linear_precision="true"), {})


def test_accumulation_steps_are_passed_only_when_asked_for() -> None:
    from hasten.launchers.plan import build_plan, resolve_settings

    def env_of(flags: dict[str, object]) -> dict[str, str]:
        resolved = resolve_settings(flags, None, {})
        return worker_env(build_plan(resolved, "t.py", count_devices=lambda: 0), environ={})

    # a default 1 would be an explicit DeepSpeed value contradicting the script's Accelerator
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env_of({})
    assert (
        env_of({"gradient_accumulation_steps": 1})["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "1"
    )
    assert (
        env_of({"gradient_accumulation_steps": 3})["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "3"
    )


def test_cpu_launch_sets_intel_openmp_pinning_unless_the_user_did() -> None:
    # Accelerate's test_cpu_launch_sets_kmp_env: `launch --cpu` sets both, a launch without leaves them
    cpu = worker_env(LaunchPlan("t.py", use_cpu=True), environ={})
    assert cpu["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and cpu["KMP_BLOCKTIME"] == "1"
    assert "KMP_AFFINITY" not in worker_env(LaunchPlan("t.py"), environ={})
    mine = worker_env(LaunchPlan("t.py", use_cpu=True), environ={"KMP_BLOCKTIME": "200"})
    assert "KMP_BLOCKTIME" not in mine and mine["KMP_AFFINITY"]
