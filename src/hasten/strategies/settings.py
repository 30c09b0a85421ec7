"""Typed settings the parallelism steps take: each Accelerate plugin resolved once, at the surface.

`strategies.parallelize`'s ``apply_*`` steps never see a user's plugin object. A strategy reads
its plugin once (`fsdp_settings` in `strategies.fsdp_plugin`, `DDPStrategy.settings`) into the
frozen values here, and a `ParallelPlan` carries them:

- `WrapSettings`: which blocks a wrap policy picks (the policy, the layer class names, the size
  threshold), bound to each model without touching the plugin;
- `FSDPSettings`: what ``fully_shard`` is given (wrap, resharding, mixed precision, offload,
  ignored modules) and whether rank 0's weights are broadcast into empty shards;
- `DDPSettings`: the ``DistributedDataParallel`` keyword arguments and the comm hook.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["DDPSettings", "FSDPSettings", "IgnoredModules", "WrapSettings"]

#: Modules FSDP leaves alone: the modules themselves, a regex of module names, or none.
IgnoredModules = tuple[nn.Module, ...] | str | None


@dataclasses.dataclass(frozen=True)
class WrapSettings:
    """Which blocks of a model a wrap policy picks (for ``fully_shard`` and for activation
    checkpointing).

    Attributes:
        policy: torch's transformer or size policy, a callable of the user's, or None (no block).
        class_names: the layer class names for the transformer policy (None: the model's
            ``_no_split_modules``).
        min_num_params: the size policy's threshold (0: no block).
    """

    policy: Callable[..., bool] | None = None
    class_names: tuple[str, ...] | None = None
    min_num_params: int = 0

    def bind(self, model: nn.Module) -> Callable[..., bool] | None:
        """The policy bound to ``model``'s classes (None: it picks no block).

        Raises:
            ValueError: a layer class name is not used anywhere in ``model``.
        """
        from hasten.config.fsdp import bind_wrap_policy

        return bind_wrap_policy(self.policy, self.class_names, self.min_num_params, model)


@dataclasses.dataclass(frozen=True)
class FSDPSettings:
    """What FSDP2's ``fully_shard`` steps are given, resolved from the FSDP plugin once.

    Attributes:
        wrap: the blocks sharded before the root.
        reshard_after_forward: free the gathered parameters after forward (or an int: keep them
            resharded to that many processes).
        mixed_precision: FSDP2's mixed precision policy (None: torch's default).
        offload: the CPU offload policy that can run here (None: no offload).
        ignored: the modules FSDP leaves alone.
        from_rank0: rank 0's real weights are broadcast into shards built on meta
            (``cpu_ram_efficient_loading``).
    """

    wrap: WrapSettings = WrapSettings()
    reshard_after_forward: bool | int = True
    mixed_precision: MixedPrecisionPolicy | None = None
    offload: OffloadPolicy | None = None
    ignored: IgnoredModules = None
    from_rank0: bool = False


@dataclasses.dataclass(frozen=True)
class DDPSettings:
    """What the DDP step wraps each model with.

    Attributes:
        kwargs: keyword arguments of the ``DistributedDataParallel`` constructor.
        comm_hook: installs the requested communication hook on the wrapped model (None: none).
    """

    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    comm_hook: Callable[[DistributedDataParallel], None] | None = None
