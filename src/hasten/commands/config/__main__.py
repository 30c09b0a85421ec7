"""``python -m hasten.commands.config``: the ``hasten config`` command."""

from hasten.commands.config import main

__all__: list[str] = []

raise SystemExit(main())
