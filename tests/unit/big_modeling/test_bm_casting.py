"""Layerwise casting: weights stored narrow (memory really shrinks), forwards run wide."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.big_modeling import attach_layerwise_casting_hooks
from hasten.hooks import LayerwiseCastingHook, remove_hook_from_module
from hasten.utils.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING


class Probe(nn.Linear):
    """A Linear (so it is cast) that records the dtype its weight had during the forward."""

    seen: list[torch.dtype]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.__dict__.setdefault("seen", []).append(self.weight.dtype)
        return super().forward(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.blocks = nn.ModuleList([Probe(8, 8) for _ in range(3)])
        self.proj_out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)  # (b, 4, 8)
        h = self.norm(h)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.proj_out(h)


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.mark.parametrize("storage", [torch.float8_e4m3fn, torch.bfloat16])
def test_parameter_memory_shrinks_to_the_storage_dtype(storage: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Net()
    norm_bytes = _param_bytes(model.norm)
    before = _param_bytes(model)
    attach_layerwise_casting_hooks(model, storage, torch.float32)
    after = _param_bytes(model)
    ratio = torch.finfo(storage).bits / 32
    expected = (before - norm_bytes) * ratio + norm_bytes  # the norm is not a supported layer
    assert after == expected
    assert after < before
    assert model.norm.weight.dtype == torch.float32
    assert all(block.weight.dtype == storage for block in model.blocks)


def test_forward_computes_in_compute_dtype_and_returns_to_storage() -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(5, 2, 8)
    attach_layerwise_casting_hooks(model, torch.float8_e4m3fn, torch.float32)
    # the reference: same (already rounded) weights, kept wide
    reference = Net()
    with torch.no_grad():
        for p, q in zip(model.parameters(), reference.parameters()):
            q.copy_(p.to(torch.float32))
    out = model(x)
    assert out.dtype == torch.float32
    assert model.blocks[0].seen == [torch.float32]  # the layer ran wide...
    assert model.blocks[0].weight.dtype == torch.float8_e4m3fn  # ...and went back narrow
    torch.testing.assert_close(out, reference(x))


def test_parameters_keep_their_identity_and_hooks_can_be_removed() -> None:
    model = Net()
    weight = model.proj_out.weight
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
    model(torch.randn(1, 2, 8))
    assert model.proj_out.weight is weight
    assert isinstance(model.proj_out._hf_hook, LayerwiseCastingHook)
    remove_hook_from_module(model, recurse=True)
    assert "_hf_hook" not in model.proj_out.__dict__


def test_skip_patterns_and_classes_keep_modules_wide() -> None:
    model = Net()
    attach_layerwise_casting_hooks(
        model,
        torch.bfloat16,
        torch.float32,
        skip_modules_pattern=(r"^proj_out$", r"blocks\.1"),
        skip_modules_classes=(nn.Conv1d,),
    )
    assert model.proj_out.weight.dtype == torch.float32
    assert model.blocks[1].weight.dtype == torch.float32
    assert model.conv.weight.dtype == torch.float32
    assert model.blocks[0].weight.dtype == torch.bfloat16
    assert model.blocks[2].weight.dtype == torch.bfloat16
    # a single string is one pattern (not a tuple of characters)
    other = Net()
    attach_layerwise_casting_hooks(
        other, torch.bfloat16, torch.float32, skip_modules_pattern="blocks"
    )
    assert all(b.weight.dtype == torch.float32 for b in other.blocks)
    assert other.proj_out.weight.dtype == torch.bfloat16


def test_a_bare_supported_layer_is_cast_itself() -> None:
    layer = nn.Linear(4, 4)
    attach_layerwise_casting_hooks(layer, torch.bfloat16, torch.float32)
    assert layer.weight.dtype == torch.bfloat16
    assert layer(torch.randn(2, 4)).dtype == torch.float32
    assert nn.Linear in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match="storage_dtype must be a floating-point"):
        attach_layerwise_casting_hooks(Net(), torch.int8, torch.float32)
    with pytest.raises(TypeError, match="compute_dtype must be a floating-point"):
        LayerwiseCastingHook(torch.bfloat16, "float32", False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid regex"):
        attach_layerwise_casting_hooks(Net(), torch.bfloat16, torch.float32, "blocks[")
    with pytest.raises(TypeError, match="skip_modules_pattern must be"):
        attach_layerwise_casting_hooks(Net(), torch.bfloat16, torch.float32, (1,))  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="measures CUDA memory (needs CUDA)")
def test_cuda_memory_drops_to_the_storage_dtype_and_forward_runs_in_bf16() -> None:
    torch.cuda.synchronize()
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).cuda().to(torch.bfloat16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    attach_layerwise_casting_hooks(model, torch.float8_e4m3fn, torch.bfloat16)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    weights = 8 * 1024 * 1024
    assert before - after >= weights  # 2 bytes -> 1 byte per weight element
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert model(x).dtype == torch.bfloat16
    assert all(layer.weight.dtype == torch.float8_e4m3fn for layer in model)
