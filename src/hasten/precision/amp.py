"""Automatic mixed precision: fp16/bf16 through `torch.autocast`, fp16 with a `GradScaler`.

Everything is decided when the policy is built: the dtype, the autocast arguments and whether
a scaler exists. The model's forward is wrapped by `AutocastForward`, a small class (not a
closure) so that a prepared model can still be pickled or deep-copied.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import update_wrapper
from typing import Any

import torch

from hasten.config.enums import DistributedType, enum_value
from hasten.core.nested import convert_to_fp32
from hasten.core.versions import is_torch_version
from hasten.platforms import current_platform
from hasten.precision.base import Precision
from hasten.state import AcceleratorState

__all__ = [
    "AmpPrecision",
    "AutocastForward",
    "get_grad_scaler",
    "get_mixed_precision_context_manager",
    "make_grad_scaler",
]

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


class AutocastForward:
    """A model forward run under `torch.autocast`, whose half-precision outputs become fp32.

    ``__wrapped__`` is the original forward, which is what unwrapping restores.

    Args:
        forward: the forward to wrap (usually the model's bound ``forward``).
        device_type: the autocast device type (``"cuda"``, ``"cpu"``, ...).
        dtype: the autocast dtype.
        enabled: autocast's ``enabled``.
        cache_enabled: autocast's ``cache_enabled`` (None: torch's default).
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        device_type: str,
        dtype: torch.dtype,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        self.device_type = device_type
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.__wrapped__ = forward
        update_wrapper(self, forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped forward under autocast and convert its outputs to fp32."""
        # A new autocast object per call (about 1 us): one shared instance would restore the
        # wrong state when the forward is re-entered (nested autocast contexts).
        with torch.autocast(self.device_type, self.dtype, self.enabled, self.cache_enabled):
            outputs = self.__wrapped__(*args, **kwargs)
        return convert_to_fp32(outputs)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "forward": self.__wrapped__,
            "device_type": self.device_type,
            "dtype": self.dtype,
            "enabled": self.enabled,
            "cache_enabled": self.cache_enabled,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


def _autocast_args(device_type: str, dtype: torch.dtype, autocast_kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"device_type": device_type, "dtype": dtype}
    if autocast_kwargs is not None:
        args.update(autocast_kwargs.to_kwargs())
    return args


class AmpPrecision(Precision):
    """fp16 or bf16 autocast; with a scaler (fp16), losses are scaled to avoid underflow.

    Args:
        mixed_precision: ``"fp16"`` or ``"bf16"``.
        device_type: the device type autocast runs on.
        autocast_kwargs: an `AutocastKwargs` (``enabled``, ``cache_enabled``).
        scaler: the grad scaler (fp16), or None.

    Raises:
        ValueError: ``mixed_precision`` is not ``"fp16"`` or ``"bf16"``.
    """

    native_amp = True

    def __init__(
        self,
        mixed_precision: str,
        device_type: str,
        autocast_kwargs: Any = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        if mixed_precision not in ("fp16", "bf16"):
            raise ValueError(
                f"AmpPrecision(mixed_precision={mixed_precision!r}) must be 'fp16' or 'bf16'; "
                "use Precision() for full precision."
            )
        super().__init__(mixed_precision)
        self.device_type = device_type
        self.dtype = _DTYPES[mixed_precision]
        self.scaler = scaler
        self._autocast = _autocast_args(device_type, self.dtype, autocast_kwargs)

    def autocast(self, autocast_handler: Any = None) -> AbstractContextManager[Any]:
        """Return a fresh `torch.autocast` for this policy (``autocast_handler`` overrides)."""
        if autocast_handler is None:
            return torch.autocast(**self._autocast)
        return torch.autocast(**_autocast_args(self.device_type, self.dtype, autocast_handler))

    def wrap_forward(self, model: torch.nn.Module) -> torch.nn.Module:
        """Replace ``model.forward`` by an `AutocastForward` around it (keeps the original).

        A model wrapped already (prepared for evaluation, now for training) is left as it is.
        """
        forward = model.forward
        if isinstance(forward, AutocastForward):
            return model
        setattr(model, "_original_forward", forward)  # noqa: B010 - what unwrapping restores
        setattr(model, "forward", AutocastForward(forward, **self._autocast))  # noqa: B010
        return model

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients of ``optimizer`` by the current loss scale (fp16 only)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def state_dict(self) -> dict[str, Any]:
        """Return the grad scaler's state (empty without a scaler)."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the grad scaler's state."""
        if self.scaler is not None and state_dict:
            self.scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        scaled = ", scaled" if self.scaler is not None else ""
        return f"AmpPrecision({self.mixed_precision!r}, {self.device_type!r}{scaled})"


def make_grad_scaler(
    device_type: str,
    distributed_type: DistributedType | str | None = None,
    *,
    sharded: bool = False,
    **kwargs: Any,
) -> torch.amp.GradScaler:
    """Build the grad scaler for ``device_type``: FSDP1's sharded one when ``sharded`` (or for
    the FSDP label, as Accelerate's ``get_grad_scaler(distributed_type)`` asks).

    Raises:
        ValueError: MPS with torch older than 2.8, which has no MPS grad scaler.
    """
    # A label from Accelerate's signature is compared by value, here only.
    if sharded or (distributed_type is not None and distributed_type == "FSDP"):
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device_type, **kwargs)
    if device_type == "mps" and not is_torch_version(">=", "2.8.0"):
        raise ValueError(
            f"A grad scaler on MPS needs torch >= 2.8 (found {torch.__version__!r}); "
            "upgrade torch or use mixed_precision='bf16'."
        )
    return torch.amp.GradScaler(device_type, **kwargs)


def get_grad_scaler(
    distributed_type: DistributedType | str | None = None, **kwargs: Any
) -> torch.amp.GradScaler:
    """Return the `GradScaler` for the platform this process runs on.

    Args:
        distributed_type: the `DistributedType` of the run (FSDP gets a `ShardedGradScaler`).
        **kwargs: forwarded to the scaler (``init_scale``, ``growth_factor``, ...).
    """
    return make_grad_scaler(current_platform().device_type, distributed_type, **kwargs)


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: Any = None
) -> AbstractContextManager[Any]:
    """Return an autocast context for the current `AcceleratorState` (a no-op if not native_amp).

    Args:
        native_amp: whether mixed precision is really on.
        autocast_kwargs: an `AutocastKwargs` customising `torch.autocast`.
    """
    if not native_amp:
        return nullcontext()
    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtype = _DTYPES.get(enum_value(state.mixed_precision))
    if dtype is None:
        return torch.autocast(device_type=state.device.type, **kwargs)
    return torch.autocast(device_type=state.device.type, dtype=dtype, **kwargs)
