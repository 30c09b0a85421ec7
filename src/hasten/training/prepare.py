"""The pieces of `Accelerator.prepare` that do not depend on the facade.

The checks of a call's arguments (one placement per object, no object twice), where a model
goes (not on the device when a dispatcher placed it), the loaders' per-process batch sizes,
bookkeeping of what was prepared (a prepared object passed again comes back unchanged; nothing
is wrapped twice; optimizers follow the moved parameters in `strategies.rebind`), the device
check that catches an optimizer prepared apart from its model, and the per-step ``backward``
chosen once from (accumulation steps, loss scaler).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten.config import envvars
from hasten.optimizer import AcceleratedOptimizer
from hasten.scheduler import AcceleratedScheduler
from hasten.strategies.base import BackwardFn, Strategy
from hasten.strategies.call import ObjectKind, kind_of

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hasten.config.project import DataLoaderConfiguration

__all__ = [
    "PreparedObjects",
    "PreparedRegistry",
    "call_placements",
    "check_optimizer_device",
    "check_unique",
    "is_dispatched",
    "make_backward",
    "model_placement",
    "per_process_batch_sizes",
    "same_device",
    "shard_data_loader",
    "sort_engine_prepared",
]


class _IdentitySet:
    """Objects held weakly where possible, else by id (a set that never calls ``__eq__``)."""

    def __init__(self) -> None:
        self._refs: weakref.WeakSet[Any] = weakref.WeakSet()
        self._ids: set[int] = set()

    def add(self, obj: Any) -> None:
        try:
            self._refs.add(obj)
        except TypeError:  # not weak-referenceable (or unhashable): identity for this session
            self._ids.add(id(obj))

    def discard(self, obj: Any) -> None:
        self._ids.discard(id(obj))
        with contextlib.suppress(TypeError):
            self._refs.discard(obj)

    def __getstate__(self) -> list[Any]:
        # Pickled with the Accelerator (Accelerate's test_can_pickle_dataloader): the live
        # objects, held weakly again once read back. Bare ids mean nothing in another process.
        return list(self._refs)

    def __setstate__(self, objects: list[Any]) -> None:
        self.__init__()  # type: ignore[misc]
        for obj in objects:
            self.add(obj)

    def __contains__(self, obj: Any) -> bool:
        if id(obj) in self._ids:
            return True
        try:
            return obj in self._refs
        except TypeError:
            return False


class PreparedRegistry:
    """What ``prepare`` was given and what it returned.

    As in Accelerate, an object ``prepare`` returned (marked ``_is_accelerate_prepared``) comes
    back unchanged when passed again. An object ``prepare`` *replaced* by a wrapper (a model
    wrapped in DDP, a raw optimizer) is refused if passed again: wrapping it a second time would
    all-reduce or step twice. A model prepared with ``evaluation_mode=True`` may later be prepared
    for training (it then gets its training wrapper); that is remembered across `forget()`.
    """

    def __init__(self) -> None:
        self._given = _IdentitySet()
        self._returned = _IdentitySet()
        self._evaluation_only = _IdentitySet()

    def __contains__(self, obj: Any) -> bool:
        return obj in self._given or obj in self._returned

    def hands_back(self, obj: Any, training: bool = True) -> bool:
        """Whether ``prepare`` should return ``obj`` as it is: it is already prepared (for
        training, if ``training``)."""
        if training and obj in self._evaluation_only:
            return False
        return obj in self._returned or getattr(obj, "_is_accelerate_prepared", False) is True

    def claim(self, obj: Any, what: str) -> None:
        """Record ``obj`` as being prepared now.

        Raises:
            RuntimeError: ``obj`` was given to prepare before and replaced by a wrapper.
        """
        if obj in self._evaluation_only:  # prepared for evaluation, now for training
            self._evaluation_only.discard(obj)
            return
        if obj in self._given:
            raise RuntimeError(
                f"This {what} ({type(obj).__name__}) was already passed to "
                "Accelerator.prepare, which returned a wrapper for it; preparing it again would "
                "wrap it twice (double DDP all-reduce, double optimizer steps). Keep using the "
                "object prepare returned (passing that one again returns it unchanged)."
            )
        self._given.add(obj)

    def record(self, obj: Any, evaluation_only: bool = False) -> None:
        """Record an object prepare returned (passing it again hands it back)."""
        self._returned.add(obj)
        if evaluation_only:
            self._evaluation_only.add(obj)

    def mark(self, prepared: object, evaluation_only: bool = False) -> None:
        """Record ``prepared`` as returned by prepare, with Accelerate's marker on it (other
        libraries test ``_is_accelerate_prepared`` to avoid preparing twice)."""
        with contextlib.suppress(AttributeError):  # an object that takes no attributes
            setattr(prepared, "_is_accelerate_prepared", True)  # noqa: B010
        self.record(prepared, evaluation_only=evaluation_only)

    def hand_back_into(self, obj: object, registry: list[Any], training: bool = True) -> bool:
        """Whether ``obj`` is handed back as it is (see `hands_back`); if so it joins
        ``registry`` (once), where prepare would have put it."""
        if not self.hands_back(obj, training):
            return False
        if not any(item is obj for item in registry):
            registry.append(obj)
        return True

    def forget(self) -> None:
        """Forget what was given and returned (`Accelerator.free_memory`); models prepared only
        for evaluation stay known, so preparing one for training still wraps it."""
        self._given = _IdentitySet()
        self._returned = _IdentitySet()


def same_device(tensor_device: torch.device, device: torch.device) -> bool:
    """Tell whether a tensor on ``tensor_device`` lives on ``device`` (index-agnostic if unset)."""
    if tensor_device.type != device.type:
        return False
    return device.index is None or tensor_device.index in (None, device.index)


def check_optimizer_device(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Refuse an optimizer whose parameters are not on ``device`` after the models moved.

    Raises:
        RuntimeError: a parameter sits on another device, i.e. the optimizer was prepared
            without (or before) the model owning it, so it would update stale copies.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not same_device(param.device, device):
                raise RuntimeError(
                    f"The optimizer {type(optimizer).__name__} holds a parameter on "
                    f"{str(param.device)!r} but the Accelerator trains on {str(device)!r}: it was "
                    "prepared without its model. Pass the model to the same prepare() call "
                    "(or prepare it first): prepare(model, optimizer, ...)."
                )


def _plain(loss: torch.Tensor, **kwargs: Any) -> None:
    loss.backward(**kwargs)


def make_backward(
    num_steps: int, scale: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> BackwardFn:
    """Return the per-step backward: divide by ``num_steps`` only if > 1, scale only if asked.

    Chosen once (and again when the number of steps changes) so a plain fp32 step costs exactly
    ``loss.backward()``.
    """
    if num_steps == 1 and scale is None:
        return _plain
    if scale is None:

        def _averaged(loss: torch.Tensor, **kwargs: Any) -> None:
            (loss / num_steps).backward(**kwargs)

        return _averaged
    scaler = scale
    if num_steps == 1:

        def _scaled(loss: torch.Tensor, **kwargs: Any) -> None:
            scaler(loss).backward(**kwargs)

        return _scaled

    def _scaled_averaged(loss: torch.Tensor, **kwargs: Any) -> None:
        scaler(loss / num_steps).backward(**kwargs)

    return _scaled_averaged


def call_placements(count: int, device_placement: list[bool] | None) -> list[bool | None]:
    """One placement per object of a ``prepare`` call (None: the Accelerator's setting).

    Raises:
        ValueError: ``device_placement`` does not have one entry per object.
    """
    if device_placement is None:
        return [None] * count
    if len(device_placement) != count:
        raise ValueError(
            f"device_placement has {len(device_placement)} entries but {count} objects "
            "were passed; give one bool per object, in the same order."
        )
    return list(device_placement)


def check_unique(args: Sequence[object]) -> None:
    """Refuse an object passed twice to one ``prepare`` call.

    Raises:
        RuntimeError: the same object (not a plain value) appears twice.
    """
    seen: set[int] = set()
    for obj in args:
        # A MegatronLMDummyDataLoader stands for the train, valid and test loaders at once:
        # Accelerate's documented usage passes it three times.
        repeatable = getattr(obj, "_repeatable_in_prepare", False) is True
        if (
            id(obj) in seen
            and not repeatable
            and not isinstance(obj, (str, int, float, bool, type(None)))
        ):
            raise RuntimeError(
                f"The same {type(obj).__name__} was passed twice to one prepare() call; "
                "pass each object once."
            )
        seen.add(id(obj))


def is_dispatched(model: nn.Module) -> bool:
    """Whether ``model`` (or a submodule) was dispatched over several devices."""
    return any(len(getattr(m, "hf_device_map", None) or ()) > 1 for m in model.modules())


def model_placement(
    model: nn.Module,
    place: bool,
    strategy: Strategy,
    device: torch.device,
    num_processes: int,
    quantized_on_cpu: Callable[[], bool],
) -> bool:
    """Whether ``model`` goes on the device: not when a dispatcher placed its layers.

    ``quantized_on_cpu`` answers whether bitsandbytes runs quantized layers on the CPU here (the
    facade passes its own look-up, which tests patch in ``hasten.accelerator``).

    Raises:
        ValueError: a model dispatched over several devices, under a strategy that syncs
            gradients across processes; or a quantized model placed where it cannot run.
    """
    if is_dispatched(model) and not envvars.read_flag("ACCELERATE_BYPASS_DEVICE_MAP"):
        if strategy.syncs_gradients:
            raise ValueError(
                "This model was dispatched over several devices (it has an hf_device_map), "
                f"which cannot be trained with {strategy.name!r} across "
                f"{num_processes} processes. Load it on one device per process (no "
                "device_map), or run a single process."
            )
        place = False  # the dispatcher placed each layer; moving it would undo that
    if getattr(model, "hf_device_map", None) and (
        getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    ):
        from hasten.big_modeling.quantization import check_quantized_placement

        check_quantized_placement(
            dict(getattr(model, "hf_device_map", {})),
            device,
            distributed=num_processes > 1,
            cpu_supported=quantized_on_cpu(),
        )
        place = False  # bitsandbytes placed the quantized weights
    return place


def per_process_batch_sizes(
    loaders: list[DataLoader[object]], num_processes: int, split_batches: bool
) -> list[int]:
    """Each loader's batch size on one process (the global one split, under split_batches)."""
    sizes = [d.batch_size for d in loaders if d.batch_size is not None]
    return [s // num_processes for s in sizes] if split_batches else sizes


def sort_engine_prepared(
    prepared: list[Any],
    models: list[nn.Module],
    optimizers: list[AcceleratedOptimizer],
    schedulers: list[AcceleratedScheduler],
    dataloaders: list[DataLoader[object]],
) -> list[Any]:
    """Record what an engine prepared in one go (Megatron-LM) in the Accelerator's lists."""
    for obj in prepared:
        if isinstance(obj, nn.Module):
            models.append(obj)
        elif isinstance(obj, AcceleratedOptimizer):
            optimizers.append(obj)
        elif isinstance(obj, AcceleratedScheduler):
            schedulers.append(obj)
        elif isinstance(obj, DataLoader):
            dataloaders.append(obj)
    return prepared


def shard_data_loader(
    data_loader: DataLoader[Any],
    config: DataLoaderConfiguration,
    device: torch.device,
    processes: tuple[int, int],
    *,
    put_on_device: bool,
    rng_types: list[str],
    slice_fn_for_dispatch: Callable[..., Any] | None,
    mesh: DeviceMesh | None,
) -> DataLoader[Any]:
    """``data_loader`` sharded for this process (``processes``: count, index) as ``config`` asks.

    Raises:
        ValueError: split_batches with a batch size not divisible by the number of processes.
    """
    from hasten.data_loader.prepare import prepare_data_loader

    num_processes, process_index = processes
    return prepare_data_loader(
        data_loader,
        device,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=config.split_batches,
        put_on_device=put_on_device,
        rng_types=rng_types,
        dispatch_batches=config.dispatch_batches,
        even_batches=config.even_batches,
        slice_fn_for_dispatch=slice_fn_for_dispatch,
        use_seedable_sampler=config.use_seedable_sampler,
        data_seed=config.data_seed,
        non_blocking=config.non_blocking,
        use_stateful_dataloader=getattr(config, "use_stateful_dataloader", False),
        torch_device_mesh=mesh,
    )


class PreparedObjects:
    """What ``prepare`` returned, by kind, and the registry of what it was given.

    The Accelerator keeps these lists under Accelerate's names (``_models``, ``_optimizers``,
    ...); an object passed to prepare again is handed back and joins its list once.
    """

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.optimizers: list[AcceleratedOptimizer] = []
        self.schedulers: list[AcceleratedScheduler] = []
        self.dataloaders: list[Any] = []
        self.registry = PreparedRegistry()
        self.loader_batch_sizes: list[int] = []

    def hand_back(self, obj: object, kind: str | None = None, training: bool = True) -> bool:
        """If ``obj`` is already prepared (for training, if ``training``), register it where
        prepare would have (once) and return True: prepare then returns it unchanged."""
        registries: dict[str, list[Any]] = {
            "model": self.models,
            "optimizer": self.optimizers,
            "scheduler": self.schedulers,
            "data_loader": self.dataloaders,
        }
        registry = registries.get(kind or kind_of(obj))
        return registry is not None and self.registry.hand_back_into(obj, registry, training)

    def claim(
        self,
        objects: Sequence[object],
        placements: Sequence[bool | None],
        default: bool,
        run: tuple[Strategy, torch.device, int, Callable[[], bool]],
    ) -> tuple[tuple[ObjectKind, ...], list[bool]]:
        """The kinds and placements of a call's ``objects`` (None: ``default``); each model is
        claimed and checked for a dispatcher's placement (`model_placement` under ``run``:
        strategy, device, number of processes, the quantized-on-CPU look-up).

        Raises:
            RuntimeError: a model was given to prepare before and replaced by a wrapper.
            ValueError: see `model_placement`.
        """
        kinds = tuple(kind_of(obj) for obj in objects)
        places = [default if p is None else p for p in placements]
        for i, kind in enumerate(kinds):
            if kind == "model":
                model = cast(nn.Module, objects[i])
                self.registry.claim(model, "model")
                places[i] = model_placement(model, places[i], *run)
        return kinds, places

    def mark(self, prepared: object, evaluation_only: bool = False) -> None:
        """Record ``prepared`` as returned by prepare (see `PreparedRegistry.mark`)."""
        self.registry.mark(prepared, evaluation_only=evaluation_only)

    def record_model(self, prepared: nn.Module, evaluation_only: bool = False) -> None:
        """Record a model prepare returned."""
        self.mark(prepared, evaluation_only=evaluation_only)
        self.models.append(prepared)

    def add_engine_prepared(self, prepared: list[Any]) -> list[Any]:
        """Record what an engine prepared in one go (Megatron-LM) as prepare() would have."""
        lists = (self.models, self.optimizers, self.schedulers, self.dataloaders)
        return sort_engine_prepared(prepared, *lists)

    def batch_sizes(self, loaders: list[Any], num_processes: int, split_batches: bool) -> list[int]:
        """Per-process batch sizes of ``loaders`` (or of those of an earlier prepare call)."""
        if loaders:
            self.loader_batch_sizes = per_process_batch_sizes(loaders, num_processes, split_batches)
        return list(self.loader_batch_sizes)
