"""The Megatron-LM engine on megatron-core's public API: set-up, model, optimizer, train step.

``initialize`` builds Megatron's argument namespace from the plugin and sets up megatron-core's
model-parallel groups; ``prepare_model_optimizer_scheduler`` builds the model (GPT, BERT or T5
through `models.py`, or the user's provider), wraps it in megatron-core's `DistributedDataParallel`, and
creates `get_megatron_optimizer` / `OptimizerParamScheduler`. `MegatronEngine` is the prepared
model: in training, ``model(**batch)`` runs forward, backward and the optimizer step through
megatron-core's pipeline schedule and returns the loss. megatron-core is imported when used.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hasten.core.imports import is_package_available, require
from hasten.core.network import get_free_port
from hasten.optimizer import AcceleratedOptimizer
from hasten.scheduler import AcceleratedScheduler
from hasten.strategies.megatron.args import (
    megatron_args,
    optimizer_config_kwargs,
    scheduler_kwargs,
)
from hasten.strategies.megatron.run import megatron_plugin
from hasten.strategies.megatron.train_step import BertTrainStep, GPTTrainStep, T5TrainStep

if TYPE_CHECKING:
    from hasten.strategies.megatron.run import RunView

__all__ = [
    "MegatronEngine",
    "MegatronLMOptimizerWrapper",
    "MegatronLMSchedulerWrapper",
    "avg_losses_across_data_parallel_group",
    "broadcast_tensor_parallel",
    "data_parallel_rank_and_size",
    "finish_mpu_init",
    "gather_across_data_parallel_groups",
    "get_args",
    "initialize",
    "model_provider_func",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
    "reduce_microbatch_losses",
    "split_micro_batches",
]

_FEATURE = "the Megatron-LM engine"
# The run's Megatron arguments (Megatron's get_args()); set by `initialize`.
_STATE: dict[str, Any] = {"args": None}


def _mcore() -> Any:
    # optional: megatron-core
    return require("megatron.core", feature=_FEATURE, extra="megatron", pip_name="megatron-core")


def _initialized() -> bool:
    if _STATE["args"] is None or not is_package_available("megatron"):
        return False
    from megatron.core import parallel_state  # optional: megatron-core (imported by initialize)

    return bool(parallel_state.model_parallel_is_initialized())


def get_args() -> SimpleNamespace:
    """Return the run's Megatron arguments.

    Raises:
        RuntimeError: Megatron-LM was not initialised (no model prepared with the plugin yet).
    """
    if _STATE["args"] is None:
        raise RuntimeError(
            "Megatron-LM is not initialised yet: prepare the model, optimizer, scheduler and "
            "data loaders with an Accelerator that has a MegatronLMPlugin first."
        )
    return _STATE["args"]


def data_parallel_rank_and_size() -> tuple[int, int]:
    """This process's data-parallel rank and the data-parallel size (the world without Megatron)."""
    if _initialized():
        from megatron.core import parallel_state  # optional: megatron-core

        return (
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_world_size(),
        )
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _data_parallel_group() -> Any:
    if _initialized():
        from megatron.core import parallel_state  # optional: megatron-core

        return parallel_state.get_data_parallel_group()
    return None  # the default group: without model parallelism every process is one replica


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """Average each loss of ``losses`` over the data-parallel group (one tensor of them)."""
    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return averaged
    group = _data_parallel_group()
    torch.distributed.all_reduce(averaged, group=group)
    return averaged / torch.distributed.get_world_size(group=group)


