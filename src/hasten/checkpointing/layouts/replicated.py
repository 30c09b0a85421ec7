"""One copy of every model and optimizer, written by the main process (and how it is read back).

`ReplicatedLayout` is the layout of strategies whose processes each hold the whole model
(one process, DDP): the main process writes ``model.safetensors`` and ``optimizer.bin`` (each
process also its accumulated, not yet stepped, gradients), and a load reads them straight
into the live parameters and optimizer state tensors (see `hasten.checkpointing.storage.scatter`).
`GatheredLayout` is the same files for strategies whose parameters are split across
processes but which save full state dicts (FSDP's FULL_STATE_DICT): the state is gathered to
the main process first, and loaded through the strategy, which shards it again.

Loading follows what is on disk: a model or optimizer saved sharded (a DCP part folder) is
read through `hasten.checkpointing.layouts.parts.load_sharded_parts`, whatever the layout.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hasten.checkpointing.layouts.base import (
    CheckpointContents,
    CheckpointLayout,
    LayoutLoad,
    LayoutSave,
    on_cpu,
    warn_or_raise,
)
from hasten.checkpointing.layouts.parts import load_sharded_parts, optimizer_owner
from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.manifest import CorruptCheckpointError
from hasten.checkpointing.storage.reader import CheckpointReader, PendingRead
from hasten.checkpointing.storage.writer import FileJob, pickle_job, safetensors_job
from hasten.optimizer import unwrap_optimizer
from hasten.state import PartialState
from hasten.strategies.checkpoints import ShardedStateDicts, StateDicts
from hasten.strategies.sharded import by_position, keyed_by_name

__all__ = ["GatheredLayout", "ReplicatedLayout", "check_counts", "warn_unsaved_gradients"]


class ReplicatedLayout(CheckpointLayout):
    """Every process holds the whole model: one copy, from the main process, loaded in place.

    Args:
        strategy: what the models' state dicts are read through (an unwrapped module's own for
            a plain one; a sharded part on disk through its sharded state dicts).
    """

    def __init__(self, strategy: StateDicts) -> None:
        self.strategy = strategy

    def contents(
        self,
        *,
        models: Sequence[nn.Module],
        optimizers: Sequence[Any],
        schedulers: Sequence[Any],
        dataloaders: Sequence[Any],
        custom_objects: Sequence[Any],
        scaler: Any | None,
        for_save: bool,
        mid_cycle: bool = False,
    ) -> CheckpointContents:
        """The user's modules (unwrapped) and, for a save, their state dicts."""
        unwrapped = [self.strategy.unwrap(m) for m in models]
        contents = CheckpointContents(
            models=unwrapped,
            prepared_models=list(models),
            optimizers=list(optimizers),
            schedulers=list(schedulers),
            dataloaders=list(dataloaders),
            custom_objects=list(custom_objects),
            scaler=scaler,
            layout=self,
        )
        if for_save:
            self._take_states(contents)
        return contents

    def _take_states(self, contents: CheckpointContents) -> None:
        contents.model_states = [m.state_dict() for m in contents.models]

    # ------------------------------------------------------------------ save

    def plan(self, save: LayoutSave) -> None:
        """The main process writes the models and optimizers; each process its own gradients."""
        plan = save.plan
        if plan.is_writer:
            states = [save.copy(s) for s in save.contents.model_states]
            jobs = _model_jobs(states, save.safe_serialization) + _optimizer_jobs(save)
            plan.jobs += jobs
            plan.shared_names += [job.name for job in jobs]
        plan.jobs += self._own_jobs(save)

    def _own_jobs(self, save: LayoutSave) -> list[FileJob]:
        """Gradients this process holds (accumulated, not yet stepped): one file per model.

        Saved only when present, so a checkpoint taken mid-accumulation resumes bitwise; each
        process writes its own, since with DDP's no_sync they differ between processes.
        """
        jobs: list[FileJob] = []
        for index, model in enumerate(save.contents.models):
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            if grads:
                name = paths.gradients_file(index, save.plan.rank)
                jobs.append(safetensors_job(name, save.copy(grads)))
        return jobs

    # ------------------------------------------------------------------ load

    def _paired(self) -> ShardedStateDicts | None:
        """The strategy, when it gives a model's and its optimizer's shards in one pass."""
        return None

    def load(self, load: LayoutLoad) -> Callable[[], None]:
        """Start reading every model and optimizer file (a sharded part is read in `finish`)."""
        files, contents = load.files, load.contents
        folder = files.folder
        check_counts(folder, contents)
        prepared = contents.prepared_models or contents.models
        on_disk = [
            i for i in range(len(prepared)) if (folder / paths.sharded_model_dir(i)).is_dir()
        ]
        dcp_optimizers = [
            i
            for i in range(len(contents.optimizers))
            if (folder / paths.sharded_optimizer_dir(i)).is_dir()
        ]
        # Every file is parsed and queued first, so parsing one overlaps reading the others;
        # each is applied only once all its blocks are read and verified.
        models = [
            None if i in on_disk else self._start_model(files, i, m, load.strict)
            for i, m in enumerate(contents.models)
        ]
        optimizers = [
            (i, o, self._start_optimizer(files, i, o, load.map_location))
            for i, o in enumerate(contents.optimizers)
            if i not in dcp_optimizers
        ]

        def finish() -> None:
            if on_disk or dcp_optimizers:  # one DCP load for every sharded part
                load_sharded_parts(
                    folder,
                    self.strategy,
                    self._paired(),
                    {i: prepared[i] for i in on_disk},
                    {i: contents.optimizers[i] for i in dcp_optimizers},
                    prepared,
                    files.manifest,
                )
            for index, pending in enumerate(models):
                if pending is not None:
                    self._apply_model(index, contents, pending.result(), load.strict)
            self._load_gradients(files, contents.models)
            for index, optimizer, started in optimizers:
                try:
                    if isinstance(started, BaseException):
                        raise started
                    self._restore_optimizer(optimizer, started.result(), prepared)
                except CorruptCheckpointError:
                    raise
                except Exception as exc:  # noqa: BLE001 - named and re-raised, or warned
                    warn_or_raise(f"optimizer {index}", exc, load.strict, stacklevel=5)

        return finish

    def _start_model(
        self, files: CheckpointReader, index: int, model: nn.Module, strict: bool
    ) -> PendingRead:
        """Start reading model ``index`` into its live tensors; a strict mismatch raises first."""

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
        name = paths.model_file(index, False)
        return files.start_unpickle(name, "cpu", like=current, check=check)

    def _apply_model(
        self, index: int, contents: CheckpointContents, state: dict[str, Any], strict: bool
    ) -> None:
        model = contents.models[index]
        problem = _mismatch(model, state)
        if problem:
            own = model.state_dict()
            state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
            warnings.warn(f"Model {index}: loading matching keys only ({problem}).", stacklevel=5)
        model.load_state_dict(state, strict=strict)

    def _load_gradients(self, files: CheckpointReader, models: list[nn.Module]) -> None:
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
                    f"{files.folder / name} holds gradients for parameters the model does not "
                    f"have (first: {', '.join(unknown[:3])}). Load a checkpoint of this model."
                )
            for key, grad in grads.items():
                param = params[key]
                param.grad = grad.to(device=param.device, dtype=param.dtype, copy=True)

    def _start_optimizer(
        self, files: CheckpointReader, index: int, optimizer: Any, where: Any
    ) -> PendingRead | Exception:
        """Start reading optimizer ``index`` (into its live state tensors); a failure is
        returned, to be raised in its turn."""
        # its state tensors are replaced by the loaded ones anyway, so large files are read
        # into them in place (see hasten.checkpointing.storage.scatter)
        try:
            return files.start_unpickle(
                paths.optimizer_file(index), where, like=_current(optimizer)
            )
        except CorruptCheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported in order by finish()
            return exc

    def _restore_optimizer(self, optimizer: Any, state: Any, prepared: list[nn.Module]) -> None:
        """Load one optimizer's state; one keyed by parameter name (a sharding engine's full
        state) is numbered in this optimizer's order first (see `by_position`)."""
        if keyed_by_name(state):
            owner = optimizer_owner(optimizer, prepared)
            module = self.strategy.unwrap(owner, keep_torch_compile=False)
            state = by_position(module, unwrap_optimizer(optimizer), state)
        optimizer.load_state_dict(state)


