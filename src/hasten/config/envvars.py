"""THE door to environment variables: one table of every variable hasten reads or writes.

Each row (`EnvVar`) gives the name, how to parse it, its default and one line of docs. Code
reads `setting("ACCELERATE_USE_CPU")` instead of poking `os.environ`, so the launcher, the
config dataclasses and `hasten env` all agree on names, spellings and defaults.

Dataclass fields that default from the environment declare it on the field::

    fsdp_version: int = field(default=None, metadata=env("FSDP_VERSION"))

and call `fill_from_env(self)` in `__post_init__`. The launcher writes the variables from its
option table (`launchers/options.py`), never from plugin objects.

Adding a variable: add ONE row to the table below (keep the groups), with a one-line doc.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hasten.config.enums import parse_mixed_precision
from hasten.core.environment import str_to_bool

__all__ = [
    "ENV_VARS",
    "EnvVar",
    "env",
    "env_name",
    "fill_from_env",
    "parse_bool",
    "parse_csv",
    "parse_lower",
    "parse_upper",
    "read",
    "read_flag",
    "read_int",
    "read_prefixed",
    "remove",
    "setting",
    "snapshot",
    "write",
]

_ENV_KEY = "hasten_env"


# The spellings launchers actually write, looked up without normalising (read_flag may sit on
# a per-step path, e.g. debug mode checks before a collective).
_COMMON_FLAGS = {
    spelling: truth
    for words, truth in ((("1", "true", "yes", "on"), True), (("0", "false", "no", "off"), False))
    for word in words
    for spelling in (word, word.upper(), word.capitalize())
}


def parse_bool(value: str) -> bool:
    """Parse a truth string (true/false, 1/0, yes/no, on/off, any case)."""
    return bool(str_to_bool(value, to_bool=True))


def parse_lower(value: str) -> str:
    """Parse a case-insensitive choice, normalised to lower case."""
    return value.strip().lower()


def parse_upper(value: str) -> str:
    """Parse a case-insensitive choice, normalised to upper case."""
    return value.strip().upper()


def parse_csv(value: str) -> list[str]:
    """Parse a comma-separated list, dropping blanks."""
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, parser, value when unset, and what it means."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


def _table(*rows: EnvVar) -> dict[str, EnvVar]:
    table: dict[str, EnvVar] = {}
    for row in rows:
        if row.name in table:
            raise ValueError(f"environment variable {row.name!r} is listed twice in ENV_VARS")
        table[row.name] = row
    return table


def _flag(name: str, doc: str, default: bool = False) -> EnvVar:
    return EnvVar(name, parse_bool, default, doc)


def _int(name: str, doc: str, default: int | None = None) -> EnvVar:
    return EnvVar(name, int, default, doc)


def _float(name: str, doc: str, default: float | None = None) -> EnvVar:
    return EnvVar(name, float, default, doc)


def _str(name: str, doc: str, default: str | None = None) -> EnvVar:
    return EnvVar(name, str, default, doc)


def _megatron(suffix: str, parse: Callable[[str], Any], doc: str, default: Any = None) -> EnvVar:
    return EnvVar(f"MEGATRON_LM_{suffix}", parse, default, doc)


def _parallelism(suffix: str, parse: Callable[[str], Any], doc: str) -> EnvVar:
    return EnvVar(f"PARALLELISM_CONFIG_{suffix}", parse, None, doc)


ENV_VARS: dict[str, EnvVar] = _table(
    # --- where this process is (set by torchrun / torch.distributed.run) -------------------
    _int("RANK", "Global index of this process in the job (torchrun)."),
    _int("WORLD_SIZE", "Number of processes in the job (torchrun)."),
    _int("LOCAL_RANK", "Index of this process on its machine (torchrun)."),
    _int("LOCAL_WORLD_SIZE", "Number of processes on this machine (torchrun)."),
    _int("GROUP_RANK", "Index of this machine among the machines of the job (torchrun)."),
    _int("NODE_RANK", "Index of this machine, as set by some launchers (MPI, SLURM wrappers)."),
    _str("MASTER_ADDR", "Address of the rank-0 machine used for the rendezvous store."),
    _int("MASTER_PORT", "Port of the rendezvous store on MASTER_ADDR."),
    _str(
        "TORCHELASTIC_RUN_ID",
        "Run id set by torch elastic; its presence means torchrun launched us.",
    ),
    _str(
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "1 makes torch elastic's c10d rendezvous give each round's workers a fresh store; hasten "
        "launch sets it (the shared store keeps an earlier round's process-group keys).",
    ),
    _int(
        "HASTEN_RESTART_COUNT",
        "Restart attempt of a worker group, set by hasten launch; workers see it as "
        "TORCHELASTIC_RESTART_COUNT.",
    ),
    # --- where this process is (set by MPI launchers: MPICH/Intel MPI, Open MPI, MVAPICH2) -----
    _int("PMI_RANK", "Global index of this process (MPICH / Intel MPI)."),
    _int("PMI_SIZE", "Number of processes in the job (MPICH / Intel MPI)."),
    _int("MPI_LOCALRANKID", "Index of this process on its machine (MPICH / Intel MPI)."),
    _int("MPI_LOCALNRANKS", "Number of processes on this machine (MPICH / Intel MPI)."),
    _int("OMPI_COMM_WORLD_RANK", "Global index of this process (Open MPI)."),
    _int("OMPI_COMM_WORLD_SIZE", "Number of processes in the job (Open MPI)."),
    _int("OMPI_COMM_WORLD_LOCAL_RANK", "Index of this process on its machine (Open MPI)."),
    _int("OMPI_COMM_WORLD_LOCAL_SIZE", "Number of processes on this machine (Open MPI)."),
    _int("MV2_COMM_WORLD_RANK", "Global index of this process (MVAPICH2)."),
    _int("MV2_COMM_WORLD_SIZE", "Number of processes in the job (MVAPICH2)."),
    _int("MV2_COMM_WORLD_LOCAL_RANK", "Index of this process on its machine (MVAPICH2)."),
    _int("MV2_COMM_WORLD_LOCAL_SIZE", "Number of processes on this machine (MVAPICH2)."),
    # --- where this process is (set by SLURM's srun for each task of a job step) ------------
    _int("SLURM_PROCID", "Global index of this task in the job step (SLURM srun)."),
    _int("SLURM_LOCALID", "Index of this task on its node (SLURM srun)."),
    _int("SLURM_NODEID", "Index of this task's node in the allocation (SLURM)."),
    _int("SLURM_NTASKS", "Number of tasks in the job (SLURM)."),
    _int("SLURM_STEP_NUM_TASKS", "Number of tasks in this job step (SLURM srun)."),
    _str("SLURM_STEP_ID", "Id of the job step this task belongs to (SLURM srun)."),
    _str("SLURM_STEP_TASKS_PER_NODE", "Tasks of this step on each node, e.g. '2(x3),1' (SLURM)."),
    _str("SLURM_TASKS_PER_NODE", "Tasks of the job on each node, e.g. '2(x3),1' (SLURM)."),
    _str("SLURM_STEP_NODELIST", "Nodes of this job step, e.g. 'node[01-04]' (SLURM srun)."),
    _str("SLURM_JOB_NODELIST", "Nodes of the job's allocation, e.g. 'node[01-04]' (SLURM)."),
    _str("SLURM_NODELIST", "Nodes of the job's allocation (SLURM's older name)."),
    _int("SLURM_JOB_ID", "Id of the SLURM job (picks its rendezvous port)."),
    _flag("FORK_LAUNCHED", "Set by the notebook launcher: workers were forked, keep the group."),
    _int("OMP_NUM_THREADS", "CPU threads per process for OpenMP/intra-op parallelism."),
    _str("HF_HOME", "Hugging Face cache directory; the default config file lives under it."),
    # --- general launcher settings ----------------------------------------------------------
    EnvVar(
        "ACCELERATE_MIXED_PRECISION",
        lambda value: parse_mixed_precision(
            value, "ACCELERATE_MIXED_PRECISION", "set it to one of them or unset it"
        ),
        "no",
        "Mixed precision: no, fp8, fp16 or bf16.",
    ),
    _flag("ACCELERATE_USE_CPU", "Force running on CPU even when an accelerator is present."),
    _flag("ACCELERATE_DEBUG_MODE", "Check shapes before every collective and report mismatches."),
    _int(
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
        "Number of micro-batches whose gradients are accumulated before a step.",
        1,
    ),
    _float("ACCELERATE_GRADIENT_CLIPPING", "Gradient-norm clipping value (DeepSpeed)."),
    EnvVar("ACCELERATE_LOG_LEVEL", parse_upper, None, "Log level of hasten's loggers (INFO, ...)."),
    _int("ACCELERATE_NUM_PROCESSES", "Number of processes requested by the launcher."),
    _str("ACCELERATE_TORCH_DEVICE", "Device type to use instead of the detected one (e.g. 'cpu')."),
    _flag("ACCELERATE_CPU_AFFINITY", "Pin each process to the CPU cores of its NUMA node."),
    _flag("ACCELERATE_DOWNCAST_BF16", "On XLA, store float32 as bfloat16 and float64 as float32."),
    _flag("ACCELERATE_ENABLE_RICH", "Use `rich` for tracebacks and log formatting when installed."),
    _flag("ACCELERATE_BYPASS_DEVICE_MAP", "Skip the device_map check when preparing a model."),
    _flag("ACCELERATE_INIT_INCLUDE_BUFFERS", "init_empty_weights also puts buffers on meta."),
    _flag("ACCELERATE_ALLOW_CP_STANDALONE", "Allow context parallelism without FSDP."),
    _flag("ACCELERATE_IN_TPU_POD", "Set by the launcher when running on a TPU pod."),
    _str("ACCELERATE_DEBUG_RDV_FILE", "File used by the debug launcher for its rendezvous."),
    _str("ACCELERATE_CONFIG_DS_FIELDS", "Comma list of launch settings also set in the DS config."),
    _flag("ACCELERATE_USE_SAGEMAKER", "Running on Amazon SageMaker."),
    EnvVar(
        "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE",
        parse_upper,
        "NO",
        "SageMaker distributed mode: NO, DATA_PARALLEL or MODEL_PARALLEL.",
    ),
    _flag("ACCELERATE_USE_DEEPSPEED", "Train with DeepSpeed."),
    _flag("ACCELERATE_USE_FSDP", "Train with Fully Sharded Data Parallel."),
    _flag("ACCELERATE_USE_MEGATRON_LM", "Train with Megatron-LM."),
    _flag(
        "ACCELERATE_USE_PARALLELISM_CONFIG", "Build a ParallelismConfig from PARALLELISM_CONFIG_*."
    ),
    # --- torch.compile (TorchDynamoPlugin) --------------------------------------------------
    EnvVar("ACCELERATE_DYNAMO_BACKEND", parse_upper, "NO", "torch.compile backend (NO = off)."),
    _str("ACCELERATE_DYNAMO_MODE", "torch.compile mode.", "default"),
    _flag("ACCELERATE_DYNAMO_USE_FULLGRAPH", "torch.compile(fullgraph=True)."),
    EnvVar("ACCELERATE_DYNAMO_USE_DYNAMIC", parse_bool, None, "torch.compile(dynamic=...)."),
    _flag("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "Compile repeated blocks one at a time."),
    # --- fp8 recipes ------------------------------------------------------------------------
    EnvVar("ACCELERATE_FP8_BACKEND", parse_upper, None, "fp8 library: TE, MSAMP or AO."),
    EnvVar("ACCELERATE_FP8_OPT_LEVEL", parse_upper, "O2", "MS-AMP optimisation level (O1 or O2)."),
    EnvVar("ACCELERATE_FP8_FORMAT", parse_upper, "HYBRID", "TE fp8 format (HYBRID, E4M3, E5M2)."),
    _int("ACCELERATE_FP8_MARGIN", "TransformerEngine scaling-factor margin.", 0),
    _int("ACCELERATE_FP8_INTERVAL", "TransformerEngine scaling-factor update interval.", 1),
    EnvVar(
        "ACCELERATE_FP8_AMAX_COMPUTE_ALGO",
        parse_lower,
        "most_recent",
        "TE amax algorithm (max, most_recent).",
    ),
    _int("ACCELERATE_FP8_AMAX_HISTORY_LEN", "TransformerEngine amax history length.", 1024),
    _flag("ACCELERATE_FP8_OVERRIDE_FPROP", "TE: run the forward GEMM in higher precision."),
    _flag("ACCELERATE_FP8_OVERRIDE_DGRAD", "TE: run the data-gradient GEMM in higher precision."),
    _flag("ACCELERATE_FP8_OVERRIDE_WGRAD", "TE: run the weight-gradient GEMM in higher precision."),
    _flag("ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", "TE: keep fp8 autocast during evaluation."),
    _flag("ACCELERATE_FP8_USE_MXFP8_BLOCK_SCALING", "TE: use MXFP8 block scaling."),
    _flag(
        "ACCELERATE_FP8_PAD_INNER_DIM", "torchao: pad inner dimensions to multiples of 16.", True
    ),
    _flag("ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", "torchao: all-gather in float8.", True),
    # --- DeepSpeed (DeepSpeedPlugin) --------------------------------------------------------
    _str("ACCELERATE_DEEPSPEED_CONFIG_FILE", "Path of a DeepSpeed JSON config file."),
    _int("ACCELERATE_DEEPSPEED_ZERO_STAGE", "ZeRO stage: 0, 1, 2 or 3.", 2),
    EnvVar(
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        parse_lower,
        "none",
        "Where ZeRO offloads optimizer states: none, cpu or nvme.",
    ),
    EnvVar(
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
        parse_lower,
        "none",
        "Where ZeRO-3 offloads parameters: none, cpu or nvme.",
    ),
    _str(
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
        "NVMe path for optimizer offload.",
        "none",
    ),
    _str(
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", "NVMe path for parameter offload.", "none"
    ),
    EnvVar("ACCELERATE_DEEPSPEED_ZERO3_INIT", parse_bool, None, "Build models sharded (ZeRO-3)."),
    _flag("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "Gather a 16-bit model when saving."),
    _str("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", "Comma list of MoE layer class names."),
    # --- FSDP (FullyShardedDataParallelPlugin) ----------------------------------------------
    _int("FSDP_VERSION", "FSDP version: 1 or 2.", 1),
    EnvVar("FSDP_SHARDING_STRATEGY", parse_upper, "FULL_SHARD", "FSDP1 sharding strategy."),
    _str("FSDP_RESHARD_AFTER_FORWARD", "Reshard after forward (FSDP2 bool / FSDP1 strategy)."),
    _flag("FSDP_OFFLOAD_PARAMS", "Offload parameters to CPU."),
    EnvVar(
        "FSDP_BACKWARD_PREFETCH", parse_upper, None, "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH."
    ),
    EnvVar("FSDP_AUTO_WRAP_POLICY", parse_upper, "NO_WRAP", "Auto-wrap policy name."),
    _str("FSDP_TRANSFORMER_CLS_TO_WRAP", "Comma list of layer classes to wrap."),
    _int("FSDP_MIN_NUM_PARAMS", "Minimum parameters of a module wrapped by size.", 0),
    EnvVar("FSDP_STATE_DICT_TYPE", parse_upper, None, "FULL_STATE_DICT, SHARDED_STATE_DICT, ..."),
    _flag("FSDP_USE_ORIG_PARAMS", "Let the optimizer see the original parameters (FSDP1)."),
    _flag("FSDP_SYNC_MODULE_STATES", "Broadcast module states from rank 0 after wrapping."),
    _flag("FSDP_FORWARD_PREFETCH", "Prefetch the next all-gather during forward."),
    _flag("FSDP_ACTIVATION_CHECKPOINTING", "Recompute activations during backward."),
    _flag("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "Offload checkpointed activations to CPU."),
    _str("FSDP_IGNORED_MODULES", "Regex of module names FSDP leaves alone."),
    _flag("FSDP_CPU_RAM_EFFICIENT_LOADING", "Only rank 0 loads the checkpoint; others get empty."),
    # --- Megatron-LM (MegatronLMPlugin) -----------------------------------------------------
    _megatron("TP_DEGREE", int, "Tensor-parallel degree.", 1),
    _megatron("PP_DEGREE", int, "Pipeline-parallel degree.", 1),
    _megatron("NUM_MICRO_BATCHES", int, "Number of micro-batches per pipeline step.", 1),
    _megatron("GRADIENT_CLIPPING", float, "Global L2-norm gradient clipping (0 disables).", 1.0),
    _megatron("SEQUENCE_PARALLELISM", parse_bool, "Enable sequence parallelism.", False),
    _megatron("RECOMPUTE_ACTIVATIONS", parse_bool, "Selective activation recomputation.", False),
    _megatron("USE_DISTRIBUTED_OPTIMIZER", parse_bool, "Shard optimizer states.", False),
    _megatron("USE_CUSTOM_FSDP", parse_bool, "Use Megatron's own FSDP.", False),
    _megatron("NO_LOAD_OPTIM", parse_bool, "Do not load optimizer state from checkpoints.", False),
    _megatron("NO_SAVE_OPTIM", parse_bool, "Do not save optimizer state in checkpoints.", False),
    _megatron("EOD_MASK_LOSS", parse_bool, "Mask the loss at end-of-document tokens.", False),
    _megatron("OPTIMIZER_CPU_OFFLOAD", parse_bool, "Offload the optimizer to CPU.", False),
    _megatron(
        "USE_PRECISION_AWARE_OPTIMIZER", parse_bool, "Use the precision-aware optimizer.", False
    ),
    _megatron(
        "OVERLAP_CPU_OPTIMIZER_D2H_H2D", parse_bool, "Overlap CPU optimizer transfers.", False
    ),
    _megatron("DECODER_LAST_PIPELINE_NUM_LAYERS", int, "Layers on the last pipeline stage."),
    _megatron("RECOMPUTE_GRANULARITY", str, "Recompute granularity: full or selective.", "full"),
    _megatron("RECOMPUTE_METHOD", str, "Recompute method: uniform or block.", "uniform"),
    _megatron("RECOMPUTE_NUM_LAYERS", int, "Layers recomputed per unit.", 1),
    _megatron("ATTENTION_BACKEND", parse_bool, "Let Megatron pick the attention backend.", True),
    _megatron("EXPERT_MODEL_PARALLEL_SIZE", int, "Expert (MoE) parallel degree.", 1),
    _megatron("CONTEXT_PARALLEL_SIZE", int, "Context-parallel degree.", 1),
    _megatron("ATTENTION_DROPOUT", float, "Attention dropout probability.", 0.0),
    _megatron("HIDDEN_DROPOUT", float, "Hidden-state dropout probability.", 0.0),
    _megatron("ATTENTION_SOFTMAX_IN_FP32", parse_bool, "Compute attention softmax in fp32.", True),
    _megatron("EXPERT_TENSOR_PARALLEL_SIZE", int, "Tensor-parallel degree inside experts.", 1),
    _megatron("CALCULATE_PER_TOKEN_LOSS", parse_bool, "Average the loss per token.", True),
    _megatron(
        "USE_ROTARY_POSITION_EMBEDDINGS", parse_bool, "Use rotary position embeddings.", True
    ),
    # --- ParallelismConfig ------------------------------------------------------------------
    _parallelism("DP_REPLICATE_SIZE", int, "Replicated data-parallel degree."),
    _parallelism("DP_SHARD_SIZE", int, "Sharded (FSDP) data-parallel degree."),
    _parallelism("TP_SIZE", int, "Tensor-parallel degree."),
    _parallelism("CP_SIZE", int, "Context-parallel degree."),
    _parallelism("CP_BACKEND", str, "Context-parallel backend (torch)."),
    _parallelism("CP_COMM_STRATEGY", str, "Context-parallel rotation: allgather or alltoall."),
    _parallelism("SP_SIZE", int, "Sequence-parallel degree."),
    _parallelism("SP_BACKEND", str, "Sequence-parallel backend (deepspeed)."),
    _parallelism("SP_SEQ_LENGTH", int, "Sequence length for sequence parallelism."),
    _parallelism("SP_SEQ_LENGTH_IS_VARIABLE", parse_bool, "Sequence length varies per batch."),
    _parallelism("SP_ATTN_IMPLEMENTATION", str, "Attention implementation for sequence parallel."),
    # --- experiment trackers (override init_trackers arguments, as in Accelerate) ----------
    _str("MLFLOW_EXPERIMENT_NAME", "MLflow experiment (instead of the project name)."),
    _str("MLFLOW_TRACKING_URI", "MLflow tracking store (file:///..., sqlite:///..., http://...)."),
    _str("MLFLOW_RUN_ID", "MLflow run to resume."),
    _str("MLFLOW_TAGS", "MLflow run tags, as a JSON object."),
    _flag("MLFLOW_NESTED_RUN", "Start the MLflow run nested in the active one."),
    _str("MLFLOW_RUN_NAME", "MLflow run display name."),
    _str("MLFLOW_RUN_NOTE", "MLflow run description."),
    _str("CLEARML_PROJECT", "ClearML project (instead of the project name)."),
    _str("CLEARML_TASK", "ClearML task name (instead of the project name)."),
)


def _row(name: str) -> EnvVar:
    try:
        return ENV_VARS[name]
    except KeyError:
        close = difflib.get_close_matches(name, ENV_VARS, n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(
            f"{name!r} is not in hasten's environment-variable table.{hint} "
            "Add a row to ENV_VARS in hasten/config/envvars.py."
        ) from None


def read(name: str, default: str | None = None) -> str | None:
    """Return the raw value of environment variable `name`, or `default` when unset."""
    return os.environ.get(name, default)


def read_flag(name: str, default: bool = False) -> bool:
    """Return environment variable `name` as a boolean, or `default` when unset.

    Raises:
        ValueError: the variable holds something other than a truth string.
    """
    value = os.environ.get(name)
    if value is None:
        return default
    flag = _COMMON_FLAGS.get(value)
    return _parse(name, parse_bool, value) if flag is None else flag


def read_int(name: str, default: int | None = None) -> int | None:
    """Return environment variable `name` as an int, or `default` when unset.

    Raises:
        ValueError: the variable is set but is not an integer.
    """
    value = os.environ.get(name)
    if value is None:
        return default
    return _parse(name, int, value)


def read_prefixed(prefix: str) -> dict[str, str]:
    """Return every environment variable whose name starts with `prefix`."""
    return {key: value for key, value in os.environ.items() if key.startswith(prefix)}


def _parse(name: str, parse: Callable[[str], Any], value: str) -> Any:
    try:
        return parse(value)
    except ValueError as err:
        raise ValueError(
            f"environment variable {name}={value!r} could not be parsed ({err}); "
            f"set it to a valid value or unset it"
        ) from None


def setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Return variable `name` parsed with its table row, or the row's default when unset.

    Args:
        name: a variable listed in `ENV_VARS`.
        environ: read from this mapping instead of the process environment.

    Raises:
        ValueError: `name` has no row in `ENV_VARS`, or its value does not parse.
    """
    row = _row(name)
    value = (os.environ if environ is None else environ).get(name)
    if value is None or value == "":
        return row.default
    return _parse(name, row.parse, value)


