"""Megatron-LM data: the dummy scheduler / data loader placeholders and data-parallel sharding.

Under Megatron-LM a batch is ``micro_batch_size x num_micro_batches`` samples; the engine cuts
it into micro-batches for the pipeline schedule. Data differs only between data-parallel
groups (tensor/pipeline/context ranks of one group read the same samples), so a prepared
loader is sharded over the data-parallel size and rank, not over all processes.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from hasten.data_loader import prepare_data_loader as shard_data_loader
from hasten.data_loader.base import dataloader_kwargs

__all__ = [
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "prepare_data_loader",
    "rebatch_for_megatron",
]

# Megatron's data arguments a dummy loader starts from (its own defaults).
_DATA_DEFAULTS: dict[str, Any] = {
    "data_path": None,
    "split": "969, 30, 1",
    "seq_length": None,
    "encoder_seq_length": None,
    "decoder_seq_length": None,
    "micro_batch_size": None,
    "num_workers": 2,
    "eval_iters": 100,
    "eval_interval": 1000,
}


class MegatronLMDummyScheduler:
    """Stands for the scheduler that Megatron-LM builds itself (`OptimizerParamScheduler`).

    Pass it to `Accelerator.prepare` with the optimizer: its step counts become Megatron's
    ``train_iters`` and ``lr_warmup_iters``.

    Args:
        optimizer: the optimizer the schedule applies to.
        total_num_steps: total optimizer steps of training (over all data-parallel ranks).
        warmup_num_steps: linear warm-up steps.
        **kwargs: kept, for Megatron's other scheduler arguments.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs


class MegatronLMDummyDataLoader:
    """Stands for a data loader that Megatron-LM builds from its own indexed datasets.

    Args:
        **dataset_kwargs: Megatron data arguments (``data_path``, ``split``, ``seq_length``,
            ``micro_batch_size``, ...), over Megatron's defaults.
    """

    def __init__(self, **dataset_kwargs: Any) -> None:
        self.dataset_args: dict[str, Any] = {**_DATA_DEFAULTS, **dataset_kwargs}
        self.dataset_args["megatron_dataset_flag"] = True

    def set_megatron_data_args(self, args: Any = None) -> None:
        """Copy the data arguments onto Megatron's argument namespace (the engine's by default)."""
        if args is None:
            from hasten.strategies.megatron.engine import get_args

            args = get_args()
        for key, value in self.dataset_args.items():
            setattr(args, key, value)

    def build_train_valid_test_data_iterators(self, accelerator: Any) -> Any:
        """Megatron's indexed-dataset pipeline is not wired into hasten.

        Raises:
            NotImplementedError: always; says what works instead.
        """
        raise NotImplementedError(
            "MegatronLMDummyDataLoader (Megatron's own indexed datasets, megatron_dataset_flag) "
            "is not wired into hasten: the megatron.training data pipeline is not part of the "
            "megatron-core wheel. Pass a torch DataLoader of tokenized samples to "
            "accelerator.prepare() instead; it is sharded over the data-parallel ranks."
        )


def rebatch_for_megatron(dataloader: DataLoader[Any], batch_size: int) -> DataLoader[Any]:
    """Rebuild ``dataloader`` to yield ``batch_size`` samples (one global step's micro-batches)."""
    kwargs = dataloader_kwargs(dataloader)
    sampler = getattr(dataloader.batch_sampler, "sampler", None) or dataloader.sampler
    drop_last = bool(getattr(dataloader.batch_sampler, "drop_last", dataloader.drop_last))
    return DataLoader(
        dataloader.dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs
    )


def prepare_data_loader(accelerator: Any, dataloader: Any) -> Any:
    """Shard ``dataloader`` over Megatron's data-parallel groups (one global step per batch).

    Raises:
        NotImplementedError: a `MegatronLMDummyDataLoader` (Megatron's own datasets).
    """
    if isinstance(dataloader, MegatronLMDummyDataLoader):
        return dataloader.build_train_valid_test_data_iterators(accelerator)
    from hasten.strategies.megatron.engine import data_parallel_rank_and_size, get_args

    args = get_args()
    rank, size = data_parallel_rank_and_size()
    loader = rebatch_for_megatron(dataloader, args.micro_batch_size * args.num_micro_batches)
    return shard_data_loader(
        loader,
        accelerator.device,
        num_processes=size,
        process_index=rank,
        split_batches=accelerator.split_batches,
        put_on_device=True,
        rng_types=list(accelerator.rng_types),
        dispatch_batches=accelerator.dispatch_batches,
    )
