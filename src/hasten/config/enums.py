"""The named choices a user can make (distributed type, precision, trackers, ...), as str enums.

Every enum here is a `str` subclass, so members compare equal to their values
(`PrecisionType.FP16 == "fp16"`, both ways), hash like them (dict lookups by string work), and
`"fp16" in PrecisionType` works on every Python version. They print like Accelerate's:
`str()` and `format()` give ``"DistributedType.MULTI_CPU"``, `repr()` gives
``<DistributedType.MULTI_CPU: 'MULTI_CPU'>``. Code that needs the bare value (environment
variables, config files, messages) uses `.value` or `enum_value()`.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "BaseEnum",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DistributedType",
    "DynamoBackend",
    "EnumWithContains",
    "FP8BackendType",
    "LoggerType",
    "PrecisionType",
    "ProfilerActivity",
    "RNGType",
    "SageMakerDistributedType",
    "enum_value",
    "parse_mixed_precision",
]


class _ValueContainsMeta(enum.EnumMeta):
    """Let `value in EnumClass` test values as well as members (Python < 3.12 raises instead)."""

    def __contains__(cls, item: object) -> bool:
        if isinstance(item, cls):
            return True
        try:
            cls(item)
        except ValueError:
            return False
        return True


# Accelerate's public names for the two: the metaclass and the base of every str enum.
EnumWithContains = _ValueContainsMeta


def enum_value(value: Any) -> str:
    """Return the bare string of ``value``: a member's ``.value``, anything else's `str()`.

    Use it wherever a setting becomes text (env vars, config files, comparisons by spelling):
    `str()` of some members is ``"Class.MEMBER"``, as in Accelerate.
    """
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


class _StrEnum(str, enum.Enum, metaclass=_ValueContainsMeta):
    """Base of every hasten enum: a str equal to its value, printed ``Class.MEMBER`` (as
    Accelerate's enums that are not ``BaseEnum``s: DistributedType, ComputeEnvironment, ...)."""

    # Spelled out (not left to EnumType) so every Python version prints the same.
    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, format_spec: str) -> str:
        return format(str(self), format_spec)

    __hash__ = str.__hash__

    @classmethod
    def list(cls) -> list[str]:
        """Return the values of every member, in declaration order."""
        return [str(member.value) for member in cls]

    @classmethod
    def _missing_(cls, value: Any) -> Any:
        # Accept the same spelling in another case ("fp16" / "FP16") so config files and env vars
        # written by hand keep working; the canonical member is returned.
        if isinstance(value, str):
            for member in cls:
                if member.value.lower() == value.lower():
                    return member
        # Raised from here, this replaces Enum's bare "'x' is not a valid Y" message.
        raise ValueError(
            f"{value!r} is not a valid {cls.__name__}; use one of {cls.list()} (any case)."
        )


class _ValueStrEnum(_StrEnum):
    """An enum that prints as its value, like those Accelerate derives from its ``BaseEnum``
    (``str(PrecisionType.BF16) == "bf16"``; transformers and trl build strings from them)."""

    def __str__(self) -> str:
        return str(self.value)


BaseEnum = _ValueStrEnum


class ComputeEnvironment(_StrEnum):
    """Where the job runs.

    Values: LOCAL_MACHINE (private or custom cluster hardware), AMAZON_SAGEMAKER.
    """

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class DistributedType(_StrEnum):
    """How the processes of a job are organised: a label derived from platform x strategy.

    NO is a single process; MULTI_<FAMILY> is plain data parallelism on that hardware family;
    DEEPSPEED, FSDP, XLA and MEGATRON_LM name the engine in charge.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


class SageMakerDistributedType(_StrEnum):
    """Distributed mode on Amazon SageMaker: NO, DATA_PARALLEL or MODEL_PARALLEL."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(_StrEnum):
    """Library that implements fp8 training: TransformerEngine (TE), MS-AMP or torchao (AO)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class DynamoBackend(_ValueStrEnum):
    """Backend handed to `torch.compile` (see https://pytorch.org/docs/stable/torch.compiler.html).

    NO disables compilation; INDUCTOR is PyTorch's default compiler; EAGER and AOT_EAGER are
    debugging backends; the others name third-party or hardware-specific compilers.
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class LoggerType(_ValueStrEnum):
    """Experiment trackers hasten can log to; ALL means every one that is installed."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class PrecisionType(_ValueStrEnum):
    """Numeric policy: NO (full fp32), FP8, FP16 (half) or BF16 (brain float)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


def parse_mixed_precision(value: Any, source: str, fix: str = "pass one of them") -> str:
    """Return the mode (``"no"``, ``"fp8"``, ``"fp16"`` or ``"bf16"``) that ``value`` names.

    The one check of a mixed-precision setting, wherever it comes from (the Accelerator
    argument, ``ACCELERATE_MIXED_PRECISION``, a config file, a launcher): a `PrecisionType` or
    its value in any case.

    Args:
        value: the setting as given.
        source: where it came from, for the message (``"Accelerator(mixed_precision=...)"``).
        fix: how to put it right there.

    Raises:
        ValueError: ``value`` names no mode; says where it came from, the allowed values and
            the fix.
    """
    allowed = [member.value for member in PrecisionType]
    text = enum_value(value).strip().lower()
    if text in allowed:
        return text
    raise ValueError(
        f"Unknown mixed_precision {value!r} (from {source}). Choose one of {allowed} "
        f"(any case): {fix}."
    )


class RNGType(_ValueStrEnum):
    """Random number generators that can be synchronised across processes."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DDPCommunicationHookType(_ValueStrEnum):
    """Gradient communication hook registered on a DistributedDataParallel model."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class CustomDtype(_StrEnum):
    """Sub-byte or non-torch dtypes understood when sizing modules for a device map."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class ProfilerActivity(_StrEnum):
    """Device activity a `ProfileKwargs` profiler records."""

    CPU = "cpu"
    XPU = "xpu"
    MTIA = "mtia"
    CUDA = "cuda"
    HPU = "hpu"
