"""`AcceleratorState`: `PartialState` plus what the `Accelerator` was asked for.

Holds the mixed precision and the engine plugins (DeepSpeed, FSDP, Megatron-LM, dynamo, tensor
parallelism, ParallelismConfig) and the engine label they imply. Like `PartialState`, every
instance shares one set of attributes; it is created by `Accelerator()`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from hasten.config import envvars
from hasten.config.enums import (
    DistributedType,
    DynamoBackend,
    parse_mixed_precision,
)
from hasten.state._shared import SharedState, unreadable_state
from hasten.state.engine import EngineChoice, resolve_engine
from hasten.state.mesh import build_device_mesh
from hasten.state.partial import PartialState

if TYPE_CHECKING:
    from hasten.config.deepspeed import DeepSpeedPlugin
    from hasten.config.dynamo import TorchDynamoPlugin
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.megatron import MegatronLMPlugin
    from hasten.config.parallelism import ParallelismConfig, TorchTensorParallelPlugin

__all__ = ["AcceleratorState"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


# Copied from PartialState at set-up: fixed for the life of the state, read as plain attributes.
_COPIED = (
    "backend",
    "debug",
    "device",
    "fork_launched",
    "local_process_index",
    "num_processes",
    "platform",
    "process_group_timeout",
    "process_index",
)
_KNOWN_ATTRS = frozenset(
    _COPIED
    + (
        "_mixed_precision",
        "_partial",
        "engine",
        "deepspeed_plugins",
        "dynamo_plugin",
        "fsdp_plugin",
        "megatron_lm_plugin",
        "parallelism_config",
        "torch_tp_plugin",
    )
)


def _validate_mixed_precision(mixed_precision: str | None) -> str:
    if mixed_precision is None:  # the table row checks the variable
        return str(envvars.setting("ACCELERATE_MIXED_PRECISION"))
    return parse_mixed_precision(
        mixed_precision,
        "AcceleratorState(mixed_precision=...)",
        "pass one of them, or None to use ACCELERATE_MIXED_PRECISION",
    )


def _call_if_present(plugin: Any, method: str, *args: Any, **kwargs: Any) -> None:
    function = getattr(plugin, method, None)
    if function is not None:
        function(*args, **kwargs)


class AcceleratorState(SharedState):
    """Process state plus mixed precision and engine plugins; shared by every instance.

    Args:
        mixed_precision: "no", "fp16", "bf16" or "fp8"; default from ACCELERATE_MIXED_PRECISION.
        cpu: run on the CPU even when an accelerator is present.
        dynamo_plugin: a `TorchDynamoPlugin`.
        deepspeed_plugin: a `DeepSpeedPlugin`, or a dict of named ones (the first is active).
        fsdp_plugin: a `FullyShardedDataParallelPlugin`.
        torch_tp_plugin: a tensor-parallel plugin.
        megatron_lm_plugin: a `MegatronLMPlugin`.
        parallelism_config: a `ParallelismConfig`.
        _from_accelerator: set by `Accelerator`; the state is not meant to be set up alone.
        kwargs: passed on to `PartialState` (and so to ``init_process_group``).

    Raises:
        ValueError: unknown `mixed_precision`, or a different one than the state already has.
        RuntimeError: first created outside an `Accelerator`.
    """

    device: torch.device
    backend: str | None
    num_processes: int
    process_index: int
    local_process_index: int
    debug: bool
    fork_launched: bool
    _partial: PartialState
    _mixed_precision: str
    engine: EngineChoice
    _cpu: bool

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugin: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: TorchTensorParallelPlugin | None = None,
        megatron_lm_plugin: MegatronLMPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__ = shared = self._shared_state
        cpu = cpu or bool(envvars.setting("ACCELERATE_USE_CPU"))
        if shared:
            self._check_initialized(mixed_precision, cpu)
            if not PartialState._shared_state:  # PartialState._reset_state() alone: set it up again
                self._rejoin_partial(PartialState(self._cpu, **kwargs))
            elif _from_accelerator:  # a new Accelerator after end_training(): a new group
                self._partial._restart_process_group()
            return
        if not _from_accelerator:
            raise RuntimeError(
                "AcceleratorState is set up by Accelerator: create `accelerator = Accelerator()` "
                "before using AcceleratorState()."
            )
        plugins = {
            "dynamo_plugin": dynamo_plugin,
            "deepspeed_plugin": deepspeed_plugin,
            "fsdp_plugin": fsdp_plugin,
            "torch_tp_plugin": torch_tp_plugin,
            "megatron_lm_plugin": megatron_lm_plugin,
            "parallelism_config": parallelism_config,
        }
        try:
            self._setup(_validate_mixed_precision(mixed_precision), cpu, plugins, kwargs)
        except BaseException:
            shared.clear()
            raise

    def _setup(
        self, mixed_precision: str, cpu: bool, plugins: dict[str, Any], kwargs: dict[str, Any]
    ) -> None:
        partial = PartialState(cpu, **kwargs)
        for name in _COPIED:
            setattr(self, name, getattr(partial, name))
        self._partial = partial
        self._cpu = cpu
        self.dynamo_plugin = plugins["dynamo_plugin"]
        self.torch_tp_plugin = plugins["torch_tp_plugin"]
        self.parallelism_config = plugins["parallelism_config"]
        self.fsdp_plugin: FullyShardedDataParallelPlugin | None = None
        self.megatron_lm_plugin: MegatronLMPlugin | None = None
        self.deepspeed_plugins: DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None = None
        self.device_mesh = None
        self._check_context_parallel(plugins)
        self._mixed_precision = mixed_precision
        self.engine = resolve_engine(
            partial.distributed_type,
            cpu=cpu,
            deepspeed_plugin=plugins["deepspeed_plugin"],
            fsdp_plugin=plugins["fsdp_plugin"],
            megatron_lm_plugin=plugins["megatron_lm_plugin"],
            context_parallel=self._context_parallel,
        )
        # Before the engine plugins are attached: a layout the engine cannot run fails first.
        self.device_mesh = build_device_mesh(
            self.parallelism_config,
            num_processes=partial.num_processes,
            device_type=partial.device.type,
            multi_device=partial.num_processes > 1,
            is_fsdp2=self.is_fsdp2,
            deepspeed="deepspeed" in self.engine.requested,
        )
        self._attach_engine_plugins(mixed_precision)
        partial.distributed_type = self.engine.distributed_type
        self._enable_tf32_for_dynamo()

    @property
    def _process(self) -> PartialState:
        """The process state the helpers below use.

        Accelerate's AcceleratorState asks ``PartialState()`` each time, so they keep working
        after ``AcceleratorState._reset_state()`` (which leaves the process state alone).
        """
        partial = self.__dict__.get("_partial")
        return partial if partial is not None else PartialState()

    def _rejoin_partial(self, partial: PartialState) -> None:
        """Take the process facts from a PartialState set up again after its reset (as Accelerate)."""
        for name in _COPIED:
            setattr(self, name, getattr(partial, name))
        self._partial = partial
        partial.distributed_type = self.engine.distributed_type

    @property
    def _context_parallel(self) -> bool:
        return bool(getattr(self.parallelism_config, "cp_enabled", False))

    def _check_context_parallel(self, plugins: dict[str, Any]) -> None:
        if not self._context_parallel or envvars.setting("ACCELERATE_ALLOW_CP_STANDALONE"):
            return
        fsdp_plugin = plugins["fsdp_plugin"]
        if fsdp_plugin is None:
            raise ValueError(
                "parallelism_config has cp_size > 1 but no fsdp_plugin was given; context "
                "parallelism shards the model with FSDP2. Pass "
                "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)."
            )
        if getattr(fsdp_plugin, "fsdp_version", 2) == 1:
            raise ValueError(
                "parallelism_config has cp_size > 1 but fsdp_plugin uses fsdp_version=1; "
                "context parallelism needs FSDP2. Set fsdp_version=2."
            )

    @property
    def _engine(self) -> str | None:
        name = self.engine.name
        return None if name == "none" else name

    def _attach_engine_plugins(self, mixed_precision: str) -> None:
        engine = self.engine
        if engine.name == "deepspeed":
            deepspeed_plugin = engine.deepspeed_plugins
            active = deepspeed_plugin
            if isinstance(deepspeed_plugin, dict):
                for plugin in deepspeed_plugin.values():
                    _call_if_present(plugin, "set_mixed_precision", mixed_precision)
                active = next(iter(deepspeed_plugin.values()))
            else:
                _call_if_present(deepspeed_plugin, "set_mixed_precision", mixed_precision)
            _call_if_present(active, "select", _from_accelerator_state=True)
            self.deepspeed_plugins = deepspeed_plugin
            if mixed_precision != "fp8":
                # DeepSpeed owns precision through its config; see `mixed_precision`.
                self._mixed_precision = "no"
        elif engine.name in ("fsdp", "megatron_lm"):
            fsdp_plugin = engine.fsdp_plugin
            if fsdp_plugin is not None and mixed_precision != "no":
                _call_if_present(fsdp_plugin, "set_mixed_precision", mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            if engine.name == "megatron_lm":
                _call_if_present(engine.megatron_lm_plugin, "set_mixed_precision", mixed_precision)
                self.megatron_lm_plugin = engine.megatron_lm_plugin

    def _enable_tf32_for_dynamo(self) -> None:
        backend = getattr(self.dynamo_plugin, "backend", DynamoBackend.NO)
        compiling = backend is not None and backend != DynamoBackend.NO
        if compiling and self._mixed_precision == "no" and self.device.type == "cuda":
            # Compiled full-precision matmuls on Ampere+ gain a lot from TF32 (as Accelerate).
            torch.backends.cuda.matmul.allow_tf32 = True

    def _check_initialized(self, mixed_precision: str | None, cpu: bool) -> None:
        template = (
            "AcceleratorState is already set up and cannot change {what}; restart the process "
            "(or call reset_state() in tests) and pass {flag} to the first Accelerator()."
        )
        if cpu and self.device.type != "cpu":
            raise ValueError(template.format(what="to the CPU", flag="cpu=True"))
        if (
            mixed_precision is not None
            and mixed_precision.lower() != self._mixed_precision
            and self._engine != "deepspeed"
        ):
            raise ValueError(
                template.format(
                    what=f"mixed_precision from {self._mixed_precision!r} to {mixed_precision!r}",
                    flag=f"mixed_precision={mixed_precision!r}",
                )
            )

    @property
    def initialized(self) -> bool:
        """Whether an Accelerator has set up this state."""
        return bool(self._shared_state)

    @property
    def distributed_type(self) -> DistributedType:
        """The kind of run, including the engine (DEEPSPEED, FSDP, MEGATRON_LM)."""
        return self._partial.distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType) -> None:
        self._partial.distributed_type = value
        self.engine = dataclasses.replace(self.engine.relabel(value), fsdp_plugin=self.fsdp_plugin)

    @property
    def mixed_precision(self) -> str:
        """The mixed precision in use; under DeepSpeed, what its config enables."""
        if self._engine == "deepspeed" and self._mixed_precision != "fp8":
            config = getattr(self.deepspeed_plugin, "deepspeed_config", None) or {}
            if config.get("fp16", {}).get("enabled", False):
                return "fp16"
            if config.get("bf16", {}).get("enabled", False):
                return "bf16"
            return "no"
        return self._mixed_precision

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeedPlugin, or None when DeepSpeed is not in use."""
        plugins = self.deepspeed_plugins
        if self._engine != "deepspeed" or plugins is None:
            return None
        if not isinstance(plugins, dict):
            return plugins
        for plugin in plugins.values():
            if getattr(plugin, "selected", False):
                return plugin
        return next(iter(plugins.values()))

    def _require_deepspeed(self, what: str) -> dict[str, Any]:
        if self._engine != "deepspeed" or not isinstance(self.deepspeed_plugins, dict):
            raise RuntimeError(
                f"AcceleratorState.{what} needs DeepSpeed with several named plugins; pass "
                "Accelerator(deepspeed_plugins={'name': DeepSpeedPlugin(...), ...})."
            )
        return self.deepspeed_plugins

    def get_deepspeed_plugin(self, name: str) -> Any:
        """Return the DeepSpeedPlugin registered under `name`."""
        return self._require_deepspeed("get_deepspeed_plugin")[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make plugin `name` the active DeepSpeed configuration.

        Raises:
            KeyError: no plugin is registered under `name`.
        """
        plugins = self._require_deepspeed("select_deepspeed_plugin")
        if name not in plugins:
            raise KeyError(
                f"No DeepSpeed plugin named {name!r}; registered names: {sorted(plugins)}."
            )
        for key, plugin in plugins.items():
            if key != name:
                _call_if_present(plugin, "_unselect")
        _call_if_present(plugins[str(name)], "select", _from_accelerator_state=True)

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP version 2 shards the model."""
        return self.engine.is_fsdp2

    @property
    def use_distributed(self) -> bool:
        """Whether several processes cooperate in this run."""
        return self._process.use_distributed

    @property
    def owns_process_group(self) -> bool:
        """Whether hasten made the process group (not Ray Train or the user)."""
        return self._partial.owns_process_group

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest index."""
        return self._process.is_last_process

    @property
    def is_main_process(self) -> bool:
        """Whether this is the main process."""
        return self._process.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is the main process of its machine."""
        return self._process.is_local_main_process

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this point."""
        self._process.wait_for_everyone()

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's share of `inputs` (see `PartialState.split_between_processes`)."""
        with self._process.split_between_processes(inputs, apply_padding=apply_padding) as share:
            yield share

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        with self._process.main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each machine's main process first, then on the others."""
        with self._process.local_main_process_first():
            yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` once per machine."""
        self._process.print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy `group` (default: the default group) unless forked workers share it."""
        self._process.destroy_process_group(group)

    def _restore(self) -> None:
        """Complete an unpickled state: hasten's, or Accelerate's attributes."""
        state = self.__dict__
        if "_partial" not in state:  # written by Accelerate
            partial = PartialState.__new__(PartialState)
            partial.__setstate__(dict(state))
            label = partial.distributed_type
            state.pop("distributed_type", None)
            for name in _COPIED:
                state[name] = getattr(partial, name)
            for name in ("fsdp_plugin", "megatron_lm_plugin", "deepspeed_plugins", "device_mesh"):
                state.setdefault(name, None)
            state.setdefault("_mixed_precision", "no")
            state["_partial"] = partial
            state["engine"] = EngineChoice(
                "none",
                label,
                fsdp_plugin=state["fsdp_plugin"],
                deepspeed_plugins=state["deepspeed_plugins"],
                megatron_lm_plugin=state["megatron_lm_plugin"],
            ).relabel(label)
        missing = [name for name in ("_partial", "engine", "_mixed_precision") if name not in state]
        if missing:
            raise unreadable_state("AcceleratorState", f"it has no {', '.join(missing)}")

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the shared state (and PartialState's too if asked); Accelerate's name."""
        AcceleratorState._clear_shared()
        if reset_partial_state:
            PartialState._reset_state()

    def __repr__(self) -> str:
        text = f"{self._partial!r}\nMixed precision type: {self.mixed_precision}\n"
        if self._engine == "deepspeed":
            text += f"ds_config: {getattr(self.deepspeed_plugin, 'deepspeed_config', None)}\n"
        return text

    def __getattr__(self, name: str) -> Any:
        if name in _KNOWN_ATTRS or name == "_cpu":
            raise AttributeError(
                f"`AcceleratorState` object has no attribute `{name}`. This happens if "
                "`AcceleratorState._reset_state()` was called and an `Accelerator` or "
                "`PartialState` was not reinitialized. (hasten's reset_state() resets it too.) "
                "Create Accelerator() again before using the state."
            )
        raise AttributeError(f"'AcceleratorState' object has no attribute {name!r}")
