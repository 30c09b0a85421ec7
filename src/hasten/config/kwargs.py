"""Kwargs handlers: dataclasses that customise a torch object hasten builds for the user.

Pass them to `Accelerator(kwargs_handlers=[...])`. Each one knows which of its fields the user
changed (`to_kwargs()`), so hasten forwards only those and torch keeps its own defaults for
the rest.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hasten.config import envvars
from hasten.config.enums import DDPCommunicationHookType, ProfilerActivity, enum_value
from hasten.config.handler import KwargsHandler
from hasten.core.constants import PROFILE_PATTERN_NAME

if TYPE_CHECKING:
    import torch

__all__ = [
    "AORecipeKwargs",
    "AmaxComputeAlgorithm",
    "AutocastKwargs",
    "Backend",
    "DistributedDataParallelKwargs",
    "FP8Format",
    "FP8Recipe",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "MSAMPRecipeKwargs",
    "OptLevel",
    "ProfileKwargs",
    "TERecipeKwargs",
]


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    """Customise `torch.autocast` (see its documentation for each argument).

    Example:
        >>> AutocastKwargs(cache_enabled=True).to_kwargs()
        {'cache_enabled': True}
    """

    enabled: bool = True
    cache_enabled: bool | None = None


def _hook_type(value: Any, field_name: str) -> DDPCommunicationHookType:
    if value in DDPCommunicationHookType:
        return DDPCommunicationHookType(value)
    raise ValueError(
        f"DistributedDataParallelKwargs({field_name}={value!r}) is not a known communication "
        f"hook; use one of {DDPCommunicationHookType.list()}"
    )


_POWER_SGD = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
_WRAPPERS = (
    DDPCommunicationHookType.NO,
    DDPCommunicationHookType.FP16,
    DDPCommunicationHookType.BF16,
)


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Customise how a model is wrapped in `torch.nn.parallel.DistributedDataParallel`.

    `comm_hook` compresses gradients before they are all-reduced (fp16, bf16, power_sgd,
    batched_power_sgd); `comm_wrapper` (fp16 or bf16) additionally casts what a power_sgd hook
    sends; `comm_state_option` is passed to `PowerSGDState` (e.g. matrix_approximation_rank).
    The comm_* fields are not DDP constructor arguments, so `to_dict()`/`to_kwargs()` leave
    them out; `register_comm_hook(ddp_model)` applies them.

    Example:
        >>> DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs()
        {'find_unused_parameters': True}
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: Literal[
        DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16
    ] = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = _hook_type(self.comm_hook, "comm_hook")
        wrapper = _hook_type(self.comm_wrapper, "comm_wrapper")
        if wrapper not in _WRAPPERS:
            raise ValueError(
                f"DistributedDataParallelKwargs(comm_wrapper={self.comm_wrapper!r}) is not a "
                f"wrapper; use one of {[w.value for w in _WRAPPERS]}"
            )
        self.comm_wrapper = wrapper  # type: ignore[assignment]
        if (
            wrapper is not DDPCommunicationHookType.NO
            and self.comm_hook is DDPCommunicationHookType.NO
        ):
            raise ValueError(
                f"DistributedDataParallelKwargs(comm_wrapper={wrapper.value!r}) wraps a hook, but "
                "comm_hook is 'no'; also set comm_hook (e.g. 'power_sgd') or drop comm_wrapper"
            )
        if self.comm_state_option and self.comm_hook not in _POWER_SGD:
            raise ValueError(
                f"DistributedDataParallelKwargs(comm_state_option={self.comm_state_option!r}) is "
                f"only used by the power_sgd hooks, but comm_hook={self.comm_hook.value!r}; set "
                "comm_hook='power_sgd' or 'batched_power_sgd', or drop comm_state_option"
            )
        if self.comm_hook in _POWER_SGD:
            _check_power_sgd_options(self.comm_state_option)

    def to_dict(self) -> dict[str, Any]:
        """Return the DDP constructor arguments (the comm_* fields are left out)."""
        values = super().to_dict()
        for name in ("comm_hook", "comm_wrapper", "comm_state_option"):
            values.pop(name)
        return values

    def register_comm_hook(self, model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Register the configured communication hook (and wrapper) on DDP-wrapped `model`.

        Raises:
            TypeError: `model` is not a DistributedDataParallel module.
        """
        if self.comm_hook is DDPCommunicationHookType.NO:
            return
        if not hasattr(model, "register_comm_hook"):
            raise TypeError(
                f"register_comm_hook needs a torch.nn.parallel.DistributedDataParallel model, got "
                f"{type(model).__name__}; wrap the model with DDP first"
            )
        if DDPCommunicationHookType.BF16 in (self.comm_hook, self.comm_wrapper):
            _require_bf16_hook_support(self.comm_hook, self.comm_wrapper)
        hook, state = _build_comm_hook(self.comm_hook, self.comm_wrapper, self.comm_state_option)
        model.register_comm_hook(state=state, hook=hook)


