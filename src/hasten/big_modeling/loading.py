"""Load checkpoints (single file, sharded index or folder) into a model, tensor by tensor.

Each tensor goes straight to its device from the device map: safetensors files are read one
tensor at a time (never a whole shard in memory twice), tensors mapped to ``"disk"`` are
written to the offload folder (or, for safetensors, just indexed where they already are), and
``.bin`` files are only read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from hasten.big_modeling.broadcast import load_broadcast
from hasten.big_modeling.device_map import device_for, resolve_device_map, validate_device
from hasten.big_modeling.offload import (
    load_offloaded_weights,
    offload_weight,
    save_offload_index,
)
from hasten.big_modeling.sizes import resolve_dtype
from hasten.big_modeling.tensors import (
    as_device,
    check_tied_parameters_on_same_device,
    find_tied_parameters,
    retie_parameters,
    set_module_tensor_to_device,
)
from hasten.core.constants import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from hasten.core.safetensors_format import SAFETENSORS_DTYPES, read_safetensors_header

__all__ = ["Loader", "checkpoint_files", "load_checkpoint_in_model", "load_state_dict"]

logger = logging.getLogger(__name__)
_META = torch.device("meta")


def _corrupt(path: str | os.PathLike[str], err: BaseException) -> ValueError:
    return ValueError(
        f"Could not read checkpoint file {os.fspath(path)!r}: {err}. The file is truncated, "
        "corrupt or not a checkpoint; re-save or re-download it."
    )


def load_state_dict(
    checkpoint_file: str | os.PathLike[str], device_map: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """Read one checkpoint file into a dict of tensors.

    For safetensors with a ``device_map``, each tensor is read straight onto its device
    (``"disk"`` entries are read to cpu). ``.bin`` files go through ``torch.load`` with
    ``weights_only=True`` and a memory map when the file format allows it.

    Raises:
        ValueError: if the file cannot be parsed.
    """
    path = os.fspath(checkpoint_file)
    if path.endswith(".safetensors"):
        try:
            _, header = read_safetensors_header(path)
            result: dict[str, torch.Tensor] = {}
            groups: dict[str, list[str]] = {}
            for name in header:
                device = device_for(name, device_map) if device_map is not None else "cpu"
                target = "cpu" if device in (None, "disk") else str(as_device(device))
                groups.setdefault(target, []).append(name)
            for target, names in groups.items():
                with safe_open(path, framework="pt", device=target) as handle:
                    for name in names:
                        result[name] = handle.get_tensor(name)
            return result
        except (OSError, ValueError, RuntimeError, SafetensorError) as err:
            raise _corrupt(path, err) from err
    return _torch_load(path)


def _torch_load(path: str) -> dict[str, torch.Tensor]:
    try:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            # legacy (non-zip) files cannot be memory-mapped
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise _corrupt(path, err) from err
    if not isinstance(loaded, Mapping):
        raise ValueError(f"{path!r} holds a {type(loaded).__name__}, not a state dict of tensors")
    return dict(loaded)


def checkpoint_files(checkpoint: str | os.PathLike[str]) -> list[str]:
    """List the files of a checkpoint: a file, a sharded ``.index.json``, or a folder of either.

    Raises:
        ValueError: if nothing loadable is found (the message lists what was looked for).
    """
    path = Path(checkpoint)
    if path.is_file() and path.name.endswith(".json"):
        index = json.loads(path.read_text(encoding="utf-8"))
        weight_map = index.get("weight_map", index)
        return sorted({str(path.parent / shard) for shard in weight_map.values()})
    if path.is_file():
        return [str(path)]
    if path.is_dir():
        for name in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
            if (path / name).is_file():
                return [str(path / name)]
        indexes = [p for p in path.iterdir() if p.name.endswith(".index.json")]
        if len(indexes) == 1:
            return checkpoint_files(indexes[0])
        found = (
            "several .index.json files" if indexes else "no weights file and no .index.json file"
        )
        raise ValueError(
            f"{os.fspath(checkpoint)!r} holds {found}: expected {SAFE_WEIGHTS_NAME}, "
            f"{WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME} or {WEIGHTS_INDEX_NAME}."
        )
    raise ValueError(
        f"checkpoint {os.fspath(checkpoint)!r} does not exist: pass a weights file, a sharded "
        "index .json, or a folder holding one of them."
    )


class Loader:
    """State of one `load_checkpoint_in_model` call: what was loaded, offloaded, or unexpected."""

    def __init__(
        self,
        model: nn.Module,
        device_map: Mapping[str, Any] | None,
        offload_folder: str | None,
        dtype: torch.dtype | None,
        keep_in_fp32_modules: list[str],
        state_dict_folder: str | None,
    ) -> None:
        self.model = model
        self.device_map = device_map
        self.offload_folder = offload_folder
        self.dtype = dtype
        self.keep_in_fp32 = set(keep_in_fp32_modules)
        self.state_dict_folder = state_dict_folder
        self.expected: dict[str, torch.Tensor] = {}
        self.buffers: set[str] = set()
        self.persistent: list[str] = []  # the names a state dict holds
        for prefix, module in model.named_modules(remove_duplicate=False):
            pre = f"{prefix}." if prefix else ""
            for local, param in module._parameters.items():
                if param is not None:
                    self.expected[pre + local] = param
                    self.persistent.append(pre + local)
            for local, buffer in module._buffers.items():
                if buffer is not None:
                    self.expected[pre + local] = buffer
                    self.buffers.add(pre + local)
                    if local not in module._non_persistent_buffers_set:
                        self.persistent.append(pre + local)
        self.offload_buffers = False
        self.loaded: set[str] = set()
        self.unexpected: list[str] = []
        self.offload_index: dict[str, Any] = {}
        self.state_dict_index: dict[str, Any] = {}

    def target_dtype(self, name: str, stored: torch.dtype) -> torch.dtype | None:
        if self.dtype is None or not stored.is_floating_point:
            return None
        if self.keep_in_fp32 and self.keep_in_fp32.intersection(name.split(".")):
            return torch.float32
        return self.dtype

    def device(self, name: str) -> Any:
        if self.device_map is None:
            current = self.expected[name].device
            return "cpu" if current == _META else current
        device = device_for(name, self.device_map)
        if device == "disk" and not self.offload_buffers and name in self.buffers:
            return "cpu"  # buffers stay loaded; the dispatch hooks move them where they run
        return device

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        want = tuple(self.expected[name].shape)
        if want != shape and type(self.expected[name]).__name__ != "Params4bit":
            raise ValueError(
                f"{name!r} has shape {shape} in the checkpoint but {want} in the model: the "
                "checkpoint does not match this model's config."
            )

    def place(self, name: str, read: Callable[[str], torch.Tensor], stored: torch.dtype) -> None:
        """Put one checkpoint tensor where the device map says; ``read`` fetches its value."""
        device = self.device(name)
        cast = self.target_dtype(name, stored)
        self.loaded.add(name)
        staged = device == "cpu" and self.state_dict_folder is not None
        if device == "disk" or staged:
            folder, index = (
                (self.state_dict_folder, self.state_dict_index)
                if staged
                else (self.offload_folder, self.offload_index)
            )
            if folder is None:
                raise ValueError(f"{name!r} is mapped to disk but no offload_folder was given")
            value = read(name)
            final = cast or self.expected[name].dtype if value.is_floating_point() else value.dtype
            # the model declares the dtype it will hold (as Accelerate): loading the staged
            # value back keeps it, e.g. float16 with dtype=torch.float16
            set_module_tensor_to_device(self.model, name, _META, dtype=final, clear_cache=False)
            offload_weight(value.to(final), name, folder, index=index)
            return
        set_module_tensor_to_device(
            self.model, name, device, value=read(name), dtype=cast, clear_cache=False
        )

    def load_safetensors(self, path: str) -> None:
        try:
            start, header = read_safetensors_header(path)
        except OSError as err:
            raise _corrupt(path, err) from err
        size = os.path.getsize(path)
        handles: dict[str, Any] = {}

        def read(key: str) -> torch.Tensor:
            # one handle per target device, so each tensor is read straight onto its device
            target = self.device(key)
            where = "cpu" if target in ("disk", None) else str(as_device(target))
            if where not in handles:
                handles[where] = safe_open(path, framework="pt", device=where).__enter__()
            return handles[where].get_tensor(key)

        try:
            for name, info in header.items():
                if name not in self.expected:
                    self.unexpected.append(name)
                    continue
                self.check_shape(name, tuple(info["shape"]))
                if start + info["data_offsets"][1] > size:
                    raise _corrupt(path, EOFError(f"tensor {name!r} runs past the end of the file"))
                stored = _stored_dtype(info["dtype"])
                if not self._index_in_place(name, path, stored):
                    self.place(name, read, stored)
        except (RuntimeError, SafetensorError) as err:
            raise _corrupt(path, err) from err
        finally:
            for handle in handles.values():
                handle.__exit__(None, None, None)

    def _index_in_place(self, name: str, path: str, stored: torch.dtype) -> bool:
        """Disk weights already in a safetensors file are indexed there, not copied."""
        if self.device(name) != "disk" or self.offload_folder is None:
            return False
        want = self.target_dtype(name, stored) or (
            self.expected[name].dtype if stored.is_floating_point else stored
        )
        self.offload_index[name] = {
            "safetensors_file": os.path.abspath(path),
            "weight_name": name,
            "dtype": str(want).removeprefix("torch."),
            "shape": list(self.expected[name].shape),
        }
        self.loaded.add(name)
        return True

    def load_torch(self, path: str) -> None:
        self.load_tensors(load_state_dict(path))

    def load_tensors(self, state: Mapping[str, torch.Tensor]) -> None:
        """Place tensors already in memory (from a ``.bin`` file or a broadcast)."""
        for name, value in state.items():
            if name not in self.expected:
                self.unexpected.append(name)
                continue
            self.check_shape(name, tuple(value.shape))
            self.place(name, state.__getitem__, value.dtype)


def _stored_dtype(code: str) -> torch.dtype:
    try:
        return SAFETENSORS_DTYPES[code]
    except KeyError as err:
        raise ValueError(f"unknown safetensors dtype {code!r}") from err


def _missing(loader: Loader, tied: list[list[str]]) -> list[str]:
    done = set(loader.loaded)
    for group in tied:
        if done.intersection(group):
            done.update(group)
    return sorted({n for n in loader.persistent if n not in done})


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: dict[str, int | str | torch.device] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load a (possibly sharded) checkpoint into ``model``, each tensor onto its mapped device.

    Call `dispatch_model` afterwards to run a model spread over devices, or use
    `load_checkpoint_and_dispatch` for both.

    Args:
        model: the model to fill (often built under `init_empty_weights`).
        checkpoint: a weights file, a sharded ``.index.json`` or a folder holding either.
        device_map: name -> device; ``"disk"`` entries are written to ``offload_folder``.
            Also ``"auto"``, ``"balanced"``, ``"balanced_low_0"`` or ``"sequential"``.
        offload_folder: folder for disk-offloaded weights.
        dtype: cast floating weights to this dtype.
        offload_state_dict: stage cpu weights on disk while loading (lower peak RAM).
        offload_buffers: write the buffers of disk-mapped modules to disk too (by default they
            are loaded, and dispatch keeps them on the execution device).
        keep_in_fp32_modules: module names whose weights stay float32 when ``dtype`` is set.
        offload_8bit_bnb: accepted for compatibility (8-bit weights are offloaded as they are).
        strict: raise if the checkpoint misses model keys or has extra keys.
        full_state_dict: tensors are always loaded whole (sharded loading is not supported).
        broadcast_from_rank0: only rank 0 reads files; other ranks receive each tensor.

    Raises:
        ValueError: disk in the map without offload folder, missing/extra keys with ``strict``,
            shape mismatches, corrupt files.
        RuntimeError: ``broadcast_from_rank0`` without an initialized process group.
    """
    device_map = resolve_device_map(model, device_map, dtype=dtype)
    if device_map is not None:
        for key, device in device_map.items():
            validate_device(device, key)
    if device_map is not None and "disk" in device_map.values() and offload_folder is None:
        disk = [k for k, v in device_map.items() if v == "disk"]
        raise ValueError(
            f"device_map sends {disk!r} to disk but offload_folder is None: pass "
            "offload_folder='some/folder' to hold the offloaded weights."
        )
    tied = find_tied_parameters(model)
    if device_map is not None:
        check_tied_parameters_on_same_device(tied, device_map)
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)
    staging = tempfile.mkdtemp() if offload_state_dict else None
    loader = Loader(
        model,
        device_map,
        os.fspath(offload_folder) if offload_folder is not None else None,
        resolve_dtype(dtype) if dtype is not None else None,
        keep_in_fp32_modules or [],
        staging,
    )
    loader.offload_buffers = offload_buffers
    if broadcast_from_rank0:
        load_broadcast(loader, lambda: checkpoint_files(checkpoint), load_state_dict)
    else:
        for path in checkpoint_files(checkpoint):
            if path.endswith(".safetensors"):
                loader.load_safetensors(path)
            else:
                loader.load_torch(path)
    _finish(loader, tied, strict, offload_folder, staging, checkpoint)


