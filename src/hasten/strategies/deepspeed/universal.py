"""ZeRO checkpoints loaded on another number of processes, through DeepSpeed's universal checkpoint.

ZeRO stages 1-3 save each data-parallel rank's partition of the optimizer state (stage 3: of the
parameters too), and DeepSpeed loads those files only on the number of ranks that wrote them.
DeepSpeed's own answer is its universal checkpoint: ``ds_to_universal`` rewrites the partitions
as one file per parameter and state (``zero/<name>/{fp32,exp_avg,...}.pt``), which the engine
loads at any number of ranks (``checkpoint.load_universal``). `universal_checkpoint` runs that
conversion in-process (``ds_to_universal.main``, one worker, no offline step) and lets the engine
load the result with its universal path switched on for that one load.

Where the converted files go: a fresh folder in the node's temporary directory (``TMPDIR``),
written by each node's local main process and removed once every process loaded it. A kill
during the conversion leaves only that folder behind: the next attempt converts into a new one
and removes the folders of dead processes first, so it loads.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hasten.state import PartialState

__all__ = [
    "ZeroPartitions",
    "check_adam_state",
    "check_one_zero3_group",
    "check_same_model",
    "saved_partitions",
    "universal_checkpoint",
]

# ``[bf16_]zero_pp_rank_<r>_mp_rank_<m>_optim_states.pt`` (each ZeRO stage) and, for stage 3,
# ``zero_pp_rank_<r>_mp_rank_<m>_model_states.pt``: the files of data-parallel rank r.
_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt")
_MODEL3 = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt")
_MODEL = re.compile(r"mp_rank_\d+_model_states\.pt")
_PREFIX = "hasten-zero-universal-"


class ZeroPartitions:
    """What a ZeRO checkpoint's tag folder holds: its data-parallel size and parameter shapes.

    The size comes from the partition files' names, so a load at the same size reads nothing
    more than the engine does; the shapes (and the size DeepSpeed recorded) come from one
    model-states file's header, read only when the checkpoint is resharded (`check_complete`).

    Args:
        folder: the tag folder (``<checkpoint>/pytorch_model``).
        world_size: the data-parallel size the partition files' names show.
        model_file: the model-states file whose header records sizes and shapes.
    """

    def __init__(self, folder: Path, world_size: int, model_file: Path) -> None:
        self.folder = folder
        self.world_size = world_size
        self.model_file = model_file

    @functools.cached_property
    def _header(self) -> dict[str, Any]:
        # DeepSpeed's own file (verified against the manifest before any read): its tensors
        # are memory-mapped, not read; DeepSpeed's conversion loads it the same way.
        state: dict[str, Any] = torch.load(
            self.model_file, map_location="cpu", mmap=True, weights_only=False
        )
        return state

    @property
    def shapes(self) -> dict[str, torch.Size]:
        """Each parameter's name and shape, as DeepSpeed recorded them."""
        shapes: dict[str, torch.Size] = {}
        for group in self._header.get("param_shapes") or []:
            shapes.update(group)
        return shapes

    def check_complete(self, names: Sequence[str] | None = None) -> None:
        """Refuse a checkpoint missing some data-parallel ranks' files (names the ranks).

        Raises:
            FileNotFoundError: a rank below the recorded data-parallel size has no files.
        """
        names = names or sorted(e.name for e in os.scandir(self.folder) if e.is_file())
        recorded = int(self._header["dp_world_size"])
        missing = set(range(recorded)) - _ranks(names, _OPTIM)
        if _ranks(names, _MODEL3):
            missing |= set(range(recorded)) - _ranks(names, _MODEL3)
        if missing:
            raise FileNotFoundError(
                f"{self.folder} was saved by {recorded} data-parallel process(es) but the ZeRO "
                f"files of rank(s) {sorted(missing)} are missing (zero_pp_rank_<rank>_*_states.pt)"
                ": each rank's partition is needed to rebuild the state. Copy those files from "
                "the saving run's checkpoint folder (every process wrote its own; on several "
                "machines each wrote to its local disk), or load a complete checkpoint."
            )
        self.world_size = recorded


