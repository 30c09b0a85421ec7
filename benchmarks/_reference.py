"""The comparison runs need Hugging Face Accelerate itself, not hasten installed as accelerate.

`make install` installs hasten as this venv's ``accelerate`` (``hasten accelerate install``);
timing that "accelerate" would time hasten against itself. The benchmarks call
`require_real_accelerate` inside the ``try`` that imports accelerate, so the comparison is
skipped here as when Accelerate is missing. To compare, run them in an environment where
Hugging Face Accelerate is installed (and hasten is not its alias).
"""

from __future__ import annotations

__all__ = ["real_accelerate_installed", "require_real_accelerate"]


def real_accelerate_installed() -> bool:
    """Whether Hugging Face Accelerate is installed here (without importing it)."""
    from hasten.compat.distribution import installed_accelerate

    found = installed_accelerate()
    return found is not None and not found.is_hasten


def require_real_accelerate() -> None:
    """Raise ImportError unless ``import accelerate`` gives Hugging Face Accelerate."""
    import accelerate

    if getattr(accelerate, "__hasten_version__", None) is not None:
        raise ImportError(
            "accelerate is hasten's alias in this environment (hasten accelerate install): "
            "compare against Hugging Face Accelerate in another environment"
        )
