"""Compile a model with `torch.compile` as a `TorchDynamoPlugin` asks, whole or by regions.

Regional compilation compiles each repeated block (children of a `ModuleList`/`Sequential`
that all share one class). Dynamo caches compiled code per code object and treats parameters as
inputs, so the second and later blocks of a class reuse the first one's graph: cold-start cost is
one block, not the whole depth of the model.

Two forms: the public `compile_regions` returns a shallow copy whose blocks are `torch.compile`
wrappers and leaves the original untouched (Accelerate's documented behaviour);
hasten's own prepare paths use `compile_regions_in_place`, which calls `nn.Module.compile` on
the blocks so that parameter names (and so checkpoints and sharding) stay unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
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
    "compile_regions_in_place",
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


def _holds_repeated_blocks(module: nn.Module) -> bool:
    """Whether `module` is a `ModuleList`/`Sequential` of two or more children of one class.

    Children that are themselves `ModuleList`/`ModuleDict` (containers without a forward) are
    not blocks: the search goes on inside them.
    """
    children = list(module.children())
    return (
        isinstance(module, (nn.ModuleList, nn.Sequential))
        and len(children) > 1
        and len({type(c) for c in children}) == 1
        and not isinstance(children[0], (nn.ModuleList, nn.ModuleDict))
    )


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """Return the repeated blocks inside ``module`` (outermost first), for regional compilation."""
    found: list[nn.Module] = []

    def visit(mod: nn.Module) -> None:
        if _holds_repeated_blocks(mod):
            found.extend(mod.children())
            return
        for child in mod.children():
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


# The bookkeeping containers every `nn.Module` keeps in its ``__dict__`` (parameters, buffers,
# submodules, hooks): a regional copy gets its own containers holding the same objects.
_MODULE_CONTAINERS = tuple(
    name for name, value in nn.Module().__dict__.items() if isinstance(value, (dict, set))
)


def _rebind_methods(copy: nn.Module, original: nn.Module) -> None:
    """Point methods bound to ``original`` in its instance ``__dict__`` at ``copy`` instead."""
    for name, value in original.__dict__.items():
        if isinstance(value, MethodType) and value.__self__ is original:
            copy.__dict__[name] = MethodType(value.__func__, copy)


def _regional_copy(
    module: nn.Module, wrap: Callable[[nn.Module], nn.Module], seen: dict[int, nn.Module]
) -> nn.Module:
    """Copy ``module``'s structure with each repeated block and each other leaf passed to ``wrap``.

    Copies share parameters, buffers and the wrapped modules with the original; every copied
    module keeps its original under ``_orig_mod`` in its ``__dict__`` (not a registered child, so
    state-dict names do not change) and has its instance-bound methods rebound to itself.
    A module reached twice (shared) maps to one copy.
    """
    if id(module) in seen:
        return seen[id(module)]
    children = dict(module._modules)
    if not children:
        # A leaf; an empty `ModuleList`/`ModuleDict` has no forward to compile and is shared.
        empty_container = isinstance(module, (nn.ModuleList, nn.ModuleDict))
        result = module if empty_container else wrap(module)
        seen[id(module)] = result
        return result
    copy = type(module).__new__(type(module))
    seen[id(module)] = copy
    copy.__dict__.update(module.__dict__)
    for name in _MODULE_CONTAINERS:
        if name in module.__dict__:
            copy.__dict__[name] = type(module.__dict__[name])(module.__dict__[name])
    blocks = _holds_repeated_blocks(module)
    for name, child in children.items():
        if child is None:
            continue
        if blocks:
            if id(child) not in seen:
                seen[id(child)] = wrap(child)
            copy._modules[name] = seen[id(child)]
        else:
            copy._modules[name] = _regional_copy(child, wrap, seen)
    copy.__dict__["_orig_mod"] = module
    _rebind_methods(copy, module)
    return copy


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Return a regionally compiled copy of ``module``; ``torch.compile(module)`` if no block repeats.

    The copy has ``module``'s class and shares its parameters; each repeated block (and each
    other leaf module) is a ``torch.compile`` wrapper (`OptimizedModule`) around the original's
    submodule, ``module`` itself stays uncompiled and is kept as the copy's ``_orig_mod``, and
    methods bound to ``module`` in its instance ``__dict__`` are rebound to the copy. State-dict
    names of the copy carry ``_orig_mod.`` inside blocks; `unwrap_model`, `save_model` and
    `get_state_dict` give the original's names.

    Args:
        module: the model.
        **compile_kwargs: passed to `torch.compile` (backend, mode, fullgraph, dynamic, options).

    Returns:
        The compiled copy, or ``torch.compile(module)`` for a model without repeated blocks.
    """
    if not repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)  # type: ignore[return-value]

    def wrap(sub: nn.Module) -> nn.Module:
        return torch.compile(sub, **compile_kwargs)  # type: ignore[return-value]

    return _regional_copy(module, wrap, {})


