"""Fixtures for the ops unit tests: install a `MirrorComm` as the communicator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hasten.ops.comm import reset_comm, set_comm
from unit.ops.mirror_comm import MirrorComm


@pytest.fixture
def mirror() -> Iterator[MirrorComm]:
    comm = MirrorComm()
    set_comm(comm)
    yield comm
    reset_comm()
