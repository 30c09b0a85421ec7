"""config.enums: members, values, str behaviour, list() and value membership."""

from __future__ import annotations

import json

import pytest

from hasten.config import enums
from hasten.config.enums import (
    ComputeEnvironment,
    CustomDtype,
    DDPCommunicationHookType,
    DistributedType,
    DynamoBackend,
    LoggerType,
    PrecisionType,
    RNGType,
    SageMakerDistributedType,
)

EXPECTED = {
    DistributedType: [
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_SDAA",
        "MULTI_MUSA",
        "MULTI_XPU",
        "DEEPSPEED",
        "FSDP",
        "XLA",
        "MEGATRON_LM",
        "MULTI_HPU",
        "MULTI_NEURON",
    ],
    DDPCommunicationHookType: ["no", "fp16", "bf16", "power_sgd", "batched_power_sgd"],
    RNGType: [
        "torch",
        "cuda",
        "mlu",
        "sdaa",
        "musa",
        "npu",
        "xla",
        "xpu",
        "hpu",
        "neuron",
        "generator",
    ],
    PrecisionType: ["no", "fp8", "fp16", "bf16"],
    LoggerType: [
        "all",
        "aim",
        "tensorboard",
        "wandb",
        "trackio",
        "comet_ml",
        "mlflow",
        "clearml",
        "dvclive",
        "swanlab",
    ],
    CustomDtype: ["fp8", "int4", "int2"],
    ComputeEnvironment: ["LOCAL_MACHINE", "AMAZON_SAGEMAKER"],
    SageMakerDistributedType: ["NO", "DATA_PARALLEL", "MODEL_PARALLEL"],
}


@pytest.mark.parametrize("enum_cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_values_and_list(enum_cls: type) -> None:
    assert enum_cls.list() == EXPECTED[enum_cls]  # type: ignore[attr-defined]


def test_dynamo_backends() -> None:
    assert DynamoBackend.list()[:4] == ["NO", "EAGER", "AOT_EAGER", "INDUCTOR"]
    assert {"TVM", "HPU_BACKEND", "NEURON", "TORCHXLA_TRACE_ONCE"} <= set(DynamoBackend.list())


def test_members_are_strings_equal_to_their_values() -> None:
    assert PrecisionType.FP16 == "fp16"
    assert isinstance(DistributedType.MULTI_GPU, str)
    assert str(LoggerType.COMETML) == "comet_ml"
    assert f"{DistributedType.MULTI_CPU}" == "MULTI_CPU"
    assert f"{PrecisionType.BF16:>6}" == "  bf16"
    assert json.dumps({"mp": PrecisionType.BF16}) == '{"mp": "bf16"}'


def test_value_membership() -> None:
    assert "fp16" in PrecisionType
    assert PrecisionType.NO in PrecisionType
    assert "fp64" not in PrecisionType
    assert 3 not in PrecisionType
    assert ["unhashable"] not in PrecisionType


def test_lookup_is_case_insensitive() -> None:
    assert PrecisionType("FP16") is PrecisionType.FP16
    assert DynamoBackend("inductor") is DynamoBackend.INDUCTOR
    assert DistributedType("multi_gpu") is DistributedType.MULTI_GPU
    with pytest.raises(
        ValueError,
        match=r"'nope' is not a valid PrecisionType; use one of \['no', 'fp8', 'fp16', 'bf16'\]",
    ):
        PrecisionType("nope")
    with pytest.raises(ValueError, match=r"3 is not a valid DistributedType; use one of \['NO', "):
        DistributedType(3)  # type: ignore[arg-type]


def test_all_is_sorted_and_complete() -> None:
    assert enums.__all__ == sorted(enums.__all__)
    for name in enums.__all__:
        assert hasattr(enums, name)
