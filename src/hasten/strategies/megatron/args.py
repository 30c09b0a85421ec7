"""Megatron-LM arguments from a `MegatronLMPlugin`: parallel sizes and megatron-core configs.

Pure functions over ``plugin.megatron_lm_default_args`` (Megatron's own argument names, as the
plugin and the model-config parsers fill them), so every decision is tested on a CPU; the
engine turns these dicts into megatron-core's `TransformerConfig`, `OptimizerConfig`,
`OptimizerParamScheduler` and `GPTModel`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hasten.config.megatron import MegatronLMPlugin

__all__ = [
    "bert_model_kwargs",
    "fp8_args",
    "gpt_model_kwargs",
    "megatron_args",
    "optimizer_config_kwargs",
    "padded_vocab_size",
    "parallel_sizes",
    "scheduler_kwargs",
    "t5_layer_counts",
    "t5_model_kwargs",
    "transformer_config_kwargs",
    "uses_transformer_engine",
]

# fp8 trains bf16 weights; Transformer Engine runs the matmuls in fp8.
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
# TransformerConfig's fp8 fields, filled by `fp8_args` (None: megatron-core's default).
_FP8_FIELDS = (
    "fp8",
    "fp8_recipe",
    "fp8_margin",
    "fp8_interval",
    "fp8_amax_history_len",
    "fp8_amax_compute_algo",
    "fp8_wgrad",
)


def parallel_sizes(plugin: MegatronLMPlugin, world_size: int) -> dict[str, int]:
    """Tensor, pipeline, context, expert and data-parallel sizes for ``world_size`` processes.

    Raises:
        ValueError: tp x pp x cp does not divide the world size (no whole data-parallel size).
    """
    tp = int(plugin.tp_degree)
    pp = int(plugin.pp_degree)
    cp = int(plugin.context_parallel_size)
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise ValueError(
            f"Megatron-LM sizes tp_degree={tp} x pp_degree={pp} x context_parallel_size={cp} = "
            f"{model_parallel} do not divide the {world_size} processes of this run: the "
            "data-parallel size (processes / (tp x pp x cp)) must be a whole number. Choose "
            f"sizes whose product divides {world_size}, or launch a multiple of {model_parallel} "
            "processes."
        )
    return {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "context_parallel_size": cp,
        "expert_model_parallel_size": int(plugin.expert_model_parallel_size),
        "expert_tensor_parallel_size": int(plugin.expert_tensor_parallel_size),
        "data_parallel_size": world_size // model_parallel,
    }


def padded_vocab_size(orig_vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of ``divisible_by x tp`` (even TP shards)."""
    multiple = divisible_by * tp
    return int(math.ceil(orig_vocab_size / multiple) * multiple)


def megatron_args(
    plugin: MegatronLMPlugin, world_size: int, mixed_precision: str
) -> SimpleNamespace:
    """The run's Megatron arguments as a namespace (what ``get_args()`` returns in Megatron).

    Raises:
        ValueError: bad parallel sizes, or the network arguments were never filled (no model
            was prepared, or its config has no parser).
    """
    values = dict(plugin.megatron_lm_default_args)
    if "num_layers" not in values:
        raise ValueError(
            "Megatron-LM needs the network arguments (num_layers, hidden_size, ...): pass the "
            "model to accelerator.prepare() together with its data loader, optimizer and "
            "scheduler, or set them in MegatronLMPlugin(other_megatron_args={...})."
        )
    values.update(parallel_sizes(plugin, world_size))
    values["world_size"] = world_size
    values["fp16"] = mixed_precision == "fp16"
    values["bf16"] = mixed_precision in ("bf16", "fp8")
    values["params_dtype"] = _DTYPES.get(mixed_precision, torch.float32)
    values.setdefault("micro_batch_size", 1)
    values.setdefault("num_micro_batches", 1)
    values.setdefault(
        "global_batch_size",
        values["micro_batch_size"] * values["num_micro_batches"] * values["data_parallel_size"],
    )
    values["padded_vocab_size"] = padded_vocab_size(
        int(values.get("orig_vocab_size") or 0), values["tensor_model_parallel_size"]
    )
    return SimpleNamespace(**values)


