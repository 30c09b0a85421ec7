"""``hasten estimate-memory``: sizes per dtype for a meta-built model; never downloads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

from hasten.commands.estimate import (
    create_empty_model,
    estimate_command_parser,
    estimate_rows,
    format_table,
)

BUILDER = "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 10))\n"


def test_rows_per_dtype() -> None:
    model = nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 10))
    rows = {r["dtype"]: r for r in estimate_rows(model, ["float32", "bfloat16", "int8", "int4"])}
    params = 1000 * 1000 + 1000 + 1000 * 10 + 10
    assert rows["float32"]["total"] == 4 * params
    assert rows["float32"]["largest_layer"] == 4 * (1000 * 1000 + 1000)
    assert rows["bfloat16"]["total"] == 2 * params
    assert rows["int8"]["total"] == params and rows["int4"]["total"] == params / 2
    assert rows["float32"]["training"] == 16 * params
    assert rows["bfloat16"]["training"] == 18 * params
    assert rows["int8"]["training"] is None
    table = format_table("t", list(rows.values()))
    assert "Training using Adam" in table and "N/A" in table
    with pytest.raises(ValueError, match="'float64' is not supported"):
        estimate_rows(model, ["float64"])


def test_create_empty_model_refuses_what_it_cannot_build_locally(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never downloads"):
        create_empty_model("gpt2", None)
    with pytest.raises(ValueError, match="never downloads"):
        create_empty_model(str(tmp_path), None)
    (tmp_path / "notmodel.py").write_text("def build():\n    return 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(TypeError, match="not a torch.nn.Module"):
            create_empty_model("notmodel:build", None)
    finally:
        sys.path.remove(str(tmp_path))


def test_config_folder_is_built_on_meta(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is optional")
    transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64
    ).save_pretrained(tmp_path)
    model = create_empty_model(str(tmp_path), None)
    assert all(p.is_meta for p in model.parameters())
    parser = estimate_command_parser()
    args = parser.parse_args([str(tmp_path), "--dtypes", "float16"])
    assert args.dtypes == ["float16"] and args.func is not None


@pytest.mark.cli
def test_cli_prints_the_table(tmp_path: Path) -> None:
    (tmp_path / "tinymodel.py").write_text(BUILDER)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hasten.commands.cli",
            "estimate-memory",
            "tinymodel:build",
            "--dtypes",
            "float32",
            "int4",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Memory Usage for loading `tinymodel:build`" in result.stdout
    assert "3.86 MB" in result.stdout and "N/A" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "hasten.commands.cli", "estimate-memory", "some/hub-model"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "never downloads" in bad.stderr
