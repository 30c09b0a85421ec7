"""Scripts that `hasten test` and the test-suite launch as workers."""

__all__: list[str] = []