def _require_bf16_hook_support(
    hook: DDPCommunicationHookType, wrapper: DDPCommunicationHookType
) -> None:
    # torch only accepts the bf16 hooks on CUDA/ROCm builds with NCCL >= 2.10 or on XPU with
    # XCCL (DistributedDataParallel._check_comm_hook); say so before DDP does it obscurely.
    import torch
    import torch.distributed as dist

    cuda_build = torch.version.cuda is not None or torch.version.hip is not None
    nccl = cuda_build and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
    xccl = (
        getattr(dist, "is_xccl_available", lambda: False)()
        and hasattr(torch, "xpu")
        and torch.xpu.is_available()
    )
    if not (nccl or xccl):
        raise RuntimeError(
            f"DistributedDataParallelKwargs(comm_hook={enum_value(hook)!r}, "
            f"comm_wrapper={enum_value(wrapper)!r})"
            " needs bf16 all-reduce, which torch only supports with CUDA and NCCL >= 2.10 or XPU "
            "with XCCL; this torch build has neither. Use comm_hook='fp16' (or "
            "comm_wrapper='fp16') instead"
        )


def _check_power_sgd_options(options: dict[str, Any]) -> None:
    # Imported here: torch.distributed's hook modules are only needed when PowerSGD is asked for.
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    allowed = set(inspect.signature(powerSGD_hook.PowerSGDState).parameters) - {"process_group"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"DistributedDataParallelKwargs(comm_state_option=...) has unknown keys {unknown}; "
            f"PowerSGDState accepts {sorted(allowed)}"
        )


