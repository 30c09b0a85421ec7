"""How many bytes a model, each of its submodules and its largest layer take.

Everything here is arithmetic on shapes and dtypes, so it works on a model built on the meta
device. `ModuleTree` walks the module graph once and is shared with the device-map planner.
"""

from __future__ import annotations

import gc
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from hasten.config.enums import CustomDtype, enum_value
from hasten.core.units import convert_file_size_to_int

__all__ = [
    "ModuleTree",
    "calculate_maximum_sizes",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "get_max_layer_size",
    "resolve_dtype",
]

_BIT_SUFFIX = re.compile(r"[^\d](\d+)$")
_BYTE_SIZES: dict[Any, int | float] = {}


def dtype_byte_size(dtype: torch.dtype | CustomDtype) -> int | float:
    """Return the bytes one element of ``dtype`` takes (``1/8`` for bool, ``1/2`` for int4).

    Raises:
        ValueError: if the dtype's width cannot be determined.
    """
    cached = _BYTE_SIZES.get(dtype)
    if cached is not None:
        return cached
    size: int | float
    if dtype == torch.bool:
        size = 1 / 8
    elif dtype == CustomDtype.INT2:
        size = 1 / 4
    elif dtype == CustomDtype.INT4:
        size = 1 / 2
    elif dtype == CustomDtype.FP8 or "float8" in str(dtype):
        size = 1
    elif isinstance(dtype, torch.dtype):
        size = dtype.itemsize
    else:
        match = _BIT_SUFFIX.search(enum_value(dtype))
        if match is None:
            raise ValueError(f"dtype {dtype!r} is not a valid dtype: pass a torch.dtype")
        size = int(match.group(1)) // 8
    _BYTE_SIZES[dtype] = size
    return size


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Accept ``torch.float16``, ``"float16"`` or ``"torch.float16"``.

    Raises:
        ValueError: if the string names no torch dtype.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = enum_value(dtype).replace("torch.", "")
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(
            f"dtype {dtype!r} is not a torch dtype; use e.g. 'float16' or torch.bfloat16"
        )
    return found


def _byte_size(dtype: Any) -> int | float:
    if isinstance(dtype, CustomDtype):
        return dtype_byte_size(dtype)
    return dtype_byte_size(resolve_dtype(dtype))


class _Sizer:
    """Bytes of one tensor after the optional conversion to ``dtype`` (integers are never cast)."""

    def __init__(
        self, dtype: str | torch.dtype | CustomDtype | None, special: Mapping[str, Any] | None
    ) -> None:
        self.target = _byte_size(dtype) if dtype is not None else None
        self.special = {k: _byte_size(v) for k, v in special.items()} if special else None
        self.cache: dict[torch.dtype, int | float] = {}

    def per_element(self, dtype: torch.dtype) -> int | float:
        size = self.cache.get(dtype)
        if size is None:
            size = dtype_byte_size(dtype)
            if self.target is not None and (dtype.is_floating_point or dtype.is_complex):
                size = min(size, self.target)
            self.cache[dtype] = size
        return size

    def __call__(self, name: str, tensor: torch.Tensor) -> int | float:
        if self.special is not None and name in self.special:
            return tensor.numel() * self.special[name]
        return tensor.numel() * self.per_element(tensor.dtype)


