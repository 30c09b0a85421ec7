"""The one answer to "which engine runs this job?", made once from plugins, variables and the run.

`resolve_engine` reads the user's plugins and the launcher's ``ACCELERATE_USE_FSDP`` /
``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_USE_MEGATRON_LM`` variables (which `hasten launch`
writes from flags and the config file), and returns an `EngineChoice`. `AcceleratorState` stores
it; ``distributed_type``, ``fsdp_plugin``, ``is_fsdp2`` and `select_strategy` all read it, so no
other module re-reads those variables or compares labels by string.

Unlike Accelerate, FSDP also shards over CPU processes (gloo): a multi-process CPU run with an
FSDP plugin is an FSDP run, not silently plain DDP. A single process without a process group
(a script run directly) keeps Accelerate's behaviour (nothing to shard, the plugin is not used);
``hasten launch --use_fsdp`` starts even one process as a one-process group, so FSDP runs.

A Megatron-LM plugin, when given, makes Megatron-LM the engine on any run (its strategy refuses
at prepare() where megatron-core cannot run, e.g. without CUDA); with FSDP or DeepSpeed it is
an error.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING

from hasten.config import envvars
from hasten.config.enums import DistributedType

if TYPE_CHECKING:
    from hasten.config.deepspeed import DeepSpeedPlugin
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.megatron import MegatronLMPlugin

    #: One DeepSpeed plugin, or several by name (``deepspeed_plugins=``).
    DeepSpeedPlugins = DeepSpeedPlugin | dict[str, DeepSpeedPlugin]

__all__ = ["ENGINES", "EngineChoice", "resolve_engine"]

#: Engine names an `EngineChoice` can hold ("none": plain DDP or a single process).
ENGINES = ("none", "fsdp", "deepspeed", "megatron_lm", "xla")

_LABELS = {
    "fsdp": DistributedType.FSDP,
    "deepspeed": DistributedType.DEEPSPEED,
    "megatron_lm": DistributedType.MEGATRON_LM,
}


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """Which engine owns the run, with the plugins it uses.

    Attributes:
        name: one of `ENGINES`.
        distributed_type: the run's label (FSDP, DEEPSPEED, ... or the plain data-parallel one).
        fsdp_plugin: the FSDP plugin in use (None unless ``name == "fsdp"``, or Megatron's).
        deepspeed_plugins: the DeepSpeed plugin (or dict of named ones) in use.
        megatron_lm_plugin: the Megatron-LM plugin in use.
        requested: the plugins the user asked for, even when this run does not use them.
    """

    name: str
    distributed_type: DistributedType
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None
    deepspeed_plugins: DeepSpeedPlugins | None = None
    megatron_lm_plugin: MegatronLMPlugin | None = None
    requested: tuple[str, ...] = ()

    @property
    def fsdp_version(self) -> int | None:
        """1 or 2 when FSDP shards the model, else None."""
        if self.name != "fsdp" or self.fsdp_plugin is None:
            return None
        return int(self.fsdp_plugin.fsdp_version or 1)

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP2 (``fully_shard``) shards the model."""
        return self.fsdp_version == 2

    def relabel(self, distributed_type: DistributedType) -> EngineChoice:
        """The same plugins under another label (tests and ``state.distributed_type = ...``)."""
        name = {v: k for k, v in _LABELS.items()}.get(distributed_type, "none")
        if distributed_type == DistributedType.XLA:
            name = "xla"
        return dataclasses.replace(self, name=name, distributed_type=distributed_type)


def _requested_plugins(
    deepspeed: DeepSpeedPlugins | None,
    fsdp: FullyShardedDataParallelPlugin | None,
    megatron: MegatronLMPlugin | None,
) -> tuple[
    DeepSpeedPlugins | None,
    FullyShardedDataParallelPlugin | None,
    MegatronLMPlugin | None,
    tuple[str, ...],
]:
    """The plugins asked for by argument or by the launcher's ACCELERATE_USE_* variables."""
    if deepspeed is None and envvars.setting("ACCELERATE_USE_DEEPSPEED"):
        from hasten.config.deepspeed import DeepSpeedPlugin

        deepspeed = DeepSpeedPlugin()
    if fsdp is None and envvars.setting("ACCELERATE_USE_FSDP"):
        from hasten.config.fsdp import FullyShardedDataParallelPlugin

        fsdp = FullyShardedDataParallelPlugin()
    if megatron is None and envvars.setting("ACCELERATE_USE_MEGATRON_LM"):
        from hasten.config.megatron import MegatronLMPlugin

        megatron = MegatronLMPlugin()
    names = tuple(
        name
        for name, plugin in (("deepspeed", deepspeed), ("fsdp", fsdp), ("megatron_lm", megatron))
        if plugin is not None
    )
    return deepspeed, fsdp, megatron, names


def _check_exclusive(names: tuple[str, ...]) -> None:
    if "megatron_lm" in names and ("deepspeed" in names or "fsdp" in names):
        other = "DeepSpeed" if "deepspeed" in names else "FSDP"
        raise ValueError(
            f"A Megatron-LM plugin and a{'n' if other == 'FSDP' else ''} {other} plugin were "
            "given (as arguments or through ACCELERATE_USE_MEGATRON_LM / ACCELERATE_USE_"
            f"{other.upper()}); Megatron-LM does its own data and model parallelism and cannot "
            f"run under {other}. Pass only one of them (and unset the other variable)."
        )
    if "deepspeed" in names and "fsdp" in names:
        raise ValueError(
            "Both an FSDP plugin and a DeepSpeed plugin were given (as arguments or through "
            "ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED); one engine shards the model. Pass "
            "only fsdp_plugin=... or only deepspeed_plugin=... (and unset the other variable)."
        )


def resolve_engine(
    base: DistributedType,
    *,
    cpu: bool,
    deepspeed_plugin: DeepSpeedPlugins | None = None,
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
    megatron_lm_plugin: MegatronLMPlugin | None = None,
    context_parallel: bool = False,
) -> EngineChoice:
    """Decide the engine of this run once.

    Args:
        base: the label the process detection gave (NO, MULTI_CPU, MULTI_GPU, ..., DEEPSPEED).
        cpu: the run is forced onto the CPU.
        deepspeed_plugin: a DeepSpeed plugin or a dict of named ones.
        fsdp_plugin: an FSDP plugin.
        megatron_lm_plugin: a Megatron-LM plugin.
        context_parallel: a ParallelismConfig asks for context parallelism (needs FSDP2).

    Raises:
        ValueError: FSDP and DeepSpeed were both requested.
    """
    deepspeed, fsdp, megatron, names = _requested_plugins(
        deepspeed_plugin, fsdp_plugin, megatron_lm_plugin
    )
    _check_exclusive(names)
    if base == DistributedType.XLA:
        return EngineChoice("xla", base, requested=names)
    if megatron is not None:
        # Asked for explicitly: the engine says at prepare() if this machine cannot run it.
        return EngineChoice(
            "megatron_lm",
            DistributedType.MEGATRON_LM,
            megatron_lm_plugin=megatron,
            requested=names,
        )
    # DeepSpeed runs on CPU too (over gloo), never silently replaced by plain DDP.
    if deepspeed is not None:
        return EngineChoice(
            "deepspeed", DistributedType.DEEPSPEED, deepspeed_plugins=deepspeed, requested=names
        )
    if base in (DistributedType.NO, DistributedType.DEEPSPEED):
        if fsdp is not None and base == DistributedType.NO:
            warnings.warn(
                "An FSDP plugin was given (or ACCELERATE_USE_FSDP is set), but this is a single "
                "process without a process group: nothing is sharded and the plugin is not used "
                "(as in Accelerate). To run FSDP on one device, start the script with "
                "`hasten launch --use_fsdp` (a one-process group).",
                UserWarning,
                stacklevel=2,
            )
        return EngineChoice("none", base, requested=names)
    if fsdp is not None or (context_parallel and base != DistributedType.MULTI_CPU):
        return EngineChoice("fsdp", DistributedType.FSDP, fsdp_plugin=fsdp, requested=names)
    return EngineChoice("none", base, requested=names)
