"""FSDP1: the model wrapped in `FullyShardedDataParallel` (flat parameters), for existing configs.

On a CPU-only run torch's FSDP1 needs ``device_id=torch.device("cpu")`` (hasten passes it), and
it cannot offload parameters (``CPUOffload(offload_params=True)``), broadcast module states
(``sync_module_states``, which ``cpu_ram_efficient_loading`` needs) or gather a full state dict
with ``offload_to_cpu=True`` (it segfaults): the first two raise here with the reason, the last is
avoided by gathering full state dicts without offload on CPU, and by turning ``offload_to_cpu``
off in the plugin's full state-dict configs there (the tensors are in host memory already), so
code that passes them to ``FSDP.state_dict_type`` itself, as Accelerate scripts do, works too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from typing_extensions import override

from hasten.optimizer import unwrap_optimizer
from hasten.precision import Precision, select_precision
from hasten.strategies.base import set_up_models, together
from hasten.strategies.call import PrepareCall, Prepared
from hasten.strategies.compile import CompileSettings, compile_model
from hasten.strategies.fsdp1_gather import gather_units, weights_layout
from hasten.strategies.fsdp_plugin import ignored_modules, wrap_settings
from hasten.strategies.rebind import canonical_name
from hasten.strategies.sharded import (
    ShardedStrategy,
    saves_shards,
    tied_parameter_names,
)

if TYPE_CHECKING:
    from hasten.config.enums import PrecisionType
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.config.kwargs import AutocastKwargs, FP8Recipe, GradScalerKwargs

__all__ = ["FSDP1Strategy"]


class FSDP1Strategy(ShardedStrategy):
    """Wrap with ``torch.distributed.fsdp.FullyShardedDataParallel`` as the plugin asks."""

    name = "fsdp1"

    plugin: FullyShardedDataParallelPlugin

    def __init__(self, plugin: FullyShardedDataParallelPlugin, device: torch.device) -> None:
        super().__init__(device, saves_shards(plugin))
        self.plugin = plugin
        # FULL_STATE_DICT with offload_to_cpu=True segfaults when FSDP1 computes on the CPU.
        self.full_offload = device.type != "cpu"
        self._prepared_roots: list[Any] = []  # FSDP roots, for clip_grad_norm_
        # Each prepared root's unwrapped state dict layout (meta stand-ins), for save_model.
        self._layouts: weakref.WeakKeyDictionary[nn.Module, dict[str, torch.Tensor]] = (
            weakref.WeakKeyDictionary()
        )
        # With flat parameters: the names of the parameters each optimizer was built on.
        self._built_names: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[str]] = (
            weakref.WeakKeyDictionary()
        )

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
        # fp16 with flat sharded gradients needs torch's ShardedGradScaler.
        return select_precision(
            mixed_precision,
            device,
            autocast_kwargs=autocast_kwargs,
            scaler_kwargs=scaler_kwargs,
            sharded_scaler=True,
            fp8_recipe=fp8_recipe,
        )

    @override
    def check_usable(self) -> None:
        if self.device.type != "cpu":
            return
        if getattr(self.plugin.cpu_offload, "offload_params", False):
            raise ValueError(
                "FSDP1 cannot offload parameters when it computes on the CPU (torch's "
                "CPUOffload(offload_params=True) needs an accelerator; the parameters are in host "
                "memory already). Set cpu_offload=False (fsdp_offload_params: false), or use "
                "fsdp_version=2, whose CPUOffloadPolicy works here."
            )
        if self.plugin.sync_module_states:
            raise ValueError(
                "FSDP1's sync_module_states=True (also implied by cpu_ram_efficient_loading) "
                "fails on a CPU-only run in torch. Set sync_module_states=False and "
                "cpu_ram_efficient_loading=False, or use fsdp_version=2, which supports "
                "cpu_ram_efficient_loading on the CPU."
            )

    def _wrap_kwargs(self, module: nn.Module) -> dict[str, Any]:
        plugin = copy.copy(self.plugin)
        plugin.set_auto_wrap_policy(module)
        kwargs: dict[str, Any] = {
            "sharding_strategy": plugin.sharding_strategy or plugin.reshard_after_forward,
            "cpu_offload": plugin.cpu_offload,
            "auto_wrap_policy": plugin.auto_wrap_policy,
            "backward_prefetch": plugin.backward_prefetch,
            "mixed_precision": plugin.mixed_precision_policy,
            "forward_prefetch": bool(plugin.forward_prefetch),
            "use_orig_params": bool(plugin.use_orig_params),
            "limit_all_gathers": plugin.limit_all_gathers,
            "sync_module_states": bool(plugin.sync_module_states),
            "ignored_modules": ignored_modules(plugin.ignored_modules, module) or None,
            "param_init_fn": plugin.param_init_fn,
            "device_id": self.device if self.device.type == "cpu" else self.device.index,
        }
        return kwargs

    def _wrap(
        self, module: nn.Module, precision: Precision, dynamo: CompileSettings | None
    ) -> nn.Module:
        """Autocast forward, the FSDP1 wrapper (+ activation checkpointing), then compile."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        self.check_usable()
        layout = weights_layout(module, tied_parameter_names(module))
        if self.device.type == "cpu":
            _no_full_offload(self.plugin)
        precision.wrap_forward(module)
        wrapped: nn.Module = FullyShardedDataParallel(module, **self._wrap_kwargs(module))
        self._prepared_roots.append(wrapped)
        if self.plugin.activation_checkpointing:
            _checkpoint_blocks(self.plugin, wrapped, module)
        if layout is not None:
            self._layouts[wrapped] = layout
        return compile_model(wrapped, dynamo)

    @override
    def setup(self, call: PrepareCall) -> Prepared:
        """With ``use_orig_params=False`` FSDP1 flattens the parameters: an optimizer over all
        of one model's parameters is pointed at its flat parameters (nothing else can follow),
        and the names of the parameters it was built on are kept (see `_built_on`)."""
        if call.evaluation:
            return super().setup(call)
        objects = together(call)

        def wrap(model: nn.Module, index: int) -> nn.Module:
            return self._wrap(model, call.precision, call.dynamo)

        if self.plugin.use_orig_params:
            return set_up_models(self, call, objects, wrap)
        models = call.indices("model")
        originals = [list(objects[i].parameters()) for i in models]
        names = {id(p): canonical_name(n) for i in models for n, p in objects[i].named_parameters()}
        for i in models:
            objects[i] = wrap(objects[i], i)
        prepared = [objects[i] for i in models]
        for i in call.indices("optimizer"):
            held = [p for group in objects[i].param_groups for p in group["params"]]
            if _onto_flat_parameters(objects[i], originals, prepared):
                self._built_names[unwrap_optimizer(objects[i])] = [names[id(p)] for p in held]
        return Prepared.of(objects)

    @override
    def _built_on(self, optimizer: torch.optim.Optimizer) -> list[str] | None:
        return self._built_names.get(optimizer)

    @override
    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        inner = self._root(module)
        return inner.no_sync() if inner is not None else contextlib.nullcontext()

    def _root(self, module: nn.Module) -> Any:
        from torch.distributed.fsdp import FullyShardedDataParallel

        module = getattr(module, "_orig_mod", module)
        return module if isinstance(module, FullyShardedDataParallel) else None

    @override
    def _module(self, model: nn.Module) -> nn.Module:
        root = self._root(model)
        return root if root is not None else model

    @override
    def full_state_dict_parts(
        self, model: nn.Module
    ) -> tuple[dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]]] | None:
        # Unit by unit with summon_full_params: no ShardedTensor state dict (torch deprecates
        # them, and building one copies every process's shard of the whole model).
        root = self._module(model)
        layout = self._layouts.get(root)
        if layout is None:  # not prepared here, or state beyond tensors: gathered whole
            return None
        return dict(layout), lambda part: gather_units(root, {k: layout[k] for k in part})

    @override
    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        wanted = {id(p) for p in parameters}
        for root in self._prepared_roots:
            if any(id(p) in wanted for p in root.parameters()):
                return root.clip_grad_norm_(max_norm, norm_type)
        raise ValueError(
            "clip_grad_norm_ under FSDP1 clips a prepared model's parameters; pass "
            "model.parameters() of a model returned by accelerator.prepare()."
        )


