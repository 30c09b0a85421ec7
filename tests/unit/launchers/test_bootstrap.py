from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hasten.launchers.bootstrap import main, record_failure


@pytest.fixture
def restore_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.mark.usefixtures("restore_sys")
def test_runs_a_script_like_python_would(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    script = tmp_path / "job.py"
    script.write_text(
        "import json, sys\n"
        f"json.dump({{'argv': sys.argv, 'name': __name__, 'path0': sys.path[0]}}, open({str(out)!r}, 'w'))\n"
    )
    main([str(script), "--lr", "3"])
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(script), "--lr", "3"], "name": "__main__", "path0": str(tmp_path)}


@pytest.mark.usefixtures("restore_sys")
def test_runs_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.txt"
    (tmp_path / "jobmod.py").write_text(
        f"import sys\nopen({str(out)!r}, 'w').write(__name__ + ' ' + ' '.join(sys.argv[1:]))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    main(["-m", "jobmod", "a", "b"])
    assert out.read_text() == "__main__ a b"


@pytest.mark.usefixtures("restore_sys")
def test_crash_is_recorded_for_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    script = tmp_path / "bad.py"
    script.write_text("raise KeyError('missing thing')\n")
    with pytest.raises(KeyError):
        main([str(script)])
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "KeyError: 'missing thing'"
    assert "bad.py" in data["message"]["extraInfo"]["py_callstack"]
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0


def test_record_failure_without_error_file_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    record_failure(RuntimeError("x"))  # must not raise


def test_usage_error_without_target() -> None:
    with pytest.raises(SystemExit, match="usage"):
        main([])


@pytest.mark.usefixtures("restore_sys")
def test_restart_attempt_reaches_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "attempt.txt"
    script = tmp_path / "job.py"
    script.write_text(
        "import os\n"
        f"open({str(out)!r}, 'w').write(os.environ['TORCHELASTIC_RESTART_COUNT'] + "
        "str('HASTEN_RESTART_COUNT' in os.environ))\n"
    )
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("HASTEN_RESTART_COUNT", "2")
    main([str(script)])
    assert out.read_text() == "2False"
