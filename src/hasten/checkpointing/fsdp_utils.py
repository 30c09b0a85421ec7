"""Accelerate's FSDP checkpoint helpers (``accelerate.utils.fsdp_utils``), on hasten's strategies.

``save_fsdp_model`` / ``load_fsdp_model`` / ``save_fsdp_optimizer`` / ``load_fsdp_optimizer``
write and read Accelerate's layout: a sharded state dict as a DCP folder
(``pytorch_model_fsdp_<i>`` / ``optimizer_<i>``, written and read as save_state's parts are:
staged, listed in the folder's own manifest, published by one rename, verified on load;
`hasten.checkpointing.storage.dcp`), a full one as ``pytorch_model_fsdp[_<i>].bin`` /
``optimizer[_<i>].bin`` from rank 0, and FSDP1's LOCAL_STATE_DICT model as each process's
``pytorch_model_fsdp[_<i>]_rank<r>.bin`` (its flat shards as plain tensors, so they load with
``weights_only=True``; the optimizer state is sharded, through DCP, as in Accelerate).
``merge_fsdp_weights`` merges a DCP folder into one file. Every process calls the collective
ones together. The prepare helpers (``fsdp2_prepare_model``, ``fsdp2_apply_ac``, ...) are in
`hasten.strategies.fsdp_helpers`; ``hasten.utils.fsdp_utils`` re-exports both.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import torch

from hasten.checkpointing.merge import merge_on_main_process
from hasten.checkpointing.storage.io import atomic_write, load
from hasten.checkpointing.storage.paths import sharded_model_dir, sharded_optimizer_dir
from hasten.core.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME
from hasten.state import PartialState
from hasten.strategies.fsdp_helpers import FSDPRunView, fsdp_strategy
from hasten.strategies.unwrap import is_peft_model

if TYPE_CHECKING:
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

__all__ = [
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


def _local_state(model: torch.nn.Module) -> tuple[Any, dict[str, Any]]:
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


def _save_local(model: torch.nn.Module, path: Path) -> None:
    _, state = _local_state(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        torch.save({k: _plain(v) for k, v in state.items()}, cast(BinaryIO, handle))


def _load_local(model: torch.nn.Module, path: Path) -> None:
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


def _adapter_refused(adapter_only: bool, model: torch.nn.Module) -> None:
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
    fsdp_plugin: FullyShardedDataParallelPlugin | None,
    accelerator: FSDPRunView,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Save ``model``: sharded into ``pytorch_model_fsdp_<i>/`` or full from rank 0."""
    _adapter_refused(adapter_only, model)
    strategy = fsdp_strategy(fsdp_plugin, accelerator)
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
    fsdp_plugin: FullyShardedDataParallelPlugin | None,
    accelerator: FSDPRunView,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what `save_fsdp_model` wrote (sharded: on any number of processes)."""
    _adapter_refused(adapter_only, model)
    strategy = fsdp_strategy(fsdp_plugin, accelerator)
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
    fsdp_plugin: FullyShardedDataParallelPlugin | None,
    accelerator: FSDPRunView,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Save ``optimizer``'s state keyed by parameter name: sharded (DCP) or full from rank 0."""
    strategy = fsdp_strategy(fsdp_plugin, accelerator)
    _save(
        strategy,
        use_dcp,
        lambda full: strategy.optimizer_state_dict(model, optimizer, full=full),
        Path(output_dir) / sharded_optimizer_dir(optimizer_index),
        Path(output_dir) / _full_file(OPTIMIZER_NAME, optimizer_index),
    )


def load_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin | None,
    accelerator: FSDPRunView,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what `save_fsdp_optimizer` wrote."""
    _adapter_refused(adapter_only, model)
    strategy = fsdp_strategy(fsdp_plugin, accelerator)
    _load(
        strategy,
        use_dcp,
        lambda full: strategy.optimizer_state_dict(model, optimizer, full=full),
        lambda state, full: strategy.load_optimizer_state_dict(model, optimizer, state, full=full),
        Path(input_dir) / sharded_optimizer_dir(optimizer_index),
        Path(input_dir) / _full_file(OPTIMIZER_NAME, optimizer_index),
    )


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