def _ranks(names: Sequence[str], pattern: re.Pattern[str]) -> set[int]:
    """The ranks in the file names that ``pattern`` matches."""
    return {int(m.group(1)) for m in map(pattern.fullmatch, names) if m is not None}


def saved_partitions(folder: Path) -> ZeroPartitions | None:
    """The partitions of the ZeRO checkpoint in tag folder ``folder``; None for a stage-0 one.

    Nothing is read: the size is the partition files' count by name (`ZeroPartitions`).

    Raises:
        FileNotFoundError: no model-states file, or a gap in the ranks' files (names them).
    """
    names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file())
    optim = _ranks(names, _OPTIM)
    if not optim:
        return None
    model = [n for n in names if _MODEL3.fullmatch(n) or _MODEL.fullmatch(n)]
    if not model:
        raise FileNotFoundError(
            f"{folder} holds ZeRO optimizer partitions but no model-states file "
            "(mp_rank_00_model_states.pt or zero_pp_rank_0_mp_rank_00_model_states.pt): the "
            "checkpoint is incomplete. Copy the whole checkpoint folder the saving run wrote."
        )
    saved = ZeroPartitions(folder, max(optim) + 1, folder / model[0])
    if len(optim) != saved.world_size:  # a gap: name the missing ranks
        saved.check_complete(names)
    return saved


def check_same_model(saved: ZeroPartitions, engine: Any) -> None:
    """Refuse a checkpoint whose parameters are not the engine's, before converting it.

    Raises:
        ValueError: names or shapes differ (says which, up to five of each).
    """
    current: dict[str, torch.Size] = {}
    for group in engine._get_zero_param_shapes():
        current.update(group)
    extra = sorted(set(saved.shapes) - set(current))
    absent = sorted(set(current) - set(saved.shapes))
    shapes = sorted(
        f"{name}: saved {tuple(saved.shapes[name])}, model {tuple(current[name])}"
        for name in set(saved.shapes) & set(current)
        if tuple(saved.shapes[name]) != tuple(current[name])
    )
    if extra or absent or shapes:
        found = [
            f"{what} {items[:5]}{' ...' if len(items) > 5 else ''}"
            for what, items in (
                ("parameters only in the checkpoint:", extra),
                ("parameters only in the model:", absent),
                ("different shapes:", shapes),
            )
            if items
        ]
        raise ValueError(
            f"{saved.folder} is a checkpoint of another model: " + "; ".join(found) + ". Load "
            "it into the model that saved it (same architecture and sizes, prepared in the same "
            "order), or load a checkpoint of this model."
        )


# The optimizers whose per-parameter state is exactly what the universal checkpoint holds
# (``step``, ``exp_avg``, ``exp_avg_sq``), by class name: torch's and DeepSpeed's Adam kinds.
_ADAM = frozenset({"Adam", "AdamW", "DeepSpeedCPUAdam", "FusedAdam"})


def check_adam_state(engine: Any, saved: int) -> None:
    """Refuse an optimizer whose state DeepSpeed's universal checkpoint would not carry.

    The conversion keeps each parameter's fp32 value and Adam moments only, so another
    optimizer's state (SGD's momentum, AMSGrad's maximum) would be lost without a word.

    Raises:
        ValueError: the engine's optimizer is not Adam/AdamW without AMSGrad (names it).
    """
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    name = type(inner).__name__
    amsgrad = any(group.get("amsgrad", False) for group in getattr(inner, "param_groups", []))
    if name in _ADAM and not amsgrad:
        return
    kind = f"{name} with amsgrad=True" if amsgrad else name
    raise ValueError(
        f"This ZeRO checkpoint was saved by {saved} process(es) and is loaded by "
        f"{engine.seq_dp_world_size}, which goes through DeepSpeed's universal checkpoint: it "
        "carries each parameter's fp32 value and Adam moments (exp_avg, exp_avg_sq) only, so "
        f"the state of {kind} would be lost. Load it on {saved} process(es), or train with "
        "torch.optim.Adam/AdamW (amsgrad=False) or DeepSpeed's Adam to resume on another "
        "number of processes."
    )


