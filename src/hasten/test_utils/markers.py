"""Small skip decorators for tests that need (or must avoid) certain hardware."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["require_cpu", "require_cuda", "require_multi_device"]

F = TypeVar("F", bound=Callable[..., Any])


def _device_count() -> int:
    from hasten.platforms.registry import current_platform  # deferred: imports torch

    platform = current_platform()
    return 0 if platform.name == "cpu" else int(platform.device_count())


def _skip_unless(condition: Callable[[], bool], reason: str) -> Callable[[F], F]:
    def decorator(test: F) -> F:
        import unittest  # skipUnless works for pytest and unittest alike

        return unittest.skipUnless(condition(), reason)(test)

    return decorator


def require_cpu(test: F) -> F:
    """Skip `test` when an accelerator is present (it must run on a CPU-only machine)."""
    return _skip_unless(lambda: _device_count() == 0, "test requires a CPU-only machine")(test)


def require_cuda(test: F) -> F:
    """Skip `test` unless at least one accelerator is visible."""
    return _skip_unless(lambda: _device_count() > 0, "test requires an accelerator")(test)


def require_multi_device(test: F) -> F:
    """Skip `test` unless at least two accelerators are visible."""
    return _skip_unless(lambda: _device_count() > 1, "test requires 2+ accelerators")(test)
