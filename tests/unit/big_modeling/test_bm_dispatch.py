"""End to end: loaded/dispatched/offloaded models give exactly the plain model's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import hasten
from hasten.big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from hasten.big_modeling.hooks import remove_hook_from_submodules
from unit.big_modeling.bm_models import TinyLM

MIXED_MAP = {
    "wte": "cpu",
    "lm_head": "cpu",
    "h.0": "cpu",
    "h.1": "disk",
    "h.2.attn": "disk",
    "h.2.ln": "cpu",
    "h.2.proj": "cpu",
    "h.2.mlp": "disk",
    "h.3": "cpu",
    "ln_f": "disk",
    "scale": "cpu",
}


@pytest.fixture
def reference() -> tuple[TinyLM, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyLM().eval()
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        return model, ids, model(ids)


def _save(model: nn.Module, folder: Path, shards: int = 2, safe: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    keys = list(state)
    weight_map = {}
    for s in range(shards):
        part = {k: state[k] for k in keys[s::shards]}
        name = f"model-{s}.{'safetensors' if safe else 'bin'}"
        save_file(part, folder / name) if safe else torch.save(part, folder / name)
        weight_map |= dict.fromkeys(part, name)
    index = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
    (folder / index).write_text(json.dumps({"weight_map": weight_map}))
    return folder


def _empty() -> TinyLM:
    with init_empty_weights():
        return TinyLM().eval()


@pytest.mark.parametrize("safe", [True, False])
def test_load_checkpoint_and_dispatch_cpu_and_disk_is_exact(
    tmp_path: Path, reference, safe: bool
) -> None:
    source, ids, want = reference
    folder = _save(source, tmp_path / "ckpt", safe=safe)
    model = load_checkpoint_and_dispatch(
        _empty(), folder, device_map=MIXED_MAP, offload_folder=tmp_path / "off"
    )
    with torch.no_grad():
        assert torch.equal(model(ids), want)
        assert torch.equal(model(ids), want)  # weights go back to meta and come back again
    assert model.h[1].attn.weight.is_meta and model.h[0].attn.weight.device.type == "cpu"
    assert model.lm_head.weight is model.wte.weight
    assert model.hf_device_map == MIXED_MAP
    with pytest.raises(RuntimeError, match="cannot be moved as a whole"):
        model.to("cpu")


def test_generate_style_loop_with_grad_enabled(tmp_path: Path, reference) -> None:
    source, ids, _ = reference
    model = load_checkpoint_and_dispatch(
        _empty(), _save(source, tmp_path / "c"), device_map=MIXED_MAP, offload_folder=tmp_path / "o"
    )

    def greedy(m: nn.Module, steps: int = 4) -> torch.Tensor:
        tokens = ids
        for _ in range(steps):
            tokens = torch.cat([tokens, m(tokens)[:, -1:].argmax(-1)], dim=1)
        return tokens

    with torch.no_grad():
        assert torch.equal(greedy(model), greedy(source))
    out = model(ids)  # autograd on: still correct, and the graph reaches loaded weights
    assert out.requires_grad


def test_auto_map_with_a_small_cpu_budget_offloads_and_stays_exact(
    tmp_path: Path, reference
) -> None:
    source, ids, want = reference
    model = load_checkpoint_and_dispatch(
        _empty(),
        _save(source, tmp_path / "c"),
        device_map="auto",
        max_memory={"cpu": 25000},
        no_split_module_classes=["Block"],
        offload_folder=tmp_path / "o",
    )
    assert "disk" in model.hf_device_map.values()
    with torch.no_grad():
        assert torch.equal(model(ids), want)


def test_single_device_map_moves_the_model_without_hooks(tmp_path: Path, reference) -> None:
    source, ids, want = reference
    model = load_checkpoint_and_dispatch(
        _empty(), _save(source, tmp_path / "c"), device_map={"": "cpu"}
    )
    assert not hasattr(model, "_hf_hook")
    with torch.no_grad():
        assert torch.equal(model(ids), want)
    plain = load_checkpoint_and_dispatch(_empty(), _save(source, tmp_path / "d"))
    with torch.no_grad():
        assert torch.equal(plain(ids), want)


def test_cpu_offload_is_exact_and_keeps_weights_off_the_module(reference) -> None:
    source, ids, want = reference
    model = TinyLM().eval()
    model.load_state_dict(source.state_dict())
    cpu_offload(model, execution_device=torch.device("cpu"))
    assert model.h[0].mlp[0].weight.is_meta
    with torch.no_grad():
        assert torch.equal(model(ids), want)
    assert model.h[0].mlp[0].weight.is_meta
    remove_hook_from_submodules(model)
    with torch.no_grad():
        assert torch.equal(model(ids), want)


def test_disk_offload_is_exact(tmp_path: Path, reference) -> None:
    source, ids, want = reference
    model = TinyLM().eval()
    model.load_state_dict(source.state_dict())
    disk_offload(model, tmp_path / "off", execution_device=torch.device("cpu"))
    assert (tmp_path / "off" / "index.json").is_file()
    with torch.no_grad():
        assert torch.equal(model(ids), want)
    again = TinyLM().eval()
    disk_offload(again, tmp_path / "off")  # reuses the existing offload folder
    with torch.no_grad():
        assert torch.equal(again(ids), want)


def test_cpu_offload_with_hook_chains_a_pipeline() -> None:
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    first, hook_1 = cpu_offload_with_hook(first, execution_device="cpu")
    second, hook_2 = cpu_offload_with_hook(second, execution_device="cpu", prev_module_hook=hook_1)
    calls: list[str] = []
    hook_1.offload = lambda: calls.append("first offloaded")  # type: ignore[method-assign]
    x = torch.randn(2, 3)
    expected = second._old_forward(first._old_forward(x))
    assert torch.equal(second(first(x)), expected)
    assert calls == ["first offloaded"]
    hook_2.remove()
    assert not hasattr(second, "_hf_hook")


def test_dispatch_model_errors(tmp_path: Path, reference) -> None:
    source, _, _ = reference
    model = TinyLM().eval()
    with pytest.raises(ValueError, match="no offload_dir was given"):
        dispatch_model(
            model,
            {"wte": "cpu", "h": "disk", "ln_f": "cpu", "lm_head": "cpu", "scale": "cpu"},
        )
    with pytest.raises(ValueError, match="no device for these tensors"):
        dispatch_model(TinyLM(), {"wte": "cpu"})
    missing = {
        k: v
        for k, v in source.state_dict().items()
        if not k.startswith("h.3.proj") and k != "lm_head.weight"
    }
    save_file({k: v.contiguous() for k, v in missing.items()}, tmp_path / "m.safetensors")
    with (
        pytest.warns(UserWarning, match="no value for"),
        pytest.raises(ValueError, match=r"never loaded .*h\.3\.proj\.weight"),
    ):
        load_checkpoint_and_dispatch(
            _empty(),
            tmp_path / "m.safetensors",
            device_map=MIXED_MAP,
            offload_folder=tmp_path / "o",
        )


def test_dispatch_model_writes_the_offload_folder_from_a_loaded_model(
    tmp_path: Path, reference
) -> None:
    source, ids, want = reference
    model = TinyLM().eval()
    model.load_state_dict(source.state_dict())
    dispatch_model(model, MIXED_MAP, offload_dir=tmp_path / "o")
    assert (tmp_path / "o" / "index.json").is_file()
    with torch.no_grad():
        assert torch.equal(model(ids), want)


def test_entry_points_are_importable_from_hasten() -> None:
    assert hasten.load_checkpoint_and_dispatch is load_checkpoint_and_dispatch
    assert hasten.init_empty_weights is init_empty_weights


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_buffers_of_disk_modules_come_from_the_checkpoint(
    tmp_path: Path, offload_buffers: bool
) -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()

    torch.manual_seed(0)
    source = build()
    source[1].running_mean.fill_(0.5)
    source[1].running_var.fill_(3.0)
    save_file(
        {k: v.contiguous() for k, v in source.state_dict().items()}, tmp_path / "m.safetensors"
    )
    with init_empty_weights():
        empty = build()
    model = load_checkpoint_and_dispatch(
        empty,
        tmp_path / "m.safetensors",
        device_map={"0": "cpu", "1": "disk", "2": "disk"},
        offload_folder=tmp_path / "off",
        offload_buffers=offload_buffers,
    )
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(model(x), source(x))


def test_dispatch_looks_its_helpers_up_on_the_package_when_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # transformers' skip_device_map_check() replaces accelerate.big_modeling.check_device_map
    # with a no-op while it dispatches a model whose map leaves some parameters out.
    import hasten.big_modeling as big_modeling

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    partial_map = {"0": "cpu"}  # "1" is not placed
    with pytest.raises(ValueError, match="1.weight"):
        hasten.dispatch_model(model, device_map=partial_map, force_hooks=True)
    monkeypatch.setattr(big_modeling, "check_device_map", lambda *args, **kwargs: None)
    dispatched = hasten.dispatch_model(model, device_map=partial_map, force_hooks=True)
    assert dispatched.hf_device_map == partial_map
    hooked: list[object] = []
    original = big_modeling.add_hook_to_module
    monkeypatch.setattr(
        big_modeling,
        "add_hook_to_module",
        lambda module, hook, append=False: hooked.append(hook) or original(module, hook, append),
    )
    hasten.cpu_offload(nn.Linear(2, 2))
    assert hooked, "cpu_offload called add_hook_to_module through hasten.big_modeling"
