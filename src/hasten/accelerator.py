"""`Accelerator`: the one object a training script talks to.

A thin facade over objects chosen once, when the Accelerator is built: a `Strategy` (how work
is split across processes), a `Precision` (autocast and loss scaling), the shared
`AcceleratorState`/`GradientState`, and a `GradientAccumulator`. Every per-step method calls
straight into the object picked for this run; nothing branches on the distributed type per step.

Example:
    >>> accelerator = Accelerator(cpu=True)
    >>> model, optimizer = accelerator.prepare(model, optimizer)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from hasten.config import envvars
from hasten.config.dynamo import TorchDynamoPlugin
from hasten.config.enums import FP8BackendType, PrecisionType
from hasten.config.project import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)
from hasten.core.imports import is_bitsandbytes_multi_backend_available
from hasten.optimizer import AcceleratedOptimizer, unwrap_optimizer
from hasten.platforms.checks import is_xpu_available
from hasten.scheduler import AcceleratedScheduler
from hasten.state import AcceleratorState, GradientState
from hasten.state.mesh import mesh_local_rank, resolve_parallelism_config
from hasten.strategies import Strategy, select_strategy
from hasten.strategies.call import PrepareCall
from hasten.strategies.ddp import sync_in_backward
from hasten.training.accumulation import GradientAccumulator
from hasten.training.arguments import (
    FP8_SLOTS,
    UNSET,
    resolve_accumulation,
    resolve_data_config,
    resolve_deepspeed,
    resolve_dynamo,
    resolve_mixed_precision,
    sort_handlers,
)
from hasten.training.prepare import (
    PreparedObjects,
    call_placements,
    check_optimizer_device,
    check_unique,
    is_dispatched,
    make_backward,
    shard_data_loader,
)

# What a run may not use (checkpoints, data loaders, trackers, collectives, kwargs handlers,
# profiling, fp8, LOMO) is imported inside the methods that use it, so that
# `from hasten import Accelerator` loads only what every run needs (the list of modules it loads
# is pinned by tests/unit/test_import_cost.py).
if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hasten.checkpointing import CheckpointContents, CheckpointManager
    from hasten.checkpointing.layouts.base import CheckpointLayout
    from hasten.config.deepspeed import DeepSpeedPlugin
    from hasten.config.enums import DynamoBackend
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.kwargs import AutocastKwargs, KwargsHandler, ProfileKwargs
    from hasten.config.megatron import MegatronLMPlugin
    from hasten.config.parallelism import ParallelismConfig, TorchTensorParallelPlugin
    from hasten.ops.comm import Communicator
    from hasten.tracking.manager import TrackerManager
    from hasten.tracking.registry import LogWith
    from hasten.training.unsaved_signals import UnsavedSignalNotice

__all__ = ["Accelerator"]

F = TypeVar("F", bound=Callable[..., Any])


def _data_parallel_comm(mesh: DeviceMesh | None) -> Communicator | None:
    """Collectives over the data-parallel replicas of ``mesh`` (None: no mesh, every process)."""
    if mesh is None:
        return None
    from hasten.ops.comm import data_parallel_comm

    return data_parallel_comm(mesh)


def _quantized_on_cpu() -> bool:
    """Whether bitsandbytes runs quantized layers on CPU (names patched here, as in Accelerate)."""
    return is_bitsandbytes_multi_backend_available() and not is_xpu_available()


class Accelerator:
    """Run one training loop unchanged on a CPU, N processes, N GPUs or N machines.

    Args:
        device_placement: move prepared models and batches to `device` automatically.
        split_batches: shortcut for ``DataLoaderConfiguration(split_batches=...)``: the batch
            size of prepared data loaders is the global one, split between processes.
        mixed_precision: "no", "fp16", "bf16" or "fp8"; None reads ACCELERATE_MIXED_PRECISION.
        gradient_accumulation_steps: micro-batches per optimizer step (used by `accumulate`).
        cpu: force the CPU even when an accelerator is present.
        dataloader_config: how data loaders are sharded (`DataLoaderConfiguration`).
        deepspeed_plugin: DeepSpeed settings: each prepare() call builds one DeepSpeed engine
            (CPU processes too, over gloo).
        fsdp_plugin: FSDP settings: FSDP2 (``fully_shard``) or FSDP1 shards the prepared models
            over the processes (CPU processes too, over gloo).
        torch_tp_plugin: tensor-parallel settings (deprecated, as in Accelerate): turned into
            ``ParallelismConfig(tp_size=...)`` with a FutureWarning.
        megatron_lm_plugin: Megatron-LM settings: megatron-core builds model, optimizer,
            schedule and loaders in one prepare() call (CUDA only).
        rng_types: RNGs synchronised at each epoch start ("torch", "cuda", "generator", ...).
        log_with: tracker name(s) or `GeneralTracker` instances for `init_trackers`/`log`.
        project_dir: where trackers and checkpoints write; sets ``project_config.project_dir``.
        project_config: a full `ProjectConfiguration`.
        gradient_accumulation_plugin: full accumulation settings (excludes the steps argument).
        step_scheduler_with_optimizer: step prepared schedulers only when optimizers step.
        kwargs_handlers: `KwargsHandler` instances customising DDP, autocast, scaler, ...
        dynamo_backend: torch.compile backend (excludes ``dynamo_plugin``).
        dynamo_plugin: full `TorchDynamoPlugin`.
        deepspeed_plugins: several named DeepSpeed plugins (excludes ``deepspeed_plugin``).
        parallelism_config: a `ParallelismConfig`: the job's device mesh, over which the
            composable strategy applies tensor parallelism and FSDP2 (HSDP, FSDP2 x TP).

    Raises:
        ValueError: an unknown mixed_precision, a non-positive accumulation, or conflicting
            arguments (both of a pair that excludes each other).
        TypeError: an argument of the wrong type (e.g. an unknown kwargs handler).
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = UNSET,
        mixed_precision: PrecisionType | str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        rng_types: list[str] | None = None,
        log_with: LogWith = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: dict[str, DeepSpeedPlugin] | None = None,
        parallelism_config: ParallelismConfig | None = None,
    ) -> None:
        self.project_configuration = project_config or ProjectConfiguration(project_dir=project_dir)
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)
        precision_name = resolve_mixed_precision(mixed_precision)
        accumulation = resolve_accumulation(
            gradient_accumulation_steps, gradient_accumulation_plugin
        )
        dynamo = resolve_dynamo(dynamo_backend, dynamo_plugin)
        deepspeed = resolve_deepspeed(deepspeed_plugin, deepspeed_plugins)
        self.dataloader_config = resolve_data_config(dataloader_config, split_batches)
        handlers = sort_handlers(kwargs_handlers)
        self.ddp_handler: Any = handlers.get("ddp_handler")
        self.scaler_handler: Any = handlers.get("scaler_handler")
        self.init_handler: Any = handlers.get("init_handler")
        self.autocast_handler: Any = handlers.get("autocast_handler")
        self.profile_handler: Any = handlers.get("profile_handler")
        for slot in FP8_SLOTS:
            setattr(self, slot, handlers.get(slot))
        self.torch_tp_plugin = torch_tp_plugin
        parallelism_config = resolve_parallelism_config(parallelism_config, torch_tp_plugin)
        self.parallelism_config = parallelism_config
        init_kwargs = self.init_handler.to_kwargs() if self.init_handler is not None else {}
        self.state = AcceleratorState(
            mixed_precision=precision_name,
            cpu=cpu,
            dynamo_plugin=dynamo,
            deepspeed_plugin=deepspeed,
            fsdp_plugin=fsdp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
            torch_tp_plugin=torch_tp_plugin,
            parallelism_config=parallelism_config,
            _from_accelerator=True,
            **init_kwargs,
        )
        if fsdp_plugin is not None:  # as Accelerate: transformers' from_pretrained reads it
            envvars.write("ACCELERATE_USE_FSDP", "true")
        self.gradient_state = GradientState(gradient_accumulation_plugin=accumulation)
        if torch_tp_plugin is not None:
            torch_tp_plugin.torch_device_mesh = self.torch_device_mesh
        # Collectives of metrics over the data-parallel replicas (None: every process).
        self._dp_comm = _data_parallel_comm(self.torch_device_mesh)
        explicit_steps = gradient_accumulation_plugin is not None or accumulation.num_steps != 1
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.rng_types = rng_types if rng_types is not None else ["generator"]
        self._setup_backends(explicit_steps)
        self._tracker_manager: TrackerManager | None = None
        self._tracker_args = (self.logging_dir, self.is_main_process)
        if log_with is not None:  # checked now; without it the manager is built on first use
            self._tracker_manager = self._new_tracker_manager(log_with)
        self.log_with = self._trackers.log_with if log_with is not None else []
        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self._objects = PreparedObjects()  # the lists below are its lists, under their old names
        self._models = self._objects.models
        self._optimizers = self._objects.optimizers
        self._schedulers = self._objects.schedulers
        self._dataloaders = self._objects.dataloaders
        self._prepared = self._objects.registry
        self._custom_objects: list[Any] = []
        self._checkpoint_manager: CheckpointManager | None = None
        self._unsaved_notice: UnsavedSignalNotice | None = None
        self._watch_signals()

    def _watch_signals(self) -> None:
        """SIGTERM/SIGUSR1 checkpoint and exit 75, or (nothing configured) warn that none saves."""
        if self.project_configuration.automatic_checkpoint_naming and (
            self._checkpoints.watch_preemption(self.save_state)  # needs a project_dir too
        ):
            return
        from hasten.training.unsaved_signals import UnsavedSignalNotice as Notice

        self._unsaved_notice = Notice()
        self._unsaved_notice.install()

    @property
    def _checkpoints(self) -> CheckpointManager:
        """Checkpoint folders, hooks and pending saves (built when first needed)."""
        if self._checkpoint_manager is None:
            from hasten.checkpointing.manager import CheckpointManager

            self._checkpoint_manager = CheckpointManager(self.project_configuration)
        return self._checkpoint_manager

    def _new_tracker_manager(self, log_with: LogWith) -> TrackerManager:
        from hasten.tracking.manager import TrackerManager

        logging_dir, is_main_process = self._tracker_args
        return TrackerManager(log_with, logging_dir, is_main_process)

    @property
    def _trackers(self) -> TrackerManager:
        """The trackers of ``log_with`` (built when first needed if none were asked for)."""
        if self._tracker_manager is None:
            self._tracker_manager = self._new_tracker_manager(None)
        return self._tracker_manager

    def _setup_backends(self, explicit_steps: bool = False) -> None:
        """Pick strategy and precision once; everything per step dispatches through them."""
        self.strategy: Strategy = select_strategy(
            self.state.engine,
            device=self.device,
            ddp_kwargs=self.ddp_handler,
            parallelism_config=self.parallelism_config,
            world_size=self.num_processes,
        )
        self.precision = self.strategy.select_precision(
            self.state.mixed_precision,
            self.device,
            self.autocast_handler,
            self.scaler_handler,
            fp8_recipe=self._fp8_recipe,
        )
        steps = self.gradient_state.num_steps
        agreed = self.strategy.accumulation_steps(steps, explicit_steps)
        if agreed != steps:  # e.g. a DeepSpeed config's explicit gradient_accumulation_steps
            self.gradient_state.plugin_kwargs.update({"num_steps": agreed})
        self.scaler = self.precision.scaler
        self.native_amp = self.precision.native_amp
        self._accumulator = GradientAccumulator(self.gradient_state, self.strategy)
        self._refresh_backward()

    def _refresh_backward(self) -> None:
        scale = self.scaler.scale if self.scaler is not None else None
        steps = self.gradient_state.num_steps
        self._backward = self.strategy.backward_fn(steps, scale) or make_backward(steps, scale)
        # Until an optimizer is prepared nothing would unscale a scaled loss.
        self._scaled_without_optimizer = scale is not None and not getattr(
            self, "_optimizers", None
        )

    # ------------------------------------------------------------------ where this process is

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""
        return self.state.device

    @property
    def distributed_type(self) -> Any:
        """The run's `DistributedType` label (a label only: behaviour lives in `strategy`)."""
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        """Total number of processes in the job."""
        return int(self.state.num_processes)

    @property
    def process_index(self) -> int:
        """Index of this process in the job."""
        return int(self.state.process_index)

    @property
    def local_process_index(self) -> int:
        """Index of this process on its machine."""
        return int(self.state.local_process_index)

    @property
    def is_main_process(self) -> bool:
        """True on the single process that should write files and print."""
        return bool(self.state.is_main_process)

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each machine."""
        return bool(self.state.is_local_main_process)

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes the model: the local main one without a parallelism
        config, else rank 0 of the replicated (dp_replicate) and context-parallel (cp) mesh dims.
        """
        config = self.parallelism_config
        if config is None:
            return self.is_local_main_process
        from hasten.checkpointing.model import saves_model_in_mesh

        return saves_model_in_mesh(config, self.process_index)

    @property
    def is_last_process(self) -> bool:
        """True on the process with the highest index."""
        return bool(self.state.is_last_process)

    @property
    def use_distributed(self) -> bool:
        """Whether more than one process takes part."""
        return bool(self.state.use_distributed)

    @property
    def multi_device(self) -> bool:
        """Whether the job spans several devices (processes with DDP-style replication)."""
        return self.num_processes > 1

    @property
    def mixed_precision(self) -> str:
        """The active mixed-precision mode ("no", "fp16", "bf16" or "fp8")."""
        return str(self.state.mixed_precision)

    @property
    def _fp8_recipe(self) -> Any:
        return next((getattr(self, s) for s in FP8_SLOTS if getattr(self, s) is not None), None)

    @property
    def fp8_enabled(self) -> bool:
        """Whether this run trains in fp8 (mixed_precision="fp8")."""
        return self.mixed_precision == "fp8"

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The fp8 library in use (AO, TE or MSAMP); otherwise what ACCELERATE_FP8_BACKEND names."""
        backend = self.precision.backend
        if backend is not None:
            return backend
        from hasten.precision.fp8 import fp8_backend_from_env

        return fp8_backend_from_env()

    @property
    def deepspeed_plugin(self) -> Any:
        """The DeepSpeed plugin passed in (or from the launcher), if any."""
        return getattr(self.state, "deepspeed_plugin", None)

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP2 (``fully_shard``) shards the prepared models."""
        return bool(self.state.is_fsdp2)

    # ------------------------------------------------------------------ N-D parallelism

    @property
    def torch_device_mesh(self) -> Any:
        """The job's `DeviceMesh` (built once from `parallelism_config`), or None."""
        return getattr(self.state, "device_mesh", None)

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Whether composable torch parallelism runs the model (FSDP2, tensor or context)."""
        config = self.parallelism_config
        return self.is_fsdp2 or bool(
            config is not None and (config.tp_enabled or config.cp_enabled)
        )

    def _mesh_rank(self, dim: str, what: str) -> int:
        if self.parallelism_config is None:
            raise RuntimeError(
                f"{what} parallelism is not configured; pass "
                "Accelerator(parallelism_config=ParallelismConfig(...)) first."
            )
        return mesh_local_rank(self.torch_device_mesh, dim)

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among the data-parallel replicas (flattened ``dp`` mesh)."""
        return self._mesh_rank("dp", "Data")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index along the ``dp_shard`` (FSDP) dimension."""
        return self._mesh_rank("dp_shard", "Shard data")

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index within its tensor-parallel group."""
        return self._mesh_rank("tp", "Tensor")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index within its context-parallel group."""
        return self._mesh_rank("cp", "Context")

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Shard ``buffers`` along ``buffer_seq_dims`` over the ``cp`` mesh for the block
        (context parallelism, CUDA only); without ``cp_size > 1`` it does nothing."""
        from hasten.training import context_parallel

        return context_parallel.maybe_context_parallel(
            self.parallelism_config,
            self.torch_device_mesh,
            buffers=buffers,
            buffer_seq_dims=buffer_seq_dims,
            no_restore_buffers=no_restore_buffers,
        )

    @property
    def pipeline_parallel_rank(self) -> int:
        """Not available: pipeline parallelism has no ParallelismConfig dimension (as Accelerate)."""
        raise NotImplementedError(
            "Pipeline parallelism is not supported: ParallelismConfig has no pipeline dimension. "
            "Use torch.distributed.pipelining directly, or tp/cp/dp dimensions."
        )

    # ------------------------------------------------------------------ configuration views

    @property
    def split_batches(self) -> bool:
        """Whether prepared data loaders split the global batch between processes."""
        return bool(self.dataloader_config.split_batches)

    @property
    def dispatch_batches(self) -> bool | None:
        """Whether the main process reads batches and dispatches slices to the others."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """Whether the last batches are topped up so every process sees as many."""
        return bool(self.dataloader_config.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether random samplers are replaced by a seedable, epoch-aware one."""
        return bool(self.dataloader_config.use_seedable_sampler)

    @property
    def non_blocking(self) -> bool:
        """Whether batches are copied to the device with ``non_blocking=True``."""
        return bool(self.dataloader_config.non_blocking)

    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether prepared data loaders are torchdata `StatefulDataLoader` objects."""
        return bool(getattr(self.dataloader_config, "use_stateful_dataloader", False))

    @property
    def project_dir(self) -> str | None:
        """The project directory (trackers, checkpoints)."""
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        """Where file-based trackers write."""
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """Index of the next automatic checkpoint."""
        return int(self.project_configuration.iteration)

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step."""
        return int(self.gradient_state.num_steps)

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin_kwargs.update({"num_steps": steps})
        self._refresh_backward()

    @property
    def step(self) -> int:
        """Micro-steps counted by `accumulate` in the current accumulation cycle/epoch."""
        return self._accumulator.step

    @step.setter
    def step(self, value: int) -> None:
        self._accumulator.step = value

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-step synchronises gradients (and so the optimizer steps)."""
        return bool(self.gradient_state.sync_gradients)

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state._set_sync_gradients(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow): do not step the LR."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def trackers(self) -> list[Any]:
        """The started trackers (after `init_trackers`)."""
        return self._trackers.trackers

    # ------------------------------------------------------------------ prepare

    def prepare(self, *args: object, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers; return them in order.

        Models are moved, compiled and wrapped (DDP when distributed), optimizers are pointed
        at the moved parameters and wrapped, data loaders are sharded, and schedulers (handled
        after every optimizer) step with their optimizer. Other objects pass through, and so
        does an object prepare returned before (as in Accelerate).

        Args:
            *args: the objects, in any order.
            device_placement: one bool per object overriding the Accelerator's setting.

        Returns:
            The prepared object if one was passed, else a tuple in the order given.

        Raises:
            ValueError: ``device_placement`` does not have one entry per object.
            RuntimeError: an object was given to prepare before and replaced by a wrapper
                (pass the wrapper: an object prepare returned comes back unchanged), or an
                optimizer's parameters are not on the training device after its model moved.
        """
        placements = call_placements(len(args), device_placement)
        check_unique(args)
        self.strategy.check_usable()
        # As in Accelerate, an object prepare returned before comes back as it is.
        fresh = [i for i, obj in enumerate(args) if not self._objects.hand_back(obj)]
        result = list(args)
        if fresh:
            prepared = self._prepare_fresh(
                tuple(args[i] for i in fresh), [placements[i] for i in fresh]
            )
            for i, obj in zip(fresh, prepared):
                result[i] = obj
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_fresh(self, args: tuple[Any, ...], placements: list[bool | None]) -> list[Any]:
        """Prepare objects not prepared before, in one go (see `prepare`)."""
        call = self._prepare_call(args, placements)
        prepared = self.strategy.setup(call)
        if prepared.by_engine:
            return self._objects.add_engine_prepared(list(prepared.objects))
        result = list(prepared.objects)
        for i in call.indices("model"):
            self._objects.record_model(result[i])
        models = [result[i] for i in call.indices("model")]
        for i, kind in enumerate(call.kinds):
            if kind == "optimizer":
                result[i] = self.prepare_optimizer(result[i], device_placement=call.placements[i])
            elif kind == "data_loader":
                result[i] = self.prepare_data_loader(result[i], device_placement=call.placements[i])
                if models:  # sharded along the sequence under DeepSpeed sequence parallelism
                    result[i] = self.deepspeed_ulysses_dl_adapter(result[i], models[0])
        for i in call.indices("scheduler"):
            result[i] = self.prepare_scheduler(result[i])
        return result

    def deepspeed_ulysses_dl_adapter(self, dl: object, model: nn.Module) -> Any:
        """Under DeepSpeed sequence parallelism (``ParallelismConfig(sp_size > 1)``), wrap the
        prepared ``dl`` so each process gets its shard of every sequence; otherwise return it.

        ``prepare`` does this for data loaders prepared with the model; transformers' Trainer
        prepares its loader apart and calls this after preparing the model (as in Accelerate).
        """
        from hasten.strategies.deepspeed.ulysses import adapt_data_loader, sequence_parallel

        if sequence_parallel(self.parallelism_config) is None:
            return dl
        return adapt_data_loader(dl, getattr(model, "device", self.device))

    def _prepare_call(
        self,
        objects: Sequence[Any],
        placements: Sequence[bool | None],
        *,
        whole: bool = True,
        evaluation: bool = False,
    ) -> PrepareCall:
        """The `PrepareCall` of ``objects``: kinds, placements, and what the strategy needs of
        the run. Each model is claimed here (and checked for a dispatcher's placement)."""
        run = (self.strategy, self.device, self.num_processes, _quantized_on_cpu)
        kinds, places = self._objects.claim(objects, placements, self.device_placement, run)
        loaders = [obj for obj, kind in zip(objects, kinds) if kind == "data_loader"]
        return PrepareCall(
            objects=tuple(objects),
            kinds=kinds,
            placements=tuple(places),
            device=self.device,
            precision=self.precision,
            dynamo=self.state.dynamo_plugin,
            batch_sizes=tuple(
                self._objects.batch_sizes(loaders, self.num_processes, self.split_batches)
            )
            if whole
            else (),
            data=self.dataloader_config,
            rng_types=tuple(self.rng_types),
            earlier_models=tuple(self._models),
            earlier_optimizers=tuple(opt.optimizer for opt in self._optimizers) if whole else (),
            whole=whole,
            evaluation=evaluation,
        )

    @property
    def deepspeed_engine_wrapped(self) -> Any:
        """The engine wrapper `backward` drives under DeepSpeed (None otherwise)."""
        return self.strategy.engine_wrapper

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> nn.Module:
        """Move ``model`` to the device, add autocast, compile and wrap it for this strategy.

        Args:
            model: the user's model.
            device_placement: override the Accelerator's ``device_placement``.
            evaluation_mode: prepare for inference only (no DDP wrapper).

        Returns:
            The model to train with (possibly a `DistributedDataParallel` or compiled wrapper).
        """
        self.strategy.check_usable()
        if self._objects.hand_back(model, "model", training=not evaluation_mode):
            return model
        call = self._prepare_call(
            (model,), [device_placement], whole=False, evaluation=evaluation_mode
        )
        prepared: nn.Module = self.strategy.setup(call).objects[0]
        self._objects.record_model(prepared, evaluation_only=evaluation_mode)
        return prepared

    @staticmethod
    def verify_device_map(model: nn.Module) -> bool:
        """Tell whether ``model`` (or a submodule) was dispatched over several devices."""
        return is_dispatched(model)

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap ``optimizer`` so it steps with the loss scaler and only on sync steps.

        Raises:
            RuntimeError: it was given to prepare before (the wrapper prepare returned comes
                back unchanged), or its parameters are not on the training device (prepare its
                model in the same call, or first).
        """
        if self._objects.hand_back(optimizer, "optimizer"):
            return optimizer  # type: ignore[return-value]  # one prepare returned
        self._prepared.claim(optimizer, "optimizer")
        place = self.device_placement if device_placement is None else device_placement
        if place and not self.strategy.owns_optimizer_step:
            check_optimizer_device(optimizer, self.device)
        wrapped = self.strategy.wrap_optimizer(
            optimizer, device_placement=place, scaler=self.scaler
        )
        self._objects.mark(wrapped)
        self._optimizers.append(wrapped)
        self._scaled_without_optimizer = False
        return wrapped

    def prepare_data_loader(
        self,
        data_loader: torch.utils.data.DataLoader[Any],
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable[..., Any] | None = None,
    ) -> Any:
        """Shard ``data_loader`` for this process (see `DataLoaderConfiguration`).

        Raises:
            RuntimeError: it was given to prepare before (the wrapper prepare returned comes
                back unchanged).
            ValueError: split_batches with a batch size not divisible by num_processes.
        """
        if self._objects.hand_back(data_loader, "data_loader"):
            return data_loader
        self._prepared.claim(data_loader, "data loader")
        place = self.device_placement if device_placement is None else device_placement
        prepared = shard_data_loader(
            data_loader,
            self.dataloader_config,
            self.device,
            (self.num_processes, self.process_index),
            put_on_device=place,
            rng_types=list(self.rng_types),
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            mesh=self.torch_device_mesh,
        )
        self._objects.mark(prepared)
        self._dataloaders.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap ``scheduler`` so it steps only when its optimizer really stepped.

        Raises:
            RuntimeError: it was given to prepare before (the wrapper prepare returned comes
                back unchanged).
        """
        if self._objects.hand_back(scheduler, "scheduler"):
            return scheduler
        self._prepared.claim(scheduler, "scheduler")
        owner = getattr(scheduler, "optimizer", None)
        optimizers: Any = next(
            (opt for opt in self._optimizers if opt.optimizer is owner), self._optimizers
        )
        wrapped = self.strategy.wrap_scheduler(
            scheduler,
            optimizers,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        self._objects.mark(wrapped)
        self._schedulers.append(wrapped)
        return wrapped

    def skip_first_batches(
        self, dataloader: torch.utils.data.DataLoader[Any], num_batches: int = 0
    ) -> Any:
        """Return a data loader that skips its first ``num_batches`` batches (to resume)."""
        from hasten.data_loader.skip import skip_first_batches

        return skip_first_batches(dataloader, num_batches)

    # ------------------------------------------------------------------ training step

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (divided by the accumulation steps, scaled under fp16); with
        ``learning_rate=`` and a prepared LOMO optimizer, run its fused backward + update.

        Raises:
            RuntimeError: under fp16 before any optimizer was prepared (the scaled gradients
                would never be unscaled).
        """
        if self._scaled_without_optimizer:
            raise RuntimeError(
                "backward() under mixed_precision='fp16' scales the loss, but no optimizer was "
                "prepared to unscale the gradients: pass the optimizer to accelerator.prepare() "
                "before training."
            )
        if kwargs.get("learning_rate") is not None and self.has_lomo_optimizer:
            # Accelerate's (and transformers' Trainer's) spelling of a LOMO step
            learning_rate = kwargs.pop("learning_rate")
            from hasten.training.lomo import lomo_backward

            lomo_backward(self._optimizers, loss / self.gradient_accumulation_steps, learning_rate)
            return
        self._backward(loss, **kwargs)

    @property
    def has_lomo_optimizer(self) -> bool:
        """Whether a LOMO/AdaLomo optimizer (lomo-optim) was prepared."""
        from hasten.training.lomo import is_lomo_optimizer

        return any(is_lomo_optimizer(opt) for opt in self._optimizers)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update in one pass with the prepared LOMO/AdaLomo optimizer (lomo-optim).

        Raises:
            ImportError: lomo-optim is missing.
            ValueError: no learning rate, or no (or several) LOMO optimizers were prepared.
        """
        from hasten.training.lomo import lomo_backward

        lomo_backward(self._optimizers, loss, learning_rate)

    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context for one micro-batch of gradient accumulation over ``models``.

        Sets `sync_gradients` (every ``gradient_accumulation_steps`` micro-batches and on the
        last batch of the data loader) and skips DDP communication on the other micro-batches.
        """
        return self._accumulator.accumulate(models)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context in which backward accumulates gradients locally (no DDP all-reduce)."""
        return self.strategy.no_sync(model)

    @staticmethod
    def trigger_sync_in_backward(model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Context forcing the next backward of a DDP ``model`` to all-reduce gradients."""
        return sync_in_backward(model)

    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Context for training on inputs whose length differs between processes.

        Under DDP, processes that run out of batches keep answering the others' all-reduces
        (`torch.distributed.algorithms.join.Join`); elsewhere it does nothing.

        Args:
            joinables: the DDP-wrapped models (and other `Joinable` objects).
            even_batches: override ``even_batches`` of the prepared map-style data loaders
                inside the context (e.g. False to really see uneven inputs).
        """
        from hasten.training.join import uneven_inputs

        processes = self.num_processes
        return uneven_inputs(self.strategy, processes, self._dataloaders, joinables, even_batches)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Unscale the gradients of ``optimizer`` (default: every prepared one) under fp16."""
        if self.scaler is None:
            return
        targets = self._optimizers if optimizer is None else optimizer
        if not isinstance(targets, (list, tuple)):
            targets = [targets]
        for opt in targets:
            self.precision.unscale_(unwrap_optimizer(opt))

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> Any:
        """Unscale gradients, then clip their total norm to ``max_norm``; return the norm."""
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale gradients, then clamp each element into ``[-clip_value, clip_value]``."""
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Any:
        """Context running the enclosed code under this run's mixed precision."""
        return self.precision.autocast(autocast_handler or self.autocast_handler)

    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """Return the user's model from the wrappers `prepare` added."""
        return self.strategy.unwrap(
            model, keep_fp32_wrapper=keep_fp32_wrapper, keep_torch_compile=keep_torch_compile
        )

    # ------------------------------------------------------------------ collectives

    def gather(self, tensor: object) -> Any:
        """Concatenate ``tensor`` (any nesting) from all processes along dim 0."""
        from hasten.ops import collectives

        return collectives.gather(tensor)

    def gather_for_metrics(self, input_data: object, use_gather_object: bool = False) -> Any:
        """Gather evaluation outputs, dropping the samples duplicated to even out batches."""
        from hasten.training import metrics

        comm = self._dp_comm
        return metrics.gather_for_metrics(
            input_data,
            use_gather_object,
            gradient_state=self.gradient_state,
            comm=comm,
        )

    def reduce(self, tensor: object, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce ``tensor`` across processes ("sum", "mean" or "none"), times ``scale``.

        With tensor/context parallelism only the data-parallel replicas are counted.
        """
        from hasten.ops import collectives

        if self._dp_comm is not None:
            return collectives.reduce_on(self._dp_comm, tensor, reduction)
        return collectives.reduce(tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        """Pad ``tensor`` along ``dim`` to the largest size among processes."""
        from hasten.ops import collectives

        return collectives.pad_across_processes(
            tensor, dim=dim, pad_index=pad_index, pad_first=pad_first
        )

    def split_between_processes(self, inputs: object, apply_padding: bool = False) -> Any:
        """Context yielding this process's share of ``inputs`` (list, tuple, dict or tensor)."""
        return self.state.split_between_processes(inputs, apply_padding=apply_padding)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        self.state.wait_for_everyone()

    def set_trigger(self) -> None:
        """Raise a flag on this process that `check_trigger` sees on every process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Return True on every process if any process called `set_trigger` (then reset it)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        from hasten.ops import collectives

        flag = collectives.reduce(self.flag_tensor, "sum")
        if int(flag.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    # ------------------------------------------------------------------ process helpers

    def print(self, *args: object, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        self.state.print(*args, **kwargs)

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context where the main process runs first, then the others."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Context where each machine's local main process runs first."""
        return self.state.local_main_process_first()

    def on_main_process(self, function: F | None = None) -> Any:
        """Decorator: run ``function`` only on the main process."""
        return self._on(function, lambda: self.is_main_process, "on_main_process")

    def on_local_main_process(self, function: F | None = None) -> Any:
        """Decorator: run ``function`` only on each machine's local main process."""
        return self._on(function, lambda: self.is_local_main_process, "on_local_main_process")

    def on_last_process(self, function: F) -> Any:
        """Decorator: run ``function`` only on the last process."""
        return self._on(function, lambda: self.is_last_process, "on_last_process")

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` only on process ``process_index``."""
        if function is None:
            return lambda fn: self.on_process(fn, process_index=process_index)
        return self._on(function, lambda: self.process_index == process_index, "on_process")

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` only on local process ``local_process_index``."""
        if function is None:
            return lambda fn: self.on_local_process(fn, local_process_index=local_process_index)
        return self._on(
            function,
            lambda: self.local_process_index == local_process_index,
            "on_local_process",
        )

    @staticmethod
    def _on(function: F | None, runs_here: Callable[[], bool], name: str) -> Any:
        if function is None:
            return lambda fn: Accelerator._on(fn, runs_here, name)
        if not callable(function):
            raise TypeError(f"{name} decorates a function, got {function!r}.")

        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if runs_here() else None

        return wrapper

    # ------------------------------------------------------------------ memory

    def free_memory(self, *objects: object) -> list[Any]:
        """Drop references to prepared objects, collect garbage and empty the device cache."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        self._prepared.forget()
        self.step = 0
        from hasten.platforms.memory import release_memory

        released = release_memory(*objects)
        gc.collect()
        return list(released) if isinstance(released, (list, tuple)) else [released]

    def clear(self, *objects: object) -> list[Any]:
        """Alias of `free_memory`."""
        return self.free_memory(*objects)

    # ------------------------------------------------------------------ profiling

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profile the enclosed block; one Chrome trace per process if an output dir is set."""
        from hasten.config.kwargs import ProfileKwargs
        from hasten.training import profiling

        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with profiling.profile(handler, self.process_index, self.wait_for_everyone) as prof:
            yield prof

    # ------------------------------------------------------------------ checkpoints

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """Return the full state dict of ``model`` (unwrapped from DDP/compile by default).

        Sharded models are gathered: every process must call this, and under FSDP the full
        tensors land on the main process (the others get an empty dict).
        """
        if not unwrap:
            return model.state_dict()
        return self.strategy.model_state_dict(model, full=True)

    def save(self, obj: object, f: Any, safe_serialization: bool = False) -> None:
        """Save ``obj`` to ``f`` once per job (once per node with ``save_on_each_node``)."""
        from hasten.checkpointing.storage import io

        io.save(
            obj,
            f,
            save_on_each_node=self.project_configuration.save_on_each_node,
            safe_serialization=safe_serialization,
        )

    def save_model(
        self,
        model: nn.Module,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write the unwrapped weights of ``model`` as one file or shards plus an index.

        Only the main process writes; tied weights are stored once. Sharded (FSDP2) models are
        gathered one shard file at a time: every process must call this.
        """
        from hasten.checkpointing.model import save_model_weights, state_dict_to_save

        parts = self.strategy.full_state_dict_parts(model)
        if parts is not None:
            held, gather = parts
            save_model_weights(
                held,
                save_directory,
                max_shard_size,
                safe_serialization,
                gather=gather,
                write=self.is_main_process,
            )
            return
        state_dict = state_dict_to_save(model, self.get_state_dict)
        if self.is_main_process:
            save_model_weights(state_dict, save_directory, max_shard_size, safe_serialization)

    def register_for_checkpointing(self, *objects: object) -> None:
        """Include ``objects`` (each with state_dict/load_state_dict) in save/load_state."""
        from hasten.checkpointing.manager import check_checkpointable

        check_checkpointable(objects)
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> Any:
        """Call ``hook(models, weights, output_dir)`` before each save; returns a removable handle."""
        return self._checkpoints.register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> Any:
        """Call ``hook(models, input_dir)`` before each load; returns a removable handle."""
        return self._checkpoints.register_load_state_pre_hook(hook)

    def _checkpoint_contents(
        self, for_save: bool
    ) -> tuple[CheckpointLayout[Any], CheckpointContents]:
        """The strategy's checkpoint layout and what this save_state/load_state holds for it."""
        from hasten.checkpointing.layouts.base import PreparedObjects
        from hasten.checkpointing.layouts.factory import checkpoint_layout

        layout = checkpoint_layout(self.strategy)
        prepared = PreparedObjects(
            models=self._models,
            optimizers=self._optimizers,
            schedulers=self._schedulers,
            dataloaders=self._dataloaders,
            custom_objects=self._custom_objects,
            scaler=self.scaler,
            mid_cycle=not self.sync_gradients,
        )
        return layout, layout.contents(prepared, for_save=for_save)

    def save_state(
        self,
        output_dir: str | None = None,
        safe_serialization: bool = True,
        async_save: bool = False,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, loaders, scaler, RNG states and registered objects.

        The folder appears complete or not at all (written aside, then renamed). With
        ``async_save`` the call returns once the state is copied to host memory (a CPU
        optimizer's state is copied on the writer thread, and that optimizer's next step waits
        for the copy); the next save, load or `end_training` waits for the write. Returns the
        folder.
        """
        layout, contents = self._checkpoint_contents(for_save=True)
        return self._checkpoints.save_state(
            output_dir,
            contents,
            list(self._models),
            layout=layout,
            step=self.step,  # mid-cycle saves resume the accumulation count
            safe_serialization=safe_serialization,
            async_save=async_save,
        )

    def load_state(
        self,
        input_dir: str | None = None,
        load_kwargs: dict[str, Any] | None = None,
        strict: bool = True,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore everything `save_state` wrote; without ``input_dir``, the newest complete one.

        A damaged or partial checkpoint is refused (naming the file); any part that cannot be
        restored raises, naming it, unless ``strict=False``, which warns once per part.
        ``keep_global_batch=True`` (hasten, a keyword): with per-process batches and another
        number of processes than saved, scale ``gradient_accumulation_steps`` to keep the
        saved global batch (docs/checkpoints.md).
        """
        from hasten.checkpointing.functional import optimizer_map_location
        from hasten.data_loader.world_size import kept_schedule

        # Accelerate takes map_location among the keyword arguments (None, "cpu", "on_device")
        where = load_model_func_kwargs.pop("map_location", (load_kwargs or {}).get("map_location"))
        keep = bool(load_model_func_kwargs.pop("keep_global_batch", False))
        for loader in self._dataloaders:
            loader.keep_global_batch = keep
        layout, contents = self._checkpoint_contents(for_save=False)
        attributes = self._checkpoints.load_state(
            input_dir,
            contents,
            layout=layout,
            map_location=optimizer_map_location(where),
            strict=strict,
        )
        self.step = int(attributes.get("step", self.step))  # the accumulation micro-step count
        if keep:  # per-process batches loaded by another number of processes
            self.gradient_accumulation_steps, self.step = kept_schedule(
                self._dataloaders, self.num_processes, self.gradient_accumulation_steps, self.step
            )

    # ------------------------------------------------------------------ tracking

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Start the ``log_with`` trackers for ``project_name`` and record ``config``."""
        self._trackers.init(project_name, config=config, init_kwargs=init_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """Return the started tracker ``name`` (its raw run object if ``unwrap``)."""
        return self._trackers.get(name, unwrap=unwrap)

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Log ``values`` at ``step`` to every started tracker (main process only)."""
        self._trackers.log(values, step=step, log_kwargs=log_kwargs)

    def end_training(self) -> None:
        """Finish pending saves and the trackers, then destroy the process group hasten made.

        Every process waits for the others first, so none tears the group down under a peer. A
        group made before the Accelerator (by Ray Train, or by the user) is left to its owner.
        """
        if self._checkpoint_manager is not None:
            self._checkpoint_manager.finish()
        if self._unsaved_notice is not None:
            self._unsaved_notice.uninstall()
        if self._tracker_manager is not None:
            self._tracker_manager.finish()
        self.wait_for_everyone()
        self.strategy.release()  # engines (DeepSpeed) go before the group they use
        if self.state.owns_process_group:
            self.state.destroy_process_group()

    def __repr__(self) -> str:
        return (
            f"Accelerator(strategy={self.strategy!r}, mixed_precision={self.mixed_precision!r}, "
            f"num_processes={self.num_processes}, device={str(self.device)!r})"
        )
