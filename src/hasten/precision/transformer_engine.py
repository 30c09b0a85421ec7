"""fp8 training with NVIDIA TransformerEngine: layer conversion and the fp8 autocast wrapper.

TransformerEngine's `te.Linear` / `te.LayerNorm` run their matmuls in fp8 inside
`te.fp8_autocast`; `apply_fp8_autowrap` makes the model's forward enter that context with the
recipe built once from a `TERecipeKwargs`. TransformerEngine is imported only when used.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial, wraps
from types import MethodType
from typing import Any

import torch
from torch import nn

from hasten.core.imports import require

__all__ = [
    "apply_fp8_autowrap",
    "build_te_recipe",
    "contextual_fp8_autocast",
    "convert_model",
    "has_transformer_engine_layers",
]

_FEATURE = "fp8 training with TransformerEngine"


def _te() -> Any:
    # optional: transformer_engine
    return require(
        "transformer_engine.pytorch",
        feature=_FEATURE,
        extra="transformer_engine",
        pip_name="transformer-engine[pytorch]",
    )


def _copy_params(source: Any, target: Any) -> None:
    with torch.no_grad():
        target.weight.copy_(source.weight)
        if getattr(source, "bias", None) is not None and source.bias.numel() > 0:
            target.bias.copy_(source.bias)


def _swap(module: nn.Module, te: Any, to_te: bool, linear: bool, ln: bool) -> nn.Module | None:
    """Return the replacement of one layer, or None when it is not converted."""
    if to_te and linear and isinstance(module, nn.Linear):
        if any(size % 16 for size in module.weight.shape):
            return None  # fp8 GEMMs need both dimensions divisible by 16
        bias = module.bias is not None
        new: nn.Module = te.Linear(
            module.in_features, module.out_features, bias=bias, params_dtype=module.weight.dtype
        )
    elif to_te and ln and isinstance(module, nn.LayerNorm):
        new = te.LayerNorm(
            module.normalized_shape[0], eps=module.eps, params_dtype=module.weight.dtype
        )
    elif not to_te and linear and isinstance(module, te.Linear):
        bias = module.bias is not None and module.bias.numel() > 0
        new = nn.Linear(
            module.in_features, module.out_features, bias=bias, dtype=module.weight.dtype
        )
    elif not to_te and ln and isinstance(module, te.LayerNorm):
        new = nn.LayerNorm(module.weight.shape[0], eps=module.eps, dtype=module.weight.dtype)
    else:
        return None
    _copy_params(module, new)
    return new


def convert_model(
    model: nn.Module,
    to_transformer_engine: bool = True,
    _convert_linear: bool = True,
    _convert_ln: bool = True,
) -> None:
    """Replace `nn.Linear`/`nn.LayerNorm` by TransformerEngine layers (or back), in place.

    New layers get copies of the weights, so an optimizer built before must be retargeted.
    Linear layers whose sizes are not multiples of 16 are left as they are.

    Raises:
        ImportError: TransformerEngine is not installed.
    """
    te = _te()
    for name, child in model.named_children():
        new = _swap(child, te, to_transformer_engine, _convert_linear, _convert_ln)
        if new is not None:
            setattr(model, name, new)
        else:
            convert_model(child, to_transformer_engine, _convert_linear, _convert_ln)


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """Return whether ``model`` holds TransformerEngine Linear, LayerNorm or TransformerLayer.

    Raises:
        ImportError: TransformerEngine is not installed.
    """
    te = _te()
    kinds = (te.LayerNorm, te.Linear, te.TransformerLayer)
    return any(isinstance(module, kinds) for module in model.modules())


def contextual_fp8_autocast(
    model_forward: Callable[..., Any], fp8_recipe: Any, use_during_eval: bool = False
) -> Callable[..., Any]:
    """Wrap ``model_forward`` so it runs under `te.fp8_autocast` (in eval only if asked).

    The returned function takes the module as its first argument (bind it to the model);
    ``__wrapped__`` is the original forward.
    """
    te = _te()

    @wraps(model_forward)
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        enabled = use_during_eval or self.training
        with te.fp8_autocast(enabled=enabled, fp8_recipe=fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward
    return forward


def build_te_recipe(fp8_recipe_handler: Any) -> tuple[Any, bool]:
    """Build TransformerEngine's recipe from a `TERecipeKwargs` (or None: TE's defaults).

    Returns:
        ``(recipe, use_autocast_during_eval)``.
    """
    _te()
    # optional: transformer_engine
    from transformer_engine.common import recipe as te_recipe

    kwargs = fp8_recipe_handler.to_kwargs() if fp8_recipe_handler is not None else {}
    kwargs.pop("backend", None)
    kwargs.pop("opt_level", None)
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    use_during_eval = bool(kwargs.pop("use_autocast_during_eval", False))
    if kwargs.pop("use_mxfp8_block_scaling", False):
        fmt = kwargs.get("fp8_format", te_recipe.Format.E4M3)
        return te_recipe.MXFP8BlockScaling(fp8_format=fmt), use_during_eval
    return te_recipe.DelayedScaling(**kwargs), use_during_eval


def apply_fp8_autowrap(model: nn.Module, fp8_recipe_handler: Any) -> nn.Module:
    """Make ``model.forward`` run under `te.fp8_autocast` with the handler's recipe.

    Raises:
        ImportError: TransformerEngine is not installed.
    """
    recipe, use_during_eval = build_te_recipe(fp8_recipe_handler)
    new_forward = contextual_fp8_autocast(model.forward, recipe, use_during_eval)
    if hasattr(model.forward, "__func__"):
        model.forward = MethodType(new_forward, model)
    else:
        model.forward = partial(new_forward, model)
    return model
