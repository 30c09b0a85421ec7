"""Model weights in a checkpoint: safetensors without a second copy, and tied-weight aliases.

Reading decodes the verified bytes in place (`hasten.core.safetensors_format`, the one codec,
``torch.frombuffer``), so the tensors are views of the one buffer that was checksummed: peak
memory while loading is the model plus one file.
"""

from __future__ import annotations

import json
import logging
import mmap
from typing import Any

import torch

from hasten.core.safetensors_format import DTYPE_CODES, decode_safetensors, encode_safetensors

__all__ = [
    "ALIASES_KEY",
    "clean_state_dict_for_safetensors",
    "dedupe_shared_tensors",
    "id_tensor_storage",
    "safetensors_bytes",
    "tensors_from_safetensors",
    "write_safetensors",
]

logger = logging.getLogger(__name__)

# safetensors metadata key listing tied names dropped from the file (alias -> kept name).
ALIASES_KEY = "hasten_tied_aliases"


def dedupe_shared_tensors(
    state_dict: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one name per shared storage (tied weights); return the rest as ``alias -> kept``.

    safetensors refuses tensors that share memory; the aliases are stored in the manifest and
    put back on load, so a model with tied embeddings round-trips without duplication.
    """
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    owner: dict[tuple[Any, ...], str] = {}
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            kept[name] = tensor
            continue
        key = (
            tensor.untyped_storage().data_ptr(),
            int(tensor.storage_offset()),
            tuple(tensor.shape),
            tensor.dtype,
        )
        if key in owner:
            aliases[name] = owner[key]
            continue
        owner[key] = name
        kept[name] = tensor
    return kept, aliases


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """Identify `tensor`'s storage as ``(device, data pointer, bytes)``: equal for shared memory.

    Two tensors with the same triple are views of one storage (tied weights), which safetensors
    refuses to save twice. Meta tensors have no pointer (0) and report their own size.
    """
    if tensor.device.type == "xla":
        xla = __import__("torch_xla")  # optional: torch_xla
        return tensor.device, int(xla._XLAC._xla_get_tensor_id(tensor)), 0
    if tensor.device.type == "meta":
        return tensor.device, 0, tensor.nelement() * tensor.element_size()
    storage = tensor.untyped_storage()
    return tensor.device, int(storage.data_ptr()), int(storage.nbytes())


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop, from `state_dict` itself, every name but the first of each shared storage; make tensors contiguous.

    safetensors refuses aliased tensors (tied weights). Removed names are logged: a model that
    ties them again on load gets them back. Non-tensor entries (bitsandbytes metadata strings)
    are kept. Returns a new dict of the remaining entries.
    """
    first: dict[tuple[Any, int, int], str] = {}
    removed: list[str] = []
    for name, tensor in list(state_dict.items()):
        if isinstance(tensor, str):
            continue
        key = id_tensor_storage(tensor)
        if key[1] == 0:  # meta: no storage to share
            continue
        if key in first:
            removed.append(name)
            del state_dict[name]
        else:
            first[key] = name
    if removed:
        logger.warning(
            "Removed shared tensor %s while saving. This should be OK, but check by verifying "
            "that you don't receive any warning while reloading",
            set(removed),
        )
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def safetensors_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """Serialize a state dict to safetensors bytes, storing tied weights once.

    The dropped names go to the file's metadata, and `tensors_from_safetensors` ties them back.
    """
    from safetensors.torch import save

    kept, aliases = dedupe_shared_tensors(state_dict)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in kept.items()}
    metadata = {"format": "pt"}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    return save(tensors, metadata=metadata)


def write_safetensors(handle: Any, state_dict: dict[str, torch.Tensor]) -> None:
    """Stream ``state_dict`` to ``handle`` in the safetensors format, straight from tensor memory.

    Unlike serializing to bytes first, no copy of the whole file is ever built
    (`encode_safetensors`). Tied weights are stored once (see `safetensors_bytes`); the output
    loads with ``safetensors.torch.load_file``.
    """
    kept, aliases = dedupe_shared_tensors(state_dict)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in kept.items()}
    if any(t.dtype not in DTYPE_CODES for t in tensors.values()):  # rare dtypes: the library
        handle.write(safetensors_bytes(state_dict))
        return
    metadata = {"format": "pt"}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    encode_safetensors(handle, tensors, metadata)


def tensors_from_safetensors(buffer: bytearray | mmap.mmap) -> dict[str, torch.Tensor]:
    """Zero-copy tensors over a safetensors file held in ``buffer``, tied names restored.

    Raises:
        ValueError: the buffer is not a valid safetensors file (the message says what is off).
    """
    tensors, metadata = decode_safetensors(buffer)
    for alias, kept in json.loads(metadata.get(ALIASES_KEY, "{}")).items():
        tensors[alias] = tensors[kept]
    return tensors
