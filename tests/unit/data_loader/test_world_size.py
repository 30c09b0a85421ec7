"""data_loader.world_size: a saved position read by another number of processes."""

from __future__ import annotations

import pytest
import torch

from hasten.data_loader.world_size import (
    adopt_saved_generator,
    kept_accumulation,
    rescale_position,
)


def test_split_batches_keep_the_position() -> None:
    state = {"batches_yielded": 3, "num_processes": 2, "split_batches": True}
    assert rescale_position(state, 1, split=False) == 3


def test_per_process_batches_rescale_and_warn() -> None:
    with pytest.warns(RuntimeWarning, match=r"global batch changes \(2 to 4"):
        assert rescale_position({"batches_yielded": 6, "num_processes": 2}, 4, split=False) == 3


def test_per_process_batches_kept_by_the_accelerator_do_not_warn() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rescale_position({"batches_yielded": 2, "num_processes": 2}, 1, False, True) == 4


def test_a_position_the_new_processes_cannot_share_is_refused() -> None:
    with pytest.raises(ValueError, match=r"saved by 2 processes after 3 batches each \(6 "):
        rescale_position({"batches_yielded": 3, "num_processes": 2}, 4, split=False)


def test_kept_accumulation_scales_and_refuses_what_cannot_divide() -> None:
    assert kept_accumulation(4, 2, 1) == 2
    assert kept_accumulation(1, 2, 4) == 2
    with pytest.raises(ValueError, match=r"3 per-process batches \(3 processes x 1 .* which 2"):
        kept_accumulation(3, 2, 1)


def test_a_sampler_without_generator_adopts_the_saved_one() -> None:
    sampler = torch.utils.data.RandomSampler(range(8))
    saved = torch.Generator().manual_seed(3)
    expected = torch.randperm(8, generator=torch.Generator().manual_seed(3)).tolist()
    assert adopt_saved_generator(sampler, {"sampler_generator": saved.get_state()}) is None
    assert list(sampler) == expected


def test_a_sampler_saved_without_generator_draws_globally_once_and_warns() -> None:
    own = torch.Generator().manual_seed(1)
    sampler = torch.utils.data.RandomSampler(range(8), generator=own)
    with pytest.warns(RuntimeWarning, match="later epochs are shuffled differently"):
        given_back = adopt_saved_generator(sampler, {"torch": torch.get_rng_state()})
    assert given_back is own
    assert sampler.generator is None
