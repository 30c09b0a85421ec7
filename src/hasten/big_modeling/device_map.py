"""Device maps: how much memory each device offers, planning a map, and checking a given one.

A device map sends module (or tensor) names to a device: an accelerator index (``0``), ``"cpu"``,
``"disk"``, ``"mps"`` or a ``torch.device``. Planning is pure arithmetic on sizes, so integer
accelerator keys work on machines that have no accelerator.
"""

from __future__ import annotations

import logging
import numbers
import warnings
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from hasten.big_modeling.planner import DeviceKey, Plan, Planner
from hasten.big_modeling.sizes import ModuleTree, convert_file_size_to_int

__all__ = [
    "DEVICE_MAP_STRATEGIES",
    "check_device_map",
    "device_for",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "resolve_device_map",
    "validate_device",
]

logger = logging.getLogger(__name__)

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_NAMED_KEYS = ("mps", "cpu", "disk")


def _free_memory() -> dict[DeviceKey, int]:
    """Free memory of every visible accelerator, then of the host."""
    import psutil

    found: dict[DeviceKey, int] = {}
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    if accelerator is not None and accelerator.type != "mps":
        for index in range(torch.accelerator.device_count()):
            try:
                found[index] = int(torch.accelerator.get_memory_info(index)[0])
            except RuntimeError as err:  # a device can be visible but unusable (busy, lost)
                logger.info("device %s is unavailable (%s); skipping it", index, err)
    host = int(psutil.virtual_memory().available)
    found["mps" if accelerator is not None and accelerator.type == "mps" else "cpu"] = host
    return found


def get_max_memory(
    max_memory: dict[int | str, int | str] | None = None,
) -> dict[int | str, int]:
    """Return the bytes each device may use: the real free memory, or ``max_memory`` parsed.

    As in Accelerate, string sizes (``"10GiB"``, ``"500MB"``) are converted *in the dict
    given* (transformers reads the converted values back from it) and numbers pass through
    unchanged, floats included (transformers hands back ``0.9 * free`` for the CPU). The result
    lists accelerators (integer keys, sorted) first, then ``"mps"``, ``"cpu"``, ``"disk"``.

    Raises:
        TypeError: ``max_memory`` is not a mapping.
        ValueError: for an unknown device key or an unreadable size string.
    """
    if max_memory is None:
        return _free_memory()
    if not isinstance(max_memory, Mapping):
        raise TypeError(
            f"max_memory must be a dict of device -> size, got {type(max_memory).__name__} "
            f"{max_memory!r}; for example {{0: '10GiB', 'cpu': '30GiB'}}."
        )
    parsed: dict[Any, Any] = dict(max_memory)
    for key, value in parsed.items():
        if not (isinstance(key, int) or key in _NAMED_KEYS):
            raise ValueError(
                f"max_memory has an unknown device {key!r}: allowed keys are accelerator "
                "indices (0, 1, ...), 'mps', 'cpu' and 'disk'."
            )
        if isinstance(key, int) and key < 0:
            logger.warning("max_memory names device %s, which is not an accelerator index.", key)
        if isinstance(value, str):
            parsed[key] = convert_file_size_to_int(value)
            if isinstance(max_memory, MutableMapping):
                max_memory[key] = parsed[key]
    ordered: list[int | str] = sorted(k for k in parsed if isinstance(k, int))
    ordered += [k for k in _NAMED_KEYS if k in parsed]
    return {k: parsed[k] for k in ordered}


def _checked_budget(budget: Mapping[Any, Any]) -> None:
    """Refuse a size that is not a number before planning with it.

    Raises:
        TypeError: naming the device and the value.
    """
    for key, value in budget.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"max_memory[{key!r}] is {value!r}; a size is a number of bytes or a string "
                "with a unit such as '10GiB' or '500MB'."
            )


def _no_split(names: list[str] | str | None) -> list[str]:
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def infer_auto_device_map(
    model: nn.Module,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, int | str]:
    """Plan a device map: accelerators first, then cpu, then disk.

    On the first accelerator (and on cpu when disk is used) room is kept for the largest layer
    still to place, so any offloaded layer can be brought back there to run. Tied parameters
    land on one device and no module of a ``no_split_module_classes`` class is split.

    Args:
        model: the model (usually built under `init_empty_weights`).
        max_memory: device -> bytes or size string; defaults to the free memory of each device.
        no_split_module_classes: class names never split across devices (residual blocks).
        dtype: the dtype weights will be loaded in (floating tensors are counted at it).
        special_dtypes: per-tensor dtype overrides.
        verbose: print each decision.
        clean_result: merge submodules that share a device under their parent's name.
        offload_buffers: whether buffers of offloaded layers are offloaded too.
        fallback_allocation: when a device would stay empty, look for any later module that fits.

    Returns:
        Module (or tensor) name -> device.
    """
    budget = get_max_memory(max_memory)
    _checked_budget(budget)
    tree = ModuleTree(
        model,
        dtype=dtype,
        special_dtypes=special_dtypes,
        no_split_module_classes=_no_split(no_split_module_classes),
    )
    if not tree.tied and getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        logger.warning(
            "The model's config ties word embeddings but no weights are tied: call "
            "model.tie_weights() before infer_auto_device_map."
        )
    planner = Planner(
        tree,
        budget,
        verbose=verbose,
        offload_buffers=offload_buffers,
        fallback_allocation=fallback_allocation,
    )
    plan = planner.run()
    _warn_no_room_to_run(planner, plan, budget)
    _report(plan, budget)
    if clean_result:
        return _clean(planner, plan)
    return {planner.name(item): device for item, device in plan.entries}


