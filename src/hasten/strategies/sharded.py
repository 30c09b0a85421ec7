"""What FSDP2 and FSDP1 share: state dicts through ``torch.distributed.checkpoint.state_dict``.

torch's `get_model_state_dict` / `get_optimizer_state_dict` (and the ``set_*`` pair) understand
plain modules, FSDP1 and FSDP2 alike: full state dicts are gathered (to rank 0 with CPU offload),
sharded ones are this process's DTensor shards keyed by parameter name. Model and optimizer are
always set in separate calls (the combined ``set_state_dict`` with an empty optimizer dict on
non-zero ranks deadlocks on gloo).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from hasten.optimizer import unwrap_optimizer
from hasten.strategies.base import LayoutT, Strategy
from hasten.strategies.rebind import canonical_name

if TYPE_CHECKING:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.strategies.checkpoints import LayoutFactory

__all__ = [
    "ShardedStrategy",
    "by_name",
    "by_position",
    "gather_to_main",
    "keyed_by_name",
    "saves_shards",
    "state_dict_options",
    "tied_parameter_names",
]


def state_dict_options(*, full: bool, cpu_offload: bool, strict: bool = True) -> Any:
    """`StateDictOptions` for a full (gathered, broadcast on load) or sharded state dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if not full:
        return StateDictOptions(strict=strict)
    return StateDictOptions(
        full_state_dict=True,
        cpu_offload=cpu_offload,
        broadcast_from_rank0=True,
        strict=strict,
    )


def tied_parameter_names(module: nn.Module) -> list[list[str]]:
    """Groups of (canonical) names under which one Parameter object is registered in ``module``.

    Read from the user's module before an engine wraps it: the gathered full tensors of tied
    parameters no longer share memory, and FSDP1's flat parameters hide the tie altogether.
    Names are in ``named_parameters`` order, which is the state dict's order.
    """
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(canonical_name(name))
    return [names for names in groups.values() if len(names) > 1]


def gather_to_main(part: dict[str, Any]) -> dict[str, Any]:
    """Full CPU copies of ``part``'s entries on rank 0 (``{}`` elsewhere), one tensor at a time.

    What ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` gives for these
    entries (each DTensor all-gathered over its mesh, plain values as they are), but only for
    the entries asked for, so a caller can write and
    drop them before gathering the next part. Every process calls it with the same keys. One
    object under several names (a tied weight) is gathered once; the names get views of it.
    """
    from torch.distributed.tensor import DTensor

    main = dist.get_rank() == 0
    out: dict[str, Any] = {}
    done: dict[int, Any] = {}
    for name, value in part.items():
        if id(value) in done:
            if main:
                first = done[id(value)]
                out[name] = first.detach() if isinstance(first, torch.Tensor) else first
            continue
        key = id(value)
        if isinstance(value, DTensor):
            if value.device.type != value.device_mesh.device_type:  # CPU-offloaded shards
                value = value.to(value.device_mesh.device_type)
            value = value.full_tensor()
        if main:
            out[name] = done[key] = value.to("cpu") if isinstance(value, torch.Tensor) else value
        else:
            done[key] = None
    return out


def by_name(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    state_dict: dict[str, Any],
    held: list[str] | None = None,
) -> dict[str, Any]:
    """A torch-format optimizer state dict (parameters numbered) keyed by parameter name instead.

    Lets a checkpoint of an unsharded run (one process, DDP) load into a sharded optimizer.
    ``held``: the names of the parameters the optimizer was built on, in its order, where it
    now holds others (FSDP1's flat parameters); by default those of its parameters in ``module``.

    Raises:
        ValueError: the saved groups hold another number of parameters than the optimizer.
    """
    groups = state_dict.get("param_groups", [])
    saved = [i for group in groups for i in group.get("params", [])]
    if not saved or not all(isinstance(i, int) for i in saved):
        return state_dict
    names = {id(p): canonical_name(n) for n, p in module.named_parameters()}
    current: list[str | None] = list(held) if held is not None else []
    if held is None:
        current = [names.get(id(p)) for group in optimizer.param_groups for p in group["params"]]
    if len(current) != len(saved) or None in current:
        raise ValueError(
            f"The checkpoint's optimizer holds {len(saved)} parameters but this optimizer holds "
            f"{len(current)} of the model's; load a checkpoint of the same model and optimizer."
        )
    rename = dict(zip(saved, current))
    return {
        "state": {rename[k]: v for k, v in state_dict.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [rename[i] for i in group["params"]]} for group in groups
        ],
    }