class ModuleTree:
    """The module graph of a model in pre-order with subtree sizes, from one walk.

    Node ``i`` is ``modules[i]``; its subtree is nodes ``i .. end[i] - 1``. A module of a
    no-split class is one node whose size covers its whole subtree (its insides are never
    placed apart, so they are summed without being recorded). A tensor reachable under two
    names (tied) counts once, under its first name in module order, as ``named_parameters``
    does; ``tied`` lists the groups of names.
    """

    def __init__(
        self,
        model: nn.Module,
        dtype: str | torch.dtype | None = None,
        special_dtypes: Mapping[str, Any] | None = None,
        no_split_module_classes: Iterable[str] = (),
    ) -> None:
        self.modules: list[nn.Module] = []
        self.parent: list[int] = []
        self.local: list[str] = []
        self.size: list[int | float] = []
        self.buffer_size: list[int | float] = []
        self.no_split: list[bool] = []
        self.end: list[int] = []
        self.layers: list[int] = []
        self.tensor_size: dict[str, int | float] = {}
        self.tied: list[list[str]] = []
        self._aliases: set[str] = set()
        self._seen: set[int] = set()
        self._has_ties = False
        self._no_split_names = frozenset(no_split_module_classes)
        self._sizer = _Sizer(dtype, special_dtypes)
        self._names: list[str] | None = None
        self._index: dict[str, int] | None = None
        self._children: list[list[int]] | None = None
        self._inner_names: dict[int, dict[int, str]] = {}
        enabled = gc.isenabled()
        gc.disable()  # the walk allocates many small objects; collections would rescan the model
        try:
            self._walk(model)
        finally:
            if enabled:
                gc.enable()
        if self._has_ties:
            self._resolve_ties()

    def _count(
        self, module: nn.Module, outer: int, params: bool = True
    ) -> tuple[int | float, int | float]:
        """Bytes of a module's own tensors (all, and buffers only) not counted before."""
        total: int | float = 0
        buffers: int | float = 0
        seen, sizer = self._seen, self._sizer
        special = sizer.special is not None
        cache = sizer.cache
        groups = ((module._parameters, False), (module._buffers, True)) if params else ()
        for group, is_buffer in groups or ((module._buffers, True),):
            if not group:
                continue
            for local, tensor in group.items():
                if tensor is None:
                    continue
                if id(tensor) in seen:
                    self._has_ties = True
                    continue
                seen.add(id(tensor))
                if special:
                    size = sizer(_join(self._module_name(module, outer), local), tensor)
                else:
                    b = cache.get(tensor.dtype)
                    size = tensor.numel() * (
                        b if b is not None else sizer.per_element(tensor.dtype)
                    )
                total += size
                if is_buffer:
                    buffers += size
        return total, buffers

    def _walk(self, model: nn.Module) -> None:
        """Record every module in pre-order with its subtree sizes, in one recursive pass.

        This is the hot loop of planning (one call per module), so it binds names to locals.
        """
        modules, parents, locals_ = self.modules, self.parent, self.local
        sizes, buffer_sizes, ends, no_split = self.size, self.buffer_size, self.end, self.no_split
        layers, no_split_names, seen_modules = self.layers, self._no_split_names, {id(model)}
        count, sum_inside, seen, seen_add, cache_get, per_element, special = (
            self._count,
            self._sum_inside,
            self._seen,
            self._seen.add,
            self._sizer.cache.get,
            self._sizer.per_element,
            self._sizer.special is not None,
        )

        def visit(module: nn.Module, parent: int, local: str) -> tuple[int | float, int | float]:
            i = len(modules)
            modules.append(module)
            parents.append(parent)
            locals_.append(local)
            sizes.append(0)
            buffer_sizes.append(0)
            ends.append(0)
            if special:
                total, buffers = count(module, i)
            else:
                # inlined parameter count: this line runs once per tensor of the model
                total, buffers = 0, 0
                for tensor in module._parameters.values():
                    if tensor is None:
                        continue
                    if id(tensor) in seen:
                        self._has_ties = True
                        continue
                    seen_add(id(tensor))
                    b = cache_get(tensor.dtype)
                    total += tensor.numel() * (b if b is not None else per_element(tensor.dtype))
                if module._buffers:
                    total, buffers = total + (c := count(module, i, params=False))[0], c[1]
            kids = module._modules
            collapsed = bool(kids) and type(module).__name__ in no_split_names
            no_split.append(collapsed)
            if collapsed:
                inner_total, inner_buffers = sum_inside(module, i, seen_modules)
                total += inner_total
                buffers += inner_buffers
            elif kids:
                for name, child in kids.items():
                    if child is None:
                        continue
                    if id(child) in seen_modules:  # a shared module: its tensors have two names
                        self._has_ties = True
                        continue
                    seen_modules.add(id(child))
                    child_total, child_buffers = visit(child, i, name)
                    total += child_total
                    buffers += child_buffers
            if i and (collapsed or not kids):
                layers.append(i)
            sizes[i], buffer_sizes[i], ends[i] = total, buffers, len(modules)
            return total, buffers

        visit(model, -1, "")

    def _sum_inside(
        self, module: nn.Module, outer: int, seen_modules: set[int]
    ) -> tuple[int | float, int | float]:
        """Sizes of everything below a no-split module, in module order, without recording it.

        Only containers are checked against ``seen_modules`` (that stops cycles); a shared leaf
        met twice adds nothing, since its tensors are already counted, and marks a tie.
        """
        total: int | float = 0
        buffers: int | float = 0
        count, seen, seen_add = self._count, self._seen, self._seen.add
        cache_get, per_element = self._sizer.cache.get, self._sizer.per_element
        special = self._sizer.special is not None
        stack = list(module._modules.values())
        stack.reverse()
        pop, extend = stack.pop, stack.extend
        while stack:
            inner = pop()
            if inner is None:
                continue
            kids = inner._modules
            if kids:
                if id(inner) in seen_modules:
                    self._has_ties = True
                    continue
                seen_modules.add(id(inner))
            if special or inner._buffers:
                inner_total, inner_buffers = count(inner, outer)
                total += inner_total
                buffers += inner_buffers
            else:
                for tensor in inner._parameters.values():
                    if tensor is None:
                        continue
                    if id(tensor) in seen:
                        self._has_ties = True
                        continue
                    seen_add(id(tensor))
                    b = cache_get(tensor.dtype)
                    total += tensor.numel() * (b if b is not None else per_element(tensor.dtype))
            if kids:
                extend(reversed(kids.values()))
        return total, buffers

    def _module_name(self, module: nn.Module, outer: int) -> str:
        """Full name of a module being counted (only needed with special dtypes)."""
        if module is self.modules[outer]:
            return self.name_of(outer)
        inner = self._inner_names.get(outer)
        if inner is None:
            inner = {id(m): n for n, m in self.modules[outer].named_modules()}
            self._inner_names[outer] = inner
        return _join(self.name_of(outer), inner[id(module)])

    def _resolve_ties(self) -> None:
        """Group the names of tensors met twice (rare: one extra pass over the parameters)."""
        groups: dict[int, list[tuple[str, torch.Tensor]]] = {}
        for name, param in self.modules[0].named_parameters(remove_duplicate=False):
            groups.setdefault(id(param), []).append((name, param))
        for members in groups.values():
            if len(members) < 2:
                continue
            head, tensor = members[0]
            self.tensor_size[head] = self._sizer(head, tensor)
            for alias, _ in members[1:]:
                self.tensor_size[alias] = 0
                self._aliases.add(alias)
            self.tied.append(sorted({name for name, _ in members}))

    @property
    def children(self) -> list[list[int]]:
        """Children of every node (built on first use; the planner uses `kids` instead)."""
        if self._children is None:
            self._children = [[] for _ in self.modules]
            for i in range(1, len(self.parent)):
                self._children[self.parent[i]].append(i)
        return self._children

    def kids(self, i: int) -> list[int]:
        """Children of node ``i``, read off the pre-order ranges."""
        found: list[int] = []
        j, stop, end = i + 1, self.end[i], self.end
        while j < stop:
            found.append(j)
            j = end[j]
        return found

    @property
    def names(self) -> list[str]:
        """Full module names, computed once on first use."""
        if self._names is None:
            names: list[str] = []
            for parent, local in zip(self.parent, self.local):
                names.append(local if parent <= 0 else f"{names[parent]}.{local}")
            self._names = names
        return self._names

    def name_of(self, i: int) -> str:
        """Full name of node ``i`` (walks up the parents; cheap for the few names needed)."""
        if self._names is not None:
            return self._names[i]
        parts: list[str] = []
        while i > 0:
            parts.append(self.local[i])
            i = self.parent[i]
        return ".".join(reversed(parts))

    def node(self, name: str) -> int | None:
        """Return the node index of a recorded module name."""
        if self._index is None:
            self._index = {n: i for i, n in enumerate(self.names)}
        return self._index.get(name)

    def holder(self, tensor_name: str) -> int:
        """Return the deepest recorded module holding a tensor (its no-split layer if inside one)."""
        probe = tensor_name.rpartition(".")[0]
        while True:
            found = self.node(probe)
            if found is not None:
                return found
            probe = probe.rpartition(".")[0]

    def tensors(self, i: int) -> list[tuple[str, int | float, bool]]:
        """A node's own ``(local name, bytes, is_buffer)``, params first; aliases count 0."""
        module = self.modules[i]
        found: list[tuple[str, int | float, bool]] = []
        prefix = self.name_of(i)
        for group, is_buffer in ((module._parameters, False), (module._buffers, True)):
            for local, tensor in group.items():
                if tensor is None:
                    continue
                full = _join(prefix, local)
                size = 0 if full in self._aliases else self._sizer(full, tensor)
                found.append((local, size, is_buffer))
        return found

    def is_layer(self, i: int) -> bool:
        """A layer is a module that is never split: no children, or a no-split class."""
        return self.end[i] == i + 1 or self.no_split[i]

    def sizes_by_name(self, buffers_only: bool = False) -> defaultdict[str, int | float]:
        """Return Accelerate's ``module_sizes``: every module and tensor name to bytes."""
        sizes: defaultdict[str, int | float] = defaultdict(int)
        for i, name in enumerate(self.names):
            sizes[name] = self.buffer_size[i] if buffers_only else self.size[i]
            for local, size, is_buffer in self.tensors(i):
                if size and (is_buffer or not buffers_only):
                    sizes[_join(name, local)] = size
        return sizes


