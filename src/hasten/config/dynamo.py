"""TorchDynamoPlugin: how `prepare` compiles a model with `torch.compile`."""

from __future__ import annotations

import dataclasses
from typing import Any

from hasten.config.enums import DynamoBackend, enum_value
from hasten.config.envvars import env, fill_from_env
from hasten.config.handler import KwargsHandler
from hasten.core.constants import TORCH_DYNAMO_MODES

__all__ = ["TorchDynamoPlugin"]


@dataclasses.dataclass
class TorchDynamoPlugin(KwargsHandler):
    """Settings for `torch.compile`; unset fields come from the ACCELERATE_DYNAMO_* variables.

    Args:
        backend: a `DynamoBackend` (or its name); NO disables compilation.
        mode: "default", "reduce-overhead", "max-autotune" or "max-autotune-no-cudagraphs".
        fullgraph: refuse graph breaks.
        dynamic: trace with dynamic shapes (None lets torch decide).
        options: backend options dict (not together with a non-default mode).
        disable: make `torch.compile` a no-op (for tests).
        use_regional_compilation: compile repeated blocks one at a time to cut cold-start time.

    Example:
        >>> TorchDynamoPlugin(backend="inductor", mode="default", fullgraph=True).to_kwargs()
        {'backend': 'inductor', 'fullgraph': True}
    """

    backend: DynamoBackend = dataclasses.field(
        default=None,  # type: ignore[assignment]
        metadata=env("ACCELERATE_DYNAMO_BACKEND"),
    )
    mode: str = dataclasses.field(default=None, metadata=env("ACCELERATE_DYNAMO_MODE"))  # type: ignore[assignment]
    fullgraph: bool = dataclasses.field(
        default=None,  # type: ignore[assignment]
        metadata=env("ACCELERATE_DYNAMO_USE_FULLGRAPH"),
    )
    dynamic: bool = dataclasses.field(default=None, metadata=env("ACCELERATE_DYNAMO_USE_DYNAMIC"))  # type: ignore[assignment]
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool = dataclasses.field(
        default=None,  # type: ignore[assignment]
        metadata=env("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"),
    )

    def __post_init__(self) -> None:
        fill_from_env(self)
        backend: Any = self.backend
        if backend not in DynamoBackend:
            raise ValueError(
                f"TorchDynamoPlugin(backend={backend!r}) is not a known dynamo backend; use one "
                f"of {DynamoBackend.list()} (any case)"
            )
        self.backend = DynamoBackend(enum_value(backend).upper())
        if self.mode not in TORCH_DYNAMO_MODES:
            raise ValueError(
                f"TorchDynamoPlugin(mode={self.mode!r}) is not a torch.compile mode; use one of "
                f"{list(TORCH_DYNAMO_MODES)}"
            )
        if self.options is not None and self.mode != "default":
            raise ValueError(
                f"TorchDynamoPlugin(mode={self.mode!r}, options=...) sets both; torch.compile "
                "accepts only one of them. Drop `mode` or move its settings into `options`"
            )

    @property
    def enabled(self) -> bool:
        """Whether a model should be compiled at all (backend is not NO)."""
        return self.backend is not DynamoBackend.NO

    def to_dict(self) -> dict[str, Any]:
        """Return every field, with the backend as the lower-case name torch.compile takes."""
        values = super().to_dict()
        values["backend"] = self.backend.value.lower()
        return values

    def to_kwargs(self) -> dict[str, Any]:
        """Return the `torch.compile` keyword arguments that differ from torch's defaults."""
        values = self.to_dict()
        kwargs: dict[str, Any] = {}
        if self.enabled:
            kwargs["backend"] = values["backend"]
        for name, default in _TORCH_COMPILE_DEFAULTS.items():
            if values[name] != default:
                kwargs[name] = values[name]
        return kwargs


# torch.compile's own defaults: arguments equal to these are not forwarded.
_TORCH_COMPILE_DEFAULTS: dict[str, Any] = {
    "mode": "default",
    "fullgraph": False,
    "dynamic": None,
    "options": None,
    "disable": False,
}