def check_one_zero3_group(engine: Any, saved: int) -> None:
    """Refuse a ZeRO-3 optimizer of several parameter groups on another number of processes.

    DeepSpeed's ZeRO-3 universal load gives every group the first group's settings (lr,
    weight_decay, ...); with those put back, a 2 -> 1 load still trained apart from the
    uninterrupted run (4e-4 relative after one step) while its state was bitwise equal, so it
    is refused rather than resumed inexactly.

    Raises:
        ValueError: ZeRO-3 with more than one parameter group.
    """
    if int(engine.zero_optimization_stage()) != 3:
        return
    groups = len(engine.optimizer.optimizer.param_groups)
    if groups > 1:
        raise ValueError(
            f"This ZeRO-3 checkpoint was saved by {saved} process(es) and is loaded by "
            f"{engine.seq_dp_world_size}, through DeepSpeed's universal checkpoint, which does "
            f"not restore ZeRO-3 optimizers of several parameter groups exactly (this one has "
            f"{groups}). Load it on {saved} process(es), use one parameter group, or use ZeRO "
            "stage 1 or 2 to resume on another number of processes."
        )


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_conversions(root: Path) -> None:
    """Remove the conversion folders of processes that are gone (killed while converting)."""
    for entry in root.glob(f"{_PREFIX}*"):
        pid = entry.name[len(_PREFIX) :].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _convert(source: Path, target: Path) -> None:
    """DeepSpeed's ``ds_to_universal`` of tag folder ``source`` into ``target``, in-process."""
    # optional: deepspeed
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(target),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # hasten's engines record no universal info of their own
    )
    # its step-by-step prints and progress bars are not the user's
    with (
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stdout(quiet),
        contextlib.redirect_stderr(quiet),
    ):
        ds_to_universal.main(args)


def _agree(error: BaseException | None) -> None:
    """Raise on every process if the conversion failed on any (a collective)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [f"process {rank}: {text}" for rank, text in enumerate(errors) if text is not None]
    if failed:
        raise RuntimeError(
            "Converting the ZeRO checkpoint to DeepSpeed's universal layout failed on "
            + "; ".join(failed)
        )


def _shared_name() -> str:
    """One conversion id for every process (process 0's choice)."""
    name = [uuid.uuid4().hex]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(name, src=0)
    return name[0]


@contextlib.contextmanager
def universal_checkpoint(engine: Any, saved: ZeroPartitions, tag: str) -> Iterator[Path]:
    """Convert ``saved`` to a universal checkpoint and switch the engine's universal load on.

    Yields the folder to pass to ``engine.load_checkpoint(folder, tag=tag)``. Every process
    calls it (collectives). On exit the engine's setting is restored and each node's local main
    process removes its converted files.
    """
    state = PartialState()
    root = Path(tempfile.gettempdir())
    # the name starts with the converting process's id: a later attempt removes it if that died
    name = _shared_name()
    folder = root / f"{_PREFIX}{os.getpid()}-{name}"
    if state.is_local_main_process:
        error: BaseException | None = None
        try:
            _remove_dead_conversions(root)
            folder.mkdir()
            _convert(saved.folder, folder / tag)
        except Exception as exc:
            error = exc
            shutil.rmtree(folder, ignore_errors=True)
        _agree(error)
    else:
        _agree(None)
    local = _local_main_folder(root, name)
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        yield local
    finally:
        config.load_universal_checkpoint = before
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if state.is_local_main_process:
            shutil.rmtree(folder, ignore_errors=True)


def _local_main_folder(root: Path, name: str) -> Path:
    """The folder this node's local main process converted into (its id is in the name)."""
    found = sorted(root.glob(f"{_PREFIX}*-{name}"))
    if len(found) != 1:
        raise RuntimeError(
            f"Expected one converted ZeRO checkpoint named *-{name} in {root}, found {found}: "
            "the temporary directory must not be shared between machines. Point TMPDIR at a "
            "node-local directory."
        )
    return found[0]
