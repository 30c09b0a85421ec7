"""`MegatronStrategy`: a `MegatronLMPlugin` run, set up by megatron-core in one prepare() call.

Megatron-LM owns the whole step: the prepared model runs forward, backward and the optimizer
inside ``model(**batch)``, so `backward` and the wrapped optimizer/scheduler steps are no-ops,
and precision (fp16/bf16) is the engine's. Sizes are checked when the Accelerator is built;
CUDA and megatron-core when something is prepared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from typing_extensions import override

from hasten.config.enums import FP8BackendType
from hasten.config.kwargs import AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.imports import is_transformer_engine_available, require
from hasten.platforms.checks import is_cuda_available
from hasten.precision import Precision
from hasten.precision.fp8 import FP8_INSTALL, check_fp8_hardware, fp8_backend_from_env
from hasten.strategies.base import BackwardFn, Strategy
from hasten.strategies.call import PrepareCall, Prepared
from hasten.strategies.megatron.args import fp8_args, parallel_sizes
from hasten.strategies.megatron.data import MegatronLMDummyDataLoader, MegatronLMDummyScheduler
from hasten.strategies.megatron.run import MegatronRun, RunView

if TYPE_CHECKING:
    from hasten.config.enums import PrecisionType
    from hasten.config.kwargs import AutocastKwargs, FP8Recipe, GradScalerKwargs
    from hasten.config.megatron import MegatronLMPlugin

__all__ = [
    "MegatronFp8Precision",
    "MegatronStrategy",
    "megatron_fp8_recipe",
    "micro_batch_size_of",
    "prepare_call",
]


class MegatronFp8Precision(Precision):
    """fp8 under Megatron-LM: megatron-core's Transformer Engine layers run the matmuls in fp8
    (TransformerConfig's fp8 fields); weights and the optimizer are bf16 like ``"bf16"``."""

    backend = FP8BackendType.TE

    def __init__(self) -> None:
        super().__init__("fp8")


def megatron_fp8_recipe(recipe: Any) -> Any:
    """The Transformer Engine recipe Megatron-LM's fp8 uses (TE's defaults when none is given).

    Raises:
        ValueError: a torchao / MS-AMP recipe, or ACCELERATE_FP8_BACKEND naming another backend.
        ImportError: Transformer Engine is not installed.
    """
    selected = fp8_backend_from_env()
    foreign = isinstance(recipe, (AORecipeKwargs, MSAMPRecipeKwargs)) and not isinstance(
        recipe, TERecipeKwargs
    )
    backend = str(getattr(recipe, "backend", "TE") or "TE").upper()
    if foreign or backend != "TE" or selected not in (FP8BackendType.NO, FP8BackendType.TE):
        what = (
            type(recipe).__name__ if foreign or backend != "TE" else f"fp8 backend {selected.value}"
        )
        raise ValueError(
            f"Megatron-LM runs fp8 through Transformer Engine (megatron-core's TE layers), but "
            f"the {what} was selected. Pass TERecipeKwargs(...) (or none) and --fp8_backend te, "
            "or use mixed_precision='bf16'."
        )
    if not is_transformer_engine_available():
        raise ImportError(
            "mixed_precision='fp8' with Megatron-LM needs Transformer Engine (megatron-core builds "
            f"its fp8 layers from it), which is not installed. Fix: {FP8_INSTALL[FP8BackendType.TE]}"
            "; or use mixed_precision='bf16'."
        )
    return recipe if recipe is not None else TERecipeKwargs()


def _no_backward(loss: torch.Tensor, **kwargs: Any) -> None:
    """The engine ran backward inside the model's forward; nothing is left to do."""


def micro_batch_size_of(plugin: MegatronLMPlugin, objects: list[Any]) -> int:
    """The micro-batch size: a dummy loader's, else the prepared loaders' (the smallest with
    ``is_train_batch_min``).

    Raises:
        ValueError: no data loader among ``objects``, or a dummy without a micro-batch size.
    """
    for obj in objects:
        if isinstance(obj, MegatronLMDummyDataLoader):
            size = obj.dataset_args["micro_batch_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(
                    f"MegatronLMDummyDataLoader(micro_batch_size={size!r}): Megatron-LM takes its "
                    "micro-batch size from the dummy loader; pass an int >= 1."
                )
            return size
    sizes = [obj.batch_size for obj in objects if getattr(obj, "batch_size", None) is not None]
    if not sizes:
        raise ValueError(
            "Megatron-LM takes its micro-batch size from the data loaders: pass the training (and "
            "evaluation) DataLoader to the same accelerator.prepare() call as the model."
        )
    return int(min(sizes) if plugin.is_train_batch_min else max(sizes))


class MegatronStrategy(Strategy):
    """Tensor / pipeline / sequence / context parallelism with megatron-core.

    Args:
        plugin: the `MegatronLMPlugin`.
        world_size: processes in the run.

    Raises:
        ValueError: tp x pp x cp does not divide ``world_size``.
    """

    name = "megatron_lm"
    syncs_gradients = True

    def __init__(self, plugin: MegatronLMPlugin, world_size: int) -> None:
        self.plugin = plugin
        self.world_size = world_size
        self.sizes = parallel_sizes(plugin, world_size)

    @override
    def check_usable(self) -> None:
        if not is_cuda_available():
            raise RuntimeError(
                "Megatron-LM needs CUDA GPUs: megatron-core's layers and its DDP run on CUDA "
                "only, and this machine has none. Remove the MegatronLMPlugin (and "
                "ACCELERATE_USE_MEGATRON_LM / distributed_type: MEGATRON_LM) to train with DDP."
            )
        # optional: megatron-core
        require(
            "megatron.core",
            feature="the Megatron-LM engine",
            extra="megatron",
            pip_name="megatron-core",
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
        """Megatron runs fp16/bf16 itself (Float16Module, mixed-precision optimizer); fp8 through
        Transformer Engine layers, configured from the TE recipe (checked here, at Accelerator()).
        """
        label = str(getattr(mixed_precision, "value", mixed_precision) or "no")
        if label == "fp8":
            recipe = megatron_fp8_recipe(fp8_recipe)
            settings = fp8_args(recipe)
            check_fp8_hardware(device, FP8BackendType.TE)
            self.plugin.set_mixed_precision("bf16")
            self.plugin.megatron_lm_default_args.update(settings)
            return MegatronFp8Precision()
        self.plugin.set_mixed_precision(label)
        return Precision(label)

    @override
    def backward_fn(self, num_steps: int, scale: Any) -> BackwardFn | None:
        return _no_backward

    @override
    def setup(self, call: PrepareCall) -> Prepared:
        """Set up a ``prepare`` call's objects together, as Megatron-LM needs (see
        `prepare_call`); ``prepare_model`` on one model keeps the base behaviour."""
        if not call.whole or call.evaluation:
            return super().setup(call)
        self.check_usable()
        objects = prepare_call(
            MegatronRun.of(call), self.plugin, self.sizes, list(call.objects), call.earlier_models
        )
        return Prepared.of(objects, by_engine=True)

    def _check_unsharded(self, what: str) -> None:
        split = self.world_size // self.sizes["data_parallel_size"]
        if split > 1:
            raise NotImplementedError(
                f"{what} of a Megatron-LM model split over {split} processes (tp x pp x cp) is "
                "not wired into hasten: each process holds only its shard. With tp_degree = "
                "pp_degree = context_parallel_size = 1 it works."
            )

    @override
    def model_state_dict(self, model: nn.Module, *, full: bool = True) -> dict[str, Any]:
        """The engine's weights (all of them: refused when the model is split)."""
        self._check_unsharded("Saving the state dict")
        return super().model_state_dict(model, full=full)

    @override
    def load_model_state_dict(
        self,
        model: nn.Module,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
        strict: bool = True,
    ) -> None:
        """Load what `model_state_dict` returned (refused when the model is split)."""
        self._check_unsharded("Loading the state dict")
        super().load_model_state_dict(model, state_dict, full=full, strict=strict)

    @override
    def __repr__(self) -> str:
        return f"MegatronStrategy({self.sizes})"


def _configure_plugin(plugin: MegatronLMPlugin, sizes: dict[str, int], objects: list[Any]) -> None:
    """Fill the plugin's Megatron arguments from the loaders, model, optimizer and scheduler."""
    plugin.set_training_args(micro_batch_size_of(plugin, objects), sizes["data_parallel_size"])
    dummies = [obj for obj in objects if isinstance(obj, MegatronLMDummyDataLoader)]
    if dummies:
        plugin.megatron_dataset_flag = True
        plugin.megatron_lm_default_args["megatron_dataset_flag"] = True
        for key in ("seq_length", "encoder_seq_length", "decoder_seq_length"):
            # The dummy's sequence lengths size the network, as a batch's would.
            if getattr(plugin, key) is None:
                setattr(plugin, key, dummies[0].dataset_args.get(key))
    batch = None
    for obj in objects:
        if isinstance(obj, torch.utils.data.DataLoader):
            batch = next(iter(obj))
            break
    for obj in objects:
        if isinstance(obj, nn.Module):
            plugin.set_network_size_args(obj, batch)
        elif isinstance(obj, torch.optim.Optimizer):
            plugin.set_optimizer_type(obj)
        elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
            raise ValueError(
                f"Megatron-LM builds its own learning-rate schedule; pass "
                f"MegatronLMDummyScheduler(optimizer, total_num_steps=..., warmup_num_steps=...) "
                f"instead of {type(obj).__name__}."
            )
        elif isinstance(obj, MegatronLMDummyScheduler):
            plugin.set_scheduler_args(obj)


def prepare_call(
    run: RunView,
    plugin: MegatronLMPlugin,
    sizes: dict[str, int],
    objects: list[Any],
    earlier_models: Sequence[nn.Module] = (),
) -> list[Any]:
    """Megatron-LM's prepare: configure, initialise megatron-core, build and wrap everything.

    Args:
        run: what the helpers read of the run (a `MegatronRun`, or an Accelerator).
        plugin: the `MegatronLMPlugin`.
        sizes: the parallel sizes (`parallel_sizes`).
        objects: the call's objects, in order.
        earlier_models: models prepared by earlier calls (Megatron-LM trains one).

    Raises:
        ValueError: a second model, no data loader, more than 3 dummy loaders, or a torch LR
            scheduler.
    """
    from hasten.strategies.megatron import engine
    from hasten.strategies.megatron.data import prepare_data_loader

    models = [obj for obj in objects if isinstance(obj, nn.Module)]
    if len(models) > 1 or (models and earlier_models):
        raise ValueError("Megatron-LM trains one model per Accelerator; prepare a single model.")
    dummies = [obj for obj in objects if isinstance(obj, MegatronLMDummyDataLoader)]
    if len(dummies) > 3:
        raise ValueError(
            f"prepare() got {len(dummies)} MegatronLMDummyDataLoader objects; they stand for the "
            "train, valid and test loaders of Megatron's datasets: pass at most 3."
        )
    _configure_plugin(plugin, sizes, objects)
    args = engine.initialize(run, args_defaults=plugin.megatron_lm_default_args)
    if dummies:
        # Before the engine: the train step reads Megatron samples when the flag is set.
        dummies[0].set_megatron_data_args(args)
    model, optimizer, scheduler = engine.prepare_model_optimizer_scheduler(run)
    wrapped_optimizer = engine.MegatronLMOptimizerWrapper(optimizer)
    replaced: dict[type, Any] = {
        nn.Module: engine.MegatronEngine(run, model, optimizer, scheduler),
        torch.optim.Optimizer: wrapped_optimizer,
        MegatronLMDummyScheduler: engine.MegatronLMSchedulerWrapper(scheduler, wrapped_optimizer),
    }
    # The dummies of the call stand for the train, valid and test loaders, in that order.
    megatron_loaders = list(prepare_data_loader(run, dummies[0])) if dummies else []
    result = []
    for obj in objects:
        kind = next((k for k in replaced if isinstance(obj, k)), None)
        if kind is not None:
            result.append(replaced[kind])
        elif isinstance(obj, MegatronLMDummyDataLoader):
            result.append(megatron_loaders.pop(0))
        elif isinstance(obj, torch.utils.data.DataLoader):
            result.append(prepare_data_loader(run, obj))
        else:
            result.append(obj)
    return result
