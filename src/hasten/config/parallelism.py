"""ParallelismConfig: how the processes of a job are laid out on a device mesh (N-D parallelism).

Dimensions: dp_replicate (DDP-style replicas), dp_shard (FSDP sharding), tp (tensor), cp
(context) and sp (DeepSpeed sequence parallelism). Unset sizes default from the
PARALLELISM_CONFIG_* variables, else 1. `build_device_mesh` is the only part that touches
torch.distributed, and only when called.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, Literal

from hasten.config import envvars
from hasten.core.coerce import whole_number

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "refuse_recurrent_layers",
]

_MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
_CP_STRATEGIES = ("allgather", "alltoall")
_SP_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


def refuse_recurrent_layers(model: Any) -> None:
    """Refuse a model with linear-attention layers before sequence parallelism shards it.

    Ulysses sequence parallelism gathers the whole sequence around the attention calls it wraps.
    A linear-attention layer keeps a running state along the sequence inside the model's own
    code, so each rank would start that state from zero: silently wrong gradients. Reads the
    ``layer_types`` of the model's (text) config; a model without them passes.

    Raises:
        ValueError: the config lists linear-attention layer types.
    """
    config: Any = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    found = sorted(
        {
            str(kind)
            for kind in getattr(config, "layer_types", None) or ()
            if "linear_attention" in str(kind)
        }
    )
    if found:
        raise ValueError(
            f"{type(model).__name__} has layers of type {found}, which sequence parallelism "
            "cannot shard: they carry a state along the sequence that each rank would restart "
            "from zero, giving wrong gradients without an error. Use a model with full "
            "attention layers only, or turn sequence parallelism off (sp_size=1)."
        )


@dataclasses.dataclass
class TorchTensorParallelConfig:
    """Tensor-parallel options.

    Unlike Accelerate, transformers is not required here: hasten shards plain PyTorch models
    from their ``tp_plan`` too, and checks the transformers version only when a transformers
    model is prepared.
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn(
                "TorchTensorParallelConfig(enable_async_tp=True) is not supported yet and is "
                "ignored",
                UserWarning,
                stacklevel=3,
            )


@dataclasses.dataclass
class TorchTensorParallelPlugin:
    """Deprecated spelling of ``ParallelismConfig(tp_size=...)`` (Accelerate's older plugin).

    `Accelerator(torch_tp_plugin=...)` maps it onto a `ParallelismConfig` with a FutureWarning
    and fills ``torch_device_mesh`` with the job's mesh; constructing it touches no devices.

    Raises:
        ValueError: ``tp_size`` is not an int greater than 1.
    """

    tp_size: int = 1
    torch_device_mesh: DeviceMesh | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int):
            raise ValueError(
                f"TorchTensorParallelPlugin(tp_size={self.tp_size!r}): `tp_size` must be an int"
            )
        if self.tp_size <= 1:
            raise ValueError(
                f"TorchTensorParallelPlugin(tp_size={self.tp_size}): `tp_size` must be greater "
                "than 1 (or pass no plugin for no tensor parallelism)"
            )