def _build_comm_hook(
    hook_type: DDPCommunicationHookType,
    wrapper_type: DDPCommunicationHookType,
    state_option: dict[str, Any],
) -> tuple[Callable[..., Any], Any]:
    # Imported here: only needed when a hook is registered (once, at prepare time).
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks: dict[DDPCommunicationHookType, Callable[..., Any]] = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
        DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
        DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers: dict[DDPCommunicationHookType, Callable[..., Any]] = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
    }
    hook = hooks[hook_type]
    if wrapper_type in wrappers:
        hook = wrappers[wrapper_type](hook)
    state = powerSGD_hook.PowerSGDState(None, **state_option) if hook_type in _POWER_SGD else None
    return hook, state


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    """Customise the `torch.amp.GradScaler` used for fp16 mixed precision.

    Example:
        >>> GradScalerKwargs(backoff_factor=0.25).to_kwargs()
        {'backoff_factor': 0.25}
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.init_scale <= 0:
            raise ValueError(f"GradScalerKwargs(init_scale={self.init_scale!r}) must be > 0")
        if self.growth_factor <= 1.0:
            raise ValueError(
                f"GradScalerKwargs(growth_factor={self.growth_factor!r}) must be > 1.0"
            )
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(
                f"GradScalerKwargs(backoff_factor={self.backoff_factor!r}) must be in (0, 1)"
            )
        if self.growth_interval < 1:
            raise ValueError(
                f"GradScalerKwargs(growth_interval={self.growth_interval!r}) must be >= 1"
            )


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Customise `torch.distributed.init_process_group`.

    `timeout=None` lets hasten use its default (10 minutes), after which a stuck collective
    raises an error naming what every rank was doing instead of hanging.

    Example:
        >>> InitProcessGroupKwargs(timeout=timedelta(seconds=800)).to_kwargs()
        {'timeout': datetime.timedelta(seconds=800)}
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None:
            if not isinstance(self.timeout, timedelta):
                raise TypeError(
                    f"InitProcessGroupKwargs(timeout={self.timeout!r}) must be a "
                    "datetime.timedelta, e.g. timedelta(seconds=800)"
                )
            if self.timeout <= timedelta(0):
                raise ValueError(
                    f"InitProcessGroupKwargs(timeout={self.timeout!r}) must be positive"
                )


_SCHEDULE_REQUIRED = ("wait", "warmup", "active")
_SCHEDULE_OPTIONAL = ("repeat", "skip_first", "skip_first_wait")


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """Customise `torch.profiler.profile`; `build()` returns the profiler.

    Args:
        activities: any of "cpu", "xpu", "mtia", "cuda", "hpu" (None = torch's default).
        schedule_option: keys wait, warmup, active (required), repeat, skip_first,
            skip_first_wait, passed to `torch.profiler.schedule`.
        on_trace_ready: called each time the schedule finishes an active window.
        record_shapes: record operator input shapes.
        profile_memory: track tensor allocations.
        with_stack: record source file and line of each operator.
        with_flops: estimate FLOPs of supported operators.
        with_modules: record the module hierarchy of each operator.
        output_trace_dir: where `export_trace()` writes a Chrome trace per process.

    Example:
        >>> ProfileKwargs(activities=["cpu"], record_shapes=True).to_kwargs()
        {'activities': ['cpu'], 'record_shapes': True}
    """

    activities: list[Literal["cpu", "xpu", "mtia", "cuda", "hpu"]] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def __post_init__(self) -> None:
        for activity in self.activities or ():
            if activity not in ProfilerActivity:
                raise ValueError(
                    f"ProfileKwargs(activities=[..., {activity!r}, ...]) has an unknown activity; "
                    f"use any of {ProfilerActivity.list()}"
                )
        if self.schedule_option is not None:
            missing = [key for key in _SCHEDULE_REQUIRED if key not in self.schedule_option]
            unknown = sorted(
                set(self.schedule_option) - set(_SCHEDULE_REQUIRED) - set(_SCHEDULE_OPTIONAL)
            )
            if missing or unknown:
                raise ValueError(
                    f"ProfileKwargs(schedule_option={self.schedule_option!r}) is missing "
                    f"{missing} / has unknown {unknown}; required keys are "
                    f"{list(_SCHEDULE_REQUIRED)}, optional {list(_SCHEDULE_OPTIONAL)}"
                )

    def _torch_activities(self) -> list[Any] | None:
        from torch.profiler import ProfilerActivity as TorchActivity

        if self.activities is None:
            return None
        result = []
        for activity in self.activities:
            member = getattr(TorchActivity, ProfilerActivity(activity).name, None)
            if member is None:
                raise ValueError(
                    f"ProfileKwargs(activities=[..., {activity!r}, ...]) is not supported by this "
                    f"torch build; available: {[a.lower() for a in TorchActivity.__members__]}"
                )
            result.append(member)
        return result

    def build(self) -> torch.profiler.profile:
        """Build a `torch.profiler.profile` from this configuration."""
        import torch.profiler

        schedule = (
            torch.profiler.schedule(**self.schedule_option)
            if self.schedule_option is not None
            else None
        )
        return torch.profiler.profile(
            activities=self._torch_activities(),
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )

    def trace_path(self, process_index: int = 0) -> Path | None:
        """Return where process `process_index`'s Chrome trace goes (None without a directory)."""
        if self.output_trace_dir is None:
            return None
        return Path(self.output_trace_dir) / PROFILE_PATTERN_NAME.format(suffix=process_index)

    def export_trace(self, profiler: torch.profiler.profile, process_index: int = 0) -> Path | None:
        """Write `profiler`'s Chrome trace to `output_trace_dir/profile_<process_index>.json`.

        Returns the file written, or None when `output_trace_dir` is not set.
        """
        path = self.trace_path(process_index)
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        return path


def _fp8(suffix: str) -> Any:
    return dataclasses.field(default=None, metadata=envvars.env(f"ACCELERATE_FP8_{suffix}"))


_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
#: The fp8 formats a TransformerEngine recipe accepts (Accelerate's type alias).
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]

# Accelerate's type names for the fp8 recipe choices (typing.Literal aliases).
AmaxComputeAlgorithm = Literal["max", "most_recent"]
OptLevel = Literal["O1", "O2"]
Backend = Literal["MSAMP", "TE"]
_AMAX_ALGOS = typing.get_args(AmaxComputeAlgorithm)
_OPT_LEVELS = typing.get_args(OptLevel)
_FP8_BACKENDS = typing.get_args(Backend)


