"""config.enums: members, values, str behaviour, list() and value membership."""

from __future__ import annotations

import enum
import json
from typing import Any

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
    enum_value,
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
    assert "fp16" == PrecisionType.FP16  # noqa: SIM300 - the reflected comparison is tested
    assert PrecisionType.FP16 != "bf16"
    assert isinstance(DistributedType.MULTI_GPU, str)
    assert json.dumps({"mp": PrecisionType.BF16}) == '{"mp": "bf16"}'
    assert PrecisionType.BF16.lower() == "bf16"
    assert "-".join([LoggerType.COMETML]) == "comet_ml"


ALL_ENUMS = [
    getattr(enums, name)
    for name in enums.__all__
    if isinstance(getattr(enums, name), type)
    and issubclass(getattr(enums, name), enum.Enum)
    and getattr(enums, name) is not enums.BaseEnum  # the base, with no members
]


# Accelerate 1.15 derives these from its BaseEnum, whose __str__ is the value.
_PRINT_VALUE = (DDPCommunicationHookType, DynamoBackend, LoggerType, PrecisionType, RNGType)


def test_every_enum_is_covered() -> None:
    assert len(ALL_ENUMS) == 11


@pytest.mark.parametrize("enum_cls", ALL_ENUMS, ids=lambda c: c.__name__)
def test_members_print_like_accelerate(enum_cls: Any) -> None:
    # Accelerate's (str, Enum)s: str/format name the member; its BaseEnum subclasses print the
    # value. repr shows the value either way.
    for member in enum_cls:
        expected = f"{enum_cls.__name__}.{member.name}"
        if enum_cls in _PRINT_VALUE:
            expected = member.value
        assert str(member) == expected
        assert f"{member}" == expected
        assert format(member, ">60") == expected.rjust(60)
        assert "{}".format(member) == expected  # noqa: UP032 - str.format is tested
        assert "%s" % member == expected  # noqa: UP031 - the %-format path is what is tested
        assert repr(member) == f"<{enum_cls.__name__}.{member.name}: {member.value!r}>"
        assert enum_value(member) == member.value


@pytest.mark.parametrize("enum_cls", ALL_ENUMS, ids=lambda c: c.__name__)
def test_members_hash_and_compare_like_their_values(enum_cls: Any) -> None:
    for member in enum_cls:
        value = member.value
        assert member == value and value == member
        assert hash(member) == hash(value)
        assert {value: 1}[member] == 1
        assert {member: 2}[value] == 2
        assert value in {member}
        assert enum_cls(value) is member


def test_accelerate_spellings() -> None:
    assert str(DistributedType.MULTI_CPU) == "DistributedType.MULTI_CPU"
    assert repr(DistributedType.MULTI_CPU) == "<DistributedType.MULTI_CPU: 'MULTI_CPU'>"
    # Accelerate's BaseEnum subclasses print their value (str and format).
    assert str(PrecisionType.BF16) == "bf16" and f"{PrecisionType.BF16}" == "bf16"
    assert str(DynamoBackend.INDUCTOR) == "INDUCTOR" and f"{LoggerType.ALL:>4}" == " all"
    assert str(RNGType.TORCH) == "torch" and str(DDPCommunicationHookType.FP16) == "fp16"
    assert str(CustomDtype.FP8) == "CustomDtype.FP8"
    assert enum_value("plain") == "plain" and enum_value(3) == "3"


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


def test_parse_mixed_precision_is_the_one_check() -> None:
    assert enums.parse_mixed_precision(enums.PrecisionType.BF16, "x") == "bf16"
    assert enums.parse_mixed_precision(" FP16 ", "x") == "fp16"
    with pytest.raises(
        ValueError,
        match=r"Unknown mixed_precision 'fp32' \(from the flag\)\. Choose one of "
        r"\['no', 'fp8', 'fp16', 'bf16'\] \(any case\): use bf16\.",
    ):
        enums.parse_mixed_precision("fp32", "the flag", "use bf16")


def test_the_environment_variable_is_checked_by_its_table_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hasten.config import envvars

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    assert envvars.setting("ACCELERATE_MIXED_PRECISION") == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "half")
    with pytest.raises(
        ValueError,
        match=r"ACCELERATE_MIXED_PRECISION='half'.*\(from ACCELERATE_MIXED_PRECISION\)\. Choose "
        r"one of \['no', 'fp8', 'fp16', 'bf16'\].*unset it",
    ):
        envvars.setting("ACCELERATE_MIXED_PRECISION")
