"""save_state / load_state on disk: every process's share, written crash-safely, verified on load.

A checkpoint is written into a hidden staging folder beside its final name; each file is fsynced
as it is written, then the main process writes the manifest (sizes and block checksums of every
file from every process) and renames the folder into place. A crash at any moment leaves the previous
checkpoints untouched and at most a staging folder that nothing will load.

Exact resume: a checkpoint holds, besides models, optimizers, schedulers, scaler and custom
objects, each process's RNG states and accumulated (not yet stepped) gradients, the
accumulation counter, and every prepared loader's epoch, position and epoch-start generator
states. After `load_accelerator_state` both conventions continue bit for bit: iterating the
loaded loader resumes at the saved position, and ``skip_first_batches(loader, n)`` (Accelerate's
way, n = batches this process consumed in the epoch) replays the saved epoch's order and skips n
(not n twice); the loader then goes on with the next epoch as the uninterrupted run would.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hasten.checkpointing.rng import capture_rng_state, has_saved_rng_state, restore_rng_state
from hasten.checkpointing.sharded_state import (
    load_sharded_parts,
    make_part_folders,
    optimizer_owner,
    sharded_model_dir,
    sharded_optimizer_dir,
    stage_sharded,
)
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.agreement import (
    agree_on_outcome,
    background_comm,
    background_group,
    missing_files,
    next_token,
    require_one_folder,
)
from hasten.checkpointing.storage.engine_files import (
    EngineCheckpoint,
    EngineFiles,
    load_engine_checkpoint,
)
from hasten.checkpointing.storage.manifest import CorruptCheckpointError, read_manifest
from hasten.checkpointing.storage.reader import CheckpointReader, PendingRead
from hasten.checkpointing.storage.writer import (
    FileJob,
    HostBuffers,
    PendingSave,
    SavePlan,
    Snapshot,
    model_jobs,
    pickle_job,
    run_plan,
    safetensors_job,
    start_adopting,
    start_jobs,
)
from hasten.core.errors import CheckpointNotFoundError
from hasten.core.nested import recursively_apply
from hasten.ops.comm import current_comm
from hasten.optimizer import unwrap_optimizer
from hasten.state import PartialState, recorder
from hasten.strategies import Strategy
from hasten.strategies.sharded import by_position, keyed_by_name

__all__ = [
    "CheckpointContents",
    "finish_async_save",
    "load_contents",
    "save_contents",
]


logger = logging.getLogger(__name__)


@dataclass
class CheckpointContents:
    """What a checkpoint holds, in the order the Accelerator prepared or registered it.

    For saving, ``model_states`` holds each model's state dict (hooks already applied); for
    loading, ``models`` holds the unwrapped modules to load into. ``prepared_models`` are the
    modules prepare returned and ``engine`` the strategy, which gives sharded state dicts when its
    ``checkpoint_layout`` is "sharded" (see `hasten.checkpointing.sharded_state`).
    """

    model_states: list[dict[str, torch.Tensor]] = field(default_factory=list)
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)
    scaler: Any | None = None
    prepared_models: list[torch.nn.Module] = field(default_factory=list)
    optimizer_states: list[dict[str, Any]] | None = None  # precomputed (full, gathered) states
    engine: Any = None  # the strategy: state dicts and ``checkpoint_layout`` (see StateDictSource)


def _sharded(contents: CheckpointContents) -> bool:
    return getattr(contents.engine, "checkpoint_layout", "replicated") == "sharded"


def _shards_parameters(contents: CheckpointContents) -> bool:
    return bool(getattr(contents.engine, "shards_parameters", False))


def _self_writing_engine(contents: CheckpointContents) -> EngineCheckpoint | None:
    """The strategy when its engine writes models/optimizers/schedulers itself (DeepSpeed)."""
    engine = contents.engine
    return engine if getattr(engine, "checkpoint_layout", None) == "engine" else None


def _shared_jobs(
    contents: CheckpointContents, copy: Callable[[Any], Any], deferred: Snapshot | None
) -> list[FileJob]:
    jobs = []
    optimizers = [] if _sharded(contents) else contents.optimizers
    for i, optimizer in enumerate(optimizers):
        name = paths.optimizer_file(i)
        given = contents.optimizer_states
        state = given[i] if given is not None else optimizer.state_dict()
        if deferred is not None and _on_cpu(state) and set(state) == {"state", "param_groups"}:
            # only the per-parameter state waits for the writer thread: a tensor learning rate
            # in param_groups may be changed in place by a scheduler before the next step
            groups = copy(state["param_groups"])
            jobs.append(
                deferred.job(name, {**state, "param_groups": groups}, unwrap_optimizer(optimizer))
            )
        else:
            jobs.append(pickle_job(name, copy(state)))
    jobs += [
        pickle_job(paths.scheduler_file(i), copy(s.state_dict()))
        for i, s in enumerate(contents.schedulers)
    ]
    jobs += [
        pickle_job(paths.dataloader_state_file(i), copy(d.state_dict()))
        for i, d in enumerate(contents.dataloaders)
        if hasattr(d, "state_dict")
    ]
    jobs += [
        pickle_job(paths.custom_object_file(i), copy(c.state_dict()))
        for i, c in enumerate(contents.custom_objects)
    ]
    if contents.scaler is not None:
        jobs.append(pickle_job(paths.scaler_file(), copy(contents.scaler.state_dict())))
    return jobs


def _identity(obj: Any) -> Any:
    return obj


def _on_cpu(obj: Any) -> bool:
    found: list[bool] = []
    recursively_apply(lambda t: found.append(t.device.type == "cpu"), obj)
    return all(found)


def _gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _warn_sharded_gradients(models: list[torch.nn.Module]) -> None:
    if any(p.grad is not None for m in models for p in m.parameters()):
        warnings.warn(
            "save_state() with a sharding engine does not save accumulated gradients; the "
            "checkpoint resumes exactly only at an optimizer-step boundary (save after "
            "optimizer.step() and zero_grad()).",
            RuntimeWarning,
            stacklevel=4,
        )


def _gradient_jobs(
    models: list[torch.nn.Module], rank: int, copy: Callable[[Any], Any]
) -> list[FileJob]:
    """Gradients this process holds (accumulated, not yet stepped): one file per model.

    Saved only when present, so a checkpoint taken mid-accumulation resumes bitwise; each
    process writes its own, since with DDP's no_sync they differ between processes.
    """
    jobs: list[FileJob] = []
    for index, model in enumerate(models):
        grads = _gradients(model)
        if grads:
            name = paths.gradients_file(index, rank)
            jobs.append(safetensors_job(name, copy(grads)))
    return jobs


def save_contents(
    output_dir: str | os.PathLike[str],
    contents: CheckpointContents,
    *,
    step: int = 0,
    safe_serialization: bool = True,
    save_on_each_node: bool = False,
    async_save: bool = False,
    total_limit: int | None = None,
    project_dir: str | None = None,
    host_buffers: HostBuffers | None = None,
    pre_hooks: Callable[[Path], None] | None = None,
) -> Path | PendingSave:
    """Write a complete checkpoint of ``contents`` to ``output_dir`` on every process together.

    Every process must call this. Synchronously it returns the final folder once it is
    published everywhere. With ``async_save`` it returns a `PendingSave` as soon as the state is
    copied to host memory; the files are written and published on a background thread.
    ``total_limit`` (with ``project_dir``) prunes the oldest automatic checkpoints after publishing.
    ``host_buffers`` (async only) are reused from the previous asynchronous save.
    ``pre_hooks`` (the user's save-state pre-hooks) run on every process with the staging folder
    before anything is written: the files they leave there are published with the checkpoint
    (and listed in its manifest), and model states they remove are not saved.
    """
    self_writing = _self_writing_engine(contents)
    state = PartialState()
    token = next_token()  # every process, first: the save's name and staging folder
    buffers = (host_buffers or HostBuffers()) if async_save else None
    if buffers is not None:
        buffers.begin()
    copy = buffers.copy if buffers is not None else _identity
    # Optimizer states are copied on the writer thread; their next step waits for that copy.
    deferred = Snapshot(buffers) if buffers is not None else None
    plan = SavePlan(
        final=Path(output_dir).absolute(),
        rank=state.process_index,
        num_processes=state.num_processes,
        is_writer=state.is_local_main_process if save_on_each_node else state.is_main_process,
        token=token,
        total_limit=total_limit,
        project_dir=project_dir,
    )
    plan.extra = {"step": step, "num_processes": state.num_processes}
    _claim_staging(plan, contents, save_on_each_node)
    try:
        if pre_hooks is not None and plan.failure is None:
            # the user's save pre-hooks write into the staging folder: their files are
            # published with the checkpoint (listed by the folder's owner), and model states
            # they remove are not saved
            pre_hooks(plan.staging)
            plan.adopt_unlisted = True
        _plan_jobs(plan, contents, copy, deferred, step, safe_serialization)
    except Exception as exc:  # noqa: BLE001 - the agreement tells every process, then raises
        if self_writing is not None or _sharded(contents):
            raise
        plan.failure, plan.jobs = exc, []
    staged = stage_sharded(contents, copy, deferred) if _sharded(contents) else None
    if buffers is not None:
        buffers.finish()  # device copies landed: training may change the originals now
    recorder.note(f"save_state: writing {_names(plan)} into {plan.staging}")
    if self_writing is not None:
        _engine_save(self_writing, plan, buffers)
    if staged is not None:  # collective: every process writes its shards, in parallel
        if state.is_main_process:
            make_part_folders(plan.staging, staged.names)
        if buffers is not None:  # DCP runs on the writer thread, over a group of its own
            group = background_group(buffers)
            return PendingSave(plan, deferred, before=lambda: staged.write(plan, deferred, group))
        try:
            staged.write(plan, None, None)
        except Exception as exc:  # noqa: BLE001 - nothing is published; every process raises
            shutil.rmtree(plan.staging, ignore_errors=True)
            agree_on_outcome(exc)
            raise
    if async_save:  # the agreement runs on the writer thread, over a group of its own
        plan.comm = background_comm(buffers)
        return PendingSave(plan, deferred)
    plan.comm = current_comm()
    try:
        final = run_plan(plan)
    except Exception as exc:  # noqa: BLE001 - every process learns the outcome, then raises
        agree_on_outcome(exc)
        raise
    agree_on_outcome(None)  # published before any process goes on
    return final


def _claim_staging(plan: SavePlan, contents: CheckpointContents, save_on_each_node: bool) -> None:
    """Make this process's staging folder, claim it, and settle whether it writes the shared files.

    Sharded and engine checkpoints need one folder every process writes: refused on every
    process before anything is written otherwise, and then only the main process writes the
    shared files. With ``save_on_each_node``, of several machines' writers that do share a
    folder only the first writes them. A folder that cannot be made is kept as the plan's
    failure, which the agreement tells every process. Ends with a barrier: every process's claim
    is in place, so the claims each process sees in its folder are exactly who shares it.
    """
    state = PartialState()
    recorder.note(f"save_state: making {plan.staging}")
    try:
        plan.agreement.claim()
    except OSError as exc:
        plan.failure = OSError(exc.errno, f"Cannot make the checkpoint folder: {exc}")
    self_writing = _self_writing_engine(contents)
    if self_writing is not None or _sharded(contents):
        what = "A sharded checkpoint" if self_writing is None else "A DeepSpeed checkpoint"
        try:
            require_one_folder(plan.agreement, what, plan.failure)
        finally:
            recorder.note(None)
        plan.is_writer = state.is_main_process
    else:
        state.wait_for_everyone()  # every claim is in place before any process looks for one
        if plan.failure is None and plan.is_writer and save_on_each_node:
            plan.is_writer = state.num_processes == 1 or plan.agreement.take_shared_files()


def _plan_jobs(
    plan: SavePlan,
    contents: CheckpointContents,
    copy: Callable[[Any], Any],
    deferred: Snapshot | None,
    step: int,
    safe_serialization: bool,
) -> None:
    """The files this process writes: the shared ones (if it is a writer), then its own."""
    if plan.failure is not None:
        return
    if plan.is_writer:
        states = [copy(s) for s in contents.model_states]
        plan.jobs = model_jobs(states, safe_serialization)
        plan.jobs += _shared_jobs(contents, copy, deferred)
        plan.shared_names = [job.name for job in plan.jobs]
    if _shards_parameters(contents):
        _warn_sharded_gradients(contents.models)
    else:
        plan.jobs += _gradient_jobs(contents.models, plan.rank, copy)
    rng = {**capture_rng_state(), "step": step}
    plan.jobs.append(pickle_job(paths.rng_file(plan.rank), rng))


def _engine_save(engine: EngineCheckpoint, plan: SavePlan, buffers: HostBuffers | None) -> None:
    """The engine writes its files through hasten's writer (copies them, when asynchronous).

    Every process's staging folder exists (`require_one_folder` made sure it is the same one),
    so hasten's own files are written beside the engine's from the start. A failure to write a
    file is reported in the agreement every process joins after writing.
    """
    if buffers is not None:
        files = EngineFiles(plan.staging, buffers.copy)
    else:
        files = EngineFiles(plan.staging)
        start_jobs(plan)
    try:
        engine.save_checkpoint(plan.staging, files)
    except BaseException:
        shutil.rmtree(plan.staging, ignore_errors=True)
        raise
    if buffers is not None:
        plan.jobs += [FileJob(name, write) for name, write in files.jobs()]
        buffers.finish()  # device copies of the engine's state landed
    elif plan.is_writer:
        start_adopting(plan, _engine_written_top_level(plan))
    plan.engine_files = files
    plan.adopt_unlisted = True


def _names(plan: SavePlan) -> str:
    """The files this process writes, for the hang recorder's report."""
    names = [job.name for job in plan.jobs]
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _engine_written_top_level(plan: SavePlan) -> list[str]:
    """Top-level files of the staging folder the engine wrote by itself (DeepSpeed's ``latest``
    and recovery script), told apart from hasten's own: the writer's jobs and every process's
    RNG file, the only ones the other processes write there."""
    own = {job.name for job in plan.jobs} | {
        paths.rng_file(rank) for rank in range(plan.num_processes)
    }
    return [
        entry.name
        for entry in os.scandir(plan.staging)
        if entry.is_file() and not entry.name.startswith(".") and entry.name not in own
    ]


def finish_async_save(pending: PendingSave) -> Path:
    """Wait for an asynchronous save on every process together; return the published folder.

    The writer publishes only after every process has written its share, so a process whose
    own part is done waits here until the folder exists everywhere (and learns if any process
    failed) before it may load or save again. Every process must call this.
    """
    error: BaseException | None = None
    try:
        pending.wait()
    except Exception as exc:  # noqa: BLE001 - every process learns the outcome, then raises
        error = exc
    agree_on_outcome(error)
    if error is not None:
        raise error
    return pending.plan.final


def _warn_or_raise(part: str, exc: BaseException, strict: bool) -> None:
    message = f"Could not restore {part} from the checkpoint: {exc}"
    if strict:
        raise RuntimeError(
            message + " (pass strict=False to skip this part with a warning)"
        ) from exc
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _open_manifest(folder: Path, strict: bool) -> dict[str, Any] | None:
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"No checkpoint folder at {folder}. Pass the folder that save_state wrote, or call "
            "load_state() without arguments to load the newest complete automatic checkpoint."
        )
    try:
        return read_manifest(folder)
    except CorruptCheckpointError as exc:
        if strict:
            raise
        warnings.warn(f"{exc} Loading without verification.", RuntimeWarning, stacklevel=4)
        return None


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