def _no_full_offload(plugin: FullyShardedDataParallelPlugin) -> None:
    """Full state-dict configs without ``offload_to_cpu`` (torch breaks on it on a CPU run)."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig

    for name in ("state_dict_config", "optim_state_dict_config"):
        config = getattr(plugin, name)
        full = isinstance(config, (FullStateDictConfig, FullOptimStateDictConfig))
        if full and config.offload_to_cpu:
            setattr(plugin, name, dataclasses.replace(config, offload_to_cpu=False))


def _checkpoint_blocks(
    plugin: FullyShardedDataParallelPlugin, wrapped: nn.Module, original: nn.Module
) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    bound = wrap_settings(plugin).bind(original)
    keywords = getattr(bound, "keywords", None) or {}
    classes = tuple(keywords.get("transformer_layer_cls", ()))
    if not classes:
        raise ValueError(
            "activation_checkpointing=True needs the layer classes to checkpoint: set "
            "auto_wrap_policy='transformer_based_wrap' with transformer_cls_names_to_wrap."
        )
    apply_activation_checkpointing(
        wrapped,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
            m, checkpoint_impl=CheckpointImpl.NO_REENTRANT
        ),
        check_fn=lambda m: isinstance(m, classes),
    )


def _onto_flat_parameters(
    optimizer: torch.optim.Optimizer,
    originals: list[list[nn.Parameter]],
    prepared: list[nn.Module],
) -> bool:
    """Point an optimizer over all of one model's parameters at that model's flat parameters.

    Returns whether it held one of the models' parameters (and now holds flat parameters).

    Raises:
        ValueError: it has several parameter groups or a subset of the parameters (which flat
            parameters cannot express: set use_orig_params=True).
    """
    held = [p for group in optimizer.param_groups for p in group["params"]]
    for before, model in zip(originals, prepared):
        if not any(p is q for p in held for q in before):
            continue
        if len(optimizer.param_groups) != 1 or {id(p) for p in held} != {id(p) for p in before}:
            raise ValueError(
                f"The optimizer {type(optimizer).__name__} has {len(optimizer.param_groups)} "
                "parameter group(s) over part of the model; with use_orig_params=False FSDP1 "
                "flattens the parameters, so only one group over all of them can follow. Set "
                "use_orig_params=True in the FSDP plugin (fsdp_use_orig_params: true)."
            )
        optimizer.param_groups[0]["params"] = list(model.parameters())
        optimizer.state.clear()
        return True
    return False
