"""The prepared GPU checks (benchmarks/gpu_*.py) import and skip cleanly on a machine without one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from hasten.core.imports import is_package_available

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run the scripts for real")
@pytest.mark.parametrize("case", ["dummy", "bert", "t5", "fp8"])
def test_megatron_cases_skip_without_a_gpu(
    case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _load("gpu_megatron")
    monkeypatch.setattr(sys, "argv", ["gpu_megatron", "--case", case])
    assert module.main() == 0
    assert capsys.readouterr().out.startswith(f"SKIP: the Megatron-LM {case} check needs")


def test_megatron_script_data_on_cpu() -> None:
    module = _load("gpu_megatron")
    bert = module.rows("bert", 2)[0]
    assert bert["input_ids"][0].item() == 1 and bert["labels"][1].item() == -100
    assert bert["labels"][8].item() == module.rows("gpt", 2)[0]["input_ids"][8].item()
    t5 = module.rows("t5", 2)[0]
    # the decoder continues the count: the next number after the encoder's last one
    assert t5["labels"][0].item() == (t5["input_ids"][-1].item() - 1) % (module.VOCAB - 2) + 2


@pytest.mark.skipif(
    not is_package_available("transformers"), reason="transformers is not installed"
)
@pytest.mark.parametrize("case", ["gpt", "bert", "t5"])
def test_megatron_script_models_have_megatron_parsers(case: str) -> None:
    from hasten.config.megatron import MegatronLMPlugin

    module = _load("gpu_megatron")
    plugin = MegatronLMPlugin()
    plugin.set_network_size_args(module.model_for(case))
    expected = {"gpt": "gpt", "bert": "bert", "t5": "t5"}[case]
    assert plugin.megatron_lm_default_args["model_type_name"] == expected
    assert plugin.megatron_lm_default_args["pretraining_flag"] is True


@pytest.mark.skipif(not is_package_available("megatron"), reason="megatron-core is not installed")
def test_megatron_script_writes_an_indexed_dataset(tmp_path: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    module = _load("gpu_megatron")
    dataset = IndexedDataset(module.indexed_dataset(str(tmp_path), documents=4))
    assert len(dataset) == 4 and dataset[0][-1] == 0 and len(dataset[0]) == 2 * module.SEQ + 1


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
