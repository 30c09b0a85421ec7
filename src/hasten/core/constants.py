"""File names and fixed values shared by checkpointing, saving and the launcher.

The checkpoint names are part of the on-disk format that Accelerate users already have, so
they are kept verbatim.
"""

from __future__ import annotations

__all__ = [
    "BETA_CP_AVAILABLE_PYTORCH_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "BETA_TP_AVAILABLE_PYTORCH_VERSION",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "CUDA_DISTRIBUTED_TYPES",
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DTENSOR_PYTORCH_VERSION",
    "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
    "FSDP2_PYTORCH_VERSION",
    "FSDP_MODEL_NAME",
    "FSDP_PYTORCH_VERSION",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "TORCH_DYNAMO_MODES",
    "TORCH_LAUNCH_PARAMS",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
]

# Written by Accelerator.save_state().
MODEL_NAME = "pytorch_model"
OPTIMIZER_NAME = "optimizer"
RNG_STATE_NAME = "random_states"
SCALER_NAME = "scaler.pt"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"

# Written by Accelerator.save_model().
SAFE_MODEL_NAME = "model"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"

# Chrome traces exported by the profiler.
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

# Modes accepted by torch.compile(mode=...).
TORCH_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Oldest torch whose profiler knows these device activities.
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"

# Oldest torch with a usable DTensor, and whose elastic launcher accepts
# `log_line_prefix_template`.
DTENSOR_PYTORCH_VERSION = "2.5.0"
# FSDP: oldest torch for FSDP1 / FSDP2 (fully_shard), and the sharded-model folder stem.
FSDP_PYTORCH_VERSION = "2.1.0"
FSDP2_PYTORCH_VERSION = "2.6.0"
FSDP_MODEL_NAME = "pytorch_model_fsdp"
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
# Oldest versions with tensor parallelism (DTensor, transformers' TP plans) and context parallelism.
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"

# Arguments `hasten launch` forwards to torch.distributed.run as they are.
TORCH_LAUNCH_PARAMS = (
    "nnodes",
    "nproc_per_node",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "standalone",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "role",
    "module",
    "m",
    "no_python",
    "run_path",
    "log_dir",
    "r",
    "redirects",
    "t",
    "tee",
    "node_rank",
    "master_addr",
    "master_port",
)

# Distributed types (by value) that run on CUDA devices through torch.distributed.
#: DeepSpeed's multi-node launchers (``--deepspeed_multinode_launcher``).
DEEPSPEED_MULTINODE_LAUNCHERS = [
    "pdsh",
    "standard",
    "openmpi",
    "mvapich",
    "mpich",
    "nossh",
    "slurm",
]
#: DeepSpeed version with the Ulysses sequence-parallel API Accelerate builds on.
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"
CUDA_DISTRIBUTED_TYPES = ("DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP")

# Distributed types (by value) whose collectives go through torch.distributed.
TORCH_DISTRIBUTED_OPERATION_TYPES = (
    *CUDA_DISTRIBUTED_TYPES,
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_CPU",
    "MULTI_HPU",
    "MULTI_NEURON",
)
