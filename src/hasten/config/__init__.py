"""Layer 1: what the user asks for, as plain data (enums, dataclasses, the env-var table).

Import from the submodules (`hasten.config.enums`, `hasten.config.kwargs`, ...); this package
imports nothing so that reading one setting never loads every config class.
"""

__all__: list[str] = []
