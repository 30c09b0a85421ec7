"""Collectives over nested structures, debug-mode shape checks and random-state helpers."""

__all__: list[str] = []
