"""Fixtures shared by the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from _support.resume import launch


@pytest.fixture(scope="session")
def launched_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-process run of ``resume_script.py`` through ``hasten launch``."""
    out = tmp_path_factory.mktemp("full_2")
    proc = launch(out, "full")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out
