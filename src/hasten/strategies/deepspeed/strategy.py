"""The DeepSpeed strategy: one `deepspeed.initialize` per model, the engine owns the step.

hasten hands DeepSpeed an initialised process group (gloo on CPU, the platform's backend
elsewhere; a one-process group when running alone), so DeepSpeed never falls back to MPI
discovery. The engine divides the loss by the accumulation steps, applies its own fp16 loss
scaling and clipping, steps the optimizer and the scheduler: the Accelerator adds none of that.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import weakref
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn
from typing_extensions import override

from hasten.config import envvars
from hasten.core.imports import require
from hasten.optimizer import AcceleratedOptimizer
from hasten.precision import Precision, select_precision
from hasten.scheduler import AcceleratedScheduler
from hasten.state import AcceleratorState, GradientState, PartialState
from hasten.strategies.base import BackwardFn, LayoutT, Strategy
from hasten.strategies.call import PrepareCall, Prepared
from hasten.strategies.checkpoints import EngineFileSink, EngineFileSource, LayoutFactory
from hasten.strategies.compile import CompileSettings, compile_model
from hasten.strategies.deepspeed.checkpoint import (
    HastenCheckpointEngine,
    check_checkpoint_engine,
    file_readers,
    install_checkpoint_engine,
)
from hasten.strategies.deepspeed.dummies import DummyOptim, DummyScheduler
from hasten.strategies.deepspeed.resolve import EngineInputs, resolve_config
from hasten.strategies.deepspeed.ulysses import register_attention, sequence_parallel
from hasten.strategies.deepspeed.universal import (
    check_adam_state,
    check_one_zero3_group,
    check_same_model,
    saved_partitions,
    universal_checkpoint,
)
from hasten.strategies.deepspeed.wrappers import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)
from hasten.strategies.deepspeed.zero import (
    GatheredParameters,
    consolidated_state_dict,
    is_zero3_partitioned,
    release_engines,
)
from hasten.strategies.unwrap import extract_model_from_parallel

if TYPE_CHECKING:
    from hasten.config.deepspeed import DeepSpeedPlugin
    from hasten.config.enums import PrecisionType
    from hasten.config.kwargs import AutocastKwargs, FP8Recipe, GradScalerKwargs

__all__ = ["DeepSpeedStrategy", "engine_tag", "ensure_process_group", "is_deepspeed_engine"]

#: Checkpoint tag of engine ``i`` (Accelerate's names, so DeepSpeed's own tools find them).
_TAG = "pytorch_model"


def engine_tag(index: int) -> str:
    """The ``save_checkpoint`` tag of the ``index``-th prepared engine."""
    return _TAG if index == 0 else f"{_TAG}_{index}"


def is_deepspeed_engine(module: Any) -> bool:
    """Whether ``module`` is a `deepspeed.DeepSpeedEngine` (without importing deepspeed)."""
    runtime = sys.modules.get("deepspeed.runtime.engine")
    return runtime is not None and isinstance(module, runtime.DeepSpeedEngine)


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()


def ensure_process_group(backend: str | None) -> None:
    """Create a one-process group when running alone, so DeepSpeed does not look for MPI.

    DeepSpeed also insists on ``LOCAL_RANK`` (torchrun sets it; a plain ``python train.py``
    does not), so a lone process gets its own index there.
    """
    if envvars.read("LOCAL_RANK") is None:
        envvars.write("LOCAL_RANK", PartialState().local_process_index)
    if dist.is_initialized():
        return
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def _check_half_precision(config: dict[str, Any]) -> None:
    """Refuse fp16 where DeepSpeed's accelerator has none (its own error names no fix).

    Raises:
        ValueError: the config enables fp16 but this device's DeepSpeed accelerator lacks it.
    """
    if str(config.get("fp16", {}).get("enabled", False)).lower() != "true":
        return
    # optional: deepspeed
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if not accelerator.is_fp16_supported():
        raise ValueError(
            f"fp16 is enabled (mixed_precision='fp16' or the DeepSpeed config's fp16.enabled) "
            f"but DeepSpeed's {accelerator.device_name()!r} accelerator does not support fp16, "
            "so its loss scaler cannot run here. Use mixed_precision='bf16' (DeepSpeed's bf16 "
            "needs no loss scaling) or 'no', or run on a GPU."
        )


class DeepSpeedStrategy(Strategy):
    """Prepare models with `deepspeed.initialize` and drive training through the engines.

    Args:
        active_plugin: returns the selected `DeepSpeedPlugin` (it can change between prepare
            calls through ``state.select_deepspeed_plugin``).
        backend: the process-group backend used when hasten runs DeepSpeed alone.
    """

    name = "deepspeed"
    syncs_gradients = True
    #: The engine places and steps the optimizer state (offload may keep it on the host).
    owns_optimizer_step = True

    def __init__(
        self, active_plugin: Callable[[], DeepSpeedPlugin], backend: str | None = "gloo"
    ) -> None:
        self._active_plugin = active_plugin
        self.backend = backend
        self.engines: list[Any] = []
        self._trainer: DeepSpeedEngineWrapper | None = None

    @override
    def check_usable(self) -> None:
        require("deepspeed", feature="DeepSpeedPlugin", extra="deepspeed")

    @property
    def plugin(self) -> DeepSpeedPlugin:
        """The DeepSpeed plugin the next prepare uses."""
        return self._active_plugin()

    @override
    def select_precision(
        self,
        mixed_precision: PrecisionType | str | None,
        device: torch.device,
        autocast_kwargs: AutocastKwargs | None,
        scaler_kwargs: GradScalerKwargs | None,
        *,
        fp8_recipe: FP8Recipe | None = None,
    ) -> Precision:
        # DeepSpeed casts the model and scales fp16 losses itself: no autocast, no GradScaler.
        return select_precision(mixed_precision, device, engine_managed=True)

    @override
    def accumulation_steps(self, requested: int, explicit: bool) -> int:
        """An explicit config value is the run's; one contradicting the Accelerator raises."""
        steps = self.plugin.get_value("gradient_accumulation_steps")
        if not isinstance(steps, int) or steps == requested:
            return requested
        if explicit:
            raise ValueError(
                f"The DeepSpeed config sets gradient_accumulation_steps={steps} but the "
                f"Accelerator was given {requested}. Set one of them: make them equal, or set "
                "the config's value to 'auto'."
            )
        return steps

    @override
    def setup(self, call: PrepareCall) -> Prepared:
        """One `deepspeed.initialize` for a ``prepare`` call's model, optimizer and scheduler.

        ``prepare_model`` on one model (and evaluation) keeps the base behaviour: the model is
        not turned into an engine.

        Raises:
            ValueError: more than one model/optimizer/scheduler, or an optimizer without its
                model (each engine is set up in its own prepare call), or a bad config.
        """
        if call.evaluation:
            return super().setup(call)
        if not call.whole:
            objects = list(call.objects)
            for i in call.indices("model"):
                objects[i] = _compile_engine(objects[i], call.dynamo)
            return Prepared.of(objects)
        models, optimizers = call.indices("model"), call.indices("optimizer")
        schedulers = call.indices("scheduler")
        counts = (len(models), len(optimizers), len(schedulers))
        if max(counts) > 1 or (not models and (optimizers or schedulers)):
            raise ValueError(
                "Under DeepSpeed each prepare() call sets up one engine: pass one model with at "
                f"most one optimizer and one scheduler (got {list(counts)} models/optimizers/"
                "schedulers). Prepare a second model in its own call, after "
                "AcceleratorState().select_deepspeed_plugin(name) if it has its own config."
            )
        objects = list(call.objects)
        if not models:
            return Prepared.of(objects)
        plugin = self.plugin
        micro = None
        if call.batch_sizes:
            sizes = call.batch_sizes
            micro = min(sizes) if plugin.is_train_batch_min else max(sizes)
        inputs = EngineInputs(
            model=objects[models[0]],
            optimizer=objects[optimizers[0]] if optimizers else None,
            scheduler=objects[schedulers[0]] if schedulers else None,
            micro_batch_size=micro,
            num_processes=PartialState().num_processes,
            accumulation_steps=GradientState().num_steps,
        )
        sequence = sequence_parallel(AcceleratorState._shared_state.get("parallelism_config"))
        if sequence is not None:  # Ulysses: data parallel over the processes / sp_size
            inputs.sequence_parallel = sequence
            inputs.num_processes //= int(sequence.sp_size or 1)
        engine, optimizer, scheduler = self._initialize(inputs)
        objects[models[0]] = _compile_engine(engine, call.dynamo)
        if optimizers:
            objects[optimizers[0]] = optimizer
        if schedulers:
            objects[schedulers[0]] = scheduler
        return Prepared.of(objects)

    def _initialize(self, inputs: EngineInputs) -> tuple[Any, Any, Any]:
        config = resolve_config(self.plugin, inputs)
        ensure_process_group(self.backend)
        # optional: deepspeed
        deepspeed = require("deepspeed", feature="DeepSpeedPlugin", extra="deepspeed")
        _check_half_precision(config)
        kwargs: dict[str, Any] = {"model": inputs.model, "config": config}
        if inputs.sequence_parallel is not None:  # needs deepspeed.comm's group: after ensure
            micro = int(config.get("train_micro_batch_size_per_gpu", 1))
            kwargs["mpu"] = register_attention(inputs.model, inputs.sequence_parallel, micro)
        optimizer, scheduler = inputs.optimizer, inputs.scheduler
        if isinstance(optimizer, DummyOptim):
            kwargs["model_parameters"] = optimizer.params
        elif optimizer is not None:
            kwargs["optimizer"] = optimizer
        if isinstance(scheduler, DummyScheduler):
            if "scheduler" not in config:
                kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
        elif scheduler is not None:
            kwargs["lr_scheduler"] = scheduler
        engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
            dist_init_required=False, **kwargs
        )
        if not self.engines:
            # At interpreter exit, engines go first (atexit runs before module teardown, in
            # reverse order of registration: after torch's own exit handlers were registered).
            atexit.register(_call_if_alive, weakref.WeakMethod(self.release_at_exit))
        install_checkpoint_engine(engine)
        self.engines.append(engine)
        if optimizer is None:
            # an inference engine: ZeRO-3 still returns its parameter-offload "optimizer"
            return engine, None, None
        self._trainer = DeepSpeedEngineWrapper(engine)
        return engine, ds_optimizer, ds_scheduler

    @override
    def backward_fn(self, num_steps: int, scale: Callable[[Any], Any] | None) -> BackwardFn | None:
        """Backward through the engine (it divides by the accumulation steps itself)."""
        gradient_state = GradientState()

        def backward(loss: torch.Tensor, **kwargs: Any) -> None:
            self.backward(loss, sync_gradients=gradient_state.sync_gradients, **kwargs)

        return backward

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """Engine backward and step (an update only when ``sync_gradients``).

        Raises:
            RuntimeError: no model was prepared together with an optimizer.
        """
        if self._trainer is None:
            raise RuntimeError(
                "backward() under DeepSpeed needs a model prepared together with its optimizer: "
                "call accelerator.prepare(model, optimizer, ...) before training."
            )
        self._trainer.backward(loss, sync_gradients=sync_gradients, **kwargs)

    @override
    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        device_placement: bool,
        scaler: torch.amp.GradScaler | None,
    ) -> AcceleratedOptimizer:
        return DeepSpeedOptimizerWrapper(optimizer)

    @override
    def wrap_scheduler(
        self, scheduler: Any, optimizers: Any, *, step_with_optimizer: bool, split_batches: bool
    ) -> AcceleratedScheduler:
        return DeepSpeedSchedulerWrapper(scheduler, optimizers)

    @property
    @override
    def engine_wrapper(self) -> DeepSpeedEngineWrapper | None:
        """The wrapper of the engine `backward` drives (the last one prepared with an
        optimizer), or None."""
        return self._trainer

    @property
    def training_engine(self) -> Any:
        """The engine `backward` drives (the last one prepared with an optimizer), or None."""
        return None if self._trainer is None else self._trainer.engine

    @override
    def no_sync(self, module: nn.Module) -> AbstractContextManager[None]:
        # DeepSpeed reduces gradients only on the boundary `backward` tells it about.
        return contextlib.nullcontext()

    @override
    def unwrap(
        self, module: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        while is_deepspeed_engine(module):
            module = module.module  # type: ignore[assignment]
        return extract_model_from_parallel(
            module, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )

    @override
    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Return the global norm DeepSpeed computed (and clipped to) at its last update.

        DeepSpeed clips inside its step with the config's ``gradient_clipping``; asking for
        another limit or norm raises rather than silently clipping at a different value.
        """
        engine = self.training_engine
        if engine is None:
            raise RuntimeError(
                "clip_grad_norm_ under DeepSpeed needs a model prepared with its optimizer."
            )
        clipping = float(engine.gradient_clipping() or 0.0)
        if float(norm_type) != 2.0 or float(max_norm) != clipping:
            raise ValueError(
                f"DeepSpeed clips gradients itself, to an L2 norm of gradient_clipping="
                f"{clipping} (from the DeepSpeed config), but clip_grad_norm_ asked for "
                f"max_norm={max_norm}, norm_type={norm_type}. Set DeepSpeedPlugin("
                f"gradient_clipping={max_norm}) (or the config's gradient_clipping) and keep "
                "norm_type=2."
            )
        norm = engine.get_global_grad_norm()
        return torch.as_tensor(float("nan") if norm is None else norm)

    @override
    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        raise NotImplementedError(
            "DeepSpeed clips gradients by norm only (its config's gradient_clipping); "
            "clip_grad_value_ cannot be honoured. Use accelerator.clip_grad_norm_ with the "
            "config's gradient_clipping instead."
        )

    @override
    def model_state_dict(self, model: nn.Module, *, full: bool = True) -> dict[str, Any]:
        """The full weights (ZeRO-3: gathered; the main process gets them, others ``{}``)."""
        engine: Any = self._engine_of(model)
        if engine is not None and engine.zero_optimization_stage() == 3:
            return consolidated_state_dict(engine)
        module = self.unwrap(model, keep_torch_compile=False)
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    @override
    def load_model_state_dict(
        self,
        model: nn.Module,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
        strict: bool = True,
    ) -> None:
        """Load full weights (ZeRO-3: given on the main process, scattered to the partitions)."""
        module = self.unwrap(model, keep_torch_compile=False)
        params = list(module.parameters())
        with GatheredParameters(params, modifier_rank=0):
            if PartialState().is_main_process or not is_zero3_partitioned(params):
                module.load_state_dict(state_dict, strict=strict)

    def _engine_of(self, model: nn.Module) -> Any:
        return next((e for e in self.engines if e is model or e.module is model), None)

    @override
    def checkpoint_layout(self, layouts: LayoutFactory[LayoutT]) -> LayoutT:
        """The engines write and read models, optimizers and schedulers themselves."""
        return layouts.engine(self)

    def save_checkpoint(self, folder: Path, files: EngineFileSink | None = None) -> None:
        """Every engine writes its checkpoint (all processes call this together).

        Each file goes to ``files`` (hasten's writer) when given and the engine uses
        DeepSpeed's default checkpoint engine; other checkpoint engines write their own files.
        """
        for engine in self.engines:
            check_checkpoint_engine(engine)
        for index, engine in enumerate(self.engines):
            with _files_route(engine, "writing_to", files):
                engine.save_checkpoint(str(folder), tag=engine_tag(index))

    def load_checkpoint(
        self, folder: Path, strict: bool = True, files: EngineFileSource | None = None
    ) -> None:
        """Every engine loads its checkpoint (module, optimizer, scheduler, step counters).

        Each file comes from ``files`` (verified bytes) when given and the engine uses
        DeepSpeed's default checkpoint engine; other checkpoint engines read their own files.

        Raises:
            FileNotFoundError: an engine's tag folder is missing (another model/engine count).
        """
        for index, engine in enumerate(self.engines):
            tag = engine_tag(index)
            if not (folder / tag).is_dir():
                raise FileNotFoundError(
                    f"{folder} holds no DeepSpeed checkpoint {tag!r} for prepared engine "
                    f"{index}; load a checkpoint saved with the same models prepared."
                )
            saved = saved_partitions(folder / tag)
            if saved is not None and files is None:  # no manifest listed the ranks' files
                saved.check_complete()
            if saved is not None and saved.world_size != engine.seq_dp_world_size:
                saved.check_complete()
                check_same_model(saved, engine)
                check_adam_state(engine, saved.world_size)
                check_one_zero3_group(engine, saved.world_size)
                with universal_checkpoint(engine, saved, tag) as converted:
                    path, _ = engine.load_checkpoint(
                        str(converted), tag=tag, load_module_strict=strict
                    )
            else:
                with _files_route(engine, "reading_from", files):
                    path, _ = engine.load_checkpoint(
                        str(folder),
                        tag=tag,
                        load_module_strict=strict,
                        load_lr_scheduler_states=True,
                    )
            if path is None:
                raise RuntimeError(f"DeepSpeed could not load {folder / tag}.")

    def refuses_process_count(self, saved: int, processes: int) -> str | None:
        """Why the engines cannot load a checkpoint of ``saved`` processes on ``processes``.

        ZeRO stages 1-3 keep each process's partition of the optimizer state (stage 3: of the
        parameters too); `load_checkpoint` repartitions them through DeepSpeed's universal
        checkpoint (`hasten.strategies.deepspeed.universal`). Optimizer state offloaded to NVMe
        is kept in per-rank swap files that the universal checkpoint does not hold.
        """
        for engine in self.engines:
            if engine.zero_optimization() and engine.zero_nvme_offload_optimizer():
                return (
                    f"This DeepSpeed checkpoint was saved by {saved} process(es) and is loaded "
                    f"by {processes}: its optimizer state is offloaded to NVMe, in per-process "
                    "swap files that DeepSpeed's universal checkpoint cannot repartition. Load "
                    f"it on {saved} process(es), or offload the optimizer to the CPU "
                    '(offload_optimizer: {"device": "cpu"}) in the run that saves.'
                )
        return None

    def file_readers(self, name: str, num_processes: int) -> Collection[int]:
        """The processes whose engine reads the checkpoint file ``name`` (relative to the
        folder) through hasten's checkpoint engine; empty when not known."""
        tag, _, basename = name.replace(os.sep, "/").partition("/")
        hasten_read = {
            engine_tag(i)
            for i, e in enumerate(self.engines)
            if isinstance(e.checkpoint_engine, HastenCheckpointEngine)
        }
        if tag not in hasten_read or "/" in basename:
            return ()
        return file_readers(basename, num_processes)

    @override
    def release(self) -> None:
        """Destroy the engines (ZeRO-3 hooks and threads) before the process group goes."""
        release_engines(self.engines)
        self.engines.clear()
        self._trainer = None

    def release_at_exit(self) -> None:
        """`release`, for the interpreter's exit (engines still alive: no end_training)."""
        if self.engines:
            self.release()

    @override
    def __repr__(self) -> str:
        return f"DeepSpeedStrategy(engines={len(self.engines)})"


def _files_route(engine: Any, route: str, files: Any) -> contextlib.AbstractContextManager[Any]:
    """hasten's checkpoint engine sending its files to/from ``files`` (``route``: its method
    ``writing_to`` or ``reading_from``); for any other checkpoint engine, nothing to set up."""
    current = engine.checkpoint_engine
    if isinstance(current, HastenCheckpointEngine):
        return cast(contextlib.AbstractContextManager[Any], getattr(current, route)(files))
    return contextlib.nullcontext()


def _compile_engine(module: nn.Module, dynamo: CompileSettings | None) -> nn.Module:
    """The engine is already placed and wrapped; regional compilation works in place.

    Raises:
        NotImplementedError: whole-model compilation (it would hide the engine's hooks).
    """
    inner = module.module if is_deepspeed_engine(module) else module
    if compile_model(inner, dynamo) is not inner:  # type: ignore[arg-type]
        raise NotImplementedError(
            "Compiling a whole DeepSpeed-wrapped model would hide the engine's hooks behind "
            "a torch.compile wrapper. Use TorchDynamoPlugin(use_regional_compilation=True) "
            "(its repeated blocks are compiled in place), or no dynamo backend."
        )
    return module