def gather_across_data_parallel_groups(tensor: Any) -> Any:
    """All-gather (nested) tensors over the data-parallel group, concatenated on dim 0."""
    from hasten.core.nested import recursively_apply

    def _gather(value: torch.Tensor) -> torch.Tensor:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return value
        group = _data_parallel_group()
        size = torch.distributed.get_world_size(group=group)
        parts = [torch.empty_like(value) for _ in range(size)]
        torch.distributed.all_gather(parts, value.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    return recursively_apply(_gather, tensor, error_on_other_type=True)


def broadcast_tensor_parallel(data: dict[str, Any], keys: list[str]) -> dict[str, torch.Tensor]:
    """Give every tensor-parallel rank the batch of its group's first rank (as-is without TP)."""
    if _initialized() and get_args().tensor_model_parallel_size > 1:
        from megatron.core import tensor_parallel  # optional: megatron-core

        return tensor_parallel.broadcast_data(keys, data, torch.int64)
    return {key: data[key] for key in keys}


def split_micro_batches(
    batch: dict[str, Any], micro_batch_size: int, num_micro_batches: int
) -> list[dict[str, Any]]:
    """Cut one global-step batch into ``num_micro_batches`` micro-batches along dim 0.

    Raises:
        ValueError: the batch holds fewer samples than the micro-batches need.
    """
    if num_micro_batches <= 1:
        return [batch]
    needed = micro_batch_size * num_micro_batches
    for key, value in batch.items():
        if len(value) < needed:
            raise ValueError(
                f"The batch's {key!r} holds {len(value)} samples but Megatron-LM needs "
                f"micro_batch_size x num_micro_batches = {needed}; use the prepared data loader "
                "(it yields batches of that size), or drop the last incomplete batch."
            )
    return [
        {
            key: value[i * micro_batch_size : (i + 1) * micro_batch_size]
            for key, value in batch.items()
        }
        for i in range(num_micro_batches)
    ]


def reduce_microbatch_losses(losses_reduced: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Average scalar losses over the micro-batches (non-scalars, e.g. logits, are concatenated)."""
    if not losses_reduced:
        return {}
    reduced: dict[str, Any] = {}
    for key in losses_reduced[0]:
        values = [item[key] for item in losses_reduced]
        if values[0].dim() == 0 or values[0].numel() == 1:
            reduced[key] = sum(v.reshape(()) for v in values) / len(values)
        else:
            reduced[key] = torch.cat(values)
    return reduced


def _extra_args(args: SimpleNamespace, extra_args_provider: Any) -> None:
    parser = extra_args_provider(argparse.ArgumentParser(add_help=False))
    for key, value in vars(parser.parse_args([])).items():
        if not hasattr(args, key):
            setattr(args, key, value)


def initialize(
    accelerator: RunView, extra_args_provider: Any = None, args_defaults: Any = None
) -> SimpleNamespace:
    """Build Megatron's arguments from the plugin and set up the model-parallel groups.

    Raises:
        RuntimeError: no CUDA GPU (megatron-core's layers and DDP run on CUDA only).
        ImportError: megatron-core is not installed.
        ValueError: parallel sizes that do not divide the world size.
    """
    _mcore()
    if not torch.cuda.is_available():
        raise RuntimeError(
            "Megatron-LM needs CUDA GPUs: megatron-core's layers and its DDP run on CUDA only, "
            "and this machine has none. Remove the MegatronLMPlugin (and ACCELERATE_USE_MEGATRON_LM) "
            "to train with DDP or FSDP."
        )
    plugin = megatron_plugin(accelerator)
    args = megatron_args(plugin, accelerator.num_processes, accelerator.mixed_precision)
    for key, value in (args_defaults or {}).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if extra_args_provider is not None:
        _extra_args(args, extra_args_provider)
    args.rank = accelerator.process_index
    args.seed = getattr(args, "seed", None) or 1234
    _STATE["args"] = args
    finish_mpu_init()
    return args


def finish_mpu_init() -> None:
    """Join torch.distributed (one process: a local group) and create megatron-core's groups."""
    mcore = _mcore()
    from megatron.core import parallel_state, tensor_parallel  # optional: megatron-core

    args = get_args()
    if not torch.distributed.is_initialized():
        # One process (no launcher): megatron-core still needs a process group.
        torch.distributed.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{get_free_port()}", world_size=1, rank=0
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=args.tensor_model_parallel_size,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=getattr(
                args, "num_layers_per_virtual_pipeline_stage", None
            ),
            context_parallel_size=args.context_parallel_size,
            expert_model_parallel_size=args.expert_model_parallel_size,
            expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        )
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    del mcore


def model_provider_func(
    pre_process: bool = True,
    post_process: bool = True,
    add_encoder: bool = True,
    add_decoder: bool = True,
) -> nn.Module:
    """Build this pipeline stage's model from the Megatron arguments (GPT, BERT or T5).

    Raises:
        ValueError: a model type without a megatron-core builder.
        NotImplementedError: a BERT classification model (no megatron-core equivalent).
    """
    _mcore()
    from hasten.strategies.megatron.models import MODEL_BUILDERS

    args = get_args()
    builder: Any = MODEL_BUILDERS.get(args.model_type_name)
    if builder is None:
        raise ValueError(
            f"hasten builds GPT, BERT and T5 models with megatron-core; for "
            f"model_type_name={args.model_type_name!r} pass "
            "MegatronLMPlugin(custom_model_provider_function=...) returning a megatron-core model."
        )
    return builder(
        args,
        pre_process=pre_process,
        post_process=post_process,
        add_encoder=add_encoder,
        add_decoder=add_decoder,
    )


def _build_chunks(provider: Any) -> list[nn.Module]:
    from megatron.core import parallel_state  # optional: megatron-core

    pre = parallel_state.is_pipeline_first_stage()
    post = parallel_state.is_pipeline_last_stage()
    return [provider(pre_process=pre, post_process=post)]


def _wrap_chunks(chunks: list[nn.Module], args: SimpleNamespace) -> list[nn.Module]:
    from megatron.core.distributed import (  # optional: megatron-core
        DistributedDataParallel,
        DistributedDataParallelConfig,
    )
    from megatron.core.transformer.module import Float16Module
    from megatron.core.utils import get_model_config

    wrapped = []
    for chunk in chunks:
        chunk.cuda(torch.cuda.current_device())
        config = get_model_config(chunk)
        if args.fp16 or args.bf16:
            chunk = Float16Module(config, chunk)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=bool(args.bf16),
            overlap_grad_reduce=False,
            use_distributed_optimizer=bool(getattr(args, "use_distributed_optimizer", False)),
        )
        wrapped.append(DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk))
    return wrapped


