"""Fixtures for the tracking tests."""

from __future__ import annotations

import pytest

from unit.tracking._tracking_fakes import RecordingTracker


@pytest.fixture
def recording() -> RecordingTracker:
    return RecordingTracker("custom")
