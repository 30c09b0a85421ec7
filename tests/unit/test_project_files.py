"""The files a fresh clone needs beside the code: the license named in pyproject, a changelog."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_file_matches_the_pyproject_license() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'^license = "([^"]+)"$', pyproject, re.MULTILINE)
    assert declared is not None, "pyproject.toml has no license line"
    declared = declared.group(1)
    assert declared == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub


def test_changelog_lists_the_current_version() -> None:
    from hasten import __version__

    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {__version__}" in changelog
    assert "## Unreleased" in changelog
