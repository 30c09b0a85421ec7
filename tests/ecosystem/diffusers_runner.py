"""Run one of diffusers' example training scripts, unchanged, where torchvision cannot load.

``python diffusers_runner.py SCRIPT ARGS...`` runs SCRIPT as ``__main__`` with ARGS. The package
index has no torchvision build for the CPU torch of this project (the one it has loads CUDA
kernels), and diffusers' examples use only ``torchvision.transforms``' image basics. When
torchvision cannot be imported, the script's own ``from torchvision import transforms`` (and only
the script's: transformers and diffusers still see no torchvision) gets `transforms_stand_in`'s
PIL/torch versions of the transforms it uses.
"""

from __future__ import annotations

import builtins
import importlib.util
import runpy
import sys
import types
from pathlib import Path
from typing import Any


def _torchvision_loads() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision.transforms  # noqa: F401
    except (ImportError, RuntimeError):
        return False
    return True


def _serve_transforms_to_main() -> None:
    import transforms_stand_in

    stand_in = types.ModuleType("torchvision")
    stand_in.transforms = transforms_stand_in  # type: ignore[attr-defined]
    real_import = builtins.__import__

    def importer(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if name == "torchvision" and globals is not None and globals.get("__name__") == "__main__":
            return stand_in
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = importer


def main() -> None:
    script = sys.argv[1]
    sys.argv = [script, *sys.argv[2:]]
    sys.path.insert(0, str(Path(script).resolve().parent))
    if not _torchvision_loads():
        _serve_transforms_to_main()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
