"""Megatron-LM data: the dummy scheduler / data loader placeholders and data-parallel sharding.

Under Megatron-LM a batch is ``micro_batch_size x num_micro_batches`` samples; the engine cuts
it into micro-batches for the pipeline schedule. Data differs only between data-parallel
groups (tensor/pipeline/context ranks of one group read the same samples), so a prepared
loader is sharded over the data-parallel size and rank, not over all processes. A
`MegatronLMDummyDataLoader` becomes three such loaders (train, valid, test) over Megatron's
indexed datasets, built by megatron-core (`datasets.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from hasten.data_loader import prepare_data_loader as shard_data_loader
from hasten.data_loader.base import dataloader_kwargs
from hasten.state import PartialState
from hasten.strategies.megatron.run import megatron_plugin

if TYPE_CHECKING:
    from hasten.strategies.megatron.run import RunView

__all__ = [
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "dataset_loader",
    "megatron_data_loaders",
    "prepare_data_loader",
    "rebatch_for_megatron",
]

# Megatron's data arguments a dummy loader starts from (its own defaults).
_DATA_DEFAULTS: dict[str, Any] = {
    "data_path": None,
    "split": "969, 30, 1",
    "train_data_path": None,
    "valid_data_path": None,
    "test_data_path": None,
    "mock_data": False,
    "data_cache_path": None,
    "mmap_bin_files": True,
    "seq_length": None,
    "encoder_seq_length": None,
    "decoder_seq_length": None,
    "micro_batch_size": None,
    "num_workers": 2,
    "dataloader_type": "single",
    "reset_position_ids": False,
    "reset_attention_mask": False,
    "mask_prob": 0.15,
    "short_seq_prob": 0.1,
    "tokenizer": None,
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

    # One dummy stands for the train, valid and test loaders: prepare() may get it three times.
    _repeatable_in_prepare = True

    def __init__(self, **dataset_kwargs: Any) -> None:
        self.dataset_args: dict[str, Any] = {**_DATA_DEFAULTS, **dataset_kwargs}
        self.dataset_args["megatron_dataset_flag"] = True
        self._given = {*dataset_kwargs, "megatron_dataset_flag"}

    def set_megatron_data_args(self, args: Any = None) -> None:
        """Copy the data arguments onto Megatron's argument namespace (the engine's by default).

        The ones passed to the dummy win; its defaults only fill what the run does not set
        (the plugin's ``eval_iters``, the model's sequence length...).
        """
        if args is None:
            from hasten.strategies.megatron.engine import get_args

            args = get_args()
        for key, value in self.dataset_args.items():
            if key in self._given and value is not None or getattr(args, key, None) is None:
                setattr(args, key, value)

    def get_train_valid_test_datasets_provider(self, accelerator: RunView) -> Any:
        """Return ``provider(train_valid_test_num_samples) -> (train, valid, test)`` datasets:
        the plugin's ``custom_megatron_datasets_provider_function``, else megatron-core's
        builder over this dummy's arguments."""
        plugin = megatron_plugin(accelerator)
        if plugin.custom_megatron_datasets_provider_function is not None:
            return plugin.custom_megatron_datasets_provider_function

        def provider(train_valid_test_num_samples: list[int]) -> list[Any]:
            from hasten.strategies.megatron.datasets import build_datasets
            from hasten.strategies.megatron.engine import get_args

            return build_datasets(get_args(), self.dataset_args, train_valid_test_num_samples)

        return provider

    def build_pretraining_data_loader(
        self, dataset: Any, consumed_samples: int, accelerator: RunView | None = None
    ) -> Any:
        """A loader over ``dataset`` in Megatron's order for this data-parallel rank, after
        ``consumed_samples`` (one global step's samples of this rank per batch)."""
        from hasten.strategies.megatron.engine import data_parallel_rank_and_size, get_args

        args = get_args()
        rank, size = data_parallel_rank_and_size()
        return dataset_loader(
            dataset,
            consumed=consumed_samples,
            batch_size=args.micro_batch_size * args.num_micro_batches,
            rank=rank,
            size=size,
            device=accelerator.device if accelerator is not None else PartialState().device,
            num_workers=int(self.dataset_args.get("num_workers") or 0),
            rng_types=list(accelerator.rng_types) if accelerator is not None else [],
        )

    def build_train_valid_test_data_iterators(self, accelerator: RunView) -> tuple[Any, Any, Any]:
        """Build the train, valid and test loaders over Megatron's datasets (None: empty split).

        Each yields one global step's samples of this data-parallel rank per batch.
        """
        return megatron_data_loaders(accelerator, self)


def dataset_loader(
    dataset: Any,
    *,
    consumed: int,
    batch_size: int,
    rank: int,
    size: int,
    device: torch.device,
    num_workers: int = 0,
    rng_types: list[Any] | None = None,
) -> Any:
    """A prepared loader over a megatron-core dataset: Megatron's sample order, after the
    ``consumed`` samples, ``batch_size`` samples per batch for data-parallel ``rank`` of ``size``.
    """
    from hasten.strategies.megatron.datasets import collate_for, sample_indices

    indices = sample_indices(len(dataset), consumed, batch_size * size)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=indices,
        collate_fn=collate_for(dataset[indices[0]] if len(indices) else None),
        num_workers=num_workers,
    )
    # Batch k of the global order goes to rank k % size: rank r gets samples r*b..(r+1)*b of
    # each global batch, as Megatron's pretraining sampler hands them out.
    return shard_data_loader(
        loader,
        device,
        num_processes=size,
        process_index=rank,
        split_batches=False,
        put_on_device=True,
        rng_types=rng_types or [],
    )


def megatron_data_loaders(accelerator: RunView, dummy: MegatronLMDummyDataLoader) -> tuple:
    """The (train, valid, test) loaders of ``dummy``'s datasets (None for an empty split)."""
    from hasten.strategies.megatron import datasets
    from hasten.strategies.megatron.engine import get_args

    sizes = datasets.num_samples_per_split(get_args())
    built = dummy.get_train_valid_test_datasets_provider(accelerator)(sizes)
    consumed = datasets.consumed_samples(get_args())
    return tuple(
        None
        if dataset is None or len(dataset) == 0
        else dummy.build_pretraining_data_loader(dataset, count, accelerator)
        for dataset, count in zip(built, consumed)
    )


def rebatch_for_megatron(dataloader: DataLoader[Any], batch_size: int) -> DataLoader[Any]:
    """Rebuild ``dataloader`` to yield ``batch_size`` samples (one global step's micro-batches)."""
    kwargs = dataloader_kwargs(dataloader)
    sampler = getattr(dataloader.batch_sampler, "sampler", None) or dataloader.sampler
    drop_last = bool(getattr(dataloader.batch_sampler, "drop_last", dataloader.drop_last))
    return DataLoader(
        dataloader.dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs
    )


def prepare_data_loader(accelerator: RunView, dataloader: Any) -> Any:
    """Shard ``dataloader`` over Megatron's data-parallel groups (one global step per batch);
    a `MegatronLMDummyDataLoader` gives its (train, valid, test) loaders."""
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
