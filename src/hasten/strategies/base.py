"""The `Strategy` interface: how a model is split across processes, decided once in prepare.

The Accelerator never branches on `DistributedType` per step; it asks its strategy object, which
`strategies.select.select_strategy` picked once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from hasten.strategies.unwrap import extract_model_from_parallel

__all__ = ["Strategy"]


class Strategy:
    """Base strategy: one replica of the model per process, nothing to synchronise.

    Subclasses override only what differs; every method here is the single-process answer.
    """

    #: Short name shown in messages and reprs.
    name: str = "base"
    #: True when gradients are exchanged between processes during backward.
    syncs_gradients: bool = False

    def check_usable(self) -> None:
        """Raise if this strategy cannot run yet (engines that are accepted but not wired)."""

    def setup_module(self, module: nn.Module, device: torch.device | None) -> nn.Module:
        """Move ``module`` to ``device`` (None: leave it where it is) and wrap it if needed."""
        if device is not None:
            module = module.to(device)
        return module

    def no_sync(self, module: nn.Module) -> AbstractContextManager[None]:
        """Context in which backward accumulates gradients locally without communicating."""
        return contextlib.nullcontext()

    def join(self, joinables: list[Any]) -> AbstractContextManager[Any]:
        """Context letting processes with fewer batches shadow collectives (nothing to do here)."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, module: nn.Module) -> Iterator[None]:
        """Context that forces the next backward to synchronise gradients."""
        yield

    def unwrap(
        self, module: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """Return the user's model from whatever this strategy wrapped it in."""
        return extract_model_from_parallel(
            module, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients' total norm in place and return that norm (before clipping)."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element into ``[-clip_value, clip_value]`` in place."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