def _format(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(_format(item) for item in value)
    return str(value)


def write(name: str, value: Any) -> None:
    """Set environment variable `name` (booleans as true/false, lists comma-joined)."""
    os.environ[name] = _format(value)


def remove(name: str) -> None:
    """Unset environment variable `name` if it is set."""
    os.environ.pop(name, None)


def snapshot() -> dict[str, str]:
    """Return a copy of the whole environment, e.g. to start a child process from."""
    return dict(os.environ)


def env(name: str, **metadata: Any) -> dict[str, Any]:
    """Return dataclass field metadata saying the field defaults from variable `name`.

    Raises:
        ValueError: `name` has no row in `ENV_VARS`.
    """
    _row(name)
    return {_ENV_KEY: name, **metadata}


def env_name(field: dataclasses.Field[Any]) -> str | None:
    """Return the variable a dataclass field defaults from (declared with `env`), if any."""
    name = field.metadata.get(_ENV_KEY)
    return None if name is None else str(name)


def _env_fields(obj: Any) -> Iterable[tuple[str, str]]:
    for field in dataclasses.fields(obj):
        name = env_name(field)
        if name is not None:
            yield field.name, name


def fill_from_env(obj: Any, environ: Mapping[str, str] | None = None) -> None:
    """Replace every `None` field of dataclass `obj` declared with `env(...)` by its setting.

    Args:
        obj: a dataclass instance whose fields use `metadata=env("NAME")`.
        environ: read from this mapping instead of the process environment (for tests).
    """
    for attribute, name in _env_fields(obj):
        if getattr(obj, attribute) is not None:
            continue
        setattr(obj, attribute, setting(name, environ))
