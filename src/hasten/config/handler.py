"""`KwargsHandler`: the base of every kwargs dataclass (`to_dict`, `to_kwargs`).

Apart from the handlers themselves (`hasten.config.kwargs`), so that a plugin that is a handler
too (`TorchDynamoPlugin`) does not load every handler class with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hasten.config import envvars

__all__ = ["KwargsHandler"]

_MISSING = object()


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _class_defaults(cls: type) -> dict[str, Any]:
    """Return `{field: default}` for dataclass `cls`, computed once per class.

    A field declared with `env(...)` and a None default counts its variable's unset value
    (from the env table) as the default, i.e. what the class holds with a clean environment.
    """
    cached = _DEFAULTS.get(cls)
    if cached is not None:
        return cached
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        variable = envvars.env_name(field)
        if variable is not None and field.default is None:
            defaults[field.name] = envvars.ENV_VARS[variable].default
        elif field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
        else:
            defaults[field.name] = _MISSING
    _DEFAULTS[cls] = defaults
    return defaults


class KwargsHandler:
    """Mixin for kwargs dataclasses: `to_dict()` and `to_kwargs()` (only the changed fields)."""

    def to_dict(self) -> dict[str, Any]:
        """Return every field of this handler as a new dict."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}  # type: ignore[arg-type]

    def to_kwargs(self) -> dict[str, Any]:
        """Return the fields whose value differs from this class's default.

        The class defaults are taken from the field declarations once per class (no instance
        is built and the environment is not consulted), so calling this is cheap.
        """
        defaults = _class_defaults(type(self))
        return {
            name: value
            for name, value in self.to_dict().items()
            if defaults.get(name, _MISSING) is _MISSING or defaults[name] != value
        }