def compile_regions_in_place(
    module: nn.Module, *, wrap_whole: bool = True, **compile_kwargs: Any
) -> nn.Module:
    """Compile each repeated block of ``module`` in place with `nn.Module.compile`.

    hasten's prepare paths use this form: no wrapper is inserted, so parameter names (and
    checkpoints, sharding plans, engine hooks) stay those of the model as written.

    Args:
        module: the model.
        wrap_whole: without repeated blocks, return ``torch.compile(module)`` (True) or compile
            ``module`` itself in place (False, for engines that must keep seeing the module).
        **compile_kwargs: passed to `torch.compile` (backend, mode, fullgraph, dynamic, options).

    Returns:
        ``module`` (compiled in place), or ``torch.compile(module)`` when nothing repeats and
        ``wrap_whole``.
    """
    blocks = repeated_blocks(module)
    if not blocks and wrap_whole:
        return torch.compile(module, **compile_kwargs)  # type: ignore[return-value]
    for block in blocks or [module]:
        block.compile(**compile_kwargs)
    return module


def compile_regions_deepspeed(module: nn.Module, **compile_kwargs: Any) -> None:
    """Compile each repeated block of a DeepSpeed engine's module in place (or the whole module).

    Never wraps: DeepSpeed's hooks and partitioned parameters stay on the modules it knows,
    which a ``torch.compile`` wrapper would hide.
    """
    compile_regions_in_place(module, wrap_whole=False, **compile_kwargs)


def _compile_kwargs(plugin: CompileSettings) -> dict[str, Any]:
    kwargs = dict(plugin.to_kwargs())
    kwargs.pop("use_regional_compilation", None)
    kwargs.pop("disable", None)
    backend = kwargs.get("backend", plugin.backend)
    kwargs["backend"] = str(getattr(backend, "value", backend)).lower()
    return kwargs


def compile_model(model: nn.Module, plugin: CompileSettings | None) -> nn.Module:
    """Compile ``model`` as ``plugin`` asks; a no-op when no backend is set or already compiled.

    Already compiled: a `torch.compile` wrapper, or a model with compiled regions (in place or
    a `compile_regions` copy), which a second compilation would nest.

    Args:
        model: the (possibly DDP-wrapped) model.
        plugin: the user's `TorchDynamoPlugin`, or None.

    Returns:
        The compiled model, or ``model`` unchanged.
    """
    if plugin is None or str(getattr(plugin.backend, "value", plugin.backend)).upper() == "NO":
        return model
    if (
        getattr(plugin, "disable", False)
        or is_compiled_module(model)
        or has_compiled_regions(model)
    ):
        return model
    kwargs = _compile_kwargs(plugin)
    if plugin.use_regional_compilation:
        return compile_regions_in_place(model, **kwargs)
    return torch.compile(model, **kwargs)  # type: ignore[return-value]


def compile_regions_fsdp2(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile ``module``'s repeated blocks in place (names unchanged), before ``fully_shard``."""
    return compile_regions_in_place(module, **compile_kwargs)
