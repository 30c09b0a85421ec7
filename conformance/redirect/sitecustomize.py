"""Installed on PYTHONPATH by ``make conformance`` only: every Python process it starts (pytest, the
``accelerate`` CLI shims, the processes they launch) resolves ``accelerate`` to hasten."""

import hasten_conformance

hasten_conformance.install()
