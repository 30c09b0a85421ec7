"""Autouse fixtures: every test starts with fresh hasten state and leaves the environment as found."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _fresh_hasten_state() -> Iterator[None]:
    yield
    try:
        from hasten.state._shared import reset_state
    except ImportError:
        return
    reset_state()
