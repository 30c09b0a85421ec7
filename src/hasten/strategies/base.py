"""The `Strategy` interface: hasten's adapter between the Accelerator and one engine (DDP, FSDP,
tensor parallelism, DeepSpeed, megatron-core: the runtime that does the distributed work).

The Accelerator never branches on `DistributedType`; it asks its strategy object, which
`strategies.select.select_strategy` picked once from the resolved `EngineChoice`. A strategy
answers, for the whole run:

- ``select_precision``: the numeric policy (autocast + scaler, or the engine's own policy);
- ``setup(PrepareCall)``: the one set-up hook: one prepare call's objects together (each model
  through `strategies.parallelize` with the plan ``parallel_plan`` gives it, then the optimizers
  pointed at the new parameters by name, with a count check); engines that set up a call at
  once (FSDP1, DeepSpeed, Megatron-LM) override it;
- ``backward_fn`` / ``wrap_optimizer``: whether it owns backward and the optimizer step;
- ``no_sync`` / ``clip_grad_norm_`` / ``unwrap``: per-step helpers;
- ``model_state_dict`` / ``optimizer_state_dict`` (+ ``load_*``): full or sharded state dicts;
- ``checkpoint_layout``: how save_state writes its models and optimizers, one of the layouts a
  `LayoutFactory` offers (one copy from the main process, gathered, sharded through
  torch.distributed.checkpoint, or written by the engine itself).

Every method here is the single-process answer; subclasses override only what differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from hasten.optimizer import AcceleratedOptimizer, unwrap_optimizer
from hasten.precision import Precision, select_precision
from hasten.scheduler import AcceleratedScheduler
from hasten.strategies.call import PrepareCall, Prepared
from hasten.strategies.rebind import canonical_name, parameter_ids, rebind_optimizers
from hasten.strategies.unwrap import extract_model_from_parallel

if TYPE_CHECKING:
    from hasten.config.enums import PrecisionType
    from hasten.config.kwargs import AutocastKwargs, FP8Recipe, GradScalerKwargs
    from hasten.strategies.checkpoints import LayoutFactory
    from hasten.strategies.parallelize import ParallelPlan

__all__ = ["BackwardFn", "Strategy", "set_up_models", "together"]

BackwardFn = Callable[..., None]
LayoutT = TypeVar("LayoutT")


class Strategy:
    """Base strategy: one replica of the model per process, nothing to synchronise."""

    #: Short name shown in messages and reprs.
    name: str = "base"
    #: True when gradients are exchanged between processes during backward.
    syncs_gradients: bool = False
    #: Whether parameters are split across processes (plain ``state_dict()`` is not the model).
    shards_parameters: bool = False
    #: True when the engine places and steps the optimizer state itself (DeepSpeed).
    owns_optimizer_step: bool = False
    #: True when `join` lets processes with fewer batches shadow the others (DDP's Join).
    joins_uneven_inputs: bool = False

    def check_usable(self) -> None:
        """Raise (naming the fix) if this strategy cannot run here (a missing package, no CUDA,
        an engine hasten does not run yet)."""

    # ------------------------------------------------------------------ set-up (once)

    def select_precision(
        self,
        mixed_precision: PrecisionType | str | None,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None,
        scaler_kwargs: GradScalerKwargs | None,
        *,
        fp8_recipe: FP8Recipe | None = None,
    ) -> Precision:
        """Choose the precision policy (default: autocast, plus a GradScaler under fp16;
        fp8 through the recipe's backend)."""
        return select_precision(
            mixed_precision,
            device,
            autocast_kwargs=autocast_kwargs,
            scaler_kwargs=scaler_kwargs,
            fp8_recipe=fp8_recipe,
        )

    def setup(self, call: PrepareCall) -> Prepared:
        """Set up one prepare call's objects together (the one set-up hook).

        The precision policy sees a ``prepare`` call's objects first (MS-AMP casts a model and
        its optimizer together); each model then goes through `parallelize` with the plan
        `parallel_plan` gives it (for evaluation: placement, autocast and compilation only);
        then every optimizer of the call (and of earlier calls) is pointed at the parameters
        that replaced the ones it held, matched by parameter name (`set_up_models`). Engines
        that set up a whole call at once (FSDP1, DeepSpeed, Megatron-LM) override this.

        Returns:
            The call's objects in order, models replaced by the prepared ones and optimizers
            retargeted (not wrapped yet).

        Raises:
            ValueError: an optimizer holds parameters that cannot be matched after set-up.
        """
        from hasten.strategies.parallelize import ParallelPlan, parallelize

        objects = together(call)
        if call.evaluation:
            for i in call.indices("model"):
                plan = ParallelPlan(call.device_of(i), precision=call.precision, dynamo=call.dynamo)
                objects[i] = parallelize(objects[i], plan)
            return Prepared.of(objects)

        def set_up(model: nn.Module, index: int) -> nn.Module:
            return parallelize(model, self.parallel_plan(model, call, index))

        return set_up_models(self, call, objects, set_up)

    def parallel_plan(self, model: nn.Module, call: PrepareCall, index: int) -> ParallelPlan:
        """The `ParallelPlan` for model ``index`` of ``call`` (default: placement, the
        precision policy's forward and compilation)."""
        from hasten.strategies.parallelize import ParallelPlan

        return ParallelPlan(call.device_of(index), precision=call.precision, dynamo=call.dynamo)

    def accumulation_steps(self, requested: int, explicit: bool) -> int:
        """The run's accumulation steps (engines whose config sets them may differ or refuse)."""
        return requested

    def release(self) -> None:
        """Free what the engine holds (hooks, threads, buffers) while the process group lives."""

    @property
    def engine_wrapper(self) -> Any:
        """The wrapper through which `backward` drives a third-party engine (DeepSpeed's
        ``DeepSpeedEngineWrapper``), or None when hasten runs backward itself."""
        return None

    def backward_fn(self, num_steps: int, scale: Callable[[Any], Any] | None) -> BackwardFn | None:
        """Return a backward the engine owns (e.g. DeepSpeed's), or None for hasten's own."""
        return None

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        device_placement: bool,
        scaler: torch.amp.GradScaler | None,
    ) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` so it steps only on sync steps (engines may own the step)."""
        return AcceleratedOptimizer(optimizer, device_placement=device_placement, scaler=scaler)

    def wrap_scheduler(
        self, scheduler: Any, optimizers: Any, *, step_with_optimizer: bool, split_batches: bool
    ) -> AcceleratedScheduler:
        """Wrap ``scheduler`` so it follows the real optimizer steps (engines may step it)."""
        return AcceleratedScheduler(
            scheduler,
            optimizers,
            step_with_optimizer=step_with_optimizer,
            split_batches=split_batches,
        )

    # ------------------------------------------------------------------ per step

    def no_sync(self, module: nn.Module) -> AbstractContextManager[None]:
        """Context in which backward accumulates gradients locally without communicating."""
        return contextlib.nullcontext()

    def join(self, joinables: list[Any]) -> AbstractContextManager[Any]:
        """Context letting processes with fewer batches shadow collectives (nothing to do here)."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, module: nn.Module) -> AbstractContextManager[None]:
        """Context that forces the next backward to synchronise gradients."""
        return contextlib.nullcontext()

    def unwrap(
        self, module: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """Return the user's model from whatever this strategy wrapped it in."""
        return extract_model_from_parallel(
            module, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients' total norm in place and return that norm (before clipping)."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element into ``[-clip_value, clip_value]`` in place."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ------------------------------------------------------------------ state dicts

    def checkpoint_layout(self, layouts: LayoutFactory[LayoutT]) -> LayoutT:
        """How save_state writes this strategy's models and optimizers: one copy of each, from
        the main process, loaded in place (`LayoutFactory.replicated`)."""
        return layouts.replicated(self)

    def model_state_dict(self, model: nn.Module, *, full: bool = True) -> dict[str, Any]:
        """The model's state dict: ``full`` = plain tensors (on the main process for sharded
        engines; other processes may get an empty dict), else this process's shards."""
        return self.unwrap(model, keep_torch_compile=False).state_dict()

    def full_state_dict_parts(
        self, model: nn.Module
    ) -> tuple[dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]]] | None:
        """For engines that gather: the state dict as held (entries report their full shape
        and dtype) and a collective that gathers a part of it to the main process (others get
        ``{}``), so ``save_model`` gathers one file at a time; None: `model_state_dict` whole."""
        return None

    def load_model_state_dict(
        self,
        model: nn.Module,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
        strict: bool = True,
    ) -> None:
        """Load what `model_state_dict` returned (``full``: plain tensors, given on every
        process or only on the main one for sharded engines)."""
        self.unwrap(model, keep_torch_compile=False).load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool = True
    ) -> dict[str, Any]:
        """The optimizer's state dict: ``full`` = torch's own format, else keyed by parameter
        name (the form sharded checkpoints store, loadable on any number of processes)."""
        if full:
            return dict(optimizer.state_dict())
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        module = self.unwrap(model, keep_torch_compile=False)
        return get_optimizer_state_dict(module, unwrap_optimizer(optimizer))

    def load_optimizer_state_dict(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
    ) -> None:
        """Load what `optimizer_state_dict` returned."""
        if full:
            optimizer.load_state_dict(state_dict)
            return
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        module = self.unwrap(model, keep_torch_compile=False)
        inner = unwrap_optimizer(optimizer)
        set_optimizer_state_dict(module, inner, state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def together(call: PrepareCall) -> list[Any]:
    """The call's objects, as the precision policy prepares a whole ``prepare`` call's objects
    together (MS-AMP casts a model and its optimizer at once)."""
    objects = list(call.objects)
    if call.whole:
        objects = list(call.precision.prepare_together(objects))
    return objects


def set_up_models(
    strategy: Strategy,
    call: PrepareCall,
    objects: list[Any],
    set_up: Callable[[nn.Module, int], nn.Module],
) -> Prepared:
    """Replace each model of ``call`` in ``objects`` by ``set_up(model, index)``, then point
    the call's (and earlier calls') optimizers at the new parameters by name.

    Raises:
        ValueError: an optimizer holds parameters that cannot be matched after set-up.
    """
    models = call.indices("model")
    before = [parameter_ids(objects[i]) for i in models]  # ids: sharding may free tensors
    for i in models:
        objects[i] = set_up(objects[i], i)
    after = [_named(strategy.unwrap(objects[i], keep_torch_compile=False)) for i in models]
    optimizers = [objects[i] for i in call.indices("optimizer")]
    rebind_optimizers([*optimizers, *call.earlier_optimizers], before, after)
    return Prepared.of(objects)


def _named(module: nn.Module) -> dict[str, nn.Parameter]:
    """Parameters by canonical name (wrapper prefixes removed), shared ones once."""
    return {canonical_name(n): p for n, p in module.named_parameters()}
