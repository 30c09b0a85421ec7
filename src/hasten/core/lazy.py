"""PEP 562 helper: a module namespace whose names are imported from their real homes on first use.

Used by `hasten` and `hasten.utils` so that `import hasten` stays cheap: nothing below is loaded
until a name is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["invert_table", "lazy_namespace"]


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
    module_name: str, table: Mapping[str, Iterable[str]], module_globals: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build the ``__getattr__`` and ``__dir__`` of a lazily populated module.

    Args:
        module_name: the ``__name__`` of the module being populated (for error messages).
        table: real home module -> names it provides.
        module_globals: the module's ``globals()``; resolved names are cached there so the
            lookup runs once per name.
    """
    where = invert_table(table)

    def __getattr__(name: str) -> Any:
        home = where.get(name)
        if home is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        module_globals[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(module_globals) | set(where))

    return __getattr__, __dir__
