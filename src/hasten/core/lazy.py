"""PEP 562 helper: a module namespace whose names are imported from their real homes on first use.

Used by `hasten`, `hasten.utils` and the packages with a lazy table, so that `import hasten`
stays cheap: nothing below is loaded until a name is asked for. Submodules resolve as
attributes too (``import hasten; hasten.utils.set_seed(7)``), as they do in Accelerate, and a
name that belongs to a capability hasten does not provide yet raises `CapabilityNotBuiltError`
naming that capability instead of a bare `AttributeError`.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["CapabilityNotBuiltError", "invert_table", "lazy_namespace"]


class CapabilityNotBuiltError(ImportError):
    """A public Accelerate name whose capability (an engine still being wired) is not built yet.

    An `ImportError`, so that ``from hasten.utils import name`` shows this message rather than
    Python's generic "cannot import name".
    """


class _TableModule(types.ModuleType):
    """A lazy module whose table names stay bound when a same-named submodule is imported.

    ``accelerate.utils.tqdm`` is both a submodule and (as ``accelerate.utils.tqdm``) the
    function; importing the submodule must not turn ``hasten.utils.tqdm`` into the module.
    """

    _table_names: frozenset[str] = frozenset()

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            name in self._table_names
            and isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            return  # the import system binding the submodule: the table's value wins
        super().__setattr__(name, value)


def invert_table(table: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Turn ``{module: [names]}`` into ``{name: module}``, refusing a name listed twice."""
    where: dict[str, str] = {}
    for module, names in table.items():
        for name in names:
            if name in where:
                raise ValueError(f"{name!r} is listed under both {where[name]!r} and {module!r}")
            where[name] = module
    return where


def lazy_namespace(
    module_name: str,
    table: Mapping[str, Iterable[str]],
    module_globals: dict[str, Any],
    pending: Mapping[str, Iterable[str]] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build the ``__getattr__`` and ``__dir__`` of a lazily populated module.

    Lookup order: a name of `table`, then a submodule of the package, then a `pending` name.

    Args:
        module_name: the ``__name__`` of the module being populated (for error messages).
        table: real home module -> names it provides.
        module_globals: the module's ``globals()``; resolved names are cached there so the
            lookup runs once per name.
        pending: capability not built yet (e.g. "the FSDP engine") -> the names that belong to
            it; asking for one raises `CapabilityNotBuiltError`. A name also in `table` resolves.
    """
    where = invert_table(table)
    waiting = {name: capability for capability, names in (pending or {}).items() for name in names}
    module = sys.modules.get(module_name)
    if module is not None and type(module) is types.ModuleType:
        attrs = {"_table_names": frozenset(where), "__module__": __name__}
        module.__class__ = type("_TableModule", (_TableModule,), attrs)
    submodules: list[frozenset[str]] = []  # filled on the first miss: one directory listing

    def _submodule_names() -> frozenset[str]:
        if not submodules:
            paths = module_globals.get("__path__") or []
            submodules.append(frozenset(info.name for info in pkgutil.iter_modules(paths)))
        return submodules[0]

    def __getattr__(name: str) -> Any:
        home = where.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
        elif not name.startswith("__") and name in _submodule_names():
            value = importlib.import_module(f"{module_name}.{name}")
        elif name in waiting:
            raise CapabilityNotBuiltError(
                f"{module_name}.{name} belongs to {waiting[name]}, which hasten does not provide "
                f"yet (Accelerate has it). Use a configuration without {waiting[name]}, or "
                "follow the hasten release notes for when it lands.",
                name=name,
            )
        else:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        module_globals[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(module_globals) | set(where) | _submodule_names())

    return __getattr__, __dir__
