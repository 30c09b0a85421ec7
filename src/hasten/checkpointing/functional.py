"""Accelerate's checkpoint functions, with its positional signatures, over hasten's checkpoints.

``save_accelerator_state`` / ``load_accelerator_state`` take the objects as lists and the
process index, as Accelerate's do, and hand them to `hasten.checkpointing.state`'s
`save_contents` / `load_contents`; ``save_custom_state`` / ``load_custom_state`` write and read
one registered object's file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, cast

import torch

from hasten.checkpointing.state import CheckpointContents, load_contents, save_contents
from hasten.checkpointing.storage.io import load, save
from hasten.checkpointing.storage.paths import custom_object_file
from hasten.state import PartialState

__all__ = [
    "load_accelerator_state",
    "load_custom_state",
    "optimizer_map_location",
    "save_accelerator_state",
    "save_custom_state",
]

logger = logging.getLogger(__name__)


def save_accelerator_state(
    output_dir: str | os.PathLike[str],
    model_states: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    step: int,
    scaler: Any | None = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> Path:
    """Accelerate's signature over `save_contents`: write a complete checkpoint, on every process.

    Args:
        output_dir: the checkpoint folder (published atomically when complete).
        model_states: each model's state dict.
        optimizers, schedulers, dataloaders: the objects whose state is saved.
        process_index: this process's index (must match the running job's).
        step: the training step, restored by `load_accelerator_state`.
        scaler: the AMP grad scaler, if any.
        save_on_each_node: write on every node's local main process, not only the main one.
        safe_serialization: model weights as safetensors (else torch pickles).

    Raises:
        ValueError: `process_index` is not this process's index.
    """
    _check_process_index(process_index)
    contents = CheckpointContents(
        model_states=list(model_states),
        optimizers=list(optimizers),
        schedulers=list(schedulers),
        dataloaders=list(dataloaders),
        scaler=scaler,
    )
    result = save_contents(
        output_dir,
        contents,
        step=step,
        safe_serialization=safe_serialization,
        save_on_each_node=save_on_each_node,
    )
    return cast(Path, result)


_MAP_LOCATIONS = (None, "cpu", "on_device")


def optimizer_map_location(map_location: Any) -> Any:
    """Where optimizer states load: None/"cpu" -> "cpu", "on_device" -> this process's device.

    Raises:
        TypeError: any other value (Accelerate's sentence first).
    """
    if map_location not in _MAP_LOCATIONS:
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, or "
            f"`'on_device'`. (hasten: got {map_location!r}.)"
        )
    return PartialState().device if map_location == "on_device" else "cpu"


def load_accelerator_state(
    input_dir: str | os.PathLike[str],
    models: list[torch.nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    scaler: Any | None = None,
    map_location: Any = None,
    load_kwargs: dict[str, Any] | None = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Accelerate's signature over `load_contents`: restore a checkpoint; return ``{"step": ...}``.

    Args:
        map_location: where optimizer states load, None/"cpu" or "on_device" (this process's
            device).
        load_kwargs: options for reading the non-model files; files are always read with
            ``weights_only=True`` semantics, so only ``{"weights_only": True}`` is accepted.
        **load_model_func_kwargs: ``strict=`` for the models' ``load_state_dict`` (default True).

    Raises:
        TypeError: an unsupported `map_location`, `load_kwargs` entry or model-loading option.
        ValueError: `process_index` is not this process's index (and see `load_contents`).
    """
    _check_process_index(process_index)
    location = optimizer_map_location(map_location)
    unsupported = {k: v for k, v in (load_kwargs or {}).items() if (k, v) != ("weights_only", True)}
    if unsupported:
        raise TypeError(
            f"load_kwargs {unsupported} are not supported: hasten reads checkpoint files only "
            "through its safe loader (weights_only=True). Drop them."
        )
    strict = load_model_func_kwargs.pop("strict", True)
    if load_model_func_kwargs:
        raise TypeError(
            f"Unsupported model loading options {sorted(load_model_func_kwargs)}; only strict= "
            "is accepted."
        )
    contents = CheckpointContents(
        models=list(models),
        optimizers=list(optimizers),
        schedulers=list(schedulers),
        dataloaders=list(dataloaders),
        scaler=scaler,
    )
    return load_contents(input_dir, contents, map_location=location, strict=bool(strict))


def _check_process_index(process_index: int) -> None:
    actual = PartialState().process_index
    if process_index != actual:
        raise ValueError(
            f"process_index={process_index} but this is process {actual}; pass "
            "PartialState().process_index (each process saves its own RNG state)."
        )


def save_custom_state(obj: Any, path: str, index: int = 0, save_on_each_node: bool = False) -> None:
    """Save ``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (as `save_state` does)."""
    target = Path(path) / custom_object_file(index)
    logger.info("Saving the state of %s to %s", type(obj).__qualname__, target)
    save(obj.state_dict(), target, save_on_each_node=save_on_each_node)


def load_custom_state(obj: Any, path: str, index: int = 0) -> None:
    """Load ``{path}/custom_checkpoint_{index}.pkl`` into ``obj.load_state_dict``.

    Read with the safe loader (plain data and tensors); a state needing arbitrary pickled
    objects is refused with `UnsafeCheckpointError`.
    """
    source = Path(path) / custom_object_file(index)
    logger.info("Loading the state of %s from %s", type(obj).__qualname__, source)
    obj.load_state_dict(load(source, map_location="cpu"))
