"""Accelerate's FSDP helper functions (``accelerate.utils.fsdp_utils``), on hasten's strategies.

``save_fsdp_model`` / ``load_fsdp_model`` / ``save_fsdp_optimizer`` / ``load_fsdp_optimizer``
write and read Accelerate's layout: a sharded state dict as a DCP folder
(``pytorch_model_fsdp_<i>`` / ``optimizer_<i>``), a full one as ``pytorch_model_fsdp[_<i>].bin``
/ ``optimizer[_<i>].bin`` from rank 0, and FSDP1's LOCAL_STATE_DICT model as each process's
``pytorch_model_fsdp[_<i>]_rank<r>.bin`` (its flat shards as plain tensors, so they load with
``weights_only=True``; the optimizer state is sharded, through DCP, as in Accelerate). The ``fsdp2_*`` helpers expose the pieces of the FSDP2
strategy's prepare. Every process calls the collective ones together.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import torch
from torch import nn

from hasten.checkpointing.merge import merge_on_main_process
from hasten.checkpointing.storage.io import atomic_write, load
from hasten.checkpointing.storage.paths import sharded_model_dir, sharded_optimizer_dir
from hasten.config import envvars
from hasten.core.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME
from hasten.precision import Precision
from hasten.state import PartialState
from hasten.strategies.composable import ComposableStrategy
from hasten.strategies.fsdp1 import FSDP1Strategy
from hasten.strategies.fsdp_plugin import ignored_modules, modules_to_shard
from hasten.strategies.parallelize import apply_ac
from hasten.strategies.rebind import canonical_name
from hasten.strategies.sharded import ShardedStrategy, state_dict_options
from hasten.strategies.unwrap import is_peft_model

if TYPE_CHECKING:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

__all__ = [
    "disable_fsdp_ram_efficient_loading",
    "enable_fsdp_ram_efficient_loading",
    "ensure_weights_retied",
    "fsdp2_apply_ac",
    "fsdp2_canonicalize_names",
    "fsdp2_load_full_state_dict",
    "fsdp2_prepare_auto_wrap_policy",
    "fsdp2_prepare_model",
    "fsdp2_switch_optimizer_parameters",
    "get_fsdp2_grad_scaler",
    "get_parameters_from_modules",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
]


def merge_fsdp_weights(
    checkpoint_dir: str,
    output_path: str,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> None:
    """Merge a sharded (DCP) FSDP checkpoint folder into one model file.

    Called by every process of a job (as Accelerate's is), the main process merges and the
    others wait for it, so each can read the merged file once this returns.
    """
    merge_on_main_process(checkpoint_dir, output_path, safe_serialization, remove_checkpoint_dir)


def enable_fsdp_ram_efficient_loading() -> None:
    """Ask for rank-0-only weight loading (``FSDP_CPU_RAM_EFFICIENT_LOADING=true``).

    Also sets ``ACCELERATE_USE_FSDP=true`` when unset, as Accelerate does: transformers'
    ``from_pretrained`` builds the model on meta on the other ranks only when both are set.
    """
    if envvars.read("ACCELERATE_USE_FSDP") is None:
        envvars.write("ACCELERATE_USE_FSDP", "true")
    envvars.write("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")


def disable_fsdp_ram_efficient_loading() -> None:
    """Load weights on every rank again (``FSDP_CPU_RAM_EFFICIENT_LOADING=false``)."""
    envvars.write("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")


def _strategy(fsdp_plugin: Any, accelerator: Any) -> ShardedStrategy:
    strategy = getattr(accelerator, "strategy", None)
    held = getattr(strategy, "plugin", None)  # None: tensor parallelism alone, no FSDP
    same = held is not None and (fsdp_plugin is None or fsdp_plugin is held)
    if isinstance(strategy, ShardedStrategy) and same:
        return strategy
    plugin = fsdp_plugin if fsdp_plugin is not None else accelerator.state.fsdp_plugin
    if plugin is None:
        raise ValueError(
            "This helper needs an FSDP run: pass the FullyShardedDataParallelPlugin (or create "
            "the Accelerator with fsdp_plugin=...)."
        )
    if plugin.fsdp_version == 2:
        return ComposableStrategy(plugin, accelerator.device)
    return FSDP1Strategy(plugin, accelerator.device)


def _kind(fsdp_plugin: Any, use_dcp: bool, *, optimizer: bool = False) -> str:
    """ "full", "sharded" (DCP) or "local" (each process's own file) for the plugin's type.

    As in Accelerate, a LOCAL_STATE_DICT optimizer state is sharded and goes through DCP.
    """
    name = getattr(fsdp_plugin.state_dict_type, "name", str(fsdp_plugin.state_dict_type))
    if name == "LOCAL_STATE_DICT":
        return "sharded" if optimizer else "local"
    if name == "SHARDED_STATE_DICT" and not use_dcp:
        raise ValueError(
            "A SHARDED_STATE_DICT is written with torch.distributed.checkpoint; pass use_dcp=True."
        )
    return "sharded" if name == "SHARDED_STATE_DICT" else "full"


def _local_file(index: int) -> str:
    """``pytorch_model_fsdp_rank<r>.bin`` (model 0) / ``pytorch_model_fsdp_<i>_rank<r>.bin``."""
    rank = PartialState().process_index
    stem = FSDP_MODEL_NAME if index == 0 else f"{FSDP_MODEL_NAME}_{index}"
    return f"{stem}_rank{rank}.bin"


def _local_state(model: Any) -> tuple[Any, dict[str, Any]]:
    """The FSDP1 root of ``model`` and its LOCAL_STATE_DICT (this process's flat shards)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    root = getattr(model, "_orig_mod", model)
    if not isinstance(root, FullyShardedDataParallel):
        raise ValueError(
            "LOCAL_STATE_DICT saves FSDP1's flat parameter shards, but this model is not wrapped "
            f"by FSDP1 ({type(root).__name__}). Prepare it with fsdp_version=1, or use "
            "SHARDED_STATE_DICT."
        )
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.LOCAL_STATE_DICT):
        return root, root.state_dict()


def _plain(value: Any) -> Any:
    """A ShardedTensor's local shard as a plain tensor (loadable with ``weights_only=True``)."""
    local = getattr(value, "local_tensor", None)
    return local().detach() if callable(local) else value


def _save_local(model: Any, path: Path) -> None:
    _, state = _local_state(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        torch.save({k: _plain(v) for k, v in state.items()}, cast(BinaryIO, handle))


def _load_local(model: Any, path: Path) -> None:
    """Put this process's saved flat shards back (same number of processes, same wrapping)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    root, state = _local_state(model)
    if not path.is_file():
        raise FileNotFoundError(
            f"No LOCAL_STATE_DICT file {path} for process {PartialState().process_index}. Such "
            "checkpoints load only on the number of processes that saved them; use "
            "SHARDED_STATE_DICT to load on another number."
        )
    saved = load(path, map_location="cpu")
    if set(saved) != set(state):
        raise ValueError(
            f"{path} holds {sorted(saved)} but the model's local state has {sorted(state)}: load "
            "it into the model it was saved from, wrapped the same way."
        )
    for key, value in state.items():
        here = _plain(value)
        if tuple(saved[key].shape) != tuple(here.shape):
            raise ValueError(
                f"{path}: {key} is {tuple(saved[key].shape)} but this process holds "
                f"{tuple(here.shape)}; load on the same number of processes with the same "
                "wrapping as when it was saved."
            )
        with torch.no_grad():
            here.copy_(saved[key])
    with FullyShardedDataParallel.state_dict_type(root, StateDictType.LOCAL_STATE_DICT):
        root.load_state_dict(state)


def _full_file(stem: str, index: int) -> str:
    return f"{stem}.bin" if index == 0 else f"{stem}_{index}.bin"


def _adapter_refused(adapter_only: bool, model: Any) -> None:
    """As in Accelerate, ``adapter_only`` matters only for a PEFT model (transformers' Trainer
    passes True for every model); for one, hasten cannot yet save or load the adapter alone."""
    if adapter_only and is_peft_model(model):
        raise ValueError(
            "adapter_only=True for a PEFT model (its adapters only) is not supported by "
            "hasten's FSDP helpers; save and load the whole model (adapter_only=False)."
        )


def _dcp_save(state: dict[str, Any], folder: Path) -> None:
    """One DCP folder, crash-safe and listed in its manifest (every process calls it)."""
    from hasten.checkpointing.storage.dcp import save_folder

    save_folder(state, folder)


def _dcp_load(state: dict[str, Any], folder: Path) -> None:
    """Fill ``state`` from a DCP folder, verified against its manifest when it has one (DCP's
    own reader unpickles anything: see dcp_safe)."""
    from hasten.checkpointing.storage.dcp import load_folder

    load_folder(state, folder)


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: Any,
    output_dir: Any,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Save ``model``: sharded into ``pytorch_model_fsdp_<i>/`` or full from rank 0."""
    _adapter_refused(adapter_only, model)
    strategy = _strategy(fsdp_plugin, accelerator)
    if _kind(strategy.plugin, use_dcp) == "local":
        _save_local(model, Path(output_dir) / _local_file(model_index))
        return
    _save(
        strategy,
        use_dcp,
        lambda full: strategy.model_state_dict(model, full=full),
        Path(output_dir) / sharded_model_dir(model_index),
        Path(output_dir) / _full_file(FSDP_MODEL_NAME, model_index),
    )


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: Any,
    input_dir: Any,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what `save_fsdp_model` wrote (sharded: on any number of processes)."""
    _adapter_refused(adapter_only, model)
    strategy = _strategy(fsdp_plugin, accelerator)
    if _kind(strategy.plugin, use_dcp) == "local":
        _load_local(model, Path(input_dir) / _local_file(model_index))
        return
    _load(
        strategy,
        use_dcp,
        lambda full: strategy.model_state_dict(model, full=full),
        lambda state, full: strategy.load_model_state_dict(model, state, full=full),
        Path(input_dir) / sharded_model_dir(model_index),
        Path(input_dir) / _full_file(FSDP_MODEL_NAME, model_index),
    )


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: Any,
    output_dir: Any,
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Save ``optimizer``'s state keyed by parameter name: sharded (DCP) or full from rank 0."""
    strategy = _strategy(fsdp_plugin, accelerator)
    _save(
        strategy,
        use_dcp,
        lambda full: strategy.optimizer_state_dict(model, optimizer, full=full),
        Path(output_dir) / sharded_optimizer_dir(optimizer_index),
        Path(output_dir) / _full_file(OPTIMIZER_NAME, optimizer_index),
    )


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: Any,
    input_dir: Any,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what `save_fsdp_optimizer` wrote."""
    _adapter_refused(adapter_only, model)
    strategy = _strategy(fsdp_plugin, accelerator)
    _load(
        strategy,
        use_dcp,
        lambda full: strategy.optimizer_state_dict(model, optimizer, full=full),
        lambda state, full: strategy.load_optimizer_state_dict(model, optimizer, state, full=full),
        Path(input_dir) / sharded_optimizer_dir(optimizer_index),
        Path(input_dir) / _full_file(OPTIMIZER_NAME, optimizer_index),
    )


def fsdp2_prepare_model(accelerator: Any, model: nn.Module) -> nn.Module:
    """Shard ``model`` with FSDP2 as the Accelerator's plugin asks (no compile, no autocast)."""
    strategy = _strategy(None, accelerator)
    if not isinstance(strategy, ComposableStrategy) or strategy.plugin is None:
        raise ValueError("fsdp2_prepare_model needs fsdp_version=2 in the FSDP plugin.")
    return strategy.prepare_module(model, accelerator.device, precision=Precision(), dynamo=None)


def fsdp2_load_full_state_dict(
    accelerator: Any, model: nn.Module, full_sd: dict, cpu_offload: bool = False
) -> None:
    """Load a full state dict held by rank 0 (others may pass ``{}``) into a sharded model."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    options = state_dict_options(full=True, cpu_offload=cpu_offload)
    set_model_state_dict(model, full_sd, options=options)


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Replace each optimizer parameter by ``mapping[param.data_ptr()]`` (or ``mapping[param]``).

    Raises:
        KeyError: a parameter has no entry (the optimizer would keep training a stale copy).
    """
    for group in optimizer.param_groups:
        replaced = []
        for param in group["params"]:
            new = mapping.get(param.data_ptr(), mapping.get(param))
            if new is None:
                raise KeyError(
                    f"No new parameter for an optimizer parameter of shape {tuple(param.shape)}: "
                    "build the mapping from every parameter of the model before sharding."
                )
            replaced.append(new)
        group["params"] = replaced


def fsdp2_apply_ac(accelerator: Any, model: nn.Module) -> nn.Module:
    """Checkpoint the activations of the blocks the plugin's wrap policy picks."""
    plugin = _strategy(None, accelerator).plugin  # an FSDP strategy's: never None here
    return apply_ac(model, cast("FullyShardedDataParallelPlugin", plugin))


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """Drop wrapper pieces (``_checkpoint_wrapped_module.``, ``_orig_mod.``...) from the keys."""
    return {canonical_name(name): value for name, value in named_params.items()}


def fsdp2_prepare_auto_wrap_policy(
    fsdp2_plugin: Any, model: nn.Module
) -> Callable[[nn.Module], bool] | None:
    """``policy(module) -> bool`` for the plugin's wrap policy bound to ``model`` (None: no wrap)."""
    chosen = {id(m) for m in modules_to_shard(fsdp2_plugin, model, [])}
    if not chosen:
        return None
    return lambda module: id(module) in chosen


def get_fsdp2_grad_scaler(**kwargs: Any) -> torch.amp.GradScaler:
    """FSDP2 uses torch's plain `GradScaler` (DTensor gradients unscale in place)."""
    return torch.amp.GradScaler(PartialState().device.type, **kwargs)


def get_parameters_from_modules(
    modules: Iterable[nn.Module] | str, model: Any, device: Any
) -> set[nn.Parameter]:
    """The parameters of ``modules`` (modules, or a regex of module names in ``model``)."""
    holder = type("_Spec", (), {"ignored_modules": modules})()
    return {p for module in ignored_modules(holder, model) for p in module.parameters()}


def ensure_weights_retied(param_init_fn: Any, model: nn.Module, device: torch.device) -> Any:
    """Wrap ``param_init_fn`` so parameters tied in ``model`` stay tied after initialisation."""
    tied: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            tied.setdefault(id(param), []).append((module, name))
    groups = [owners for owners in tied.values() if len(owners) > 1]
    if not groups:
        return param_init_fn

    def init_and_retie(module: nn.Module) -> Any:
        result = param_init_fn(module)
        for owners in groups:
            first, name = owners[0]
            for other, other_name in owners[1:]:
                setattr(other, other_name, getattr(first, name))
        return result

    return init_and_retie


def _save(
    strategy: Any,
    use_dcp: bool,
    state_of: Callable[[bool], dict[str, Any]],
    sharded_dir: Path,
    full_path: Path,
) -> None:
    """Write ``state_of(full)``: DCP shards from every process, or one torch file from rank 0."""
    if _kind(strategy.plugin, use_dcp, optimizer=True) == "sharded":
        _dcp_save(state_of(False), sharded_dir)
        return
    state = state_of(True)
    if PartialState().is_main_process:
        os.makedirs(full_path.parent, exist_ok=True)
        torch.save(state, full_path)


def _load(
    strategy: Any,
    use_dcp: bool,
    state_of: Callable[[bool], dict[str, Any]],
    apply: Callable[[dict[str, Any], bool], None],
    sharded_dir: Path,
    full_path: Path,
) -> None:
    """Read what `_save` wrote (DCP fills this process's shards in place) and ``apply`` it.

    Full files load with ``weights_only=True``: state dicts hold only tensors and plain values.
    """
    if _kind(strategy.plugin, use_dcp, optimizer=True) == "sharded":
        state = state_of(False)
        _dcp_load(state, sharded_dir)
        apply(state, False)
        return
    apply(torch.load(full_path, map_location="cpu", weights_only=True), True)