def prepare_optimizer(accelerator: RunView, model: list[nn.Module]) -> Any:
    """megatron-core's optimizer for ``model`` (mixed-precision master weights under fp16/bf16)."""
    _mcore()
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # optional

    config = OptimizerConfig(**optimizer_config_kwargs(get_args()))
    return get_megatron_optimizer(config, model)


def prepare_scheduler(accelerator: RunView, optimizer: Any, scheduler: Any) -> Any:
    """megatron-core's `OptimizerParamScheduler` (steps counted in samples)."""
    _mcore()
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # optional

    return OptimizerParamScheduler(optimizer, **scheduler_kwargs(get_args()))


def prepare_model_optimizer_scheduler(accelerator: RunView) -> tuple[list[nn.Module], Any, Any]:
    """Build the model chunks, the optimizer and the scheduler of this run."""
    from megatron.core.distributed import finalize_model_grads  # optional: megatron-core
    from megatron.core.utils import get_model_config

    plugin = megatron_plugin(accelerator)
    args = get_args()
    if plugin.custom_prepare_model_function is not None:
        chunks = plugin.custom_prepare_model_function()
        chunks = chunks if isinstance(chunks, list) else [chunks]
    else:
        provider = plugin.custom_model_provider_function or model_provider_func
        chunks = _wrap_chunks(_build_chunks(provider), args)
    optimizer = prepare_optimizer(accelerator, chunks)
    scheduler = prepare_scheduler(accelerator, optimizer, None)
    config = get_model_config(chunks[0])
    # What megatron.training sets: gradient sync and loss scaling inside the schedule.
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = chunks[0].no_sync if len(chunks) == 1 else [c.no_sync for c in chunks]
    return chunks, optimizer, scheduler


def _train_step_handler(accelerator: RunView, args: SimpleNamespace) -> Any:
    plugin = megatron_plugin(accelerator)
    if plugin.custom_train_step_class is not None:
        return plugin.custom_train_step_class(args, **(plugin.custom_train_step_kwargs or {}))
    steps = {"gpt": GPTTrainStep, "bert": BertTrainStep, "t5": T5TrainStep}
    if args.model_type_name not in steps:
        raise ValueError(
            f"No Megatron-LM train step for model_type_name={args.model_type_name!r}; give "
            "MegatronLMPlugin(custom_train_step_class=...)."
        )
    return steps[args.model_type_name](accelerator, args)


