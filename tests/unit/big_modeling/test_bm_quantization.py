"""bitsandbytes quantization: same outputs whether quantized in place or loaded and dispatched."""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hasten.big_modeling import init_empty_weights
from hasten.big_modeling import quantization as quant
from hasten.config.quantization import BnbQuantizationConfig
from hasten.core.imports import install_command
from unit.big_modeling.bm_models import TinyLM


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[TinyLM, Path, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM(dim=64).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors")
    return model, tmp_path / "model.safetensors", torch.randint(0, 50, (2, 6))


def _empty() -> TinyLM:
    with init_empty_weights():
        return TinyLM(dim=64).eval()


CONFIGS = {
    "8bit": lambda: BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32),
    "4bit": lambda: BnbQuantizationConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype="fp32", torch_dtype=torch.float32
    ),
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_quantized_then_dispatched_equals_quantized_in_place(
    checkpoint, tmp_path: Path, kind: str
) -> None:
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is optional")
    source, path, ids = checkpoint
    in_place = quant.load_and_quantize_model(copy.deepcopy(source), CONFIGS[kind]())
    device_map = {"wte": "cpu", "h": "cpu", "ln_f": "cpu", "lm_head": "cpu", "scale": "cpu"}
    loaded = quant.load_and_quantize_model(
        _empty(), CONFIGS[kind](), weights_location=path, device_map=device_map
    )
    layer = bnb.nn.Linear8bitLt if kind == "8bit" else bnb.nn.Linear4bit
    assert isinstance(loaded.h[0].attn, layer) and isinstance(in_place.h[0].attn, layer)
    assert type(loaded.lm_head) is torch.nn.Linear  # tied output layer left alone
    assert loaded.is_loaded_in_8bit == (kind == "8bit")
    assert quant.has_4bit_bnb_layers(loaded) == (kind == "4bit")
    with torch.no_grad():
        got, want, full = loaded(ids), in_place(ids), source(ids)
    assert torch.equal(got, want)
    assert not torch.equal(got, full)  # really quantized


def test_8bit_with_disk_offload_and_fp32_modules(checkpoint, tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is optional")
    source, path, ids = checkpoint
    config = BnbQuantizationConfig(
        load_in_8bit=True, torch_dtype=torch.float32, keep_in_fp32_modules=["ln_f"]
    )
    in_place = quant.load_and_quantize_model(copy.deepcopy(source), config)
    device_map = {
        "wte": "cpu",
        "h.0": "cpu",
        "h.1": "disk",
        "h.2": "disk",
        "h.3": "cpu",
        "ln_f": "cpu",
        "lm_head": "cpu",
        "scale": "cpu",
    }
    config = BnbQuantizationConfig(
        load_in_8bit=True, torch_dtype=torch.float32, keep_in_fp32_modules=["ln_f"]
    )
    loaded = quant.load_and_quantize_model(
        _empty(),
        config,
        weights_location=path,
        device_map=device_map,
        offload_folder=tmp_path / "off",
    )
    assert loaded.ln_f.weight.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(loaded(ids), in_place(ids))


def test_auto_map_counts_quantized_weights(checkpoint) -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is optional")
    _, path, ids = checkpoint
    config = BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float32)
    model = quant.load_and_quantize_model(
        _empty(), config, weights_location=path, device_map="auto", max_memory={"cpu": "1GB"}
    )
    assert model.hf_device_map == {"": "cpu"}
    assert model(ids).shape == (2, 6, 50)


def test_keys_to_not_convert_and_replace_with_bnb_layers() -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is optional")
    model = TinyLM()
    assert quant.get_keys_to_not_convert(model) == ["lm_head", "wte"]
    config = BnbQuantizationConfig(load_in_8bit=True)
    quant.replace_with_bnb_layers(model, config, modules_to_not_convert=["h.1", "lm_head"])
    assert type(model.h[1].attn) is torch.nn.Linear and type(model.h[0].attn) is not torch.nn.Linear


