"""Let the package index's torchvision import over the local CPU-only torch (suite venvs only).

The torchvision wheels on the package index link their C++ ops against torch's CUDA libraries,
which the local ``torch==2.13.0+cpu`` wheel does not have, so the ops library does not load and
``import torchvision`` fails registering fake kernels for ``torchvision::nms`` and ``qnms``. The
diffusers example scripts (and transformers' image paths) only need ``torchvision.transforms``,
which is plain torch. This module, imported from a ``.pth`` file in a scratch suite venv, defines
the two op schemas just before torchvision is first imported, so the import succeeds; the
compiled ops themselves (nms, roi_align, ...) stay unavailable and fail if called. It is the same
in the accelerate and the hasten venv, and never part of hasten.

Install: ``python torchvision_shim.py --install`` (copies itself into the venv's site-packages);
the suite runner installs it only where ``import torchvision`` fails without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

__all__ = ["install"]

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Defines the op schemas the first time ``torchvision`` is looked up, then steps aside."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            lib = torch.library.Library("torchvision", "DEF")
            for schema in _SCHEMAS.values():
                lib.define(schema)
            _KEEP.append(lib)
        return


_KEEP: list[Any] = []


def install() -> None:
    """Copy this module into the running venv and add the ``.pth`` line that imports it."""
    site = Path(sysconfig.get_paths()["purelib"])
    shutil.copy(__file__, site / "_torchvision_shim.py")
    (site / "_torchvision_shim.pth").write_text("import _torchvision_shim\n")
    print(f"torchvision shim installed in {site}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--install"]:
        install()
elif __name__ == "_torchvision_shim":
    sys.meta_path.insert(0, _BeforeTorchvision())