class MegatronEngine(nn.Module):
    """The prepared Megatron-LM model: ``model(**batch)`` trains one global step (in train mode)
    or evaluates (in eval mode) through megatron-core's pipeline schedule; returns the loss.

    Args:
        accelerator: the Accelerator (or the strategy's `MegatronRun`).
        model: the model chunks (one per virtual pipeline stage).
        optimizer: megatron-core's optimizer.
        scheduler: megatron-core's `OptimizerParamScheduler`.
    """

    def __init__(self, accelerator: RunView, model: Any, optimizer: Any, scheduler: Any) -> None:
        super().__init__()
        self.module = nn.ModuleList(model if isinstance(model, list) else [model])
        self.base_model = self.module[0]
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_step_handler = _train_step_handler(accelerator, get_args())
        if optimizer is not None:
            optimizer.skipped_iter = False
        self.iteration = 0

    def _run(self, batch: dict[str, Any], forward_only: bool) -> list[dict[str, torch.Tensor]]:
        from megatron.core.pipeline_parallel import get_forward_backward_func  # optional

        args = get_args()
        chunks = split_micro_batches(batch, args.micro_batch_size, args.num_micro_batches)
        iterator: Any = iter(chunks) if batch else None
        if len(self.module) > 1:
            iterator = [iter(chunks) if batch else None for _ in self.module]
        return get_forward_backward_func()(
            forward_step_func=self.train_step_handler.forward_step,
            data_iterator=iterator,
            model=list(self.module),
            num_microbatches=args.num_micro_batches,
            seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size,
            decoder_seq_length=getattr(args, "decoder_seq_length", None),
            forward_only=forward_only,
        )

    def train_step(self, **batch_data: Any) -> tuple[dict[str, Any], int, Any, Any]:
        """Forward + backward over the micro-batches, then the optimizer and scheduler steps."""
        args = get_args()
        for chunk in self.module:
            chunk.zero_grad_buffer()  # type: ignore[operator]
        self.optimizer.zero_grad()
        losses = self._run(batch_data, forward_only=False)
        update_successful, grad_norm, num_zeros = self.optimizer.step()
        if update_successful:
            self.scheduler.step(
                increment=args.micro_batch_size * args.num_micro_batches * args.data_parallel_size
            )
        self.optimizer.skipped_iter = not update_successful
        return reduce_microbatch_losses(losses), int(not update_successful), grad_norm, num_zeros

    def eval_step(self, **batch_data: Any) -> dict[str, Any]:
        """Forward only, over the micro-batches; the averaged losses."""
        with torch.no_grad():
            return reduce_microbatch_losses(self._run(batch_data, forward_only=True))

    def forward(self, **batch_data: Any) -> Any:
        """Train one step (train mode) or evaluate (eval mode); returns the loss (or an output)."""
        if self.module[0].training:
            loss_dict, _, _, _ = self.train_step(**batch_data)
            self.iteration += 1
        else:
            loss_dict = self.eval_step(**batch_data)
        scalars = [value.reshape(()) for value in loss_dict.values() if value.numel() == 1]
        # Only the last pipeline stage computes losses; the others report zero.
        loss = torch.stack(scalars).sum() if scalars else torch.zeros(())
        logits = loss_dict.get("logits")
        output_class = self.train_step_handler.model_output_class
        return output_class(loss=loss, logits=logits) if output_class is not None else loss


class MegatronLMOptimizerWrapper(AcceleratedOptimizer):
    """The prepared Megatron optimizer: `MegatronEngine` steps and zeroes it, so these are no-ops.

    Args:
        optimizer: megatron-core's optimizer.
    """

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing to do: the engine zeroes the gradient buffers before each step."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Nothing to do: the engine stepped the optimizer inside ``model(**batch)``."""

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step was skipped (fp16 overflow)."""
        return bool(getattr(self.optimizer, "skipped_iter", False))


class MegatronLMSchedulerWrapper(AcceleratedScheduler):
    """The prepared Megatron scheduler: the engine steps it, so ``step`` is a no-op.

    Args:
        scheduler: megatron-core's `OptimizerParamScheduler`.
        optimizers: the prepared optimizer(s).
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the engine stepped the scheduler inside ``model(**batch)``."""
