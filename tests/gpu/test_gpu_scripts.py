"""The prepared GPU checks (benchmarks/gpu_*.py) import and skip cleanly on a machine without one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run the scripts for real")
@pytest.mark.parametrize("name", ["gpu_fp8", "gpu_megatron"])
def test_script_skips_without_a_gpu(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _load(name)
    monkeypatch.setattr(sys, "argv", [name])
    assert module.main() == 0
    assert capsys.readouterr().out.startswith("SKIP:")


def test_fp8_script_model_and_data_on_cpu() -> None:
    module = _load("gpu_fp8")
    model = module.TinyGPT(width=64, layers=1, seq=16)
    tokens = module.batches(1, 2, 16, torch.device("cpu"))[0]
    loss = module.loss_of(model(tokens[:, :-1]), tokens)
    assert loss.item() == pytest.approx(
        torch.log(torch.tensor(float(module.VOCAB))).item(), rel=0.1
    )


def test_device_shell_scripts_parse() -> None:
    for script in ("gpu_device.sh", "gpu_fetch_wheels.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / script)], check=True)