def _start_model(
    files: CheckpointReader, index: int, model: torch.nn.Module, strict: bool, fresh: bool = False
) -> PendingRead:
    """Start reading model ``index``; a strict mismatch raises before any weight is touched.

    ``fresh``: the model's parameters are sharded, so read into new memory (no check against
    its local state dict; the engine checks the full one).
    """
    if fresh:
        safe_name = paths.model_file(index, True)
        if files.exists(safe_name):
            return files.start_tensors(safe_name, like=None)
        return files.start_unpickle(paths.model_file(index, False), "cpu")

    def check(state: dict[str, torch.Tensor]) -> None:
        problem = _mismatch(model, state)
        if problem and strict:
            raise ValueError(
                f"The checkpoint's model {index} does not match the model given: {problem}. "
                "Load a checkpoint of this model, or pass strict=False to load the matching "
                "keys only."
            )

    safe_name = paths.model_file(index, True)
    current = model.state_dict(keep_vars=True)  # large files are read into these in place
    if files.exists(safe_name):
        return files.start_tensors(safe_name, like=current, check=check)
    return files.start_unpickle(paths.model_file(index, False), "cpu", like=current, check=check)


def _apply_model(
    index: int, model: torch.nn.Module, state: dict[str, torch.Tensor], strict: bool
) -> None:
    problem = _mismatch(model, state)
    if problem:
        own = model.state_dict()
        state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
        warnings.warn(f"Model {index}: loading matching keys only ({problem}).", stacklevel=4)
    model.load_state_dict(state, strict=strict)


