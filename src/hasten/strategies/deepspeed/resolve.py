"""Turn a `DeepSpeedPlugin`'s config into the dict `deepspeed.initialize` gets, once per prepare.

Every ``"auto"`` is filled from what the Accelerator knows (data loader batch size, accumulation,
clipping, the `DummyOptim` / `DummyScheduler` values, the model's hidden size); what cannot be
filled, and every combination DeepSpeed would reject later or silently get wrong, raises here
with the value to set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hasten.strategies.deepspeed.dummies import DummyOptim, DummyScheduler

if TYPE_CHECKING:
    from hasten.config.deepspeed import DeepSpeedPlugin

__all__ = ["EngineInputs", "check_batch_sizes", "resolve_config"]

# DeepSpeed's client-optimizer classes that run on the host (offload works without the force flag).
_DS_CPU_OPTIMIZERS = ("DeepSpeedCPUAdam", "DeepSpeedCPUAdagrad", "DeepSpeedCPULion")


@dataclass
class EngineInputs:
    """What one `deepspeed.initialize` call is made of."""

    model: nn.Module
    optimizer: Any = None
    scheduler: Any = None
    micro_batch_size: int | None = None
    num_processes: int = 1
    accumulation_steps: int = 1
    #: The ParallelismConfig asking for DeepSpeed sequence parallelism, if any
    #: (``num_processes`` is then the data-parallel size: processes / sp_size).
    sequence_parallel: Any = None


def _hidden_size(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    if size is None:
        sizes = getattr(config, "hidden_sizes", None)
        size = max(sizes) if sizes else None
    return int(size) if isinstance(size, int) else None


def _check_optimizer(config: dict[str, Any], optimizer: Any) -> None:
    in_config = "optimizer" in config
    if in_config and optimizer is not None and not isinstance(optimizer, DummyOptim):
        raise ValueError(
            "The DeepSpeed config has an 'optimizer' section and a real optimizer was passed to "
            "prepare(); use one: remove the section, or pass hasten.utils.DummyOptim(params, "
            "lr=...) instead of the optimizer."
        )
    if isinstance(optimizer, DummyOptim) and not in_config:
        raise ValueError(
            "DummyOptim was passed to prepare() but the DeepSpeed config has no 'optimizer' "
            'section to build it from; add one (e.g. {"type": "AdamW", "params": {"lr": '
            '"auto", "torch_adam": true}}) or pass a torch optimizer.'
        )


def _check_scheduler(config: dict[str, Any], scheduler: Any) -> None:
    in_config = "scheduler" in config
    if in_config and scheduler is not None and not isinstance(scheduler, DummyScheduler):
        raise ValueError(
            "The DeepSpeed config has a 'scheduler' section and a real scheduler was passed to "
            "prepare(); use one: remove the section, or pass hasten.utils.DummyScheduler."
        )
    if (
        isinstance(scheduler, DummyScheduler)
        and not in_config
        and scheduler.lr_scheduler_callable is None
    ):
        raise ValueError(
            "DummyScheduler was passed to prepare() but the DeepSpeed config has no 'scheduler' "
            "section; add one, or give DummyScheduler(lr_scheduler_callable=...)."
        )


def _check_offload(config: dict[str, Any], optimizer: Any) -> None:
    zero = config.get("zero_optimization") or {}
    device = str((zero.get("offload_optimizer") or {}).get("device", "none")).lower()
    if device not in ("cpu", "nvme") or optimizer is None or isinstance(optimizer, DummyOptim):
        return
    if type(optimizer).__name__ in _DS_CPU_OPTIMIZERS:
        return
    if config.get("zero_force_ds_cpu_optimizer", True) not in (False, "false", "False"):
        raise ValueError(
            f"ZeRO offload_optimizer.device={device!r} with the client optimizer "
            f"{type(optimizer).__name__}: DeepSpeed refuses this unless told to. Either set "
            '"zero_force_ds_cpu_optimizer": false in the DeepSpeed config (keep your optimizer, '
            "stepped on the host), or let DeepSpeed build its CPU optimizer: add an 'optimizer' "
            "section to the config and pass hasten.utils.DummyOptim(model.parameters()) instead."
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_batch_sizes(config: dict[str, Any], num_processes: int) -> None:
    """Refuse a train_batch_size that is not micro batch x accumulation x processes.

    Raises:
        ValueError: the three explicit values disagree (all are named, with the product).
    """
    values = [
        config.get(key)
        for key in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        )
    ]
    if not all(_is_int(v) for v in values):
        return
    total, micro, steps = (int(v) for v in values)  # type: ignore[arg-type]
    expected = micro * steps * num_processes
    if total != expected:
        raise ValueError(
            f"DeepSpeed train_batch_size={total} but train_micro_batch_size_per_gpu={micro} x "
            f"gradient_accumulation_steps={steps} x {num_processes} processes = {expected}. Set "
            f"train_batch_size to {expected} or to 'auto' (hasten fills it in)."
        )


def _auto_values(plugin: DeepSpeedPlugin, inputs: EngineInputs) -> dict[str, Any]:
    """Values for every "auto" hasten knows; dotted config keys."""
    values: dict[str, Any] = {
        "gradient_accumulation_steps": inputs.accumulation_steps,
        "gradient_clipping": (
            1.0 if plugin.gradient_clipping in (None, "auto") else plugin.gradient_clipping
        ),
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": bool(
            plugin.zero3_save_16bit_model
        ),
    }
    micro = plugin.get_value("train_micro_batch_size_per_gpu")  # an explicit value wins
    if not isinstance(micro, int):
        micro = inputs.micro_batch_size
    if isinstance(micro, int):
        values["train_micro_batch_size_per_gpu"] = micro
        values["train_batch_size"] = micro * inputs.accumulation_steps * inputs.num_processes
    hidden = _hidden_size(inputs.model)
    if hidden is not None:
        values["zero_optimization.reduce_bucket_size"] = hidden * hidden
        values["zero_optimization.stage3_prefetch_bucket_size"] = int(0.9 * hidden * hidden)
        values["zero_optimization.stage3_param_persistence_threshold"] = 10 * hidden
    optimizer, scheduler = inputs.optimizer, inputs.scheduler
    if isinstance(optimizer, DummyOptim):
        values["optimizer.params.lr"] = optimizer.lr
        values["optimizer.params.weight_decay"] = optimizer.weight_decay
        values.update({f"optimizer.params.{k}": v for k, v in optimizer.kwargs.items()})
    if isinstance(scheduler, DummyScheduler):
        lr = getattr(optimizer, "lr", None) or plugin.get_value("optimizer.params.lr")
        values["scheduler.params.warmup_min_lr"] = 0
        values["scheduler.params.warmup_num_steps"] = scheduler.warmup_num_steps
        if lr is not None:
            values["scheduler.params.warmup_max_lr"] = lr
        if scheduler.total_num_steps is not None:
            values["scheduler.params.total_num_steps"] = scheduler.total_num_steps
    return values


def _check_accumulation(config: dict[str, Any], steps: int) -> None:
    value = config.get("gradient_accumulation_steps", "auto")
    if value != "auto" and value != steps:
        raise ValueError(
            f"The DeepSpeed config sets gradient_accumulation_steps={value!r} but the "
            f"Accelerator accumulates {steps} steps (Accelerator(gradient_accumulation_steps=...)"
            " / GradientAccumulationPlugin). Set one of them: make them equal, or set the "
            "config's value to 'auto'."
        )


def _remaining_autos(config: dict[str, Any], prefix: str = "") -> list[str]:
    found = []
    for key, value in config.items():
        if isinstance(value, dict):
            found += _remaining_autos(value, f"{prefix}{key}.")
        elif value == "auto":
            found.append(prefix + key)
    return found


def resolve_config(plugin: DeepSpeedPlugin, inputs: EngineInputs) -> dict[str, Any]:
    """Fill the plugin's config for one engine and check it; returns the plugin's config dict.

    Raises:
        ValueError: an "auto" with no value (naming it and what to set), an explicit value
            that contradicts the Accelerator, an inconsistent train_batch_size, an optimizer or
            scheduler both in the config and in code, or offload with a client optimizer.
    """
    config: dict[str, Any] = plugin.deepspeed_config
    _check_optimizer(config, inputs.optimizer)
    if isinstance(inputs.optimizer, torch.optim.Optimizer):
        # as Accelerate: ZeRO wraps any torch optimizer given in code (SGD, Lion...), where
        # DeepSpeed alone refuses those outside its tested list
        config["zero_allow_untested_optimizer"] = True
    _check_scheduler(config, inputs.scheduler)
    _check_accumulation(config, inputs.accumulation_steps)
    values = _auto_values(plugin, inputs)
    missing = [key for key in _remaining_autos(config) if key not in values]
    if missing:
        hints = {
            "train_micro_batch_size_per_gpu": "pass the training DataLoader to the same "
            "prepare() call, or set train_micro_batch_size_per_gpu in the DeepSpeed config",
        }
        detail = "; ".join(f"{key}: {hints.get(key, 'set it in the config')}" for key in missing)
        raise ValueError(f"These DeepSpeed config values are 'auto' and cannot be filled: {detail}")
    plugin.deepspeed_config_process(must_match=False, **values)
    check_batch_sizes(config, inputs.num_processes)
    _check_offload(config, inputs.optimizer)
    return config