def _get(args: SimpleNamespace, name: str, default: Any = None) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def transformer_config_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `TransformerConfig` for this run."""
    kwargs: dict[str, Any] = {
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "num_attention_heads": args.num_attention_heads,
        "ffn_hidden_size": _get(args, "ffn_hidden_size", 4 * args.hidden_size),
        "num_query_groups": _get(args, "num_query_groups"),
        "hidden_dropout": _get(args, "hidden_dropout", 0.1),
        "attention_dropout": _get(args, "attention_dropout", 0.1),
        "layernorm_epsilon": _get(args, "norm_epsilon", 1e-5),
        "normalization": _get(args, "normalization", "LayerNorm"),
        "gated_linear_unit": bool(_get(args, "swiglu", False)),
        "add_bias_linear": bool(_get(args, "add_bias_linear", True)),
        "attention_softmax_in_fp32": bool(_get(args, "attention_softmax_in_fp32", False)),
        "calculate_per_token_loss": bool(_get(args, "calculate_per_token_loss", False)),
        "fp16": args.fp16,
        "bf16": args.bf16,
        "params_dtype": args.params_dtype,
        "pipeline_dtype": args.params_dtype,
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "context_parallel_size": args.context_parallel_size,
        "expert_model_parallel_size": args.expert_model_parallel_size,
        "expert_tensor_parallel_size": args.expert_tensor_parallel_size,
        "sequence_parallel": bool(_get(args, "sequence_parallel", False)),
        "recompute_granularity": _get(args, "recompute_granularity"),
        "recompute_method": _get(args, "recompute_method"),
        "recompute_num_layers": _get(args, "recompute_num_layers"),
        "num_moe_experts": _get(args, "num_experts"),
        "moe_router_topk": _get(args, "moe_router_topk", 2),
        "moe_ffn_hidden_size": _get(args, "moe_ffn_hidden_size"),
        "moe_shared_expert_intermediate_size": _get(args, "moe_shared_expert_intermediate_size"),
        "variable_seq_lengths": False,
    }
    if _get(args, "use_cpu_initialization"):
        kwargs["use_cpu_initialization"] = True  # Megatron's --use-cpu-initialization
    if _get(args, "kv_channels") is not None:
        kwargs["kv_channels"] = args.kv_channels
    for name in _FP8_FIELDS:
        if _get(args, name) is not None:
            kwargs[name] = getattr(args, name)
    if kwargs["recompute_granularity"] != "full":
        # Megatron only takes a method / layer count with full recomputation.
        kwargs["recompute_method"] = kwargs["recompute_num_layers"] = None
    if kwargs["gated_linear_unit"]:
        kwargs["activation_func"] = torch.nn.functional.silu
    return kwargs


def optimizer_config_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `OptimizerConfig` (from the torch optimizer)."""
    return {
        "optimizer": _get(args, "optimizer", "adam"),
        "lr": _get(args, "lr", 1e-3),
        "min_lr": _get(args, "min_lr", 0.0),
        "weight_decay": _get(args, "weight_decay", 0.0),
        "adam_beta1": _get(args, "adam_beta1", 0.9),
        "adam_beta2": _get(args, "adam_beta2", 0.999),
        "adam_eps": _get(args, "adam_eps", 1e-8),
        "sgd_momentum": _get(args, "sgd_momentum", 0.9),
        "clip_grad": _get(args, "clip_grad", 1.0),
        "fp16": args.fp16,
        "bf16": args.bf16,
        "params_dtype": args.params_dtype,
        "use_distributed_optimizer": bool(_get(args, "use_distributed_optimizer", False)),
    }


def scheduler_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """Keyword arguments of `OptimizerParamScheduler`, counted in samples as Megatron does.

    Raises:
        ValueError: neither ``train_iters`` nor ``train_samples`` is known.
    """
    batch = args.global_batch_size
    train_iters = _get(args, "train_iters")
    if train_iters is not None:
        decay = _get(args, "lr_decay_iters", train_iters) * batch
        warmup = _get(args, "lr_warmup_iters", 0) * batch
        total = train_iters * batch
    elif _get(args, "train_samples") is not None:
        total = args.train_samples
        decay = _get(args, "lr_decay_samples", total)
        warmup = _get(args, "lr_warmup_samples", 0)
    else:
        raise ValueError(
            "Megatron-LM needs the length of training: pass a MegatronLMDummyScheduler("
            "optimizer, total_num_steps=..., warmup_num_steps=...) to prepare(), or set "
            "MegatronLMPlugin(train_iters=...)."
        )
    fraction = _get(args, "lr_warmup_fraction")
    if fraction is not None:
        warmup = int(fraction * decay)
    weight_decay = _get(args, "weight_decay", 0.0)
    return {
        "init_lr": 0.0,
        "max_lr": _get(args, "lr", 1e-3),
        "min_lr": _get(args, "min_lr", 0.0),
        "lr_warmup_steps": int(warmup),
        "lr_decay_steps": int(decay),
        "lr_decay_style": _get(args, "lr_decay_style", "linear"),
        "start_wd": _get(args, "start_weight_decay", weight_decay),
        "end_wd": _get(args, "end_weight_decay", weight_decay),
        "wd_incr_steps": int(total),
        "wd_incr_style": _get(args, "weight_decay_incr_style", "constant"),
    }


def _language_model_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """The keyword arguments megatron-core's GPT and BERT models share."""
    return {
        "vocab_size": args.padded_vocab_size,
        "max_sequence_length": _get(args, "max_position_embeddings", args.seq_length),
        "parallel_output": True,
        "share_embeddings_and_output_weights": not _get(
            args, "untie_embeddings_and_output_weights", False
        ),
        "position_embedding_type": _get(args, "position_embedding_type", "learned_absolute"),
    }


def gpt_model_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `GPTModel` (besides config and layer spec)."""
    return {**_language_model_kwargs(args), "rotary_base": int(_get(args, "rotary_base", 10000))}


def bert_model_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `BertModel` (besides config and layer spec).

    Raises:
        NotImplementedError: a classification model (Megatron's ``Classification`` head is not
            part of megatron-core).
    """
    if not _get(args, "pretraining_flag", True):
        raise NotImplementedError(
            "hasten builds BERT pretraining models (masked LM, optional sentence-order head) with "
            "megatron-core's BertModel; megatron-core has no sequence-classification BERT. Pass "
            "MegatronLMPlugin(custom_model_provider_function=...) returning a megatron-core model "
            "with a classification head."
        )
    return {
        "num_tokentypes": int(_get(args, "num_tokentypes", 2)),
        **_language_model_kwargs(args),
        "add_binary_head": bool(_get(args, "bert_binary_head", False)),
    }


def t5_layer_counts(args: SimpleNamespace) -> tuple[int, int]:
    """(encoder layers, decoder layers) of a T5 model: Megatron's ``encoder/decoder_num_layers``."""
    encoder = int(_get(args, "encoder_num_layers", args.num_layers))
    return encoder, int(_get(args, "decoder_num_layers", encoder))


def t5_model_kwargs(args: SimpleNamespace) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `T5Model` (besides configs and layer specs)."""
    encoder = _get(args, "encoder_seq_length", args.seq_length)
    decoder = _get(args, "decoder_seq_length", encoder)
    return {
        "vocab_size": args.padded_vocab_size,
        "max_sequence_length": _get(args, "max_position_embeddings", max(encoder, decoder)),
        "parallel_output": True,
        "share_embeddings_and_output_weights": not _get(
            args, "untie_embeddings_and_output_weights", False
        ),
        "position_embedding_type": _get(args, "position_embedding_type", "learned_absolute"),
        "relative_attention_num_buckets": int(_get(args, "relative_attention_num_buckets", 32)),
        "relative_attention_max_distance": int(_get(args, "relative_attention_max_distance", 128)),
    }


def uses_transformer_engine(args: SimpleNamespace) -> bool:
    """Whether the layers come from Transformer Engine (fp8 needs them; otherwise local layers)."""
    return _get(args, "fp8") is not None or _get(args, "transformer_impl") == "transformer_engine"


_MEGATRON_FP8_FORMATS = {"HYBRID": "hybrid", "E4M3": "e4m3"}


def fp8_args(recipe: Any) -> dict[str, Any]:
    """Megatron's fp8 arguments (TransformerConfig fields) from a `TERecipeKwargs`.

    The recipe's format, margin, interval, amax history and algorithm map to ``fp8``,
    ``fp8_margin``, ``fp8_interval``, ``fp8_amax_history_len`` and ``fp8_amax_compute_algo``;
    MXFP8 block scaling to ``fp8_recipe="mxfp8"`` (else "delayed"); keeping the weight-gradient
    GEMM in higher precision (``override_linear_precision[2]``) to ``fp8_wgrad=False``.

    Raises:
        ValueError: the E5M2 format (megatron-core trains with "hybrid" or "e4m3").
    """
    fmt = str(recipe.fp8_format).upper()
    if fmt not in _MEGATRON_FP8_FORMATS:
        raise ValueError(
            f"TERecipeKwargs(fp8_format={recipe.fp8_format!r}) cannot be used with Megatron-LM: "
            "megatron-core trains with fp8_format 'HYBRID' (E4M3 forward, E5M2 gradients) or "
            "'E4M3'. Choose one of those."
        )
    override = tuple(recipe.override_linear_precision or (False, False, False))
    return {
        "fp8": _MEGATRON_FP8_FORMATS[fmt],
        "fp8_recipe": "mxfp8" if recipe.use_mxfp8_block_scaling else "delayed",
        "fp8_margin": int(recipe.margin),
        "fp8_interval": int(recipe.interval),
        "fp8_amax_history_len": int(recipe.amax_history_len),
        "fp8_amax_compute_algo": str(recipe.amax_compute_algo),
        "fp8_wgrad": not bool(override[2]),
    }
