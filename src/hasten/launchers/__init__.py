"""Launch engine: `hasten launch` planning and running, plus the in-Python launchers.

`notebook_launcher` and `debug_launcher` live in `hasten.launchers.notebook` and are loaded on
first use, so a worker starting through `hasten.launchers.bootstrap` imports nothing extra.
"""

from hasten.core.lazy import lazy_namespace

_TABLE: dict[str, list[str]] = {
    "hasten.launchers.notebook": ["debug_launcher", "notebook_launcher"],
    "hasten.launchers.prepare": ["PrepareForLaunch", "test_launch"],
}

__getattr__, __dir__ = lazy_namespace(__name__, _TABLE, globals())

__all__ = ["PrepareForLaunch", "debug_launcher", "notebook_launcher", "test_launch"]
