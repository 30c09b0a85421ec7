"""Model files shared by the layouts that write whole models: weights, gradients, mismatches.

The replicated and gathered layouts write the same ``model.safetensors`` (or pickled) files;
they differ in how a load puts them back: `InPlaceModels` reads into the live tensors,
`StrategyModels` hands a fresh full state to the sharding strategy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from hasten.checkpointing.storage import paths
from hasten.checkpointing.storage.reader import CheckpointReader, PendingRead
from hasten.checkpointing.storage.writer import FileJob, pickle_job, safetensors_job
from hasten.strategies.checkpoints import ShardedStateDicts

__all__ = [
    "InPlaceModels",
    "StrategyModels",
    "gradient_jobs",
    "load_gradients",
    "mismatch",
    "model_jobs",
    "warn_unsaved_gradients",
]


def model_jobs(states: Sequence[dict[str, torch.Tensor]], safe: bool) -> list[FileJob]:
    """Files for the model weights: safetensors (tied weights stored once) or pickles."""
    return [
        safetensors_job(paths.model_file(i, True), state)
        if safe
        else pickle_job(paths.model_file(i, False), state)
        for i, state in enumerate(states)
    ]


def gradient_jobs(
    models: Sequence[nn.Module],
    rank: int,
    copy: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
) -> list[FileJob]:
    """Gradients this process holds (accumulated, not yet stepped): one file per model.

    Saved only when present, so a checkpoint taken mid-accumulation resumes bitwise; each
    process writes its own, since with DDP's no_sync they differ between processes.
    """
    jobs: list[FileJob] = []
    for index, model in enumerate(models):
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        if grads:
            jobs.append(safetensors_job(paths.gradients_file(index, rank), copy(grads)))
    return jobs


def load_gradients(files: CheckpointReader, models: Sequence[nn.Module], rank: int) -> None:
    """Put back the gradients this process had accumulated when the checkpoint was taken.

    Raises:
        ValueError: the file holds gradients of parameters the model lacks (names the first).
    """
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


def mismatch(model: nn.Module, state: dict[str, torch.Tensor]) -> str:
    """What differs between ``model``'s state dict and ``state`` ("" when they match)."""
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


class InPlaceModels:
    """Whole models read straight into their live tensors (every process holds the model)."""

    gradients = True

    def start(
        self, files: CheckpointReader, index: int, model: nn.Module, name: str, strict: bool
    ) -> PendingRead:
        """Start reading file ``name`` into model ``index``; a strict mismatch raises first.

        Raises:
            ValueError: (strict) the file holds another model (says what differs).
        """

        def check(state: dict[str, torch.Tensor]) -> None:
            problem = mismatch(model, state)
            if problem and strict:
                raise ValueError(
                    f"The checkpoint's model {index} does not match the model given: {problem}. "
                    "Load a checkpoint of this model, or pass strict=False to load the matching "
                    "keys only."
                )

        current = model.state_dict(keep_vars=True)  # large files are read into these in place
        if name.endswith(".safetensors"):
            return files.start_tensors(name, like=current, check=check)
        return files.start_unpickle(name, "cpu", like=current, check=check)

    def apply(
        self,
        index: int,
        model: nn.Module,
        prepared: nn.Module,
        state: dict[str, torch.Tensor],
        strict: bool,
    ) -> None:
        """Load ``state`` into ``model`` (non-strict: the matching keys, with a warning)."""
        problem = mismatch(model, state)
        if problem:
            own = model.state_dict()
            state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
            warnings.warn(f"Model {index}: loading matching keys only ({problem}).", stacklevel=6)
        model.load_state_dict(state, strict=strict)


class StrategyModels:
    """Whole models read into new memory and loaded through the strategy, which shards them."""

    gradients = False

    def __init__(self, strategy: ShardedStateDicts) -> None:
        self.strategy = strategy

    def start(
        self, files: CheckpointReader, index: int, model: nn.Module, name: str, strict: bool
    ) -> PendingRead:
        """Start reading file ``name`` (the strategy checks the full state when it loads it)."""
        if name.endswith(".safetensors"):
            return files.start_tensors(name, like=None)
        return files.start_unpickle(name, "cpu")

    def apply(
        self,
        index: int,
        model: nn.Module,
        prepared: nn.Module,
        state: dict[str, torch.Tensor],
        strict: bool,
    ) -> None:
        """Load the full ``state`` into the prepared (sharded) module."""
        self.strategy.load_model_state_dict(prepared, state, strict=strict)