def _load_gradients(files: CheckpointReader, models: list[torch.nn.Module]) -> None:
    """Put back the gradients this process had accumulated when the checkpoint was taken."""
    rank = PartialState().process_index
    for index, model in enumerate(models):
        name = paths.gradients_file(index, rank)
        if not files.exists(name):
            continue
        grads = files.tensors(name)
        params = dict(model.named_parameters())
        unknown = sorted(set(grads) - set(params))
        if unknown:
            raise ValueError(
                f"{files.folder / name} holds gradients for parameters the model does not have "
                f"(first: {', '.join(unknown[:3])}). Load a checkpoint of this model."
            )
        for key, grad in grads.items():
            param = params[key]
            param.grad = grad.to(device=param.device, dtype=param.dtype, copy=True)


def _check_counts(folder: Path, contents: CheckpointContents) -> None:
    if _self_writing_engine(contents) is not None:  # the engine checks its parts itself
        return
    found = {
        "models": len(
            [p for p in folder.iterdir() if p.name.startswith(("model", "pytorch_model"))]
        ),
        "custom objects": len(list(folder.glob("custom_checkpoint_*.pkl"))),
        "optimizers": len(
            [p for p in folder.glob("optimizer*") if p.suffix == ".bin" or p.is_dir()]
        ),
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


def load_contents(
    input_dir: str | os.PathLike[str],
    contents: CheckpointContents,
    *,
    map_location: Any = "cpu",
    strict: bool = True,
) -> dict[str, Any]:
    """Restore ``contents`` from a checkpoint; return the saved attributes (``{"step": ...}``).

    Every process must call this: they agree on the outcome, so a process that cannot load
    makes every other one raise too (naming it), instead of leaving them to wait for it in the
    next collective.

    Raises:
        CheckpointNotFoundError: (a ValueError, as in Accelerate, and a FileNotFoundError)
            ``input_dir`` does not exist, or lacks files this process needs (the processes
            did not share one folder when saving: the message says where they were written).
        CorruptCheckpointError: partial or damaged checkpoint (names the file).
        ValueError: a different model or a different number of prepared/registered objects.
        RuntimeError: a part (RNG, sampler, scaler, custom object, ...) could not be restored;
            with ``strict=False`` each such part warns instead; or another process could not
            load.
    """
    recorder.note(f"load_state: reading {Path(input_dir).absolute()}")
    error: Exception | None = None
    try:
        attributes = _load_contents(Path(input_dir), contents, map_location, strict)
    except Exception as exc:  # noqa: BLE001 - every process learns the outcome, then raises
        error = exc
    try:
        agree_on_outcome(error, "The checkpoint was not loaded")
    finally:
        recorder.note(None)
    if error is not None:
        raise error
    return attributes


def _load_contents(
    folder: Path, contents: CheckpointContents, map_location: Any, strict: bool
) -> dict[str, Any]:
    manifest = _open_manifest(folder, strict)
    if manifest is not None:
        missing = missing_files(folder, manifest, PartialState().process_index)
        if missing is not None:
            raise CheckpointNotFoundError(missing)
    _check_counts(folder, contents)
    self_writing = _self_writing_engine(contents)
    if self_writing is not None:
        load_engine_checkpoint(self_writing, folder, manifest, strict, _agree_on_load)
    engine = contents.engine if contents.engine is not None else Strategy()
    prepared = contents.prepared_models or contents.models
    dcp_models = [i for i in range(len(prepared)) if (folder / sharded_model_dir(i)).is_dir()]
    dcp_optimizers = [
        i for i in range(len(contents.optimizers)) if (folder / sharded_optimizer_dir(i)).is_dir()
    ]
    with CheckpointReader(folder, manifest) as files:
        # Every file is parsed and queued first, so parsing one overlaps reading the others;
        # each is applied only once all its blocks are read and verified.
        gathered = _shards_parameters(contents)
        models = [
            None if i in dcp_models else _start_model(files, i, m, strict, fresh=gathered)
            for i, m in enumerate(contents.models)
        ]
        parts = [
            (part, target, _start_part(files, name, target, contents, map_location))
            for part, name, target in _stateful_parts(contents, skip=dcp_optimizers)
        ]
        if dcp_models or dcp_optimizers:  # one DCP load for every sharded part
            load_sharded_parts(
                folder,
                engine,
                {i: prepared[i] for i in dcp_models},
                {i: contents.optimizers[i] for i in dcp_optimizers},
                prepared,
                manifest,
            )
        for index, (model, pending) in enumerate(zip(contents.models, models)):
            if pending is None:
                continue
            if gathered:
                engine.load_model_state_dict(prepared[index], pending.result(), strict=strict)
            else:
                _apply_model(index, model, pending.result(), strict)
        if not gathered:
            _load_gradients(files, contents.models)
        for part, target, started in parts:
            try:
                if isinstance(started, BaseException):
                    raise started
                _restore(target, started.result(), contents, engine, prepared)
            except CorruptCheckpointError:
                raise
            except Exception as exc:  # noqa: BLE001 - named and re-raised, or warned if non-strict
                _warn_or_raise(part, exc, strict)
        return {"step": _load_rng(files, _read_rng(files), strict)}


def _restore(
    target: Any, state: Any, contents: CheckpointContents, engine: Any, prepared: list[Any]
) -> None:
    """Load one part; an optimizer through a sharding engine, or by name (see `by_position`)."""
    sharded = _shards_parameters(contents)
    if any(target is o for o in contents.optimizers) and (sharded or keyed_by_name(state)):
        owner = optimizer_owner(target, prepared)
        if sharded:
            engine.load_optimizer_state_dict(owner, target, state, full=True)
            return
        module = engine.unwrap(owner, keep_torch_compile=False)
        state = by_position(module, unwrap_optimizer(target), state)
    target.load_state_dict(state)


def _agree_on_load(error: BaseException | None) -> None:
    """Every process learns whether any could not verify its engine files (see agree_on_outcome)."""
    try:
        agree_on_outcome(error, "The checkpoint was not loaded")
    except RuntimeError as exc:
        raise CorruptCheckpointError(str(exc)) from exc


def _start_part(
    files: CheckpointReader, name: str, target: Any, contents: CheckpointContents, where: Any
) -> PendingRead | Exception:
    """Start loading one stateful part; a failure is returned, to be raised in its turn."""
    # an optimizer's state tensors are replaced by the loaded ones anyway, so large files are
    # read into them in place (see hasten.checkpointing.storage.scatter)
    is_optimizer = any(target is o for o in contents.optimizers)
    like = _current_state(target) if is_optimizer and not _shards_parameters(contents) else None
    try:
        return files.start_unpickle(name, where, like=like)
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported in order by load_contents
        return exc


def _current_state(optimizer: Any) -> Any:
    """The optimizer's live state dict to read into, or None if it cannot give one cheaply."""
    try:
        return optimizer.state_dict()
    except Exception:  # noqa: BLE001 - e.g. ZeroRedundancyOptimizer before consolidation
        return None


def _stateful_parts(
    contents: CheckpointContents, skip: list[int] | None = None
) -> list[tuple[str, str, Any]]:
    """(name for errors, file, object) of everything restored through ``load_state_dict``.

    Optimizers listed in ``skip`` are loaded from their sharded folders instead.
    """
    parts: list[tuple[str, str, Any]] = [
        (f"optimizer {i}", paths.optimizer_file(i), o)
        for i, o in enumerate(contents.optimizers)
        if i not in (skip or [])
    ]
    parts += [
        (f"scheduler {i}", paths.scheduler_file(i), s) for i, s in enumerate(contents.schedulers)
    ]
    parts += [
        (f"dataloader {i}", paths.dataloader_state_file(i), d)
        for i, d in enumerate(contents.dataloaders)
        if hasattr(d, "load_state_dict")
    ]
    parts += [
        (f"custom object {i}", paths.custom_object_file(i), c)
        for i, c in enumerate(contents.custom_objects)
    ]
    if contents.scaler is not None:
        parts.append(("grad scaler", paths.scaler_file(), contents.scaler))
    return parts


def _read_rng(files: CheckpointReader) -> Any:
    """This process's saved RNG states, the exception reading them raised, or {} (resharded)."""
    rank = PartialState().process_index
    if not has_saved_rng_state(files.manifest, rank):  # warns: a process the save did not have
        return {}
    try:
        return files.unpickle(paths.rng_file(rank), "cpu")
    except Exception as exc:  # noqa: BLE001 - raised or warned about by _load_rng
        return exc


def _load_rng(files: CheckpointReader, rng: Any, strict: bool) -> int:
    """Restore the RNG states `_read_rng` gave; return the saved step."""
    saved_step = int((files.manifest or {}).get("step", 0))
    if isinstance(rng, CorruptCheckpointError):
        raise rng
    if isinstance(rng, Exception):
        _warn_or_raise("the RNG states", rng, strict)
        return saved_step
    step = int(rng.pop("step", saved_step))
    restore_rng_state(rng, strict=strict)
    return step
