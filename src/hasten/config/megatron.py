"""MegatronLMPlugin: the user's Megatron-LM request (tensor/pipeline/sequence parallelism, ...).

Pure data and validation: Megatron-LM itself is only imported by the engine that runs it.
Fields backed by a MEGATRON_LM_* variable default from it when left as None.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from hasten.config.envvars import env, fill_from_env
from hasten.config.megatron_models import MODEL_CONFIGS_TO_MEGATRON_PARSERS

__all__ = ["MegatronLMPlugin"]

_DECAY_STYLES = ("constant", "linear", "cosine")
_RECOMPUTE_GRANULARITY = ("full", "selective")
_RECOMPUTE_METHODS = ("uniform", "block")
_SCHEDULE_ARGS = (
    "train_iters",
    "lr_warmup_iters",
    "train_samples",
    "lr_warmup_samples",
    "lr_decay_iters",
    "lr_decay_samples",
    "lr_warmup_fraction",
    "lr_decay_style",
    "weight_decay_incr_style",
    "start_weight_decay",
    "end_weight_decay",
    "min_lr",
)
_DEGREES = (
    "tp_degree",
    "pp_degree",
    "num_micro_batches",
    "expert_model_parallel_size",
    "context_parallel_size",
    "expert_tensor_parallel_size",
    "recompute_num_layers",
)


def _env(suffix: str) -> Any:
    return dataclasses.field(default=None, metadata=env(f"MEGATRON_LM_{suffix}"))


@dataclasses.dataclass
class MegatronLMPlugin:
    """Megatron-LM settings: tensor, pipeline, sequence, context and data parallelism,
    selective activation recomputation, and training-schedule arguments.

    Field names and defaults follow Accelerate's MegatronLMPlugin; `megatron_lm_default_args`
    (built at construction) holds them under Megatron-LM's own argument names. One deliberate
    difference: `context_parallel_size` defaults to 1 (no context parallelism), not 2.
    """

    tp_degree: int = _env("TP_DEGREE")
    pp_degree: int = _env("PP_DEGREE")
    use_custom_fsdp: bool = _env("USE_CUSTOM_FSDP")
    overlap_cpu_optimizer_d2h_h2d: bool = _env("OVERLAP_CPU_OPTIMIZER_D2H_H2D")
    no_load_optim: bool = _env("NO_LOAD_OPTIM")
    eod_mask_loss: bool = _env("EOD_MASK_LOSS")
    no_save_optim: bool = _env("NO_SAVE_OPTIM")
    optimizer_cpu_offload: bool = _env("OPTIMIZER_CPU_OFFLOAD")
    use_precision_aware_optimizer: bool = _env("USE_PRECISION_AWARE_OPTIMIZER")
    decoder_last_pipeline_num_layers: int | None = _env("DECODER_LAST_PIPELINE_NUM_LAYERS")
    recompute_granularity: str = _env("RECOMPUTE_GRANULARITY")
    recompute_method: str = _env("RECOMPUTE_METHOD")
    recompute_num_layers: int = _env("RECOMPUTE_NUM_LAYERS")
    attention_backend: bool = _env("ATTENTION_BACKEND")
    expert_model_parallel_size: int = _env("EXPERT_MODEL_PARALLEL_SIZE")
    context_parallel_size: int = _env("CONTEXT_PARALLEL_SIZE")
    attention_dropout: float = _env("ATTENTION_DROPOUT")
    hidden_dropout: float = _env("HIDDEN_DROPOUT")
    attention_softmax_in_fp32: bool = _env("ATTENTION_SOFTMAX_IN_FP32")
    expert_tensor_parallel_size: int = _env("EXPERT_TENSOR_PARALLEL_SIZE")
    calculate_per_token_loss: bool = _env("CALCULATE_PER_TOKEN_LOSS")
    use_rotary_position_embeddings: bool = _env("USE_ROTARY_POSITION_EMBEDDINGS")
    num_micro_batches: int = _env("NUM_MICRO_BATCHES")
    gradient_clipping: float = _env("GRADIENT_CLIPPING")
    sequence_parallelism: bool = _env("SEQUENCE_PARALLELISM")
    recompute_activations: bool = _env("RECOMPUTE_ACTIVATIONS")
    use_distributed_optimizer: bool = _env("USE_DISTRIBUTED_OPTIMIZER")
    pipeline_model_parallel_split_rank: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    is_train_batch_min: str | bool = True
    train_iters: int | None = None
    train_samples: int | None = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int | None = None
    lr_decay_samples: int | None = None
    lr_warmup_iters: int | None = None
    lr_warmup_samples: int | None = None
    lr_warmup_fraction: float | None = None
    min_lr: float = 0
    consumed_samples: list[int] | None = None
    no_wd_decay_cond: Callable[..., Any] | None = None
    scale_lr_cond: Callable[..., Any] | None = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    tensorboard_dir: str | None = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Any | None = None
    custom_train_step_kwargs: dict[str, Any] | None = None
    custom_model_provider_function: Callable[..., Any] | None = None
    custom_prepare_model_function: Callable[..., Any] | None = None
    custom_megatron_datasets_provider_function: Callable[..., Any] | None = None
    custom_get_batch_function: Callable[..., Any] | None = None
    custom_loss_function: Callable[..., Any] | None = None
    other_megatron_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        fill_from_env(self)
        self._validate()
        # Pipeline parallelism and the distributed optimizer need Megatron's local DDP.
        self.DDP_impl = "local" if self.pp_degree > 1 or self.use_distributed_optimizer else "torch"
        if self.consumed_samples is not None:
            # One counter per data loader (train, valid, test); missing ones start at zero.
            self.consumed_samples = list(self.consumed_samples) + [0] * (
                3 - len(self.consumed_samples)
            )
        self.megatron_lm_default_args: dict[str, Any] = {
            "tensor_model_parallel_size": self.tp_degree,
            "pipeline_model_parallel_size": self.pp_degree,
            "pipeline_model_parallel_split_rank": self.pipeline_model_parallel_split_rank,
            "num_layers_per_virtual_pipeline_stage": self.num_layers_per_virtual_pipeline_stage,
            "DDP_impl": self.DDP_impl,
            "use_distributed_optimizer": self.use_distributed_optimizer,
            "sequence_parallel": self.sequence_parallelism,
            "clip_grad": self.gradient_clipping,
            "num_micro_batches": self.num_micro_batches,
            "consumed_samples": self.consumed_samples,
            "no_wd_decay_cond": self.no_wd_decay_cond,
            "scale_lr_cond": self.scale_lr_cond,
            "lr_mult": self.lr_mult,
            "megatron_dataset_flag": self.megatron_dataset_flag,
            "eval_iters": self.eval_iters,
            "eval_interval": self.eval_interval,
        }
        for name in (
            "use_custom_fsdp",
            "no_load_optim",
            "eod_mask_loss",
            "no_save_optim",
            "optimizer_cpu_offload",
            "overlap_cpu_optimizer_d2h_h2d",
            "use_precision_aware_optimizer",
            "decoder_last_pipeline_num_layers",
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
            "attention_backend",
            "expert_model_parallel_size",
            "context_parallel_size",
            "attention_dropout",
            "hidden_dropout",
            "attention_softmax_in_fp32",
            "expert_tensor_parallel_size",
            "calculate_per_token_loss",
            "use_rotary_position_embeddings",
        ):
            self.megatron_lm_default_args[name] = getattr(self, name)
        for name in _SCHEDULE_ARGS:
            # The schedule set on the plugin; a MegatronLMDummyScheduler may fill it later.
            self.megatron_lm_default_args[name] = getattr(self, name)
        if self.recompute_activations:
            self.megatron_lm_default_args["recompute_granularity"] = "selective"
        if self.other_megatron_args is not None:
            self.megatron_lm_default_args.update(self.other_megatron_args)

    def _validate(self) -> None:
        for name in _DEGREES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MegatronLMPlugin({name}={value!r}) must be an int >= 1")
        choices = {
            "weight_decay_incr_style": _DECAY_STYLES,
            "lr_decay_style": _DECAY_STYLES,
            "recompute_granularity": _RECOMPUTE_GRANULARITY,
            "recompute_method": _RECOMPUTE_METHODS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"MegatronLMPlugin({name}={getattr(self, name)!r}) must be one of "
                    f"{list(allowed)}"
                )
        for name in ("attention_dropout", "hidden_dropout"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(
                    f"MegatronLMPlugin({name}={getattr(self, name)!r}) must be in [0, 1]"
                )
        if self.consumed_samples is not None and len(self.consumed_samples) > 3:
            raise ValueError(
                f"MegatronLMPlugin(consumed_samples={self.consumed_samples!r}) has one entry per "
                "prepared data loader (train, valid, test): at most 3"
            )

    def set_network_size_args(self, model: Any, batch_data: Any = None) -> None:
        """Fill the network arguments (layers, sizes, sequence length) from ``model.config``.

        Raises:
            ValueError: no parser is registered for the model's ``config.model_type``.
        """
        model_type = str(getattr(getattr(model, "config", None), "model_type", "")).lower()
        for name, parser in MODEL_CONFIGS_TO_MEGATRON_PARSERS.items():
            if model_type and name in model_type:
                parser(self, model, batch_data)
                return
        raise ValueError(
            f"Megatron-LM has no model-config parser for model_type={model_type!r} "
            f"({type(model).__name__}); supported: {sorted(MODEL_CONFIGS_TO_MEGATRON_PARSERS)}. "
            "Register one with @add_model_config_to_megatron_parser(model_type)."
        )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Enable Megatron's fp16 or bf16 training (bf16 needs Megatron's local DDP)."""
        if mixed_precision == "fp16":
            self.megatron_lm_default_args["fp16"] = True
        elif mixed_precision == "bf16":
            self.megatron_lm_default_args["bf16"] = True
            self.DDP_impl = "local"
            self.megatron_lm_default_args["DDP_impl"] = self.DDP_impl

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Record the micro batch size and data-parallel degree, and the global batch size."""
        self.data_parallel_size = dp_degree
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = dp_degree * micro_batch_size * self.num_micro_batches
        self.megatron_lm_default_args.update(
            data_parallel_size=dp_degree,
            micro_batch_size=micro_batch_size,
            global_batch_size=self.global_batch_size,
        )

    def set_optimizer_type(self, optimizer: Any) -> None:
        """Translate a torch Adam/AdamW or SGD optimizer into Megatron's optimizer arguments.

        Raises:
            ValueError: the optimizer is neither an Adam variant nor SGD.
        """
        name = type(optimizer).__name__.lower()
        defaults = optimizer.defaults
        args = self.megatron_lm_default_args
        if "adam" in name:
            args.update(
                optimizer="adam",
                adam_beta1=defaults["betas"][0],
                adam_beta2=defaults["betas"][1],
                adam_eps=defaults["eps"],
            )
        elif "sgd" in name:
            args.update(optimizer="sgd", sgd_momentum=defaults["momentum"])
        else:
            raise ValueError(
                f"Megatron-LM supports Adam-style and SGD optimizers, got "
                f"{type(optimizer).__name__}; use torch.optim.AdamW or torch.optim.SGD"
            )
        args.update(lr=defaults["lr"], weight_decay=defaults["weight_decay"])

    def set_scheduler_args(self, scheduler: Any) -> None:
        """Take train/warm-up iterations from a scheduler exposing `total_num_steps` and
        `warmup_num_steps` (per data-parallel rank), then record the schedule arguments."""
        dp = self.megatron_lm_default_args.get("data_parallel_size", 1)
        if self.train_iters is None:
            self.train_iters = scheduler.total_num_steps // dp
            if self.train_samples is not None:
                warnings.warn(
                    "MegatronLMPlugin: train_samples is ignored because train_iters comes from the "
                    "scheduler",
                    UserWarning,
                    stacklevel=2,
                )
                self.train_samples = None
        if self.lr_warmup_iters is None:
            self.lr_warmup_iters = scheduler.warmup_num_steps // dp
            self.lr_warmup_samples = 0
        for name in _SCHEDULE_ARGS:
            self.megatron_lm_default_args[name] = getattr(self, name)
