from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hasten.commands import cli
from hasten.commands import test as test_cmd
from hasten.commands.cli import COMMANDS, build_parser, main


def test_command_table_lists_every_subcommand() -> None:
    assert COMMANDS["estimate-memory"] == "hasten.commands.estimate"
    assert COMMANDS["plot"] == "hasten.commands.plot"
    assert {"launch", "config", "env", "test"} <= set(COMMANDS)


def test_missing_command_module_still_lists_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.COMMANDS, "ghost", "hasten.commands.no_such_module")
    assert "not available" in build_parser().format_help()


def test_launch_parsing_does_not_import_torch() -> None:
    code = (
        "import sys\nfrom hasten.commands.cli import build_parser\n"
        "build_parser(only='launch').parse_args(['launch', '--cpu', 't.py'])\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_config_default_and_update_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    assert main(["config", "default", "--mixed_precision", "fp16", "--config_file", str(path)]) == 0
    assert yaml.safe_load(path.read_text())["mixed_precision"] == "fp16"
    path.write_text(yaml.safe_dump({"distributed_type": "NO", "fp16": True}))
    assert main(["config", "update", "--config_file", str(path)]) == 0
    updated = yaml.safe_load(path.read_text())
    assert updated["mixed_precision"] == "fp16" and "fp16" not in updated
    assert "Successfully updated" in capsys.readouterr().out


def test_questionnaire_saves_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("0\n0\nyes\nno\n\nno\n"))
    path = tmp_path / "q.json"
    assert main(["config", "--config_file", str(path)]) == 0
    assert '"use_cpu": true' in path.read_text()


def test_user_errors_are_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "update", "--config_file", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hasten config: error: Config file") and "Traceback" not in err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 1
    assert "usage: hasten" in capsys.readouterr().out


@pytest.mark.parametrize(("code", "word"), [(0, "success"), (3, "FAILED (exit code 3)")])
def test_test_command_reports_pass_or_fail(
    code: int, word: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def fake_launch(args: Any, *, replace_process: bool = True) -> int:
        seen.update(script=args.training_script, config=args.config_file, replace=replace_process)
        return code

    monkeypatch.setattr(test_cmd, "run_launch", fake_launch)
    assert main(["test", "--config_file", "c.yaml"]) == code
    assert word in capsys.readouterr().out
    assert seen == {"script": str(test_cmd.SELF_CHECK), "config": "c.yaml", "replace": False}
    assert test_cmd.SELF_CHECK.is_file()


def test_version_flag_prints_hastens_version(capsys: pytest.CaptureFixture[str]) -> None:
    from hasten import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"hasten {__version__} (the API of Accelerate 1.15.0)"
