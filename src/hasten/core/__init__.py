"""Layer 0: standard-library and torch helpers that import nothing else from hasten."""

__all__: list[str] = []
