"""The same exactness checks with an accelerator as the main device (skipped without CUDA)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hasten.big_modeling import cpu_offload, init_empty_weights, load_checkpoint_and_dispatch
from unit.big_modeling.bm_models import TinyLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _checkpoint(tmp_path: Path) -> tuple[TinyLM, Path]:
    torch.manual_seed(0)
    model = TinyLM(dim=64).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors")
    return model, tmp_path / "model.safetensors"


def test_gpu_cpu_and_disk_dispatch_is_exact(tmp_path: Path) -> None:
    source, path = _checkpoint(tmp_path)
    device_map = {
        "wte": 0,
        "lm_head": 0,
        "h.0": 0,
        "h.1": "cpu",
        "h.2": "disk",
        "h.3": 0,
        "ln_f": "cpu",
        "scale": 0,
    }
    with init_empty_weights():
        empty = TinyLM(dim=64).eval()
    model = load_checkpoint_and_dispatch(
        empty, path, device_map=device_map, offload_folder=tmp_path / "off"
    )
    ids = torch.randint(0, 50, (2, 7))
    reference = copy.deepcopy(source).cuda()
    with torch.no_grad():
        got = model(ids)
        want = reference(ids.cuda())
    assert got.device.type == "cpu"  # outputs come back where the inputs were
    assert torch.equal(got, want.cpu())
    assert model.h[1].attn.weight.is_meta and model.h[0].attn.weight.device.type == "cuda"


def test_gpu_cpu_offload_is_exact(tmp_path: Path) -> None:
    source, _ = _checkpoint(tmp_path)
    model = copy.deepcopy(source)
    cpu_offload(model, execution_device=torch.device("cuda", 0))
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids.cuda()), copy.deepcopy(source).cuda()(ids.cuda()))


def test_gpu_bnb_8bit_dispatch_equals_in_place(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is optional")
    from hasten.big_modeling.quantization import load_and_quantize_model
    from hasten.config.quantization import BnbQuantizationConfig

    source, path = _checkpoint(tmp_path)
    config = BnbQuantizationConfig(load_in_8bit=True)
    in_place = load_and_quantize_model(copy.deepcopy(source), config)
    with init_empty_weights():
        empty = TinyLM(dim=64).eval()
    loaded = load_and_quantize_model(
        empty, BnbQuantizationConfig(load_in_8bit=True), weights_location=path, device_map={"": 0}
    )
    ids = torch.randint(0, 50, (2, 7)).cuda()
    with torch.no_grad():
        assert torch.equal(loaded(ids), in_place(ids))
