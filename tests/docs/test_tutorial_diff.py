"""docs/start/from-pytorch.md: both sides of its diff run, and on one process train the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "start" / "from-pytorch.md"


def _sides() -> tuple[str, str, str]:
    text = PAGE.read_text()
    (diff,) = re.findall(r"^```diff\n(.*?)^```$", text, re.M | re.S)
    before = "".join(line[1:] + "\n" for line in diff.splitlines() if not line.startswith("+"))
    after = "".join(line[1:] + "\n" for line in diff.splitlines() if not line.startswith("-"))
    final = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)[0]
    return before, after, final


def _code(source: str) -> list[str]:
    """The statements, without comments, blank lines or import grouping."""
    lines = (re.sub(r"\s+#.*$", "", line).rstrip() for line in source.splitlines())
    return sorted(line for line in lines if line and not line.lstrip().startswith("#"))


def _run(source: str, tmp_path: Path, name: str) -> str:
    script = tmp_path / name
    script.write_text(source)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_diff_applied_is_the_page_s_script() -> None:
    _, after, final = _sides()
    # the diff keeps a `device` name for the lines it removes; the finished script needs none
    assert [line for line in _code(after) if line != "device = accelerator.device"] == _code(final)


def test_before_and_after_train_the_same_on_one_process(tmp_path: Path) -> None:
    before, after, _ = _sides()
    plain = _run(before, tmp_path, "plain.py")
    ported = _run(after, tmp_path, "ported.py")
    assert re.findall(r"epoch \d: loss [0-9.]+", plain) == re.findall(
        r"epoch \d: loss [0-9.]+", ported
    )
    assert len(re.findall(r"epoch \d", plain)) == 3
