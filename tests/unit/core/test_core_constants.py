"""core.constants: the on-disk names Accelerate users already have."""

from __future__ import annotations

from hasten.core import constants


def test_checkpoint_names_match_the_reference() -> None:
    assert constants.MODEL_NAME == "pytorch_model"
    assert constants.OPTIMIZER_NAME == "optimizer"
    assert constants.RNG_STATE_NAME == "random_states"
    assert constants.SCALER_NAME == "scaler.pt"
    assert constants.SCHEDULER_NAME == "scheduler"
    assert constants.SAMPLER_NAME == "sampler"
    assert constants.WEIGHTS_NAME == "pytorch_model.bin"
    assert constants.SAFE_WEIGHTS_NAME == "model.safetensors"
    assert constants.SAFE_MODEL_NAME == "model"
    assert constants.WEIGHTS_INDEX_NAME == "pytorch_model.bin.index.json"
    assert constants.SAFE_WEIGHTS_INDEX_NAME == "model.safetensors.index.json"


def test_patterns_format_with_a_suffix() -> None:
    assert constants.WEIGHTS_PATTERN_NAME.format(suffix="_1") == "pytorch_model_1.bin"
    assert constants.SAFE_WEIGHTS_PATTERN_NAME.format(suffix="_1") == "model_1.safetensors"
    assert constants.PROFILE_PATTERN_NAME.format(suffix=0) == "profile_0.json"
    assert "default" in constants.TORCH_DYNAMO_MODES


def test_launcher_and_profiling_constants() -> None:
    assert {"nproc_per_node", "rdzv_backend", "max_restarts"} <= set(constants.TORCH_LAUNCH_PARAMS)
    assert "MULTI_CPU" in constants.TORCH_DISTRIBUTED_OPERATION_TYPES
    assert "NO" not in constants.TORCH_DISTRIBUTED_OPERATION_TYPES
    assert constants.XPU_PROFILING_AVAILABLE_PYTORCH_VERSION == "2.4.0"
    assert constants.MITA_PROFILING_AVAILABLE_PYTORCH_VERSION == "2.1.0"
