"""Build models without allocating their weights (meta device) or straight on a device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from hasten.config import envvars

__all__ = ["init_empty_weights", "init_on_device"]


def _moved_parameter(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    """The same parameter class and attributes, on ``device``."""
    cls = type(param)
    extra = dict(param.__dict__)
    marker = extra.pop("_is_hf_initialized", None)
    moved = param.data.to(device)
    try:
        new = cls(moved, requires_grad=param.requires_grad, **extra)
    except TypeError:
        new = cls(moved, requires_grad=param.requires_grad)
        for key, value in extra.items():
            setattr(new, key, value)
    if marker is not None:
        new.__dict__["_is_hf_initialized"] = marker
    return new


@contextlib.contextmanager
def init_on_device(device: torch.device, include_buffers: bool | None = None) -> Iterator[None]:
    """Create every parameter (and, with ``include_buffers``, every buffer) on ``device``.

    Args:
        device: where new parameters go (``torch.device("meta")`` allocates nothing).
        include_buffers: also put buffers and all new tensors there; defaults to
            ``ACCELERATE_INIT_INCLUDE_BUFFERS``.

    Example:
        >>> with init_on_device(torch.device("meta")):
        ...     layer = nn.Linear(4, 4)
        >>> layer.weight.device
        device(type='meta')
    """
    if include_buffers is None:
        include_buffers = envvars.read_flag("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    target = torch.device(device)
    if include_buffers:
        # torch's device context places every factory call (buffers included) on `target`;
        # nn.Module is left untouched, as in Accelerate (its tests check register_parameter)
        with target:
            yield
        return
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device != target:
            module._parameters[name] = _moved_parameter(param, target)

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Build models whose parameters live on the meta device: shapes and dtypes, no memory.

    Load real weights afterwards with `load_checkpoint_and_dispatch` (or
    `load_checkpoint_in_model`).

    Args:
        include_buffers: put buffers on meta too; defaults to ``ACCELERATE_INIT_INCLUDE_BUFFERS``.

    Example:
        >>> with init_empty_weights():
        ...     model = nn.Sequential(nn.Linear(10_000, 10_000), nn.Linear(10_000, 10))
        >>> model[0].weight.is_meta
        True
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield
