"""`PartialState`: who this process is in the job, set up once, readable from anywhere.

The first `PartialState()` detects the run (`hasten.state.detect.detect_run`), creates the
process group and picks the device; every later `PartialState()` costs well under a
microsecond and every property is a plain attribute read, so hot paths may create it freely.

A process group that already exists (made by Ray Train, or by the user) is adopted: hasten
neither makes it again nor destroys it in `Accelerator.end_training`. A gloo group hasten made
is destroyed when the interpreter exits, if nothing did so before: left to the interpreter's
own teardown, its threads (gloo's loop and workers, the store's server on rank 0) were still
running while the objects around them were destroyed, and a finished job could end with
SIGABRT ("terminate called without an active exception"). Destroying and releasing groups is
`hasten.state.teardown`'s (it also keeps destroyed gloo groups until their threads are idle).
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hasten.config import envvars
from hasten.config.enums import DistributedType
from hasten.core.errors import ProcessGroupDestroyedError, StateNotInitializedError
from hasten.platforms.base import Platform
from hasten.platforms.numa import set_numa_affinity
from hasten.platforms.registry import PLATFORMS, current_platform, get_platform
from hasten.state import recorder
from hasten.state._shared import SharedState, register_reset_hook, unreadable_state
from hasten.state.detect import RunSpec, detect_run, main_is_last_process, runs_distributed
from hasten.state.split import split_inputs
from hasten.state.teardown import destroy_group, release_retired, remember_made_group

__all__ = ["DEFAULT_PROCESS_GROUP_TIMEOUT", "PartialState"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=10)

register_reset_hook(recorder.reset)

# Attributes that exist once the state is initialised; reading one after a reset gets a
# message that says why instead of a bare AttributeError.
_KNOWN_ATTRS = frozenset(
    {
        "_cpu",
        "_mixed_precision",
        "backend",
        "debug",
        "device",
        "distributed_type",
        "fork_launched",
        "local_process_index",
        "num_processes",
        "process_index",
        "process_group_timeout",
        "platform",
        "_spec",
        "_distributed_type",
        "_use_distributed",
        "_main_is_last",
        "_barrier",
        "_group_kwargs",
    }
)

# What an unpickled PartialState must hold (the rest has defaults).
_PICKLED_REQUIRED = (
    "_spec",
    "_distributed_type",
    "device",
    "num_processes",
    "process_index",
    "local_process_index",
)
_ACCELERATE_REQUIRED = (
    "distributed_type",
    "device",
    "num_processes",
    "process_index",
    "local_process_index",
)

_DESTROYED = (
    "{what} needs the process group of this {n}-process job, but end_training() (or "
    "destroy_process_group()) destroyed it. Call it before end_training(), or create a new "
    "Accelerator() to start a new process group (every process must do so)."
)


def _skip(function: F) -> F:
    """Return a no-op that keeps `function`'s name and docstring."""

    @functools.wraps(function)
    def skipped(*args: Any, **kwargs: Any) -> None:
        return None

    return skipped  # type: ignore[return-value]


def _set_cpu_threads(local_num_processes: int) -> None:
    # Without OMP_NUM_THREADS every process would start one thread per core and they would
    # oversubscribe the host; split the physical cores between the local processes instead.
    if envvars.setting("OMP_NUM_THREADS") is not None:
        return
    import psutil

    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    threads = max(1, cores // max(local_num_processes, 1))
    torch.set_num_threads(threads)
    logger.info(
        "OMP_NUM_THREADS is unset: using %d CPU threads per process "
        "(%d cores / %d local processes); set OMP_NUM_THREADS to choose.",
        threads,
        cores,
        local_num_processes,
    )


def _init_process_group(spec: RunSpec, backend: str, kwargs: dict[str, Any]) -> None:
    release_retired()  # a group hasten destroyed before goes first, with its store
    if spec.use_deepspeed:
        from hasten.core.imports import require

        deepspeed = require("deepspeed", feature="ACCELERATE_USE_DEEPSPEED", extra="deepspeed")
        comm = deepspeed.comm  # optional: deepspeed
        if not comm.is_initialized():
            comm.init_distributed(dist_backend=backend, auto_mpi_discovery=False, **kwargs)
        return
    kwargs.setdefault("rank", spec.process_index)
    kwargs.setdefault("world_size", spec.num_processes)
    dist.init_process_group(backend=backend, **kwargs)


def _destroyed_barrier(num_processes: int) -> Callable[[], None]:
    def barrier() -> None:
        raise ProcessGroupDestroyedError(
            _DESTROYED.format(what="wait_for_everyone()", n=num_processes)
        )

    return barrier


def _restore_accelerate_attributes(state: dict[str, Any]) -> None:
    """Turn the attributes of an Accelerate `PartialState` (a pickle written under Accelerate)
    into hasten's, in place.

    Raises:
        pickle.UnpicklingError: an attribute every Accelerate version writes is missing or
            unreadable.
    """
    missing = [name for name in _ACCELERATE_REQUIRED if name not in state]
    if missing:
        raise unreadable_state("PartialState", f"it has no {', '.join(missing)}")
    try:
        distributed_type = DistributedType(state.pop("distributed_type"))
        device = torch.device(state["device"])
    except (TypeError, ValueError, RuntimeError) as err:
        raise unreadable_state(
            "PartialState", f"its distributed_type or device is invalid ({err})"
        ) from err
    cpu = bool(state.get("_cpu", False))
    state.update(
        device=device,
        _cpu=cpu,
        debug=bool(state.get("debug", False)),
        fork_launched=bool(state.get("fork_launched", False)),
        backend=state.get("backend"),
        _mixed_precision=str(state.get("_mixed_precision", "no")),
        process_group_timeout=state.get("process_group_timeout", DEFAULT_PROCESS_GROUP_TIMEOUT),
        platform=get_platform(device.type) if device.type in PLATFORMS else get_platform("cpu"),
        _group_destroyed=False,
        _distributed_type=distributed_type,
        _main_is_last=main_is_last_process(distributed_type),
        _use_distributed=runs_distributed(distributed_type) and int(state["num_processes"]) > 1,
    )
    state["_spec"] = RunSpec(
        distributed_type=distributed_type,
        backend=state["backend"],
        num_processes=int(state["num_processes"]),
        process_index=int(state["process_index"]),
        local_process_index=int(state["local_process_index"]),
        device_type=device.type,
        cpu=cpu,
    )


def _barrier_for(spec: RunSpec, device: torch.device) -> Callable[[], None] | None:
    """Choose the barrier once: none for one process, device-bound for nccl."""
    if spec.num_processes <= 1 or spec.backend is None:
        return None
    if device.type == "cuda" and spec.backend.startswith("nccl"):
        device_ids = [device.index or 0]
        return lambda: dist.barrier(device_ids=device_ids)
    return dist.barrier


class PartialState(SharedState):
    """Where this process stands: device, ranks, distributed type, and process-control helpers.

    Every instance shares the same attributes; the first one sets everything up.

    Args:
        cpu: run on the CPU even when an accelerator is present.
        kwargs: passed to `torch.distributed.init_process_group` (see
            `InitProcessGroupKwargs.to_kwargs()`); ``timeout`` defaults to 10 minutes.

    Example:
        >>> state = PartialState()
        >>> state.num_processes, state.is_main_process
        (1, True)
    """

    device: torch.device
    backend: str | None
    num_processes: int
    process_index: int
    local_process_index: int
    debug: bool
    fork_launched: bool
    process_group_timeout: datetime.timedelta
    platform: Platform
    _cpu: bool
    _mixed_precision: str
    _spec: RunSpec
    _barrier: Callable[[], None] | None
    _distributed_type: DistributedType
    _use_distributed: bool
    _main_is_last: bool
    _group_kwargs: dict[str, Any]
    _group_destroyed: bool
    _owns_group: bool

    # Rebuilt when unpickled: the barrier may be a closure, the store and group arguments
    # belong to this process's group.
    _transient = frozenset({"_barrier", "_group_kwargs", "_kept_store"})

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self.__dict__ = shared = self._shared_state
        if shared:
            return
        try:
            self._setup(cpu, kwargs)
        except BaseException:
            shared.clear()
            raise

    def _setup(self, cpu: bool, kwargs: dict[str, Any]) -> None:
        cpu = cpu or bool(envvars.setting("ACCELERATE_USE_CPU"))
        kwargs.pop("_use_sagemaker_dp", None)
        requested_backend = kwargs.pop("backend", None)
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = DEFAULT_PROCESS_GROUP_TIMEOUT
        platform = current_platform(cpu)
        spec = detect_run(
            envvars.snapshot(),
            platform,
            cpu,
            backend=requested_backend,
            mpi_available=dist.is_available() and dist.is_mpi_available(),
        )
        self._cpu = cpu
        self.platform = platform
        self._spec = spec
        self.local_process_index = spec.local_process_index
        # The device is made current before the group exists: nccl binds to it at creation.
        self.set_device()
        if spec.backend is not None:
            for name, value in spec.env_updates.items():
                envvars.write(name, value)
            if spec.device_type == "cpu":
                _set_cpu_threads(spec.local_num_processes)
            self._owns_group = not dist.is_initialized()
            if self._owns_group:
                _init_process_group(spec, spec.backend, dict(kwargs))
                remember_made_group(spec.backend)
        else:
            self._owns_group = False
        self._group_kwargs = dict(kwargs)
        self._group_destroyed = False
        self.debug = bool(envvars.setting("ACCELERATE_DEBUG_MODE"))
        self.fork_launched = bool(envvars.setting("FORK_LAUNCHED"))
        self._mixed_precision = str(envvars.setting("ACCELERATE_MIXED_PRECISION"))
        self.process_group_timeout = kwargs["timeout"]
        self.backend = spec.backend
        self._apply_ranks(spec)
        self.distributed_type = spec.distributed_type
        self._barrier = _barrier_for(spec, self.device)
        if envvars.setting("ACCELERATE_CPU_AFFINITY"):
            set_numa_affinity(self.local_process_index)

    def _apply_ranks(self, spec: RunSpec) -> None:
        if spec.needs_process_group and dist.is_initialized() and not spec.use_deepspeed:
            # A group created before us (by the user or another library) is the truth.
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
        else:
            self.num_processes = spec.num_processes
            self.process_index = spec.process_index

    @property
    def distributed_type(self) -> DistributedType:
        """The kind of run (NO, MULTI_CPU, MULTI_GPU, ..., DEEPSPEED, FSDP)."""
        return self._distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        self._distributed_type = value
        self._main_is_last = main_is_last_process(value)
        self._use_distributed = runs_distributed(value) and self.num_processes > 1

    @property
    def initialized(self) -> bool:
        """Whether the shared state has been set up."""
        return bool(self._shared_state)

    @property
    def owns_process_group(self) -> bool:
        """Whether hasten made the process group (False when it adopted one Ray or the user made).

        `Accelerator.end_training` destroys only a group hasten made.
        """
        return bool(self.__dict__.get("_owns_group"))

    @property
    def use_distributed(self) -> bool:
        """Whether several processes cooperate in this run."""
        return self._use_distributed

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest index."""
        return self.process_index == self.num_processes - 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is the main process (index 0; the last one under Megatron-LM)."""
        if self._main_is_last:
            return self.is_last_process
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its machine."""
        if self._main_is_last:
            return self.is_last_process
        return self.local_process_index == 0

    @property
    def mixed_precision(self) -> str:
        """The mixed precision the launcher asked for (``ACCELERATE_MIXED_PRECISION``)."""
        return self._mixed_precision

    @property
    def default_device(self) -> torch.device:
        """The device a single process uses: the platform's default, or the CPU if forced."""
        return torch.device("cpu") if self._cpu else self.platform.device()

    def set_device(self) -> None:
        """Pick this process's device (once) and make it current on its platform."""
        if "device" in self.__dict__:
            return
        spec = self._spec
        override = envvars.setting("ACCELERATE_TORCH_DEVICE")
        if override:
            self.device = torch.device(override)
        elif spec.backend is None:
            self.device = self.default_device
        elif spec.device_type == "cpu":
            self.device = torch.device("cpu")
        else:
            self.device = self.platform.device(self.local_process_index)
            self.platform.set_device(self.device)

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point (no-op for a single process).

        A barrier that outlives the process-group timeout raises an error that names what every
        rank was doing.
        """
        barrier = self._barrier
        if barrier is not None:
            recorder.guarded("wait_for_everyone", barrier)

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's share of `inputs` (list, tuple, dict of those, tensor).

        Shares differ by at most one element, earlier processes taking the extra ones. With
        `apply_padding`, shorter shares are padded with the input's last element so every
        process gets the same length (drop the padding after gathering).

        Example:
            >>> with PartialState().split_between_processes(["a", "b", "c"]) as mine:
            ...     mine  # on 2 processes: ["a", "b"] on process 0, ["c"] on process 1
            ['a', 'b', 'c']
        """
        if self.num_processes == 1:
            yield inputs
            return
        yield split_inputs(inputs, self.process_index, self.num_processes, apply_padding)

    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others together."""
        yield from self._goes_first(self.is_main_process)

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's main process first, then on the others."""
        yield from self._goes_first(self.is_local_main_process)

    def _keep_if(self, keep: bool, function: F) -> F:
        if keep or not self._use_distributed:
            return function
        return _skip(function)

    def on_main_process(self, function: F | None = None) -> Any:
        """Decorate `function` to run only on the main process (also as ``on_main_process()``)."""
        if not self.initialized:
            raise StateNotInitializedError(
                "PartialState.on_main_process was used before the state was set up; create "
                "PartialState() or Accelerator() first."
            )
        if function is None:
            return self.on_main_process
        return self._keep_if(self.is_main_process, function)

    def on_local_main_process(self, function: F | None = None) -> Any:
        """Decorate `function` to run only on the main process of each machine."""
        if function is None:
            return self.on_local_main_process
        return self._keep_if(self.is_local_main_process, function)

    def on_last_process(self, function: F) -> F:
        """Decorate `function` to run only on the last process."""
        return self._keep_if(self.is_last_process, function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorate `function` to run only on process `process_index`.

        Usable as ``@state.on_process(process_index=1)``.
        """
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._keep_if(self.process_index == process_index, function)

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorate `function` to run only on local process `local_process_index` of each machine."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._keep_if(self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` once per machine (on the local main process)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy `group` (default: the default group) unless forked workers share it.

        Afterwards `wait_for_everyone` and the collectives raise `ProcessGroupDestroyedError`
        (they would otherwise hang or silently act as if alone); a new `Accelerator()` starts a
        new group.
        """
        if self.fork_launched and group is None:
            return
        if dist.is_available() and dist.is_initialized():
            ours = group is None and self._spec.needs_process_group
            if ours:
                # Keep the rendezvous store: a restart then needs no new rendezvous (where rank
                # 0 hosts the store, a peer could otherwise join the old one as it closes).
                self._kept_store = recorder.default_store()
            destroy_group(group)
            if ours:
                self._group_destroyed = True
                self._barrier = _destroyed_barrier(self.num_processes)

    def _check_process_group(self, what: str) -> None:
        """Raise `ProcessGroupDestroyedError` if `destroy_process_group` ended the job's group."""
        if self.__dict__.get("_group_destroyed"):
            raise ProcessGroupDestroyedError(_DESTROYED.format(what=what, n=self.num_processes))

    def _restart_process_group(self) -> None:
        """Create the process group again after `destroy_process_group` (a new Accelerator).

        Every process must call it (it is a rendezvous), which constructing an Accelerator on
        each process does.
        """
        if not self.__dict__.get("_group_destroyed") or dist.is_initialized():
            return
        spec = self._spec
        assert spec.backend is not None  # a destroyed group had one
        kwargs = dict(self._group_kwargs)
        store = self.__dict__.pop("_kept_store", None)
        if store is not None and not spec.use_deepspeed:
            self._restarts = self.__dict__.get("_restarts", 0) + 1
            kwargs["store"] = dist.PrefixStore(f"hasten_restart_{self._restarts}/", store)
            kwargs.pop("init_method", None)
        _init_process_group(spec, spec.backend, kwargs)
        remember_made_group(spec.backend)
        self._owns_group = True
        self._barrier = _barrier_for(spec, self.device)
        self._group_destroyed = False

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (Accelerate's name; tests use `reset_state()`)."""
        PartialState._clear_shared()

    def _restore(self) -> None:
        """Complete an unpickled state (hasten's, or Accelerate's attributes) and its barrier."""
        state = self.__dict__
        if "_spec" not in state:  # written by Accelerate: build what hasten keeps from it
            _restore_accelerate_attributes(state)
        missing = [name for name in _PICKLED_REQUIRED if name not in state]
        if missing:
            raise unreadable_state("PartialState", f"it has no {', '.join(missing)}")
        self._group_kwargs = {}
        if state.get("_group_destroyed"):
            self._barrier = _destroyed_barrier(self.num_processes)
        else:
            self._barrier = _barrier_for(self._spec, self.device)

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.backend else ""
        return (
            f"Distributed environment: {self.distributed_type}{backend}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    def __getattr__(self, name: str) -> Any:
        if name in _KNOWN_ATTRS:
            raise AttributeError(
                f"`PartialState` object has no attribute `{name}`. This happens if "
                "`PartialState._reset_state()` was called and an `Accelerator` or "
                "`PartialState` was not reinitialized. (hasten's reset_state() resets it too.) "
                "Create PartialState() or Accelerator() again before using the state."
            )
        raise AttributeError(f"'PartialState' object has no attribute {name!r}")
