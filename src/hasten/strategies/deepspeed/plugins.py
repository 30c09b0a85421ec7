"""Which `DeepSpeedPlugin` is active, for code that only has the accelerator state."""

from __future__ import annotations

from typing import Any

__all__ = ["get_active_deepspeed_plugin"]


def get_active_deepspeed_plugin(state: Any) -> Any:
    """Return the selected `DeepSpeedPlugin` of ``state`` (an `AcceleratorState`).

    Raises:
        ValueError: the run does not use DeepSpeed.
    """
    plugins = getattr(state, "deepspeed_plugins", None)
    if getattr(state, "deepspeed_plugin", None) is None or plugins is None:
        raise ValueError(
            "No DeepSpeedPlugin is active: configure the Accelerator for DeepSpeed "
            "(deepspeed_plugin=... / deepspeed_plugins={...} or hasten launch --use_deepspeed), "
            "or select one with AcceleratorState().select_deepspeed_plugin(name) first."
        )
    if not isinstance(plugins, dict):
        return plugins
    return next((p for p in plugins.values() if p.selected), next(iter(plugins.values())))
