"""Test helpers shipped with hasten, and the ``hasten test`` self-check script.

The self-check lives in ``hasten/test_utils/scripts/self_check.py`` and is started by path
(``hasten test``), so importing this package loads nothing heavy.
"""

from hasten.test_utils.markers import require_cpu, require_cuda, require_multi_device

__all__ = ["require_cpu", "require_cuda", "require_multi_device"]