def test_errors(checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path, _ = checkpoint
    config = BnbQuantizationConfig(load_in_8bit=True)
    with pytest.raises(TypeError, match="BnbQuantizationConfig"):
        quant.load_and_quantize_model(_empty(), {"load_in_8bit": True})  # type: ignore[arg-type]
    if importlib.util.find_spec("bitsandbytes") is not None:
        with pytest.raises(ValueError, match="needs weights_location"):
            quant.load_and_quantize_model(_empty(), config)
    monkeypatch.setattr(quant, "require", _missing)
    with pytest.raises(ImportError, match=re.escape(install_command("bitsandbytes", "bnb"))):
        quant.load_and_quantize_model(_empty(), config, weights_location=path)


def _missing(package: str, *, feature: str, extra: str | None = None) -> object:
    from hasten.core.imports import require

    return require("a_package_that_is_not_installed_" + package, feature=feature, extra=extra)


def test_get_parameter_device_and_its_error() -> None:
    from hasten.big_modeling.quantization import get_parameter_device

    assert get_parameter_device(nn.Linear(2, 2)) == torch.device("cpu")
    with pytest.raises(ValueError, match="ReLU has no parameters"):
        get_parameter_device(nn.ReLU())


def test_quantize_and_offload_8bit_with_statistics_writes_weight_and_scales(tmp_path: Any) -> None:
    from hasten.big_modeling.offload import load_offloaded_weight
    from hasten.big_modeling.quantization import quantize_and_offload_8bit

    model = nn.Sequential(nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)  # as in a bitsandbytes Linear8bitLt
    weight = torch.randint(-127, 127, (2, 4), dtype=torch.int8)
    scales = torch.rand(2)
    index: dict[str, Any] = {}
    quantize_and_offload_8bit(model, weight, "0.weight", torch.int8, tmp_path, index, scales)
    assert set(index) == {"0.weight", "0.SCB"}
    assert model[0].weight.device.type == "meta"
    assert torch.equal(load_offloaded_weight(tmp_path / "0.weight.dat", index["0.weight"]), weight)
    assert torch.equal(load_offloaded_weight(tmp_path / "0.SCB.dat", index["0.SCB"]), scales)


def test_get_quantized_model_device_map_checks_strategies_and_4bit_offload() -> None:
    from hasten.big_modeling.quantization import get_quantized_model_device_map
    from hasten.config.quantization import BnbQuantizationConfig

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    config = BnbQuantizationConfig(load_in_8bit=True)
    assert get_quantized_model_device_map(model, config, {"": "cpu"}) == {"": "cpu"}
    with pytest.raises(ValueError, match="must be a dict or one of"):
        get_quantized_model_device_map(model, config, "fastest")
    four_bit = BnbQuantizationConfig(load_in_4bit=True)
    with pytest.raises(ValueError, match="4-bit weights cannot be offloaded"):
        get_quantized_model_device_map(model, four_bit, {"0": 0, "1": "cpu"})


def test_check_quantized_placement_refuses_what_bitsandbytes_cannot_train() -> None:
    cpu, cuda0, cuda1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    check = quant.check_quantized_placement
    check({"": "cpu"}, cpu, distributed=False, cpu_supported=True)  # CPU build of bitsandbytes
    check({"": 0}, torch.device("cuda"), distributed=False, cpu_supported=False)
    check({"": 1}, cuda1, distributed=True, cpu_supported=False)
    check({"a": 0, "b": 1}, cuda0, distributed=False, cpu_supported=False)  # naive pipeline
    with pytest.raises(
        ValueError, match=r"^You can't train .* with CPU or disk offload\. \(hasten"
    ):
        check({"": "cpu"}, cpu, distributed=False, cpu_supported=False)
    with pytest.raises(ValueError, match=r"with CPU or disk offload"):
        check({"a": 0, "b": "disk"}, cuda0, distributed=False, cpu_supported=True)
    with pytest.raises(
        ValueError, match=r"^You can't train .* on multiple devices in any distributed"
    ):
        check({"a": 0, "b": 1}, cuda0, distributed=True, cpu_supported=True)
    with pytest.raises(ValueError, match=r"on a different device than the one you're training on"):
        check({"": 1}, cuda0, distributed=False, cpu_supported=False)


def test_prepare_model_checks_a_quantized_models_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    # Accelerate's test patches these two names in the accelerator module; they are looked up there.
    from hasten import Accelerator
    from hasten import accelerator as accelerator_module

    accelerator = Accelerator()
    model = nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cpu"}
    monkeypatch.setattr(accelerator_module, "is_xpu_available", lambda: False)
    monkeypatch.setattr(
        accelerator_module, "is_bitsandbytes_multi_backend_available", lambda: False
    )
    with pytest.raises(ValueError, match="CPU or disk offload"):
        accelerator.prepare_model(model)
    monkeypatch.setattr(accelerator_module, "is_bitsandbytes_multi_backend_available", lambda: True)
    assert accelerator.prepare_model(nn.Linear(2, 2)) is not None
    quantized = nn.Linear(2, 2)
    quantized.is_loaded_in_8bit = True
    quantized.hf_device_map = {"": "cpu"}
    assert accelerator.prepare_model(quantized) is quantized