def _join(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def compute_module_sizes(
    model: nn.Module,
    dtype: str | torch.device | None = None,
    special_dtypes: dict[str, str | torch.device] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Compute the size in bytes of every submodule, parameter and buffer (``""`` is the model).

    Args:
        model: the model to measure (may be on the meta device).
        dtype: if given, floating tensors are counted as if cast to it (never upcast).
        special_dtypes: per-tensor dtype overrides, by full tensor name.
        buffers_only: count only buffers.
    """
    tree = ModuleTree(model, dtype=dtype, special_dtypes=special_dtypes)  # type: ignore[arg-type]
    return tree.sizes_by_name(buffers_only=buffers_only)  # type: ignore[return-value]


def get_max_layer_size(
    modules: list[tuple[str, Any]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """Return the largest layer size among ``modules`` and the names of the layers that reach it.

    A layer is a module without children or one whose class is in ``no_split_module_classes``;
    other modules are looked into. Tensors in ``modules`` are ignored.
    """
    no_split = set(no_split_module_classes or ())
    best: int = 0
    names: list[str] = []
    stack = [(n, m) for n, m in reversed(modules) if isinstance(m, nn.Module)]
    while stack:
        name, module = stack.pop()
        children = list(module.named_children())
        if children and type(module).__name__ not in no_split:
            stack.extend((f"{name}.{n}", m) for n, m in reversed(children))
            continue
        size = module_sizes[name]
        if size > best:
            best, names = size, [name]
        elif size == best:
            names.append(name)
    return best, names


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """Return the model's total size and ``(largest layer size, its names)``.

    The layer classes never split are read from ``model._no_split_modules`` (set by transformers).
    """
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    tree = ModuleTree(model, no_split_module_classes=no_split)
    sizes = tree.sizes_by_name()
    best: int | float = 0
    names: list[str] = []
    for i in tree.layers:
        size = tree.size[i]
        if size > best:
            best, names = size, [tree.names[i]]
        elif size == best:
            names.append(tree.names[i])
    return sizes[""], (best, names)  # type: ignore[return-value]


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: str | torch.device | None = None,
    special_dtypes: dict[str, str | torch.device] | None = None,
) -> int:
    """Return the bytes of all of `model`'s buffers (counted at `dtype` / `special_dtypes` if given)."""
    sizes = compute_module_sizes(
        model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True
    )
    return sizes.get("", 0)
