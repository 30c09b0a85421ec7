"""FullyShardedDataParallelPlugin: the user's FSDP request, validated and normalised.

Strings (from the user, a config file or the FSDP_* variables) are turned into the torch FSDP
objects the FSDP engine will need, so a bad value fails here, at construction, with the list of
allowed values. Nothing here touches devices or wraps a model.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

from hasten.config import envvars
from hasten.core.coerce import whole_number
from hasten.core.constants import FSDP2_PYTORCH_VERSION
from hasten.core.versions import is_torch_version

if TYPE_CHECKING:
    import torch

__all__ = [
    "FSDP2_STATE_DICT_TYPE",
    "FSDP_AUTO_WRAP_POLICY",
    "FSDP_BACKWARD_PREFETCH",
    "FSDP_SHARDING_STRATEGY",
    "FSDP_STATE_DICT_TYPE",
    "FullyShardedDataParallelPlugin",
    "bind_wrap_policy",
    "get_module_class_from_name",
    "model_no_split",
]

# Names in the order of torch's enum values (ShardingStrategy.FULL_SHARD == 1, ...).
FSDP_SHARDING_STRATEGY = [
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]

_MIXED_PRECISION_NAMES = ("fp8", "fp16", "bf16", "fp32")


def _dtype_for(name: str) -> torch.dtype:
    import torch

    # fp8 training keeps FSDP's own buffers in bf16; the fp8 maths happens in the fp8 backend.
    return {
        "fp8": torch.bfloat16,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "fp32": torch.float32,
    }[name]


def _to_enum(enum_cls: Any, value: Any, names: list[str], field_name: str) -> Any:
    """Turn a name (any case) or a 1-based index into member `enum_cls`."""
    if isinstance(value, enum_cls):
        return value
    text = str(value).strip().upper()
    if text in names:
        return enum_cls(names.index(text) + 1)
    if text.isdigit() and 1 <= int(text) <= len(names):
        return enum_cls(int(text))
    raise ValueError(
        f"FullyShardedDataParallelPlugin({field_name}={value!r}) is not valid; use one of "
        f"{names} (any case) or a {enum_cls.__name__}"
    )


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type | None:
    """Return the class called `name` among `module` and its submodules, or None."""
    for submodule in module.modules():
        if type(submodule).__name__ == name:
            return type(submodule)
    return None


def bind_wrap_policy(
    policy: Callable[..., bool] | None,
    class_names: Iterable[str] | None,
    min_num_params: int | None,
    model: torch.nn.Module,
) -> Callable[..., bool] | None:
    """A wrap ``policy`` bound to ``model``: torch's transformer policy over the classes named in
    ``class_names`` (default: ``model._no_split_modules``), its size policy over
    ``min_num_params`` (None when 0), any other policy as it is.

    Raises:
        ValueError: a layer class name is not used anywhere in ``model``.
    """
    from torch.distributed.fsdp.wrap import (
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    if policy is transformer_auto_wrap_policy:
        names = class_names if class_names is not None else model_no_split(model)
        classes = set()
        for name in names:
            found = get_module_class_from_name(model, name)
            if found is None:
                present = sorted({type(m).__name__ for m in model.modules()})
                raise ValueError(
                    f"transformer_cls_names_to_wrap has {name!r}, which is not a layer class "
                    f"of this model; classes present: {present}"
                )
            classes.add(found)
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    if policy is size_based_auto_wrap_policy:
        if not min_num_params:
            return None
        return functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params)
    return policy


def model_no_split(model: torch.nn.Module) -> list[str]:
    """The layer class names ``model`` declares as not to be split (``_no_split_modules``)."""
    return list(getattr(model, "_no_split_modules", None) or [])


@dataclasses.dataclass
class FullyShardedDataParallelPlugin:
    """What the user wants from Fully Sharded Data Parallel (FSDP1 or FSDP2).

    Unset fields default from the FSDP_* environment variables written by `hasten launch`.
    String values are validated and converted to torch's FSDP types: `sharding_strategy` /
    `reshard_after_forward` (FSDP1: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD,
    HYBRID_SHARD_ZERO2; FSDP2: a bool), `backward_prefetch` (BACKWARD_PRE, BACKWARD_POST,
    NO_PREFETCH), `state_dict_type` (FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT),
    `auto_wrap_policy` (transformer_based_wrap, size_based_wrap, no_wrap, or a callable),
    `mixed_precision_policy` (fp8/fp16/bf16/fp32, a dict of dtypes or a torch policy) and
    `cpu_offload` (a bool or a torch offload policy).

    `cpu_ram_efficient_loading` (FSDP2): rank 0's weights are broadcast into every process's
    shards, so the other ranks may build the model on meta and never hold a full copy. For a
    plain model build it under `init_empty_weights()` off the main process; transformers'
    ``from_pretrained`` does that by itself (it reads ``FSDP_CPU_RAM_EFFICIENT_LOADING`` and
    ``ACCELERATE_USE_FSDP``, which this plugin and the Accelerator set). Peak host memory of
    ``prepare`` (benchmarks/bench_fsdp_memory.py): rank 0 the model plus its shard, the others
    their shard plus one tensor.
    """

    fsdp_version: int = None  # type: ignore[assignment]
    sharding_strategy: str | Any = None
    reshard_after_forward: str | Any | bool = None
    backward_prefetch: str | Any | None = None
    mixed_precision_policy: dict[str, Any] | str | Any | None = None
    auto_wrap_policy: (
        Callable[..., Any] | Literal["transformer_based_wrap", "size_based_wrap", "no_wrap"] | None
    ) = None
    cpu_offload: bool | Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: str | Any = None
    state_dict_config: Any | None = None
    optim_state_dict_config: Any | None = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool = None  # type: ignore[assignment]
    activation_checkpointing: bool = None  # type: ignore[assignment]
    activation_checkpointing_offload: bool = None  # type: ignore[assignment]
    cpu_ram_efficient_loading: bool = None  # type: ignore[assignment]
    transformer_cls_names_to_wrap: list[str] | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        notes: list[str] = []
        self._resolve_version()
        self._resolve_sharding(notes)
        self._resolve_cpu_offload()
        self._resolve_backward_prefetch(notes)
        self.set_state_dict_type()
        self._resolve_auto_wrap_policy(notes)
        self._resolve_flags(notes)
        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)
        elif isinstance(self.mixed_precision_policy, dict):
            self.set_mixed_precision(self.mixed_precision_policy)
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()
        if notes:
            warnings.warn("; ".join(notes), UserWarning, stacklevel=3)

    # --- normalisation steps (each reads its FSDP_* variable when the field is unset) -------

    def _resolve_version(self) -> None:
        if self.fsdp_version is None:
            self.fsdp_version = envvars.setting("FSDP_VERSION")
        if isinstance(self.fsdp_version, str) and self.fsdp_version.strip() in ("1", "2"):
            self.fsdp_version = int(self.fsdp_version)  # as from a config file or the CLI
        elif whole_number(self.fsdp_version) in (1, 2):
            self.fsdp_version = whole_number(self.fsdp_version)  # type: ignore[assignment]
        if self.fsdp_version not in (1, 2) or isinstance(self.fsdp_version, bool):
            raise ValueError(
                f"FullyShardedDataParallelPlugin(fsdp_version={self.fsdp_version!r}) must be 1 or 2"
            )
        if self.fsdp_version == 2 and not is_torch_version(">=", FSDP2_PYTORCH_VERSION):
            import torch

            raise ImportError(
                f"FullyShardedDataParallelPlugin(fsdp_version=2) needs torch >= "
                f"{FSDP2_PYTORCH_VERSION} (torch.distributed.fsdp.fully_shard); this is torch "
                f"{torch.__version__}. Upgrade torch or use fsdp_version=1."
            )

    def _resolve_sharding(self, notes: list[str]) -> None:

        if self.fsdp_version == 1:
            self._resolve_fsdp1_sharding()
            return
        if self.sharding_strategy is not None:
            notes.append("sharding_strategy is deprecated with FSDP2; use reshard_after_forward")
        if self.reshard_after_forward is None and self.sharding_strategy is None:
            self.reshard_after_forward = envvars.read("FSDP_RESHARD_AFTER_FORWARD", "true")
        value = self.reshard_after_forward
        if value is None:
            raise ValueError(
                f"FullyShardedDataParallelPlugin(sharding_strategy={self.sharding_strategy!r}) is "
                "FSDP1's setting; with fsdp_version=2 set reshard_after_forward instead: True "
                "(like FULL_SHARD) or False (like SHARD_GRAD_OP)"
            )
        if isinstance(value, str):
            try:
                value = envvars.parse_bool(value)
            except ValueError:
                pass
        if not isinstance(value, bool):
            raise ValueError(
                f"FullyShardedDataParallelPlugin(reshard_after_forward={value!r}) must be a "
                "bool with fsdp_version=2 (True = reshard after forward, like FULL_SHARD)"
            )
        self.reshard_after_forward = value

    def _resolve_fsdp1_sharding(self) -> None:
        """FSDP1: ``sharding_strategy`` or its newer name ``reshard_after_forward`` (a strategy
        too), whichever is given; neither: the launcher's variables, else FULL_SHARD."""
        from torch.distributed.fsdp import ShardingStrategy

        if isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"FullyShardedDataParallelPlugin(reshard_after_forward="
                f"{self.reshard_after_forward!r}) must be a sharding strategy with "
                f"fsdp_version=1: one of {FSDP_SHARDING_STRATEGY}"
            )
        if self.sharding_strategy is None and self.reshard_after_forward is None:
            self.sharding_strategy = envvars.read("FSDP_SHARDING_STRATEGY")
            self.reshard_after_forward = envvars.read("FSDP_RESHARD_AFTER_FORWARD")
            if self.sharding_strategy is None and self.reshard_after_forward is None:
                self.sharding_strategy = "FULL_SHARD"
        for name in ("sharding_strategy", "reshard_after_forward"):
            if getattr(self, name) is not None:
                value = _to_enum(
                    ShardingStrategy, getattr(self, name), FSDP_SHARDING_STRATEGY, name
                )
                setattr(self, name, value)
        given: tuple[Any, Any] = (self.sharding_strategy, self.reshard_after_forward)
        if None not in given and given[0] != given[1]:
            raise ValueError(
                f"FullyShardedDataParallelPlugin(sharding_strategy={given[0].name}, "
                f"reshard_after_forward={given[1].name}) disagree: with fsdp_version=1 they are "
                "one setting (reshard_after_forward is the newer name); give only one of them "
                "(fsdp_sharding_strategy / fsdp_reshard_after_forward)"
            )

    def _resolve_cpu_offload(self) -> None:
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        if self.cpu_offload is None:
            self.cpu_offload = envvars.setting("FSDP_OFFLOAD_PARAMS")
        if isinstance(self.cpu_offload, bool):
            # a bare request: the strategy may drop pinning where no accelerator can pin
            self._cpu_offload_from_bool = self.cpu_offload
            if self.fsdp_version == 2:
                self.cpu_offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
            else:
                self.cpu_offload = CPUOffload(offload_params=self.cpu_offload)
        expected: type = OffloadPolicy if self.fsdp_version == 2 else CPUOffload
        if not isinstance(self.cpu_offload, expected):
            raise ValueError(
                f"FullyShardedDataParallelPlugin(cpu_offload={self.cpu_offload!r}) must be a bool "
                f"or a torch.distributed.fsdp.{expected.__name__} with "
                f"fsdp_version={self.fsdp_version}"
            )

    def _resolve_backward_prefetch(self, notes: list[str]) -> None:
        from torch.distributed.fsdp import BackwardPrefetch

        if self.backward_prefetch is None:
            self.backward_prefetch = envvars.setting("FSDP_BACKWARD_PREFETCH")
        value = self.backward_prefetch
        if isinstance(value, str) and value.strip().upper() == "NO_PREFETCH":
            value = None
        if value is not None:
            value = _to_enum(
                BackwardPrefetch, value, FSDP_BACKWARD_PREFETCH[:2], "backward_prefetch"
            )
            if self.fsdp_version == 2:
                notes.append("backward_prefetch is not supported by FSDP2 and was set to None")
                value = None
        self.backward_prefetch = value

    def _resolve_auto_wrap_policy(self, notes: list[str]) -> None:
        from torch.distributed.fsdp.wrap import (
            size_based_auto_wrap_policy,
            transformer_auto_wrap_policy,
        )

        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = envvars.setting("FSDP_AUTO_WRAP_POLICY")
        if not isinstance(self.auto_wrap_policy, str):
            if not callable(self.auto_wrap_policy):
                raise TypeError(
                    f"FullyShardedDataParallelPlugin(auto_wrap_policy={self.auto_wrap_policy!r}) "
                    f"must be a callable or one of {[p.lower() for p in FSDP_AUTO_WRAP_POLICY]}"
                )
            return
        name = self.auto_wrap_policy.strip().upper()
        if name not in FSDP_AUTO_WRAP_POLICY:
            raise ValueError(
                f"FullyShardedDataParallelPlugin(auto_wrap_policy={self.auto_wrap_policy!r}) is "
                f"not a known policy; use one of {[p.lower() for p in FSDP_AUTO_WRAP_POLICY]} or "
                "pass a callable"
            )
        if name == "TRANSFORMER_BASED_WRAP":
            self.auto_wrap_policy = transformer_auto_wrap_policy
            names: Any = self.transformer_cls_names_to_wrap
            if names is None:
                names = envvars.read("FSDP_TRANSFORMER_CLS_TO_WRAP")
            self.transformer_cls_names_to_wrap = (
                envvars.parse_csv(names) if isinstance(names, str) else names
            )
        elif name == "SIZE_BASED_WRAP":
            self.auto_wrap_policy = size_based_auto_wrap_policy
            if self.min_num_params is None:
                self.min_num_params = envvars.setting("FSDP_MIN_NUM_PARAMS")
            if isinstance(self.min_num_params, bool) or not isinstance(self.min_num_params, int):
                raise ValueError(
                    f"FullyShardedDataParallelPlugin(min_num_params={self.min_num_params!r}) must "
                    "be an int (modules with fewer parameters are not wrapped)"
                )
            if self.min_num_params == 0:
                notes.append(
                    "auto_wrap_policy='size_based_wrap' with min_num_params=0 wraps no submodule "
                    "(only the root is sharded, as in Accelerate); set min_num_params "
                    "(fsdp_min_num_params) to shard modules of at least that many parameters"
                )
        else:
            self.auto_wrap_policy = None

    def _resolve_flags(self, notes: list[str]) -> None:
        v1 = self.fsdp_version == 1
        for name, variable in (
            ("use_orig_params", "FSDP_USE_ORIG_PARAMS"),
            ("sync_module_states", "FSDP_SYNC_MODULE_STATES"),
        ):
            if v1 and getattr(self, name) is None:
                setattr(self, name, envvars.setting(variable))
            elif not v1 and getattr(self, name) is not None:
                notes.append(f"{name} is not used by FSDP2 and was set to None")
                setattr(self, name, None)
        if not v1 and self.param_init_fn is not None:
            raise ValueError(
                "FullyShardedDataParallelPlugin(param_init_fn=...) is FSDP1's (it initialises "
                "meta-device modules while wrapping); FSDP2 does not call it. Leave it None and "
                "set cpu_ram_efficient_loading=True to build the model on meta off the main "
                "process, or use fsdp_version=1."
            )
        if not v1 and self.limit_all_gathers is not True:
            notes.append("limit_all_gathers is FSDP1's; FSDP2 always limits all-gathers in flight")
        if v1 and self.forward_prefetch is None:
            self.forward_prefetch = envvars.setting("FSDP_FORWARD_PREFETCH")
        if not v1 and self.forward_prefetch is not None:
            raise ValueError(
                f"FullyShardedDataParallelPlugin(forward_prefetch={self.forward_prefetch!r}) is "
                "not implemented by FSDP2; leave it None or use fsdp_version=1"
            )
        if self.activation_checkpointing is None:
            self.activation_checkpointing = envvars.setting("FSDP_ACTIVATION_CHECKPOINTING")
        if self.activation_checkpointing_offload is None:
            self.activation_checkpointing_offload = envvars.setting(
                "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"
            )
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError(
                "FullyShardedDataParallelPlugin(activation_checkpointing_offload=True) needs "
                "activation_checkpointing=True as well"
            )
        if self.activation_checkpointing_offload and v1:
            raise ValueError(
                "FullyShardedDataParallelPlugin(activation_checkpointing_offload=True) needs "
                "fsdp_version=2"
            )
        if self.ignored_modules is None:
            self.ignored_modules = envvars.read("FSDP_IGNORED_MODULES")
        if self.cpu_ram_efficient_loading is None:
            self.cpu_ram_efficient_loading = envvars.setting("FSDP_CPU_RAM_EFFICIENT_LOADING")
        else:
            # transformers' from_pretrained reads this variable to load on rank 0 only.
            envvars.write("FSDP_CPU_RAM_EFFICIENT_LOADING", self.cpu_ram_efficient_loading)
        if v1 and self.cpu_ram_efficient_loading and not self.sync_module_states:
            notes.append("cpu_ram_efficient_loading needs sync_module_states; set it to True")
            self.sync_module_states = True

    # --- documented methods ------------------------------------------------------------------

    def set_state_dict_type(self, state_dict_type: str | Any | None = None) -> None:
        """Set `state_dict_type` (given, from FSDP_STATE_DICT_TYPE, or the version's default)
        and fill in matching state-dict configs that were not given."""
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
            StateDictType,
        )

        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        if self.state_dict_type is None:
            default = "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT"
            self.state_dict_type = envvars.setting("FSDP_STATE_DICT_TYPE") or default
        self.state_dict_type = _to_enum(
            StateDictType, self.state_dict_type, FSDP_STATE_DICT_TYPE, "state_dict_type"
        )
        if self.fsdp_version == 2 and self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ValueError(
                "FullyShardedDataParallelPlugin(state_dict_type='LOCAL_STATE_DICT') is not "
                f"supported by FSDP2; use one of {FSDP2_STATE_DICT_TYPE}"
            )
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = FullOptimStateDictConfig(
                    offload_to_cpu=True, rank0_only=True
                )
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Bind the policy to `model`: resolve layer class names (or `model._no_split_modules`)
        for transformer-based wrapping, or `min_num_params` for size-based wrapping.

        Raises:
            ValueError: a layer class name is not used anywhere in `model`.
        """
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        wraps_layers = self.auto_wrap_policy is transformer_auto_wrap_policy
        if wraps_layers and self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = model_no_split(model)
        policy = cast("Callable[..., bool] | None", self.auto_wrap_policy)  # names resolved
        self.auto_wrap_policy = bind_wrap_policy(
            policy, self.transformer_cls_names_to_wrap, self.min_num_params, model
        )

    def set_mixed_precision(
        self,
        mixed_precision: str | torch.dtype | dict[str, Any],
        buffer_autocast: bool = False,
        override: bool = False,
    ) -> None:
        """Set the mixed precision policy from a name (fp8/fp16/bf16/fp32), a dtype or a dict.

        An existing policy is kept unless `override`; a dict policy is converted to torch's type.

        Raises:
            ValueError: unknown name or dtype, or a dict with missing keys or bad dtypes.
        """
        import torch

        allowed = {_dtype_for(name) for name in _MIXED_PRECISION_NAMES}
        dtype: Any = mixed_precision
        if isinstance(mixed_precision, str):
            if mixed_precision not in _MIXED_PRECISION_NAMES:
                raise ValueError(
                    f"FSDP mixed precision {mixed_precision!r} is not valid; use one of "
                    f"{list(_MIXED_PRECISION_NAMES)}"
                )
            dtype = _dtype_for(mixed_precision)
        elif isinstance(mixed_precision, torch.dtype) and mixed_precision not in allowed:
            raise ValueError(
                f"FSDP mixed precision dtype {mixed_precision!r} is not valid; use one of "
                f"{sorted(str(d) for d in allowed)}"
            )
        policy_cls = self._mixed_precision_class()
        if override or self.mixed_precision_policy is None:
            args: dict[str, Any] = {"param_dtype": dtype, "reduce_dtype": dtype}
            if self.fsdp_version == 1:
                args["buffer_dtype"] = torch.float32 if buffer_autocast else dtype
            else:
                args["output_dtype"] = dtype
            self.mixed_precision_policy = policy_cls(**args)
        elif isinstance(self.mixed_precision_policy, dict):
            keys = ["param_dtype", "reduce_dtype"] + (
                ["buffer_dtype"] if self.fsdp_version == 1 else ["output_dtype"]
            )
            policy = self.mixed_precision_policy
            missing = [key for key in keys if key not in policy]
            unknown = sorted(set(policy) - set(keys))
            bad = [key for key, value in policy.items() if value not in allowed]
            if missing or unknown or bad:
                raise ValueError(
                    f"FSDP mixed_precision_policy={policy!r} is not valid: it needs exactly the "
                    f"keys {keys} (missing {missing}, unknown {unknown}) with dtypes among "
                    f"{sorted(str(d) for d in allowed)} (bad: {bad})"
                )
            self.mixed_precision_policy = policy_cls(**policy)

    def _mixed_precision_class(self) -> type:
        if self.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            return MixedPrecisionPolicy
        from torch.distributed.fsdp import MixedPrecision

        return MixedPrecision

    def validate_mixed_precision_policy(self) -> None:
        """Check `mixed_precision_policy` is torch's policy type for this FSDP version.

        Raises:
            ValueError: it is something else.
        """
        expected = self._mixed_precision_class()
        if not isinstance(self.mixed_precision_policy, expected):
            raise ValueError(
                f"FullyShardedDataParallelPlugin(mixed_precision_policy="
                f"{self.mixed_precision_policy!r}) must be a torch.distributed.fsdp."
                f"{expected.__name__} with fsdp_version={self.fsdp_version} (or a name/dict)"
            )