def _finish(
    loader: Loader,
    tied: list[list[str]],
    strict: bool,
    offload_folder: str | os.PathLike[str] | None,
    staging: str | None,
    checkpoint: str | os.PathLike[str],
) -> None:
    missing = _missing(loader, tied)
    if strict and (missing or loader.unexpected):
        raise ValueError(
            f"checkpoint does not match {type(loader.model).__name__}: missing keys "
            f"{missing!r}, unexpected keys {sorted(loader.unexpected)!r}. Fix the checkpoint or "
            "pass strict=False."
        )
    if missing:
        warnings.warn(
            f"The checkpoint has no value for {missing!r}; those weights keep their current "
            "value (or stay on the meta device).",
            stacklevel=3,
        )
    if loader.unexpected:
        logger.warning(
            "Some weights of the model checkpoint at %s were not used when initializing %s: %s. "
            "(hasten: these keys are not in the model and were ignored; pass strict=True to "
            "refuse such a checkpoint.)",
            checkpoint,
            type(loader.model).__name__,
            sorted(loader.unexpected),
        )
    if offload_folder is not None:
        save_offload_index(loader.offload_index, offload_folder)
    if staging is not None:
        load_offloaded_weights(loader.model, loader.state_dict_index, staging)
        shutil.rmtree(staging, ignore_errors=True)
    retie_parameters(loader.model, tied)