@dataclasses.dataclass
class TorchContextParallelConfig:
    """Context-parallel options: how shards of the sequence exchange keys and values."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = envvars.read("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in _CP_STRATEGIES:
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or "
                f"'alltoall'. (hasten: set TorchContextParallelConfig(cp_comm_strategy=...) or "
                "PARALLELISM_CONFIG_CP_COMM_STRATEGY to one of them.)"
            )


@dataclasses.dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed (Ulysses) sequence-parallel options."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = envvars.read_flag(
                "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", True
            )
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raw = envvars.read("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            if raw is None:
                raise ValueError(
                    "DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False) needs "
                    "sp_seq_length (or PARALLELISM_CONFIG_SP_SEQ_LENGTH); set it to the fixed "
                    "sequence length, or set sp_seq_length_is_variable=True"
                )
            self.sp_seq_length = (
                None if raw == "None" else envvars.read_int("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            )
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = envvars.read("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        name = self.sp_attn_implementation
        # Hub-hosted flash-attention kernels ("kernels-community/flash-attn2") are allowed too.
        hub_kernel = name is not None and "/" in name and "flash-attn" in name
        if name is not None and name not in _SP_ATTENTION and not hub_kernel:
            raise ValueError(
                f"Invalid sp_attn_implementation: {name}. Must be one of {list(_SP_ATTENTION)} or a "
                "hub-hosted flash attention kernel (e.g. 'kernels-community/flash-attn2'). "
                "(hasten: 'eager' and 'flex_attention' cannot run under sequence parallelism; set "
                "DeepSpeedSequenceParallelConfig(sp_attn_implementation=...) or "
                "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION.)"
            )


def _size(value: int | None, variable: str, field_name: str) -> int:
    if value is None:
        value = envvars.read_int(variable, 1)
    size = whole_number(value)  # np.int64(2) and 2.0 count too, as in Accelerate
    if size is None or size < 1:
        raise ValueError(f"ParallelismConfig({field_name}={value!r}) must be an int >= 1")
    return size


@dataclasses.dataclass
class ParallelismConfig:
    """Sizes of each parallelism dimension; their product is the number of processes.

    Example:
        >>> config = ParallelismConfig(dp_shard_size=2, tp_size=2)
        >>> config.total_size, config.active_mesh_dims
        (4, ['dp_shard', 'tp'])
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: Literal["torch"] = None  # type: ignore[assignment]
    sp_size: int | None = None
    sp_backend: Literal["deepspeed"] = None  # type: ignore[assignment]
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None

    def __post_init__(self) -> None:
        prefix = "PARALLELISM_CONFIG_"
        for dim in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
            name = f"{dim}_size"
            setattr(self, name, _size(getattr(self, name), prefix + name.upper(), name))
        if self.cp_backend is None:
            self.cp_backend = envvars.read(prefix + "CP_BACKEND", "torch")
        if self.sp_backend is None:
            self.sp_backend = envvars.read(prefix + "SP_BACKEND", "deepspeed")
        if self.cp_backend != "torch":
            raise ValueError(f"ParallelismConfig(cp_backend={self.cp_backend!r}) must be 'torch'")
        if self.sp_backend != "deepspeed":
            raise ValueError(
                f"ParallelismConfig(sp_backend={self.sp_backend!r}) must be 'deepspeed'"
            )
        self._check_combination()
        if self.tp_enabled and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_enabled:
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise TypeError(
                    f"ParallelismConfig(cp_backend='torch') needs a TorchContextParallelConfig "
                    f"cp_handler, got {type(self.cp_handler).__name__}"
                )
        if self.sp_enabled and self.sp_handler is None:
            self.sp_handler = DeepSpeedSequenceParallelConfig()
        self.device_mesh: DeviceMesh | None = None

    def _check_combination(self) -> None:
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                f"ParallelismConfig(cp_size={self.cp_size}, sp_size={self.sp_size}): context and "
                "sequence parallelism are mutually exclusive; set one of them to 1"
            )
        if (
            (self.tp_enabled or self.cp_enabled)
            and self.dp_replicate_enabled
            and not (self.dp_shard_enabled)
        ):
            raise ValueError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, "
                f"tp_size={self.tp_size}, cp_size={self.cp_size}): tp/cp cannot be combined with "
                "pure replication; use dp_shard_size > 1 (FSDP + TP/CP), optionally with "
                "dp_replicate_size > 1 (HSDP)"
            )

    @property
    def _sizes(self) -> dict[str, int]:
        return {dim: getattr(self, f"{dim}_size") for dim in _MESH_ORDER}

    @property
    def dp_replicate_enabled(self) -> bool:
        """Whether data is replicated across more than one group (dp_replicate_size > 1)."""
        return self.dp_replicate_size > 1  # type: ignore[operator]

    @property
    def dp_shard_enabled(self) -> bool:
        """Whether parameters are sharded across more than one process (dp_shard_size > 1)."""
        return self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism is on (tp_size > 1)."""
        return self.tp_size > 1  # type: ignore[operator]

    @property
    def cp_enabled(self) -> bool:
        """Whether context parallelism is on (cp_size > 1)."""
        return self.cp_size > 1  # type: ignore[operator]

    @property
    def sp_enabled(self) -> bool:
        """Whether sequence parallelism is on (sp_size > 1)."""
        return self.sp_size > 1  # type: ignore[operator]

    def _enabled(self, dims: tuple[str, ...]) -> list[str]:
        return [dim for dim in dims if getattr(self, f"{dim}_enabled")]

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled data-parallel dimensions (each gets different batches)."""
        return self._enabled(("dp_replicate", "dp_shard"))

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose members see the same batch (tp, cp, sp)."""
        return self._enabled(("tp", "cp", "sp"))

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into the mesh FSDP shards over."""
        return self._enabled(("dp_shard", "cp"))

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the loss is averaged over."""
        return self._enabled(("dp_replicate", "dp_shard", "cp"))

    @property
    def fsdp_dim_names(self) -> list[str]:
        """Mesh dimensions FSDP is applied over (with replication for HSDP)."""
        return self._enabled(("dp_replicate",)) + ["dp_shard_cp"]

    @property
    def total_size(self) -> int:
        """Product of every dimension's size: the number of processes needed."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def non_data_parallel_size(self) -> int:
        """Product of the tp, cp and sp sizes."""
        return self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def data_parallel_size(self) -> int:
        """Product of the dp_replicate and dp_shard sizes."""
        return self.dp_replicate_size * self.dp_shard_size  # type: ignore[operator]

    @property
    def active_mesh_dims(self) -> list[str]:
        """Names of every enabled dimension, data-parallel ones first."""
        return self.dp_dim_names + self.non_dp_dim_names

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        active = [dim for dim in _MESH_ORDER if dim in self.active_mesh_dims]
        return tuple(active), tuple(self._sizes[dim] for dim in active)

    def build_device_mesh(self, device_type: str) -> DeviceMesh | None:
        """Build the device mesh (plus flattened dp, dp_shard_cp and dp_cp views).

        Returns None when nothing is parallel, or when DeepSpeed owns the sequence groups.
        """
        from torch.distributed.device_mesh import init_device_mesh

        if self.sp_backend == "deepspeed" and self.sp_enabled:
            return None
        names, shape = self._get_mesh()
        if not names:
            return None
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
        # torch has no public API for joint views of several mesh dims yet; _flatten is the
        # documented-in-tests way DTensor users build them (torch/distributed/device_mesh.py).
        for flat, dims in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            if dims:
                mesh[dims]._flatten(flat)  # type: ignore[index]  # a list, as Accelerate passes
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> DeviceMesh | None:
        """Return the device mesh, building it on first use.

        Raises:
            ValueError: no mesh exists and no `device_type` was given, or the existing mesh
                is on a different device type.
        """
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError(
                    "ParallelismConfig.get_device_mesh() has no mesh yet; pass the device type, "
                    "e.g. get_device_mesh('cuda')"
                )
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"ParallelismConfig.get_device_mesh({device_type!r}): the mesh was already built "
                f"on {self.device_mesh.device_type!r}; ask for that device type"
            )
        return self.device_mesh

    def validate_for(
        self,
        num_processes: int,
        *,
        multi_device: bool,
        is_fsdp2: bool = False,
        is_deepspeed: bool = False,
    ) -> list[str]:
        """Check this layout fits the job; a 1-sized layout becomes pure replication.

        Returns the (non-fatal) warnings, e.g. a handler set for a dimension of size 1.

        Raises:
            ValueError: the sizes do not multiply to `num_processes`, FSDP2 has no dimension to
                shard over, or the job is neither FSDP2, multi-device nor DeepSpeed.
        """
        if not multi_device and self.total_size == 1:
            return []
        if self.total_size == 1:
            self.dp_replicate_size = num_processes
        deepspeed_sp = self.sp_backend == "deepspeed" and self.sp_enabled
        if not deepspeed_sp and self.total_size != num_processes:
            raise ValueError(
                f"ParallelismConfig total_size ({self.total_size}) does not match the number of "
                f"processes ({num_processes}); adjust dp_replicate_size/dp_shard_size/tp_size/"
                "cp_size/sp_size so their product is the process count"
            )
        if is_fsdp2 and not self.dp_shard_enabled and not self.cp_enabled:
            raise ValueError(
                "FSDP is enabled but ParallelismConfig has no dimension to shard over (dp_shard_size "
                "and cp_size are both 1); lower tp_size to leave processes for FSDP, or launch "
                "without FSDP"
            )
        if self.total_size > 1 and not (is_fsdp2 or multi_device or is_deepspeed):
            raise ValueError(
                "ParallelismConfig needs FSDP2, DeepSpeed or a multi-device data-parallel job"
            )
        return [
            f"ParallelismConfig.{dim}_handler is set but {dim}_size is 1; it is ignored"
            for dim, size in self._sizes.items()
            if size == 1 and getattr(self, f"{dim}_handler", None) is not None
        ]

    def to_json(self) -> dict[str, Any]:
        """Return the sizes, backends and handler fields as a JSON-serialisable dict."""
        result: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            is_config = dataclasses.is_dataclass(value) and not isinstance(value, type)
            result[field.name] = dataclasses.asdict(value) if is_config else value
        return result
