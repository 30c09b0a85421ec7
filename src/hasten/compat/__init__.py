"""hasten as the ``accelerate`` package: the import alias and the distribution that installs it.

`hasten.compat.alias` is what ``import accelerate`` runs once the distribution is installed;
`hasten.compat.distribution` builds that distribution and installs, removes and reports it
(``hasten accelerate install | uninstall | status``).
"""

__all__: list[str] = []
