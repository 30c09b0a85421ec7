"""Fixtures for the ops unit tests: install a `MirrorComm` as the communicator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mirror_comm import MirrorComm

from hasten.ops.comm import reset_comm, set_comm


@pytest.fixture
def mirror() -> Iterator[MirrorComm]:
    comm = MirrorComm()
    set_comm(comm)
    yield comm
    reset_comm()