class GatheredLayout(ReplicatedLayout):
    """Parameters split across processes, saved as one full copy gathered to the main process.

    The files are the replicated layout's; reading them back goes through the strategy, which
    shards what it loads (every process reads the whole file: nothing is read into place).
    Accumulated gradients are not saved (a warning says so).
    """

    def __init__(self, strategy: ShardedStateDicts) -> None:
        super().__init__(strategy)
        self.sharding = strategy

    def _take_states(self, contents: CheckpointContents) -> None:
        # gathered to the main process (collectives), before the user's pre-hooks see them
        prepared = contents.prepared_models
        contents.model_states = [self.sharding.model_state_dict(m, full=True) for m in prepared]
        contents.optimizer_states = [
            self.sharding.optimizer_state_dict(optimizer_owner(o, prepared), o, full=True)
            for o in contents.optimizers
        ]

    def _own_jobs(self, save: LayoutSave) -> list[FileJob]:
        warn_unsaved_gradients(save.contents.models, stacklevel=6)
        return []

    def _paired(self) -> ShardedStateDicts | None:
        return self.sharding

    def _start_model(
        self, files: CheckpointReader, index: int, model: nn.Module, strict: bool
    ) -> PendingRead:
        # the parameters are sharded: read into new memory (the strategy checks the full state)
        safe_name = paths.model_file(index, True)
        if files.exists(safe_name):
            return files.start_tensors(safe_name, like=None)
        return files.start_unpickle(paths.model_file(index, False), "cpu")

    def _apply_model(
        self, index: int, contents: CheckpointContents, state: dict[str, Any], strict: bool
    ) -> None:
        self.sharding.load_model_state_dict(
            (contents.prepared_models or contents.models)[index], state, strict=strict
        )

    def _load_gradients(self, files: CheckpointReader, models: list[nn.Module]) -> None:
        """Nothing: a sharding strategy's checkpoint holds no gradients."""

    def _start_optimizer(
        self, files: CheckpointReader, index: int, optimizer: Any, where: Any
    ) -> PendingRead | Exception:
        try:
            return files.start_unpickle(paths.optimizer_file(index), where)
        except CorruptCheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported in order by finish()
            return exc

    def _restore_optimizer(self, optimizer: Any, state: Any, prepared: list[nn.Module]) -> None:
        owner = optimizer_owner(optimizer, prepared)
        self.sharding.load_optimizer_state_dict(owner, optimizer, state, full=True)


