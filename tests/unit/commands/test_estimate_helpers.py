"""Accelerate's estimate-memory helpers: table, training usage, hub checks (never online)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from hasten.commands.estimate import (
    add_timm_hub_prefix,
    check_has_model,
    create_ascii_table,
    estimate_training_usage,
    gather_data,
    verify_on_hub,
)


def test_ascii_table_boxes_title_headers_and_rows() -> None:
    table = create_ascii_table(["a", "bb"], [["1", "22"], [3, 4]], "T")
    lines = table.splitlines()
    assert lines[1].strip("|").strip() == "T"
    assert lines[3] == "| a | bb |"
    assert lines[5] == "| 1 | 22 |" and lines[6] == "| 3 | 4  |"
    assert len({len(line) for line in lines}) == 1  # a rectangle
    wide = create_ascii_table(["a"], [["1"]], "a much longer title")
    assert len({len(line) for line in wide.splitlines()}) == 1
    with pytest.raises(ValueError, match=r"has 1 cells for 2 headers"):
        create_ascii_table(["a", "b"], [["1"]], "T")


def test_training_usage_parts() -> None:
    assert estimate_training_usage(1000, "float32") == {
        "model": 1000,
        "optimizer": 2000,
        "gradients": 1000,
        "step": 4000,
    }
    assert estimate_training_usage(1000, "bfloat16") == {
        "model": 1000,
        "optimizer": 2000,
        "gradients": 1500,
        "step": 2000,
    }
    assert set(estimate_training_usage(1000, "int4").values()) == {-1}
    with pytest.raises(ValueError, match="without MS-AMP"):
        estimate_training_usage(1000, "fp8", msamp_config="O1")
    with pytest.raises(ValueError, match="Unknown mixed_precision 'fp64'"):
        estimate_training_usage(1000, "fp64")


def test_gather_data_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tinymod.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(10, 10)\n"
    )
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(
        model_name="tinymod:build",
        library_name=None,
        trust_remote_code=False,
        access_token=None,
        dtypes=["float32", "float16"],
    )
    rows = gather_data(args)
    assert [row[0] for row in rows] == ["float32", "float16"]
    assert rows[0][2] == 440 and rows[1][2] == 220  # 110 parameters
    assert rows[1][3]["step"] == 880  # training parts count from the float32 size
    with pytest.raises(ValueError, match="library_name='timm'"):
        gather_data(argparse.Namespace(**{**vars(args), "library_name": "timm"}))


def test_timm_prefix_and_error_origin() -> None:
    # registry names and prefixed names unchanged; Hub repo ids get timm's source prefix
    assert add_timm_hub_prefix("resnet50") == "resnet50"
    assert add_timm_hub_prefix("resnet50.a1_in1k") == "resnet50.a1_in1k"
    assert add_timm_hub_prefix("timm/resnet50.a1_in1k") == "hf-hub:timm/resnet50.a1_in1k"
    assert add_timm_hub_prefix("hf-hub:timm/resnet50") == "hf-hub:timm/resnet50"
    assert add_timm_hub_prefix("local-dir:/path/to/model") == "local-dir:/path/to/model"
    assert check_has_model(RuntimeError("Unknown model (resnet)")) == "timm"
    error = OSError("repo does not appear to have a file named config.json")
    assert check_has_model(error) == "transformers"
    assert check_has_model(ValueError("other")) == "unknown"
    assert check_has_model(RuntimeError()) == "unknown"


def test_verify_on_hub_offline_is_immediate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE is set"):
        verify_on_hub("org/model")


def test_verify_on_hub_maps_gated_and_missing_repos(monkeypatch: pytest.MonkeyPatch) -> None:
    hub_utils = pytest.importorskip("huggingface_hub.utils", reason="needs huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # built without __init__, which wants a real HTTP response
    gated = hub_utils.GatedRepoError.__new__(hub_utils.GatedRepoError, "gated")
    missing = hub_utils.RepositoryNotFoundError.__new__(hub_utils.RepositoryNotFoundError, "nope")
    seen: list[dict[str, Any]] = []

    def fake_info(repo: str, **kwargs: Any) -> Any:
        seen.append({"repo": repo, **kwargs})
        outcome = {"gated/m": gated, "missing/m": missing, "down/m": OSError("unreachable")}
        if repo in outcome:
            raise outcome[repo]
        return {"id": repo}

    monkeypatch.setattr(sys.modules["huggingface_hub"], "model_info", fake_info)
    assert verify_on_hub("ok/m", token="t") == {"id": "ok/m"}
    assert seen[0] == {"repo": "ok/m", "token": "t", "timeout": 10}
    assert verify_on_hub("gated/m") == "gated"
    assert verify_on_hub("missing/m") == "repo"
    with pytest.raises(ConnectionError, match="Cannot reach the Hugging Face Hub"):
        verify_on_hub("down/m")


def test_a_name_that_is_no_local_config_is_refused_as_value_and_os_error() -> None:
    from hasten.commands.estimate import create_empty_model

    with pytest.raises(ValueError, match="never downloads") as info:
        create_empty_model("somebrokenname", library_name=None)
    assert isinstance(info.value, OSError)  # what Accelerate's Hub lookup raises
