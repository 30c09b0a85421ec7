"""`AcceleratedOptimizer`: steps only on synchronising steps, through the grad scaler under fp16.

Whether a scaler is used and how a skipped step is detected are settled in the constructor.
A skipped step (fp16 overflow) is detected by a step hook on the wrapped optimizer, which
costs no device synchronisation and no per-step patching.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from hasten.core.nested import honor_type
from hasten.state import GradientState, PartialState

__all__ = ["AcceleratedOptimizer", "move_to_device", "patch_optimizer_step", "unwrap_optimizer"]

# Attributes rebuilt on unpickling rather than pickled: the shared state is per process, the
# hook handle points into the wrapped optimizer, and `step` may be a scheduler's closure.
_TRANSIENT = ("gradient_state", "_step_hook", "step")


def move_to_device(state: Any, device: torch.device | str) -> Any:
    """Return ``state`` (nested lists, tuples and dicts) with every tensor moved to ``device``."""
    if isinstance(state, (list, tuple)):
        return honor_type(state, (move_to_device(t, device) for t in state))
    if isinstance(state, dict):
        return type(state)({k: move_to_device(v, device) for k, v in state.items()})
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return state


def unwrap_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer under hasten's (or an engine's) wrapper: the one whose ``step`` changes the
    state; ``optimizer`` itself when it is not wrapped."""
    return getattr(optimizer, "optimizer", optimizer)


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wrap an optimizer so it steps and zeroes gradients only when gradients are synchronised.

    Args:
        optimizer: the optimizer to wrap.
        device_placement: move the optimizer's state to this process's device.
        scaler: the `GradScaler` of fp16 training; steps go through it and a step it skips
            (inf/NaN gradients) is reported by `step_was_skipped`.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        # No super().__init__: parameters, state and hooks all live in the wrapped optimizer.
        self.optimizer = optimizer
        self.scaler = scaler
        self.device_placement = device_placement
        self.gradient_state = GradientState()
        self._is_overflow = False
        self._stepped = False
        self._step_hook: Any = None
        self._zero_grad_takes_set_to_none = "set_to_none" in _parameters(optimizer.zero_grad)
        if scaler is not None:
            self._watch_steps()
        if device_placement and optimizer.state:
            state_dict = move_to_device(optimizer.state_dict(), PartialState().device)
            optimizer.load_state_dict(state_dict)

    def _watch_steps(self) -> None:
        register = getattr(self.optimizer, "register_step_post_hook", None)
        if register is not None:
            self._step_hook = register(self._mark_stepped)

    def _mark_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True

    # -- the training-loop calls -------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        """Step the wrapped optimizer, unless gradients are still being accumulated."""
        if self.gradient_state.sync_gradients:
            if self.scaler is None:
                self.optimizer.step(closure)
            else:
                self._scaled_step(closure)

    def _scaled_step(self, closure: Callable[[], Any] | None) -> None:
        scaler: Any = self.scaler  # step() only comes here when a scaler exists
        if self._step_hook is None:
            # No step hooks on this optimizer: a skipped step shows as a lowered scale.
            before = scaler.get_scale()
            scaler.step(self.optimizer, closure)
            scaler.update()
            self._is_overflow = scaler.get_scale() < before
            return
        self._stepped = False
        scaler.step(self.optimizer, closure)
        scaler.update()
        self._is_overflow = not self._stepped

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Zero the gradients, unless they are still being accumulated.

        Raises:
            ValueError: ``set_to_none`` passed to an optimizer whose zero_grad does not take it.
        """
        if not self.gradient_state.sync_gradients:
            return
        if self._zero_grad_takes_set_to_none:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)
            return
        if set_to_none is not None:
            raise ValueError(
                f"zero_grad(set_to_none={set_to_none!r}) is not supported by "
                f"{type(self.optimizer).__name__}.zero_grad; call zero_grad() without it."
            )
        self.optimizer.zero_grad()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step was skipped by the grad scaler (inf/NaN gradients)."""
        return self._is_overflow

    # -- pass-throughs -----------------------------------------------------------------------

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's default hyper-parameters."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """Return the wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict into the wrapped optimizer (it moves state next to the params)."""
        self.optimizer.load_state_dict(state_dict)

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """Register a hook run before each step of the wrapped optimizer."""
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable[..., Any]) -> Any:
        """Register a hook run after each step of the wrapped optimizer."""
        return self.optimizer.register_step_post_hook(hook)

    def train(self) -> None:
        """Put the optimizer in train mode (schedule-free optimizers; a no-op otherwise)."""
        _call_mode(self.optimizer, "train")

    def eval(self) -> None:
        """Put the optimizer in eval mode (schedule-free optimizers; a no-op otherwise)."""
        _call_mode(self.optimizer, "eval")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _TRANSIENT}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.gradient_state = GradientState()
        self._step_hook = None
        if self.scaler is not None:
            self._watch_steps()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def patch_optimizer_step(
    accelerated_optimizer: AcceleratedOptimizer, method: Callable[..., Any]
) -> Callable[..., Any]:
    """Wrap the inner optimizer's `method` (its ``step``) so a call marks the step as taken.

    `AcceleratedOptimizer.step_was_skipped` reads that mark after a scaled step: the grad scaler
    skips the inner ``step`` on inf/NaN gradients. Step hooks do this by default; patching is
    for optimizers whose ``step`` runs no hooks.
    """

    @functools.wraps(method)
    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._stepped = True
        return method(*args, **kwargs)

    return patched_step


def _parameters(function: Callable[..., Any]) -> Iterable[str]:
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return ()


def _call_mode(optimizer: Any, mode: str) -> None:
    # DeepSpeed wraps the real optimizer one level deeper.
    for target in (optimizer, getattr(optimizer, "optimizer", None)):
        method = getattr(target, mode, None)
        if callable(method):
            method()
            return