def warn_unsaved_gradients(models: Sequence[nn.Module], stacklevel: int) -> None:
    """Warn that a sharding strategy's checkpoint leaves out the gradients accumulated so far."""
    if any(p.grad is not None for m in models for p in m.parameters()):
        warnings.warn(
            "save_state() with a sharding engine does not save accumulated gradients; the "
            "checkpoint resumes exactly only at an optimizer-step boundary (save after "
            "optimizer.step() and zero_grad()).",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


def _model_jobs(states: list[dict[str, torch.Tensor]], safe: bool) -> list[FileJob]:
    """Files for the model weights: safetensors (tied weights stored once) or pickles."""
    return [
        safetensors_job(paths.model_file(i, True), state)
        if safe
        else pickle_job(paths.model_file(i, False), state)
        for i, state in enumerate(states)
    ]


def _optimizer_jobs(save: LayoutSave) -> list[FileJob]:
    """One file per optimizer; a CPU state of an asynchronous save is copied on the writer thread."""
    jobs = []
    given = save.contents.optimizer_states
    for i, optimizer in enumerate(save.contents.optimizers):
        name = paths.optimizer_file(i)
        state = given[i] if given is not None else optimizer.state_dict()
        deferred = save.deferred
        if deferred is not None and on_cpu(state) and set(state) == {"state", "param_groups"}:
            # only the per-parameter state waits for the writer thread: a tensor learning rate
            # in param_groups may be changed in place by a scheduler before the next step
            groups = save.copy(state["param_groups"])
            jobs.append(
                deferred.job(name, {**state, "param_groups": groups}, unwrap_optimizer(optimizer))
            )
        else:
            jobs.append(pickle_job(name, save.copy(state)))
    return jobs


def _mismatch(model: nn.Module, state: dict[str, torch.Tensor]) -> str:
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


def _current(optimizer: Any) -> Any:
    """The optimizer's live state dict to read into, or None if it cannot give one cheaply."""
    try:
        return optimizer.state_dict()
    except Exception:  # noqa: BLE001 - e.g. ZeroRedundancyOptimizer before consolidation
        return None


def check_counts(folder: Path, contents: CheckpointContents) -> None:
    """Refuse a checkpoint of another number of models, optimizers, schedulers or custom objects.

    Raises:
        ValueError: names the part, both counts and the fix.
    """
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
