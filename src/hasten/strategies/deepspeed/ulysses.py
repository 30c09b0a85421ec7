"""DeepSpeed's Ulysses sequence parallelism (ALST), as Accelerate wires it for transformers.

With ``ParallelismConfig(sp_size=N, sp_backend="deepspeed")`` each group of N processes splits
every sequence N ways: DeepSpeed's ``UlyssesSPAttentionHF`` replaces a transformers model's
attention with one that trades sequence shards for head shards (all-to-all) around the core
attention, ``deepspeed.initialize`` gets its groups (``mpu``), and a ``UlyssesSPDataLoaderAdapter``
hands each process its shard of every sequence. Data parallelism is over the remaining
``world / N`` processes. It runs wherever DeepSpeed does, CPU processes over gloo included.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from hasten.config.parallelism import ParallelismConfig
from hasten.core.imports import require
from hasten.core.versions import compare_versions

__all__ = ["MIN_DEEPSPEED", "adapt_data_loader", "register_attention", "sequence_parallel"]

#: The first DeepSpeed release with the Ulysses pieces transformers' Trainer uses.
MIN_DEEPSPEED = "0.18.2"


def sequence_parallel(config: ParallelismConfig | None) -> ParallelismConfig | None:
    """``config`` if it asks for DeepSpeed sequence parallelism (sp_size > 1), else None."""
    if config is None or not config.sp_enabled or config.sp_backend != "deepspeed":
        return None
    return config


def _require_deepspeed() -> Any:
    deepspeed = require(
        "deepspeed", feature="sequence parallelism (sp_size > 1)", extra="deepspeed"
    )
    if not compare_versions("deepspeed", ">=", MIN_DEEPSPEED):
        raise ImportError(
            f"DeepSpeed's Ulysses sequence parallelism needs deepspeed>={MIN_DEEPSPEED}, but "
            f"deepspeed {deepspeed.__version__} is installed. Upgrade it "
            "(pip install -U deepspeed), or set sp_size=1."
        )
    return deepspeed


def register_attention(model: nn.Module, config: ParallelismConfig, micro_batch_size: int) -> Any:
    """Put Ulysses attention into transformers ``model``; return DeepSpeed's ``mpu`` (its
    sequence- and data-parallel groups) for ``deepspeed.initialize``.

    Raises:
        ImportError: DeepSpeed is missing or older than `MIN_DEEPSPEED`.
        ValueError: ``model`` is not a transformers model (it has no ``config``).
    """
    deepspeed = _require_deepspeed()
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    if not deepspeed.comm.is_initialized():
        # The groups are made through deepspeed.comm: let it adopt the existing process group.
        deepspeed.comm.init_distributed(
            dist_backend=torch.distributed.get_backend(),
            dist_init_required=False,
            auto_mpi_discovery=False,
        )
    if not hasattr(model, "config"):
        raise ValueError(
            f"Sequence parallelism (sp_size={config.sp_size}) replaces the attention of a "
            f"transformers model, but this {type(model).__name__} has no `config`. Use a "
            "transformers model, or set sp_size=1."
        )
    handler = config.sp_handler
    kwargs: dict[str, Any] = {}
    if (
        "disable_in_eval"
        in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters
    ):
        kwargs["disable_in_eval"] = True
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        sequence_parallel_size=config.sp_size,
        seq_length=getattr(handler, "sp_seq_length", None),
        seq_length_is_variable=getattr(handler, "sp_seq_length_is_variable", True),
        core_attn_implementation=getattr(handler, "sp_attn_implementation", None),
        micro_batch_size=micro_batch_size,
        **kwargs,
    )


def adapt_data_loader(loader: Any, device: torch.device) -> Any:
    """Wrap a prepared data loader so each process gets its shard of every sequence.

    Needs the sequence-parallel groups, which exist once a model was prepared.

    Raises:
        RuntimeError: no model was prepared under sequence parallelism yet.
    """
    _require_deepspeed()
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from deepspeed.utils import groups

    if getattr(groups, "mpu", None) is None:
        raise RuntimeError(
            "The sequence-parallel data loader needs DeepSpeed's sequence-parallel groups, which "
            "exist once the model is prepared: call accelerator.prepare(model, ...) first, then "
            "deepspeed_ulysses_dl_adapter(data_loader, model)."
        )
    return UlyssesSPDataLoaderAdapter(
        loader,
        sp_rank=groups._get_sequence_parallel_rank(),
        sp_group=groups._get_sequence_parallel_group(),
        sp_world_size=groups._get_sequence_parallel_world_size(),
        device=device,
    )
