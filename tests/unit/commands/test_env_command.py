from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hasten.commands.env import collect_report, format_report


def test_report_shows_each_setting_with_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump({"distributed_type": "NO", "mixed_precision": "fp16", "debug": True})
    )
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    report = collect_report(str(config))
    assert report["config_file"] == str(config)
    assert report["settings"]["mixed_precision"] == (
        "bf16",
        "environment ACCELERATE_MIXED_PRECISION",
    )
    assert report["settings"]["debug"] == (True, "config file")
    assert report["settings"]["max_restarts"] == (0, "default")
    assert report["accelerate_env"]["ACCELERATE_MIXED_PRECISION"] == "bf16"
    import torch

    assert report["versions"]["PyTorch version"] == torch.__version__
    text = format_report(report)
    assert "- PyTorch version: " in text
    assert "mixed_precision: bf16 [environment ACCELERATE_MIXED_PRECISION]" in text
    assert f"- Config file: {config}" in text
    assert "ACCELERATE_MIXED_PRECISION=bf16" in text


def test_report_without_config_uses_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    report = collect_report()
    assert report["config_file"] is None
    assert "Config file: none (defaults)" in format_report(report)


def test_missing_explicit_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        collect_report(str(tmp_path / "missing.yaml"))


def test_env_command_returns_accelerates_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hasten.commands import env

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no default config file
    monkeypatch.setattr(env, "which", lambda name: None)  # Accelerate's test patches it here
    args = env.env_command_parser().parse_args([])
    info = env.env_command(args)
    assert info["`accelerate` bash location"] == "Not found"
    assert info["`Accelerate` configs"] == "Not found"
    assert info["`Accelerate` version"].startswith("hasten ")
    assert "Copy-and-paste" in capsys.readouterr().out
    monkeypatch.setattr(env, "which", lambda name: f"/bin/{name}")
    assert env.env_command(args)["`accelerate` bash location"] == "/bin/accelerate"
    assert args.func(args) == 0  # the command's exit code
