"""fp8 mixed precision: bf16 autocast around fp8 matmuls from torchao, TransformerEngine or MS-AMP.

Everything is decided once, when the Accelerator is built (`select_fp8`): which backend (the
recipe handler's, else ``ACCELERATE_FP8_BACKEND``, else the first installed of torchao,
TransformerEngine, MS-AMP), whether its package is installed, and whether the device can run
fp8 matmuls (CUDA compute capability 8.9+: Ada, Hopper, Blackwell). A request that cannot be
honoured fails there, with what to do instead, never in the first forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from typing_extensions import override

from hasten.config import envvars
from hasten.config.enums import FP8BackendType
from hasten.config.kwargs import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.imports import (
    is_msamp_available,
    is_torchao_available,
    is_transformer_engine_available,
    require,
)
from hasten.precision.amp import AmpPrecision

__all__ = [
    "FP8_INSTALL",
    "Fp8Precision",
    "check_fp8_hardware",
    "fp8_backend_from_env",
    "select_fp8",
]

# How to install each backend (named in errors).
FP8_INSTALL = {
    FP8BackendType.AO: "pip install 'hasten[fp8]' (torchao)",
    FP8BackendType.TE: "pip install 'hasten[transformer_engine]' (transformer-engine[pytorch])",
    FP8BackendType.MSAMP: "install MS-AMP from source (https://github.com/Azure/MS-AMP)",
}
_AVAILABLE = {
    FP8BackendType.AO: is_torchao_available,
    FP8BackendType.TE: is_transformer_engine_available,
    FP8BackendType.MSAMP: is_msamp_available,
}
_RECIPE_BACKEND = {
    AORecipeKwargs: FP8BackendType.AO,
    TERecipeKwargs: FP8BackendType.TE,
    MSAMPRecipeKwargs: FP8BackendType.MSAMP,
}


def fp8_backend_from_env() -> FP8BackendType:
    """Return the backend named by ACCELERATE_FP8_BACKEND (``--fp8_backend``), or NO."""
    value = envvars.setting("ACCELERATE_FP8_BACKEND")
    if value in (None, ""):
        return FP8BackendType.NO
    try:
        return FP8BackendType(str(value).upper())
    except ValueError:
        raise ValueError(
            f"ACCELERATE_FP8_BACKEND={value!r} is not an fp8 backend; choose one of "
            f"{[b.value for b in FP8BackendType if b is not FP8BackendType.NO]} (e.g. "
            "hasten launch --fp8_backend ao)."
        ) from None


def _recipe_backend(recipe: Any) -> FP8BackendType:
    if isinstance(recipe, FP8RecipeKwargs):
        return FP8BackendType(str(recipe.backend).upper())
    for cls, backend in _RECIPE_BACKEND.items():
        if isinstance(recipe, cls):
            return backend
    raise TypeError(f"{recipe!r} is not an fp8 recipe handler")


def _choose_backend(recipe: Any) -> FP8BackendType:
    """The recipe's backend, checked against ACCELERATE_FP8_BACKEND; else the env; else installed."""
    selected = fp8_backend_from_env()
    if recipe is not None:
        backend = _recipe_backend(recipe)
        if selected not in (FP8BackendType.NO, backend):
            raise ValueError(
                f"A {type(recipe).__name__} (a recipe for the {backend.value} fp8 backend) was "
                f"passed, but the selected fp8 backend is {selected.value} "
                "(ACCELERATE_FP8_BACKEND / --fp8_backend / fp8_config.backend). Pass the recipe "
                f"of the selected backend, or select {backend.value}."
            )
        return backend
    if selected is not FP8BackendType.NO:
        return selected
    for backend in (FP8BackendType.AO, FP8BackendType.TE, FP8BackendType.MSAMP):
        if _AVAILABLE[backend]():
            return backend
    raise ImportError(
        "mixed_precision='fp8' needs an fp8 backend and none is installed (torchao, "
        "transformer-engine or MS-AMP). Fix: pip install 'hasten[fp8]' (torchao), or use "
        "mixed_precision='bf16'."
    )


def check_fp8_hardware(device: torch.device, backend: FP8BackendType) -> None:
    """Refuse devices without fp8 matmuls (NVIDIA compute capability 8.9+).

    Raises:
        ValueError: ``device`` is not such a GPU; names the hardware needed and bf16.
    """
    _check_hardware(torch.device(device), backend)


def _check_hardware(device: torch.device, backend: FP8BackendType) -> None:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) >= (8, 9):
            return
        found = f"a CUDA GPU of compute capability {major}.{minor}"
    else:
        found = f"device type {device.type!r}"
    raise ValueError(
        f"mixed_precision='fp8' ({backend.value} backend) needs an NVIDIA GPU with fp8 matmuls "
        f"(compute capability 8.9+: Ada L4/L40, Hopper H100/H200, Blackwell), but this process "
        f"computes on {found}. Use mixed_precision='bf16' here (or 'fp16' on older GPUs)."
    )


