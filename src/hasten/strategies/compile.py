"""Compile a model with `torch.compile` as a `TorchDynamoPlugin` asks, whole or by regions.

Regional compilation compiles each repeated block (children of a `ModuleList`/`Sequential`
that all share one class) in place with `nn.Module.compile`. Dynamo caches compiled code per
code object and treats parameters as inputs, so the second and later blocks of a class reuse
the first one's graph: cold-start cost is one block, not the whole depth of the model. Compiling
in place keeps parameter names (and so checkpoints) unchanged.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from hasten.strategies.unwrap import is_compiled_module

__all__ = [
    "CompileSettings",
    "compile_model",
    "compile_regions",
    "compile_regions_deepspeed",
    "compile_regions_fsdp2",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_repeated_blocks",
    "repeated_blocks",
]


class CompileSettings(Protocol):
    """What `compile_model` reads from `TorchDynamoPlugin`."""

    backend: Any
    use_regional_compilation: bool

    def to_kwargs(self) -> dict[str, Any]: ...


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """Return the repeated blocks inside ``module`` (outermost first), for regional compilation."""
    found: list[nn.Module] = []

    def visit(mod: nn.Module) -> None:
        children = list(mod.children())
        if (
            isinstance(mod, (nn.ModuleList, nn.Sequential))
            and len(children) > 1
            and len({type(c) for c in children}) == 1
        ):
            found.extend(children)
            return
        for child in children:
            visit(child)

    visit(module)
    return found


def is_repeated_blocks(module: nn.Module) -> bool:
    """Return whether `module` is a non-empty `ModuleList` whose children all share one class.

    Accelerate's test for "regional compilation applies here"; `repeated_blocks` also accepts
    `Sequential` containers when it picks the blocks to compile.
    """
    return (
        isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(isinstance(child, type(module[0])) for child in module)
    )


def has_repeated_blocks(module: nn.Module) -> bool:
    """Return whether `module` or any submodule is a repeated block (see `is_repeated_blocks`)."""
    return any(is_repeated_blocks(sub) for sub in module.modules())


def has_compiled_regions(module: nn.Module) -> bool:
    """Return whether a submodule of `module` was compiled.

    Compiled means an `OptimizedModule`, or a module whose `.compile()` was called.
    """
    return any(
        is_compiled_module(sub) or getattr(sub, "_compiled_call_impl", None) is not None
        for sub in module.modules()
    )


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile each repeated block of ``module`` in place; compile the whole if none repeat.

    Args:
        module: the model.
        **compile_kwargs: passed to `torch.compile` (backend, mode, fullgraph, dynamic, options).

    Returns:
        ``module`` itself with its blocks compiled, or ``torch.compile(module)`` without blocks.
    """
    blocks = repeated_blocks(module)
    if not blocks:
        return torch.compile(module, **compile_kwargs)  # type: ignore[return-value]
    for block in blocks:
        block.compile(**compile_kwargs)
    return module


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> None:
    """Compile each repeated block of a DeepSpeed engine's module in place (or the whole module).

    Never wraps: DeepSpeed's hooks and partitioned parameters stay on the modules it knows,
    which a ``torch.compile`` wrapper would hide.
    """
    blocks = repeated_blocks(module) or [module]
    for block in blocks:
        block.compile(**compile_kwargs)


def _compile_kwargs(plugin: CompileSettings) -> dict[str, Any]:
    kwargs = dict(plugin.to_kwargs())
    kwargs.pop("use_regional_compilation", None)
    kwargs.pop("disable", None)
    backend = kwargs.get("backend", plugin.backend)
    kwargs["backend"] = str(getattr(backend, "value", backend)).lower()
    return kwargs


def compile_model(model: nn.Module, plugin: CompileSettings | None) -> nn.Module:
    """Compile ``model`` as ``plugin`` asks; a no-op when no backend is set or already compiled.

    Args:
        model: the (possibly DDP-wrapped) model.
        plugin: the user's `TorchDynamoPlugin`, or None.

    Returns:
        The compiled model, or ``model`` unchanged.
    """
    if plugin is None or str(getattr(plugin.backend, "value", plugin.backend)).upper() == "NO":
        return model
    if getattr(plugin, "disable", False) or is_compiled_module(model):
        return model
    kwargs = _compile_kwargs(plugin)
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return torch.compile(model, **kwargs)  # type: ignore[return-value]


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile ``module``'s repeated blocks in place (names unchanged), before ``fully_shard``."""
    return compile_regions(module, **compile_kwargs)
