"""Weights kept on disk: write them once, read them back memory-mapped when a layer runs.

An offload folder holds one raw ``<name>.dat`` file per tensor plus ``index.json`` (dtype and
shape of each), the layout Accelerate uses. Index entries may instead point into a
``.safetensors`` file (``safetensors_file`` + ``weight_name``), so a checkpoint already on disk
is read in place instead of copied (through `hasten.core.safetensors_format`, the one codec).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hasten.big_modeling.tensors import set_module_tensor_to_device
from hasten.core.safetensors_format import read_safetensors_tensor

__all__ = [
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "extract_submodules_state_dict",
    "load_offloaded_weight",
    "load_offloaded_weights",
    "offload_state_dict",
    "offload_weight",
    "save_offload_index",
]

# numpy has no bfloat16 / float8: those are stored as same-width integers and viewed back
_STORED_AS = {"bfloat16": torch.int16}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def offload_weight(
    weight: torch.Tensor,
    weight_name: str,
    offload_folder: str | os.PathLike[str],
    index: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Write one tensor to ``<offload_folder>/<weight_name>.dat`` and record it in ``index``."""
    name = _dtype_name(weight.dtype)
    raw = weight.detach()
    if raw.device.type != "cpu":
        raw = raw.cpu()
    raw = raw.contiguous()
    if name in _STORED_AS or name.startswith("float8"):
        raw = raw.view(_STORED_AS.get(name, torch.int8))
    array = raw.numpy()
    path = Path(offload_folder) / f"{weight_name}.dat"
    # raw C-order bytes: the same file np.memmap would write, without a second buffer
    with open(path, "wb") as handle:
        array.tofile(handle)
    if index is not None:
        index[weight_name] = {"dtype": name, "shape": list(weight.shape)}
    return index


def load_offloaded_weight(
    weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any]
) -> torch.Tensor:
    """Map one ``.dat`` file back as a tensor (copy-on-write mapping: no read until used)."""
    name = str(weight_info["dtype"])
    shape = tuple(weight_info["shape"])
    target = getattr(torch, name)
    stored = _STORED_AS.get(name, torch.int8 if name.startswith("float8") else target)
    numpy_dtype = torch.empty((), dtype=stored).numpy().dtype
    count = int(np.prod(shape)) if shape else 1
    if count == 0:
        return torch.empty(shape, dtype=target)
    array = np.memmap(weight_file, dtype=numpy_dtype, mode="c", shape=(count,))
    tensor = torch.from_numpy(array)
    if stored != target:
        tensor = tensor.view(target)
    return tensor.reshape(shape)


def save_offload_index(
    index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]
) -> None:
    """Merge ``index`` into ``<offload_folder>/index.json``."""
    if not index:
        return
    path = Path(offload_folder) / "index.json"
    current: dict[str, Any] = {}
    if path.is_file():
        current = json.loads(path.read_text(encoding="utf-8"))
    current.update(index)
    path.write_text(json.dumps(current, indent=2), encoding="utf-8")


def offload_state_dict(
    save_dir: str | os.PathLike[str], state_dict: dict[str, torch.Tensor]
) -> None:
    """Write every tensor of ``state_dict`` to ``save_dir`` (created if needed) with its index."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


class PrefixedDataset(Mapping[str, Any]):
    """A view of ``dataset`` where key ``k`` reads ``dataset[prefix + k]``."""

    def __init__(self, dataset: Mapping[str, Any], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __contains__(self, key: object) -> bool:
        return f"{self.prefix}{key}" in self.dataset

    def __iter__(self) -> Iterator[str]:
        size = len(self.prefix)
        return iter([k[size:] for k in self.dataset if k.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for k in self.dataset if k.startswith(self.prefix))


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """Read-only mapping of weights held in memory (``state_dict``) or on disk (``index``).

    Disk weights are memory-mapped on each access and released with the returned tensor.

    Args:
        state_dict: weights kept in memory; they take priority.
        save_folder: folder of ``.dat`` files and ``index.json``.
        index: the index; read from ``save_folder/index.json`` when not given.
        device: device to load safetensors entries on (cpu by default).

    Raises:
        ValueError: if none of ``state_dict``, ``save_folder`` and ``index`` is given.
    """

    def __init__(
        self,
        state_dict: dict[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike[str] | None = None,
        index: Mapping[str, Any] | None = None,
        device: int | str | torch.device | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError(
                "OffloadedWeightsLoader needs a state_dict, a save_folder or an index: pass at "
                "least one of them."
            )
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = save_folder
        if index is None and save_folder is not None:
            path = Path(save_folder) / "index.json"
            index = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        self.index: Mapping[str, Any] = {} if index is None else index
        self.all_keys = list(self.state_dict)
        self.all_keys += [k for k in self.index if k not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        found = self.state_dict.get(key)
        if found is not None:
            return found
        info = self.index[key]
        source = info.get("safetensors_file")
        if source is not None:
            tensor = read_safetensors_tensor(source, info.get("weight_name", key))
            if "dtype" in info and _dtype_name(tensor.dtype) != info["dtype"]:
                tensor = tensor.to(getattr(torch, info["dtype"]))
        else:
            if self.save_folder is None:
                raise ValueError(f"weight {key!r} is on disk but the loader has no save_folder")
            tensor = load_offloaded_weight(Path(self.save_folder) / f"{key}.dat", info)
        if self.device is not None:
            tensor = tensor.to(self.device)
        return tensor

    def __contains__(self, key: object) -> bool:
        return key in self.state_dict or key in self.index

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def extract_submodules_state_dict(
    state_dict: dict[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """Keep the entries of ``state_dict`` that belong to the given submodules (or are them)."""
    result: dict[str, torch.Tensor] = {}
    if "" in submodule_names:
        return dict(state_dict)
    wanted = set(submodule_names)
    for key, value in state_dict.items():
        probe = key
        while probe:
            if probe in wanted:
                result[key] = value
                break
            probe = probe.rpartition(".")[0]
    return result


def load_offloaded_weights(
    model: nn.Module, index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]
) -> None:
    """Load every weight listed in ``index`` from ``offload_folder`` into ``model`` on cpu."""
    if not index:
        return
    for name, info in index.items():
        if name.endswith(".SCB"):
            continue
        statistics = None
        scb = name.rpartition(".")[0] + ".SCB" if name.endswith(".weight") else None
        if scb is not None and scb in index:
            statistics = load_offloaded_weight(Path(offload_folder) / f"{scb}.dat", index[scb])
        weight = load_offloaded_weight(Path(offload_folder) / f"{name}.dat", info)
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)  # type: ignore[arg-type]
