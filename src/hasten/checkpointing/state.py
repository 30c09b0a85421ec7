"""save_state / load_state on disk: every process's share, written crash-safely, verified on load.

A checkpoint is written into a hidden staging folder beside its final name; each file is fsynced
as it is written, then the main process writes the manifest (sizes and CRC32 of every file from
every process) and renames the folder into place. A crash at any moment leaves the previous
checkpoints untouched and at most a staging folder that nothing will load.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing import layout
from hasten.checkpointing.io import fsync_directory, load
from hasten.checkpointing.manifest import (
    ChecksumWriter,
    CorruptCheckpointError,
    FileRecord,
    read_manifest,
    read_verified,
    write_manifest,
)
from hasten.checkpointing.rng import capture_rng_state, restore_rng_state
from hasten.checkpointing.tensors import (
    dedupe_shared_tensors,
    safetensors_bytes,
    tensors_from_safetensors,
)
from hasten.ops.collectives import gather_object
from hasten.state import PartialState

__all__ = ["CheckpointContents", "load_accelerator_state", "save_accelerator_state"]


@dataclass
class CheckpointContents:
    """What a checkpoint holds, in the order the Accelerator prepared or registered it.

    For saving, ``model_states`` holds each model's state dict (hooks already applied); for
    loading, ``models`` holds the unwrapped modules to load into.
    """

    model_states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)
    scaler: Any | None = None


def _write(folder: Path, name: str, write: Callable[[Any], None]) -> FileRecord:
    with open(folder / name, "wb") as handle:
        writer = ChecksumWriter(handle)
        write(writer)
        handle.flush()
        os.fsync(handle.fileno())
    return FileRecord(name, writer.size, writer.crc32)


def _write_pickle(folder: Path, name: str, obj: Any) -> FileRecord:
    return _write(folder, name, lambda w: torch.save(obj, w))


def _write_models(
    folder: Path, states: Sequence[dict[str, torch.Tensor]], safe: bool
) -> tuple[list[FileRecord], dict[str, dict[str, str]]]:
    records, aliases = [], {}
    for index, state in enumerate(states):
        name = layout.model_file(index, safe)
        if safe:
            kept, dropped = dedupe_shared_tensors(state)
            data = safetensors_bytes(kept, {})
            records.append(_write(folder, name, lambda w, d=data: w.write(d)))
            if dropped:
                aliases[name] = dropped
        else:
            records.append(_write_pickle(folder, name, state))
    return records, aliases


def _write_shared_parts(folder: Path, contents: CheckpointContents) -> list[FileRecord]:
    records = []
    for index, optimizer in enumerate(contents.optimizers):
        records.append(_write_pickle(folder, layout.optimizer_file(index), optimizer.state_dict()))
    for index, scheduler in enumerate(contents.schedulers):
        records.append(_write_pickle(folder, layout.scheduler_file(index), scheduler.state_dict()))
    for index, loader in enumerate(contents.dataloaders):
        if hasattr(loader, "state_dict"):
            name = layout.dataloader_state_file(index)
            records.append(_write_pickle(folder, name, loader.state_dict()))
    for index, obj in enumerate(contents.custom_objects):
        records.append(_write_pickle(folder, layout.custom_object_file(index), obj.state_dict()))
    if contents.scaler is not None:
        records.append(_write_pickle(folder, layout.scaler_file(), contents.scaler.state_dict()))
    return records


def save_accelerator_state(
    output_dir: str | os.PathLike[str],
    contents: CheckpointContents,
    *,
    step: int = 0,
    safe_serialization: bool = True,
    save_on_each_node: bool = False,
) -> Path:
    """Write a complete checkpoint of ``contents`` to ``output_dir`` on every process together.

    Returns the final folder. Every process must call this (it synchronises them).
    """
    state = PartialState()
    final = Path(output_dir).absolute()
    staging = layout.staging_path(final)
    writer = state.is_local_main_process if save_on_each_node else state.is_main_process
    if writer:
        final.parent.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            shutil.rmtree(staging)  # left by a save that crashed; never loadable
        staging.mkdir()
    state.wait_for_everyone()
    records: list[FileRecord] = []
    aliases: dict[str, dict[str, str]] = {}
    if writer:
        records, aliases = _write_models(staging, contents.model_states, safe_serialization)
        records += _write_shared_parts(staging, contents)
    rng = {**capture_rng_state(), "step": step}
    records.append(_write_pickle(staging, layout.rng_file(state.process_index), rng))
    everyone = (
        gather_object([(socket.gethostname(), records)])
        if state.num_processes > 1
        else [(socket.gethostname(), records)]
    )
    if writer:
        host = socket.gethostname()
        mine = [r for h, rs in everyone for r in rs if h == host or not save_on_each_node]
        extra = {"step": step, "num_processes": state.num_processes, "aliases": aliases}
        fsync_directory(staging)
        write_manifest(staging, mine, extra)
        layout.publish(staging, final)
    state.wait_for_everyone()
    return final


def _warn_or_raise(part: str, exc: BaseException, strict: bool) -> None:
    message = f"Could not restore {part} from the checkpoint: {exc}"
    if strict:
        raise RuntimeError(
            message + " (pass strict=False to skip this part with a warning)"
        ) from exc
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _open_manifest(folder: Path, strict: bool) -> dict[str, Any] | None:
    if not folder.is_dir():
        raise FileNotFoundError(
            f"No checkpoint folder at {folder}. Pass the folder that save_state wrote, or call "
            "load_state() without arguments to load the newest complete automatic checkpoint."
        )
    try:
        return read_manifest(folder)
    except CorruptCheckpointError as exc:
        if strict:
            raise
        warnings.warn(f"{exc} Loading without verification.", RuntimeWarning, stacklevel=3)
        return None


def _read_bytes(folder: Path, name: str, manifest: dict[str, Any] | None) -> bytearray:
    data = read_verified(folder, name, manifest)
    return bytearray(data) if not isinstance(data, bytearray) else data


def _load_pickle(folder: Path, name: str, manifest: dict[str, Any] | None, where: Any) -> Any:
    data = read_verified(folder, name, manifest)
    return load(io.BytesIO(data), map_location=where)


def _mismatch(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            parts.append(f"{len(items)} {label} (first: {', '.join(items[:3])})")
    return "; ".join(parts)


def _load_model(
    folder: Path, index: int, model: torch.nn.Module, manifest: dict[str, Any] | None, strict: bool
) -> None:
    safe_name = layout.model_file(index, True)
    if (folder / safe_name).is_file():
        state = tensors_from_safetensors(_read_bytes(folder, safe_name, manifest))
        for alias, kept in ((manifest or {}).get("aliases", {}).get(safe_name, {})).items():
            state[alias] = state[kept]
    else:
        state = _load_pickle(folder, layout.model_file(index, False), manifest, "cpu")
    problem = _mismatch(model, state)
    if problem and strict:
        raise ValueError(
            f"The checkpoint's model {index} does not match the model given: {problem}. Load a "
            "checkpoint of this model, or pass strict=False to load the matching keys only."
        )
    if problem:
        own = model.state_dict()
        state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
        warnings.warn(f"Model {index}: loading matching keys only ({problem}).", stacklevel=3)
    model.load_state_dict(state, strict=strict)


def _check_counts(folder: Path, contents: CheckpointContents) -> None:
    found = {
        "models": len(
            [p for p in folder.iterdir() if p.name.startswith(("model", "pytorch_model"))]
        ),
        "custom objects": len(list(folder.glob("custom_checkpoint_*.pkl"))),
        "optimizers": len(list(folder.glob("optimizer*.bin"))),
        "schedulers": len(list(folder.glob("scheduler*.bin"))),
    }
    given = {
        "models": len(contents.models),
        "custom objects": len(contents.custom_objects),
        "optimizers": len(contents.optimizers),
        "schedulers": len(contents.schedulers),
    }
    for part, count in found.items():
        if count != given[part]:
            raise ValueError(
                f"The checkpoint at {folder} holds {count} {part} but {given[part]} were "
                f"prepared or registered. Prepare/register the same {part} (in the same order) "
                "as when it was saved."
            )


def load_accelerator_state(
    input_dir: str | os.PathLike[str],
    contents: CheckpointContents,
    *,
    map_location: Any = "cpu",
    strict: bool = True,
) -> dict[str, Any]:
    """Restore ``contents`` from a checkpoint; return the saved attributes (``{"step": ...}``).

    Raises:
        FileNotFoundError: ``input_dir`` does not exist.
        CorruptCheckpointError: partial or damaged checkpoint (names the file).
        ValueError: a different model or a different number of prepared/registered objects.
        RuntimeError: a part (RNG, sampler, scaler, custom object, ...) could not be restored;
            with ``strict=False`` each such part warns instead.
    """
    folder = Path(input_dir)
    manifest = _open_manifest(folder, strict)
    _check_counts(folder, contents)
    for index, model in enumerate(contents.models):
        _load_model(folder, index, model, manifest, strict)
    parts: list[tuple[str, str, Any]] = [
        (f"optimizer {i}", layout.optimizer_file(i), o) for i, o in enumerate(contents.optimizers)
    ]
    parts += [
        (f"scheduler {i}", layout.scheduler_file(i), s) for i, s in enumerate(contents.schedulers)
    ]
    parts += [
        (f"dataloader {i}", layout.dataloader_state_file(i), d)
        for i, d in enumerate(contents.dataloaders)
        if hasattr(d, "load_state_dict")
    ]
    parts += [
        (f"custom object {i}", layout.custom_object_file(i), c)
        for i, c in enumerate(contents.custom_objects)
    ]
    if contents.scaler is not None:
        parts.append(("grad scaler", layout.scaler_file(), contents.scaler))
    for part, name, target in parts:
        try:
            target.load_state_dict(_load_pickle(folder, name, manifest, map_location))
        except CorruptCheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - named and re-raised, or warned when non-strict
            _warn_or_raise(part, exc, strict)
    rng_name = layout.rng_file(PartialState().process_index)
    try:
        rng = _load_pickle(folder, rng_name, manifest, "cpu")
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001
        _warn_or_raise("the RNG states", exc, strict)
        return {"step": (manifest or {}).get("step", 0)}
    step = rng.pop("step", (manifest or {}).get("step", 0))
    restore_rng_state(rng, strict=strict)
    return {"step": step}