def _warn_no_room_to_run(planner: Planner, plan: Plan, budget: Mapping[DeviceKey, int]) -> None:
    """Offloaded layers run on the main device: warn when its budget is below the largest layer.

    A warning, not an error, as in Accelerate: ``max_memory`` caps what is stored there, and the
    device itself may still have room for one layer at a time.
    """
    accelerators = [d for d in planner.devices if d not in ("cpu", "disk")]
    main = accelerators[0] if accelerators else "cpu"
    offloaded = ("disk",) if main in ("cpu", "mps") else ("cpu", "disk")
    if not any(device in offloaded for _, device in plan.entries):
        return
    tree = planner.tree
    largest = max(planner.layers, key=lambda i: tree.size[i], default=None)
    if largest is None or budget.get(main, 0) >= tree.size[largest]:
        return
    need = tree.size[largest]
    logger.warning(
        f"max_memory gives {main!r} {budget.get(main, 0)} bytes, which cannot hold even the "
        f"largest layer ({tree.name_of(largest)!r}, {need} bytes); offloaded layers are "
        f"brought there to run, so running this map may run out of memory. Give {main!r} at "
        f"least {need} bytes (max_memory[{main!r}] >= {_readable(need)!r})."
    )


def _readable(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}B" if unit == "B" else f"{size:.2f}{unit}"
        size /= 1024
    return f"{size:.2f}GiB"


def _report(plan: Plan, budget: Mapping[DeviceKey, int]) -> None:
    if plan.offloaded_buffers > 0:
        accelerators = [d for d in budget if d not in ("cpu", "disk", "mps")]
        fits = any(budget[d] >= plan.offloaded_buffers + plan.used.get(d, 0) for d in accelerators)
        if accelerators and not fits:
            warnings.warn(
                f"The offloaded layers keep {plan.offloaded_buffers} bytes of buffers, which fit "
                "on no accelerator next to its weights; pass offload_buffers=True if you run "
                "out of memory.",
                stacklevel=3,
            )
    if plan.too_small:
        lines = ", ".join(f"{d}: at least {m} bytes" for d, m in plan.too_small.items())
        logger.info(
            "Based on the current allocation process, no modules could be assigned to the "
            "following devices due to insufficient memory: %s. (hasten: give them that much in "
            "max_memory, or pass fallback_allocation=True to place a smaller module there.)",
            lines,
        )


def _clean(planner: Planner, plan: Plan) -> dict[str, int | str]:
    """Merge entries under the highest module whose whole subtree went to one device."""
    tree = planner.tree
    mixed = object()
    count: dict[int, int] = {}
    device_of: dict[int, Any] = {}
    touched: dict[int, list[int]] = {}
    own: dict[int, list[tuple[Any, DeviceKey]]] = {}
    for item, device in plan.entries:
        node = item if type(item) is int else item[0]  # type: ignore[index]
        own.setdefault(node, []).append((item, device))
        child = -1
        while node >= 0:
            if node not in count:
                count[node] = 0
                device_of[node] = device
                if child >= 0:
                    touched.setdefault(node, []).append(child)
            elif child >= 0 and count[child] == 1:
                touched.setdefault(node, []).append(child)
            count[node] += 1
            if device_of[node] != device:
                device_of[node] = mixed
            child, node = node, tree.parent[node]
    result: dict[str, int | str] = {}
    stack = [0]
    while stack:
        node = stack.pop()
        entries = own.get(node, [])
        single = device_of[node] is not mixed
        if single and (count[node] > 1 or entries == [(node, device_of[node])]):
            result[tree.name_of(node)] = device_of[node]
            continue
        for item, device in entries:
            if item != node:
                result[planner.name(item)] = device
        stack.extend(sorted(touched.get(node, ()), reverse=True))
    return result


