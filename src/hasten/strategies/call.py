"""`PrepareCall`: one ``Accelerator.prepare`` (or ``prepare_model``) call, as a strategy sees it.

The Accelerator sorts the call's objects by kind, resolves each one's device placement and
hands the whole call to `Strategy.setup` with what a strategy needs of the run: the device, the
precision policy, the compile settings, the data loaders' batch sizes and settings, and what
earlier calls prepared. `setup` returns a `Prepared`; no strategy calls back into the
Accelerator or holds it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from hasten.precision import Precision

if TYPE_CHECKING:
    from hasten.config.dynamo import TorchDynamoPlugin
    from hasten.config.project import DataLoaderConfiguration

__all__ = ["ObjectKind", "PrepareCall", "Prepared", "kind_of"]

#: What ``prepare`` does with an object.
ObjectKind = Literal["model", "optimizer", "scheduler", "data_loader", "other"]


def _is_deepspeed_dummy(obj: Any, class_name: str) -> bool:
    """``obj`` is a `DummyOptim` / `DummyScheduler` (they stand for a DeepSpeed config's optimizer
    / scheduler). Read from ``sys.modules`` so that importing hasten never loads the DeepSpeed
    strategy package: nobody can hold a dummy before its module was imported."""
    dummies = sys.modules.get("hasten.strategies.deepspeed.dummies")
    return dummies is not None and isinstance(obj, getattr(dummies, class_name))


def kind_of(obj: Any) -> ObjectKind:
    """What ``prepare`` does with ``obj``: model, optimizer, scheduler, data loader or other."""
    if isinstance(obj, nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer) or _is_deepspeed_dummy(obj, "DummyOptim"):
        return "optimizer"
    if isinstance(obj, torch.utils.data.DataLoader):
        return "data_loader"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or _is_deepspeed_dummy(
        obj, "DummyScheduler"
    ):
        return "scheduler"
    return "other"


@dataclasses.dataclass(frozen=True)
class PrepareCall:
    """The objects of one prepare call, by kind, with the run's settings a strategy needs.

    Attributes:
        objects: the objects, in the order given.
        kinds: `kind_of` each object.
        placements: for each object, whether it goes on `device` (the Accelerator's
            ``device_placement`` or the call's override; False for a model a dispatcher placed).
        device: this process's device.
        precision: the run's precision policy.
        dynamo: the compile settings (`TorchDynamoPlugin`), or None.
        batch_sizes: per-process batch sizes of the call's data loaders (or of an earlier
            call's), for engines whose config needs them (DeepSpeed's micro batch size).
        data: the data loaders' settings (`DataLoaderConfiguration`).
        rng_types: the RNGs data loaders synchronise at each epoch.
        earlier_models: models prepared by earlier calls.
        earlier_optimizers: the (unwrapped) optimizers of earlier calls, pointed at the new
            parameters too when a model of this call replaces theirs.
        whole: True for a ``prepare`` call; False for ``prepare_model`` on one model (an engine
            that builds everything of a ``prepare`` call at once prepares it as one model).
        evaluation: ``prepare_model(evaluation_mode=True)``: placed, autocast and compiled,
            without the strategy's wrapper.
    """

    objects: tuple[Any, ...]
    kinds: tuple[ObjectKind, ...]
    placements: tuple[bool, ...]
    device: torch.device
    precision: Precision
    dynamo: TorchDynamoPlugin | None = None
    batch_sizes: tuple[int, ...] = ()
    data: DataLoaderConfiguration | None = None
    rng_types: tuple[str, ...] = ()
    earlier_models: tuple[nn.Module, ...] = ()
    earlier_optimizers: tuple[torch.optim.Optimizer, ...] = ()
    whole: bool = True
    evaluation: bool = False

    def indices(self, kind: ObjectKind) -> list[int]:
        """Positions of the objects of ``kind``."""
        return [i for i, k in enumerate(self.kinds) if k == kind]

    def of_kind(self, kind: ObjectKind) -> list[Any]:
        """The objects of ``kind``, in order."""
        return [self.objects[i] for i in self.indices(kind)]

    def device_of(self, index: int) -> torch.device | None:
        """Where object ``index`` goes: `device`, or None to leave it where it is."""
        return self.device if self.placements[index] else None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What `Strategy.setup` made of a `PrepareCall`.

    Attributes:
        objects: the call's objects in the same order: models, optimizers and schedulers
            replaced by what the engine made of them (optimizers not wrapped yet).
        by_engine: the engine prepared every object itself (optimizers and schedulers wrapped,
            data loaders built: Megatron-LM); the Accelerator only records them.
    """

    objects: tuple[Any, ...]
    by_engine: bool = False

    @classmethod
    def of(cls, objects: Sequence[Any], *, by_engine: bool = False) -> Prepared:
        """A `Prepared` of ``objects`` (any sequence)."""
        return cls(tuple(objects), by_engine=by_engine)
