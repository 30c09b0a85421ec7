"""The code on the documentation pages runs: each page's Python blocks, in order, as one script.

Every ```` ```python ```` block of a page is run, top to bottom, in a fresh folder, the way a
reader would paste them into one file; blocks that need what a test machine lacks are marked with
an HTML comment ``<!-- not run: why -->`` on the line before (none today). All pages run in one
interpreter (`tests/_support/run_scripts.py`: hasten's state reset between pages), so the cost is
one torch import. Shell blocks are not run here: the commands they show run in the examples'
tests and the CLI tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cli, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The design notes are included in the site as they are; their code is fragments of the code
#: base they describe, tested there.
DESIGN_NOTES = {
    "architecture.md",
    "checkpoints.md",
    "conformance.md",
    "differences.md",
    "launch.md",
}
FENCE = re.compile(
    r"^(?P<skip><!-- not run: [^>]+ -->\n)?```python\n(?P<code>.*?)^```$", re.M | re.S
)


def pages() -> list[Path]:
    """The site's Markdown pages other than the design notes."""
    found = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
    return [p for p in found if str(p.relative_to(DOCS)) not in DESIGN_NOTES]


def blocks(page: Path) -> list[str]:
    """The page's Python blocks that are run, in order."""
    return [m["code"] for m in FENCE.finditer(page.read_text()) if not m["skip"]]


def test_pages_have_runnable_code() -> None:
    names = {str(p.relative_to(DOCS)) for p in pages()}
    assert {"start/install.md", "start/porting.md", "how-to/fsdp.md", "benchmarks.md"} <= names
    without = [
        name
        for name in sorted(names)
        if not blocks(DOCS / name) and name not in {"examples.md", "benchmarks.md"}
    ]
    assert not without, f"pages without a runnable Python block: {without}"


def test_every_python_block_on_the_pages_runs(tmp_path: Path) -> None:
    jobs = []
    for page in pages():
        code = blocks(page)
        if not code:
            continue
        name = str(page.relative_to(DOCS)).replace("/", "__").removesuffix(".md")
        folder = tmp_path / name
        folder.mkdir()
        script = folder / "page.py"
        script.write_text("\n\n".join(code))
        jobs.append({"name": name, "script": str(script), "args": [], "cwd": str(folder)})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_support" / "run_scripts.py"), str(tmp_path / "jobs.json")],
        capture_output=True, text=True, timeout=540, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    outputs = {job["name"]: (Path(job["cwd"]) / "stdout.0.txt").read_text() for job in jobs}
    # Spot checks that the pages' code did what the pages say it does.
    assert "True" in outputs["how-to__checkpoints"]  # the resumed run equals the uninterrupted
    assert "16 batches, 4 updates" in outputs["how-to__gradient-accumulation"]
    assert "torch.bfloat16 torch.float32 torch.float32" in outputs["how-to__mixed-precision"]
    assert "'disk'" in outputs["how-to__big-models"] and "True" in outputs["how-to__big-models"]
    assert "What each rank was doing" in outputs["how-to__hangs"]
    assert "this process holds" in outputs["how-to__fsdp"]
    assert "5 8 1 4" in outputs["clusters"] and "gpu07 23456" in outputs["clusters"]
