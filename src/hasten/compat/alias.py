"""``import accelerate`` as hasten: every ``accelerate.x`` module *is* the ``hasten.x`` module.

The ``accelerate`` distribution that ``hasten accelerate install`` writes holds one file,
``accelerate/__init__.py``, which sets ``__version__`` and calls `install`. From then on:

- ``accelerate.utils is hasten.utils`` (and so for every submodule, imported in any order, also
  ``python -m accelerate.commands.launch`` and pickles naming ``accelerate.state.PartialState``):
  a meta path finder, first on ``sys.meta_path``, hands out hasten's module objects themselves,
  so replacing a name on one replaces it on the other.
- The ``accelerate`` module itself keeps its own ``__version__`` ("1.15.0", the Accelerate API
  hasten implements; libraries compare it) and ``__hasten_version__``; every other attribute is
  read from, and written to, the ``hasten`` package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["ACCELERATE_API_VERSION", "AccelerateFinder", "install", "is_alias"]

#: The Accelerate release whose API hasten implements (what ``accelerate.__version__`` says).
ACCELERATE_API_VERSION = "1.15.0"

_ALIAS = "accelerate"
_TARGET = "hasten"


def _hasten() -> types.ModuleType:
    return sys.modules.get(_TARGET) or importlib.import_module(_TARGET)


def _own(name: str) -> bool:
    """Attributes the ``accelerate`` module keeps for itself: dunders (its version, spec, ...)."""
    return name.startswith("__") and name.endswith("__")


class _AliasModule(types.ModuleType):
    """The ``accelerate`` module: its own dunders, every other name read from and written to
    ``hasten`` (so ``accelerate.Accelerator is hasten.Accelerator``, also after a patch)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(_hasten(), name)
        except AttributeError:
            raise AttributeError(f"module 'accelerate' has no attribute {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if _own(name):
            super().__setattr__(name, value)
        else:
            setattr(_hasten(), name, value)

    def __delattr__(self, name: str) -> None:
        if _own(name):
            super().__delattr__(name)
        else:
            delattr(_hasten(), name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(_hasten())) | set(self.__dict__))


class _AliasLoader(importlib.abc.Loader):
    """Loads ``accelerate.x`` as the module ``hasten.x`` (imported, or imported now)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._target_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self._target_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # Already executed as hasten.x. The import system has just set its __spec__ to the
        # accelerate-named one: give it back its own, so hasten.x stays hasten.x.
        if self._target_spec is not None:
            module.__spec__ = self._target_spec

    def _real_loader(self) -> Any:
        spec = importlib.util.find_spec(self.target)
        if spec is None or spec.loader is None:
            raise ImportError(f"{self.target} cannot be loaded", name=self.target)
        return spec.loader

    def get_code(self, fullname: str) -> Any:
        """The code of ``hasten.x``: ``python -m accelerate.commands.launch`` runs it."""
        return self._real_loader().get_code(self.target)

    def get_source(self, fullname: str) -> str | None:
        """The source of ``hasten.x`` (tracebacks, inspect)."""
        source: str | None = self._real_loader().get_source(self.target)
        return source

    def is_package(self, fullname: str) -> bool:
        """Whether ``hasten.x`` is a package."""
        return bool(self._real_loader().is_package(self.target))


class AccelerateFinder(importlib.abc.MetaPathFinder):
    """Finds ``accelerate.x`` as ``hasten.x``; first on ``sys.meta_path`` once installed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec of ``accelerate.x`` if ``hasten.x`` exists, else None (not found)."""
        if not fullname.startswith(_ALIAS + "."):
            return None
        real = _TARGET + fullname[len(_ALIAS) :]
        try:
            found = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            return None
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname,
            _AliasLoader(real),
            origin=found.origin,
            is_package=found.submodule_search_locations is not None,
        )


_FINDER = AccelerateFinder()


def install(module_name: str = _ALIAS) -> None:
    """Make the module ``module_name`` (``accelerate``, being imported) the alias of hasten.

    Called once by the ``accelerate/__init__.py`` that the distribution installs, after it set
    ``__version__``. Idempotent.
    """
    module = sys.modules[module_name]
    hasten = _hasten()
    module.__dict__["__hasten_version__"] = hasten.__version__
    module.__dict__.setdefault("__version__", ACCELERATE_API_VERSION)
    if not isinstance(module, _AliasModule):
        module.__class__ = _AliasModule
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def is_alias(module: Any) -> bool:
    """Whether ``module`` (an imported ``accelerate``) is hasten's alias, not Hugging Face's."""
    return isinstance(module, _AliasModule)