def get_balanced_memory(
    model: nn.Module,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.device] | None = None,
    low_zero: bool = False,
) -> dict[int | str, int]:
    """Lower each accelerator's budget so `infer_auto_device_map` spreads the model evenly.

    Args:
        low_zero: keep accelerator 0 as empty as possible (it runs `generate` and the like).
    """
    user_given = max_memory is not None
    budget = get_max_memory(max_memory)
    _checked_budget(budget)
    accelerators = sorted(k for k, v in budget.items() if isinstance(k, int) and v > 0)
    if not accelerators:
        return budget
    if len(accelerators) == 1:
        low_zero = False
        if not user_given:
            budget[accelerators[0]] = int(budget[accelerators[0]] * 0.9)
    tree = ModuleTree(model, dtype=dtype, special_dtypes=special_dtypes)
    total = tree.size[0]
    per_device = total // (len(accelerators) - 1 if low_zero else len(accelerators))
    no_split = set(_no_split(no_split_module_classes))
    first_no_split: dict[str, int | float] = {}
    for i, module in enumerate(tree.modules):
        name = type(module).__name__
        if name in no_split:
            first_no_split.setdefault(name, tree.size[i])
    # Accelerate's margin: the mean size of the lowest modules that hold weights
    empty = [not tree.children[i] and not tree.tensors(i) for i in range(len(tree.modules))]
    lowest = [
        i
        for i in range(1, len(tree.modules))
        if not empty[i] and all(empty[c] for c in tree.children[i])
    ]
    mean_leaf = int(sum(tree.size[i] for i in lowest) / max(len(lowest), 1))
    margin = int(1.25 * max(max(first_no_split.values(), default=0), mean_leaf))
    per_device += margin
    for index in accelerators[:-1]:
        cap = budget[0] if low_zero and index == 0 else per_device
        budget[index] = int(min(cap, budget[index]))
    if low_zero:
        rest = sum(budget[i] for i in accelerators[1:])
        budget[accelerators[0]] = int(min(max(0, total - rest), budget[accelerators[0]]))
    return budget


def validate_device(device: Any, where: str) -> int | str | torch.device:
    """Check one device-map value; return it unchanged.

    Raises:
        ValueError: for anything that is not an index, 'cpu', 'disk', 'meta', 'mps' or a device.
    """
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return device
    if isinstance(device, str):
        if device == "disk":
            return device
        try:
            torch.device(device)
        except RuntimeError:
            pass
        else:
            return device
    raise ValueError(
        f"device_map[{where!r}] = {device!r} is not a device: use an accelerator index (0, 1, ...), "
        "'cpu', 'disk', 'mps', a device string like 'cuda:1', or a torch.device."
    )


def check_device_map(model: nn.Module, device_map: dict[str, int | str | torch.device]) -> None:
    """Check that ``device_map`` names real modules, valid devices, and covers every tensor once.

    A name that is no module or tensor of the model is warned about (as Accelerate) and ignored.

    Raises:
        TypeError: if the map is not a dict.
        ValueError: for an unknown device, a name listed inside another listed name, or model
            tensors the map does not place (all named).
    """
    if not isinstance(device_map, Mapping):
        raise TypeError(f"device_map must be a dict of name -> device, got {device_map!r}")
    for key, device in device_map.items():
        validate_device(device, key)
    if len(device_map) == 1 and "" in device_map:
        return  # the whole model on one device covers every tensor
    keys = sorted(device_map)
    if "" in device_map and len(keys) > 1:
        raise ValueError(
            f"device_map places the whole model ('') and also {keys[1:]!r}: keep either '' alone "
            "or per-module entries."
        )
    for a, b in zip(keys, keys[1:]):
        if b.startswith(a + "."):
            raise ValueError(
                f"device_map lists {b!r} inside {a!r}, so its tensors would be placed twice: "
                "keep only one of them."
            )
    modules = dict(model.named_modules())
    tensors = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    tensors += [n for n, _ in model.named_buffers()]
    known = set(modules) | set(tensors)
    unknown = [k for k in device_map if k not in known]
    if unknown:
        # A warning, as Accelerate's: transformers passes maps with names the model may lack.
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model: {unknown}. "
            f"(hasten: they are not modules or tensors of {type(model).__name__} and place "
            "nothing; fix the names, see model.named_modules().)",
            UserWarning,
            stacklevel=2,
        )
    missing = [t for t in tensors if device_for(t, device_map) is None]
    if missing:
        raise ValueError(
            f"device_map gives no device for these tensors: {', '.join(missing)}. Add entries for "
            "them (or their modules), or use device_map='auto'."
        )


def device_for(name: str, device_map: Mapping[str, Any]) -> Any:
    """Return the device of the longest device-map key that is ``name`` or a parent of it."""
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            return None
        probe = probe.rpartition(".")[0]


def resolve_device_map(
    model: nn.Module,
    device_map: str | dict[str, Any] | None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_buffers: bool = False,
) -> dict[str, Any] | None:
    """Turn ``"auto" | "balanced" | "balanced_low_0" | "sequential"`` into a planned map.

    Raises:
        ValueError: for any other string.
    """
    if device_map is None or isinstance(device_map, Mapping):
        return device_map
    if not isinstance(device_map, str) or device_map not in DEVICE_MAP_STRATEGIES:
        raise ValueError(
            f"device_map={device_map!r} is not supported: pass a dict of name -> device or one "
            f"of {DEVICE_MAP_STRATEGIES!r}."
        )
    if device_map != "sequential":
        max_memory = get_balanced_memory(  # type: ignore[assignment]
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            low_zero=device_map == "balanced_low_0",
        )
    return infer_auto_device_map(
        model,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
        dtype=dtype,
        offload_buffers=offload_buffers,
    )