class Fp8Precision(AmpPrecision):
    """fp8 training: the model's forward runs under bf16 autocast and the backend's fp8 layers.

    Args:
        backend: `FP8BackendType.AO`, `TE` or `MSAMP`.
        recipe: the backend's recipe handler (None: the backend's defaults).
        device_type: the autocast device type.
        autocast_kwargs: an `AutocastKwargs`.
    """

    backend: FP8BackendType

    def __init__(
        self,
        backend: FP8BackendType,
        recipe: Any = None,
        device_type: str = "cuda",
        autocast_kwargs: Any = None,
    ) -> None:
        super().__init__("bf16", device_type, autocast_kwargs=autocast_kwargs)
        self.mixed_precision = "fp8"
        self.backend = FP8BackendType(backend)
        self.recipe = recipe

    def convert_module(self, model: nn.Module) -> nn.Module:
        """Swap ``model``'s layers for the backend's fp8 layers (torchao, TransformerEngine)."""
        if self.backend is FP8BackendType.AO:
            from hasten.precision.ao import convert_model_to_fp8_ao, has_ao_layers

            if has_ao_layers(model):
                return model
            recipe = self.recipe if self.recipe is not None else AORecipeKwargs()
            config = recipe.build_config()
            return convert_model_to_fp8_ao(model, config, recipe.module_filter_func)
        if self.backend is FP8BackendType.TE:
            from hasten.precision.transformer_engine import (
                convert_model,
                has_transformer_engine_layers,
            )

            if not has_transformer_engine_layers(model):
                with torch.no_grad():
                    convert_model(model)
        return model

    @override
    def wrap_forward(self, model: nn.Module) -> nn.Module:
        """Convert the layers, add bf16 autocast, and (TransformerEngine) its fp8 autocast."""
        self.convert_module(model)
        super().wrap_forward(model)
        if self.backend is FP8BackendType.TE:
            from hasten.precision.transformer_engine import apply_fp8_autowrap

            # `_original_forward` (set above) stays the forward from before both wrappers.
            apply_fp8_autowrap(model, self.recipe)
        return model

    @override
    def prepare_together(self, objects: list[Any]) -> list[Any]:
        """MS-AMP: `msamp.initialize` casts the one model and its optimizer of the call together.

        Raises:
            ValueError: MS-AMP with several models or optimizers in one prepare call.
        """
        if self.backend is not FP8BackendType.MSAMP:
            return objects
        models = [i for i, obj in enumerate(objects) if isinstance(obj, nn.Module)]
        optimizers = [i for i, o in enumerate(objects) if isinstance(o, torch.optim.Optimizer)]
        if not models and not optimizers:
            return objects
        if len(models) != 1 or len(optimizers) != 1:
            raise ValueError(
                f"fp8 with MS-AMP prepares exactly one model with its optimizer in one prepare() "
                f"call; this call has {len(models)} model(s) and {len(optimizers)} optimizer(s). "
                "Pass the model and its optimizer together, or use the torchao backend."
            )
        # optional: msamp
        msamp = require("msamp", feature="fp8 training with MS-AMP")
        level = self.recipe.opt_level if self.recipe is not None else MSAMPRecipeKwargs().opt_level
        result = list(objects)
        model, optimizer = msamp.initialize(
            objects[models[0]], objects[optimizers[0]], opt_level=level
        )
        result[models[0]], result[optimizers[0]] = model, optimizer
        return result

    @override
    def __repr__(self) -> str:
        return f"Fp8Precision(backend={self.backend.value!r}, {self.device_type!r})"


def select_fp8(
    device: torch.device | str,
    recipe: Any = None,
    autocast_kwargs: Any = None,
    check_hardware: bool = True,
) -> Fp8Precision:
    """Choose and check the fp8 backend for ``device``; return its precision policy.

    Args:
        device: where the model computes.
        recipe: the one fp8 recipe handler passed (`AORecipeKwargs`, `TERecipeKwargs`,
            `MSAMPRecipeKwargs` or `FP8RecipeKwargs`), or None.
        autocast_kwargs: an `AutocastKwargs`.
        check_hardware: refuse devices without fp8 matmuls (tests of conversion pass False).

    Raises:
        ImportError: the chosen backend (or, with no choice, every backend) is not installed.
        ValueError: the recipe is for another backend than the selected one, or the device has
            no fp8 matmuls.
    """
    backend = _choose_backend(recipe)
    if not _AVAILABLE[backend]():
        raise ImportError(
            f"mixed_precision='fp8' with the {backend.value} backend needs its package, which is "
            f"not installed. Fix: {FP8_INSTALL[backend]}; or choose another backend "
            "(--fp8_backend ao|te|msamp), or use mixed_precision='bf16'."
        )
    device = torch.device(device)
    if check_hardware:
        _check_hardware(device, backend)
    return Fp8Precision(backend, recipe, device.type, autocast_kwargs)
