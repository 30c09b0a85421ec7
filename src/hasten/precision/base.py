"""`Precision`: the numeric policy of a training run, chosen once; this base is plain fp32.

The Accelerator asks its precision object to wrap the model's forward, run backward and
unscale gradients; the fp32 policy does nothing in each, so choosing it costs nothing per step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from hasten.config.enums import FP8BackendType

__all__ = ["Precision"]


class Precision:
    """Full precision (``mixed_precision="no"``): no autocast, no loss scaling.

    Also stands for engines that manage precision themselves (DeepSpeed, Megatron-LM): then
    ``mixed_precision`` carries the requested label while every hook stays a no-op.

    Args:
        mixed_precision: the label reported to the user (``"no"`` unless an engine owns it).
    """

    native_amp: bool = False
    scaler: torch.amp.GradScaler | None = None
    #: The fp8 library of an fp8 policy (None for the others).
    backend: FP8BackendType | None = None

    def __init__(self, mixed_precision: str = "no") -> None:
        self.mixed_precision = mixed_precision

    def autocast(self, autocast_handler: Any = None) -> AbstractContextManager[Any]:
        """Return the context that runs code under this policy (here: nothing changes)."""
        return nullcontext()

    def wrap_forward(self, model: torch.nn.Module) -> torch.nn.Module:
        """Make ``model.forward`` run under this policy (here: unchanged)."""
        return model

    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """Transform the objects of one prepare() call that the policy must see together
        (MS-AMP casts a model and its optimizer at once); here: unchanged."""
        return objects

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients of ``optimizer`` by the loss scale (here: nothing to undo)."""

    def state_dict(self) -> dict[str, Any]:
        """Return what a checkpoint must keep of this policy (the grad scaler's state)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mixed_precision={self.mixed_precision!r})"
