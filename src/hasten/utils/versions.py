"""Compatibility path for ``accelerate.utils.versions``; the code lives in `hasten.core.versions`."""

from hasten.core.versions import compare_versions, is_torch_version

__all__ = ["compare_versions", "is_torch_version"]