def saves_shards(plugin: FullyShardedDataParallelPlugin | None) -> bool:
    """Whether save_state writes an FSDP plugin's models as shards (DCP): for a
    SHARDED_STATE_DICT (and without a plugin: tensor parallelism alone); otherwise they are
    gathered to the main process."""
    if plugin is None:
        return True
    name = getattr(plugin.state_dict_type, "name", str(plugin.state_dict_type))
    return name == "SHARDED_STATE_DICT"


def keyed_by_name(state_dict: Any) -> bool:
    """Whether an optimizer state dict names its parameters (sharding engines' full states)."""
    groups = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
    return any(isinstance(p, str) for group in groups for p in group.get("params", []))


def by_position(module: nn.Module, optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name in torch's format, numbered in the order
    of ``optimizer``'s parameters (torch's ``load_state_dict`` matches them by position only).

    The inverse of `by_name`: a full state a sharding engine saved (in its own parameter order,
    e.g. FSDP1's flat-parameter order) loads into an unsharded optimizer. A tensor shared by
    several parameters' states (FSDP1's one ``step`` per flat parameter) is copied for each.

    Raises:
        ValueError: the saved groups hold other parameters than the optimizer's groups.
    """
    names = {id(p): canonical_name(n) for n, p in module.named_parameters()}
    saved_groups = state_dict.get("param_groups", [])
    groups: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    matches = len(saved_groups) == len(optimizer.param_groups)
    for saved, group in zip(saved_groups, optimizer.param_groups):
        mine = [names.get(id(p), "") for p in group["params"]]
        matches = matches and "" not in mine and sorted(saved["params"]) == sorted(mine)
        if not matches:
            break
        start = len(index)
        index.update({name: start + i for i, name in enumerate(mine)})
        groups.append({**saved, "params": list(range(start, len(index)))})
    if not matches:
        count = sum(len(group.get("params", [])) for group in saved_groups)
        raise ValueError(
            f"The checkpoint's optimizer state names {count} parameters in {len(saved_groups)} "
            f"group(s), which are not this optimizer's {len(optimizer.param_groups)} group(s) of "
            "the model's parameters; load a checkpoint of the same model and optimizer (same "
            "parameter groups)."
        )
    seen: set[int] = set()
    state = {}
    for name, entries in state_dict.get("state", {}).items():
        # one tensor in several parameters' states (FSDP1 keeps one step per flat parameter)
        # becomes one each: torch's optimizers update their state in place
        state[index[name]] = {
            key: value.clone() if id(value) in seen else value for key, value in entries.items()
        }
        seen.update(id(value) for value in entries.values() if isinstance(value, torch.Tensor))
    return {"state": state, "param_groups": groups}


class ShardedStrategy(Strategy):
    """Base of the strategies whose parameters are split across processes.

    Full state dicts are gathered with torch's state-dict API (to the main process, in host
    memory, when `full_offload`), sharded ones are this process's DTensor shards by name.

    Args:
        device: this process's compute device.
        sharded_checkpoints: whether save_state writes shards (DCP) or gathers the state to the
            main process (see `saves_shards`).
    """

    syncs_gradients = True
    shards_parameters = True
    #: Whether full state dicts are gathered to the main process in host memory (FSDP1
    #: segfaults doing so on CPU; tensor parallelism alone gathers on every process).
    full_offload = True
    #: The FSDP plugin the strategy shards as (None: tensor parallelism alone).
    plugin: FullyShardedDataParallelPlugin | None = None

    def __init__(self, device: torch.device, sharded_checkpoints: bool) -> None:
        self.device = device
        self.sharded_checkpoints = sharded_checkpoints
        # Tied parameter names of each prepared model (keyed by what `_module` returns).
        self._ties: weakref.WeakKeyDictionary[nn.Module, list[list[str]]] = (
            weakref.WeakKeyDictionary()
        )

    def _record_ties(self, prepared: nn.Module, ties: list[list[str]]) -> None:
        """Remember ``ties`` (`tied_parameter_names` of the model before wrapping) for saving."""
        if ties:
            self._ties[self._module(prepared)] = ties

    def _module(self, model: nn.Module) -> nn.Module:
        return self.unwrap(model, keep_torch_compile=False)

    @override
    def checkpoint_layout(self, layouts: LayoutFactory[LayoutT]) -> LayoutT:
        """Shards through DCP (every process writes its own), or the state gathered to the main
        process and written as one copy (`saves_shards`)."""
        return layouts.sharded(self) if self.sharded_checkpoints else layouts.gathered(self)

    @override
    def model_state_dict(self, model: nn.Module, *, full: bool = True) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        options = state_dict_options(full=full, cpu_offload=self.full_offload)
        return get_model_state_dict(self._module(model), options=options)

    @override
    def full_state_dict_parts(
        self, model: nn.Module
    ) -> tuple[dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]]] | None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        module = self._module(model)
        options = state_dict_options(full=False, cpu_offload=False)
        held = get_model_state_dict(module, options=options)  # DTensors: their full shapes
        for group in self._ties.get(module, ()):  # one object per tie: saved once, like unsharded
            present = [name for name in group if name in held]
            for alias in present[1:]:
                held[alias] = held[present[0]]
        return dict(held), lambda part: gather_to_main({k: held[k] for k in part})

    @override
    def load_model_state_dict(
        self,
        model: nn.Module,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
        strict: bool = True,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        options = state_dict_options(full=full, cpu_offload=self.full_offload, strict=strict)
        set_model_state_dict(self._module(model), state_dict, options=options)

    @override
    def optimizer_state_dict(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool = True
    ) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        options = state_dict_options(full=full, cpu_offload=self.full_offload)
        return get_optimizer_state_dict(
            self._module(model), unwrap_optimizer(optimizer), options=options
        )

    @override
    def load_optimizer_state_dict(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        options = state_dict_options(full=full, cpu_offload=self.full_offload)
        module, inner = self._module(model), unwrap_optimizer(optimizer)
        if full:
            state_dict = by_name(module, inner, state_dict, self._built_on(inner))
        set_optimizer_state_dict(module, inner, state_dict, options=options)

    def _built_on(self, optimizer: torch.optim.Optimizer) -> list[str] | None:
        """Names of the parameters ``optimizer`` was built on, where set-up replaced them by
        parameters of other names (see `by_name`); None: its parameters keep their names."""
        return None

    def sharded_state_dicts(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """This process's shards of ``model`` and of its one ``optimizer``, in one pass.

        torch's `get_state_dict` walks the model once for both, where separate model and
        optimizer calls walk it twice (a sharded save_state's only per-checkpoint planning).
        """
        from torch.distributed.checkpoint.state_dict import get_state_dict

        options = state_dict_options(full=False, cpu_offload=self.full_offload)
        module, inner = self._module(model), unwrap_optimizer(optimizer)
        return get_state_dict(module, inner, options=options)

    def load_sharded_state_dicts(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        model_state: dict[str, Any],
        optimizer_state: dict[str, Any],
    ) -> None:
        """Load what `sharded_state_dicts` returned (sharded: no broadcast, so one call is safe)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        options = state_dict_options(full=False, cpu_offload=self.full_offload)
        set_state_dict(
            self._module(model),
            unwrap_optimizer(optimizer),
            model_state_dict=model_state,
            optim_state_dict=optimizer_state,
            options=options,
        )

    @override
    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        to_full = getattr(norm, "full_tensor", None)
        return to_full() if callable(to_full) else norm
