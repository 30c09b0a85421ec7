"""Layer 8: the ``hasten`` command line (launch, config, env, test, estimate-memory, plot,
merge-weights, tpu-config).

Import the submodules directly (`hasten.commands.launch`, ...); this package imports nothing.
"""

__all__: list[str] = []