@dataclasses.dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 training with torchao: a `Float8LinearConfig` (or the two options that build one).

    Args:
        config: a ready `torchao.float8.Float8LinearConfig`; None builds one from the options.
        module_filter_func: `(module, fqn) -> bool` choosing which Linear layers become fp8.
        pad_inner_dim: pad inner dimensions to multiples of 16 (ACCELERATE_FP8_PAD_INNER_DIM).
        enable_fsdp_float8_all_gather: all-gather FSDP2 shards in fp8.
    """

    config: Any = None
    module_filter_func: Callable[..., Any] | None = None
    pad_inner_dim: bool | None = _fp8("PAD_INNER_DIM")
    enable_fsdp_float8_all_gather: bool | None = _fp8("ENABLE_FSDP_FLOAT8_ALL_GATHER")

    def __post_init__(self) -> None:
        envvars.fill_from_env(self)

    def build_config(self) -> Any:
        """Return `config`, or a torchao `Float8LinearConfig` built from the options.

        Raises:
            ImportError: torchao is not installed.
        """
        if self.config is not None:
            return self.config
        from hasten.core.imports import require

        # optional: torchao
        float8 = require("torchao.float8", feature="AORecipeKwargs", pip_name="torchao")
        return float8.Float8LinearConfig(
            pad_inner_dim=self.pad_inner_dim,
            enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather,
        )


@dataclasses.dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 training with NVIDIA TransformerEngine: the delayed-scaling recipe.

    Unset fields come from the ACCELERATE_FP8_* variables. `override_linear_precision` is a
    (fprop, dgrad, wgrad) triple of "keep this GEMM in higher precision" flags.
    """

    use_autocast_during_eval: bool | None = _fp8("USE_AUTOCAST_DURING_EVAL")
    margin: int | None = _fp8("MARGIN")
    interval: int | None = _fp8("INTERVAL")
    fp8_format: str | None = _fp8("FORMAT")
    amax_history_len: int | None = _fp8("AMAX_HISTORY_LEN")
    amax_compute_algo: str | None = _fp8("AMAX_COMPUTE_ALGO")
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = _fp8("USE_MXFP8_BLOCK_SCALING")

    def __post_init__(self) -> None:
        envvars.fill_from_env(self)
        self.fp8_format = enum_value(self.fp8_format).upper()
        if self.fp8_format not in _FP8_FORMATS:
            raise ValueError(
                f"{type(self).__name__}(fp8_format={self.fp8_format!r}) must be one of "
                f"{list(_FP8_FORMATS)}"
            )
        self.amax_compute_algo = enum_value(self.amax_compute_algo).lower()
        if self.amax_compute_algo not in _AMAX_ALGOS:
            raise ValueError(
                f"{type(self).__name__}(amax_compute_algo={self.amax_compute_algo!r}) must be one "
                f"of {list(_AMAX_ALGOS)}"
            )
        if self.override_linear_precision is None:
            self.override_linear_precision = (
                envvars.setting("ACCELERATE_FP8_OVERRIDE_FPROP"),
                envvars.setting("ACCELERATE_FP8_OVERRIDE_DGRAD"),
                envvars.setting("ACCELERATE_FP8_OVERRIDE_WGRAD"),
            )
        if len(tuple(self.override_linear_precision)) != 3:
            raise ValueError(
                f"{type(self).__name__}(override_linear_precision="
                f"{self.override_linear_precision!r}) must be three booleans (fprop, dgrad, wgrad)"
            )

    def to_kwargs(self) -> dict[str, Any]:
        """Return the changed fields; (False, False, False) precision overrides are the default."""
        kwargs = super().to_kwargs()
        if tuple(kwargs.get("override_linear_precision", (True,))) == (False, False, False):
            del kwargs["override_linear_precision"]
        return kwargs


@dataclasses.dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """fp8 training with MS-AMP: its optimisation level, "O1" or "O2"."""

    opt_level: str | None = _fp8("OPT_LEVEL")

    def __post_init__(self) -> None:
        envvars.fill_from_env(self)
        self.opt_level = enum_value(self.opt_level).upper()
        if self.opt_level not in _OPT_LEVELS:
            raise ValueError(
                f"{type(self).__name__}(opt_level={self.opt_level!r}) must be one of "
                f"{list(_OPT_LEVELS)}"
            )


@dataclasses.dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated: one class for TE and MS-AMP recipes; use TERecipeKwargs or MSAMPRecipeKwargs.

    `backend` ("TE" or "MSAMP") defaults to ACCELERATE_FP8_BACKEND, else MSAMP when installed.
    """

    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated; use TERecipeKwargs or MSAMPRecipeKwargs",
            FutureWarning,
            stacklevel=3,
        )
        from hasten.core.imports import is_msamp_available

        if self.backend is None:
            fallback = "MSAMP" if is_msamp_available() else "TE"
            self.backend = envvars.setting("ACCELERATE_FP8_BACKEND") or fallback
        self.backend = enum_value(self.backend).upper()
        if self.backend not in _FP8_BACKENDS:
            raise ValueError(
                f"FP8RecipeKwargs(backend={self.backend!r}) must be 'MSAMP' or 'TE'; for torchao "
                "use AORecipeKwargs"
            )
        TERecipeKwargs.__post_init__(self)
        MSAMPRecipeKwargs.__post_init__(self)


#: Any fp8 recipe handler (`FP8RecipeKwargs` is both a TE and an MS-AMP recipe).
FP8Recipe = AORecipeKwargs | TERecipeKwargs | MSAMPRecipeKwargs
