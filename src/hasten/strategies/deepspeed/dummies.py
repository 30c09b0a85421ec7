"""Placeholders for an optimizer / scheduler that the DeepSpeed config file defines.

`DummyOptim` and `DummyScheduler` carry the parameters and the values that fill the config's
``"auto"`` entries; `deepspeed.initialize` builds the real objects from the config's
``optimizer`` / ``scheduler`` sections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["DummyOptim", "DummyScheduler", "map_pytorch_optim_to_deepspeed"]


class DummyOptim:
    """Stands for the optimizer of the DeepSpeed config (its ``optimizer`` section).

    Args:
        params: the model parameters (or parameter groups) to optimize.
        lr: fills ``optimizer.params.lr`` when it is "auto".
        weight_decay: fills ``optimizer.params.weight_decay`` when it is "auto".
        **kwargs: other values kept for the config (e.g. ``betas``, ``eps``).
    """

    def __init__(
        self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any
    ) -> None:
        self.params = params if isinstance(params, list) else list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler of the DeepSpeed config (or one built by ``lr_scheduler_callable``).

    Args:
        optimizer: the `DummyOptim` (or prepared optimizer) it schedules.
        total_num_steps: fills ``scheduler.params.total_num_steps`` when it is "auto".
        warmup_num_steps: fills ``scheduler.params.warmup_num_steps`` when it is "auto".
        lr_scheduler_callable: ``f(optimizer) -> scheduler`` used when the config has no
            ``scheduler`` section.
        **kwargs: other values kept for the config.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """Return DeepSpeed's own version of a torch Adam/AdamW/Adagrad (CPU Adam when on CPU).

    Keeps the learning rate, weight decay and (for Adam) betas/eps of every group.

    Raises:
        ValueError: the optimizer is not one DeepSpeed has an equivalent for.
    """
    # optional: deepspeed
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        defaults.update(betas=optimizer.defaults["betas"], eps=optimizer.defaults["eps"])
        return DeepSpeedCPUAdam(
            optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults
        )
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    raise ValueError(
        f"map_pytorch_optim_to_deepspeed has no DeepSpeed equivalent of "
        f"{type(optimizer).__name__}; it maps torch.optim.Adam, AdamW and Adagrad. Keep your "
        "optimizer (with zero_force_ds_cpu_optimizer: false under offload) instead."
    )
