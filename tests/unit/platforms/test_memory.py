"""OOM detection and the batch-size finder, with real CPU out-of-memory errors."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from hasten.platforms.memory import (
    clear_device_cache,
    find_executable_batch_size,
    get_xpu_available_memory,
    release_memory,
    should_reduce_batch_size,
)


def cpu_oom() -> RuntimeError:
    try:
        torch.empty(2**50, dtype=torch.uint8)
    except RuntimeError as error:
        return error
    pytest.skip("this host granted a 1 PiB allocation")


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("XPU out of memory. Tried to allocate 1 GiB"),
        RuntimeError("NPU out of memory. Tried to allocate 1 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if..."),
        RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"),
        MemoryError(),
        torch.OutOfMemoryError("anything"),
    ],
)
def test_out_of_memory_errors_are_recognised(error: BaseException) -> None:
    assert should_reduce_batch_size(error)


@pytest.mark.parametrize(
    "error", [RuntimeError("shape mismatch"), ValueError("out of memory."), KeyError("x")]
)
def test_other_errors_are_not(error: BaseException) -> None:
    assert not should_reduce_batch_size(error)


def test_a_real_cpu_oom_is_recognised() -> None:
    assert should_reduce_batch_size(cpu_oom())


def test_shrinks_by_ten_percent_until_it_fits() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size: int, scale: int) -> int:
        tried.append(batch_size)
        if batch_size > 100:
            torch.empty(2**50 * scale, dtype=torch.uint8)  # a genuine CPU OOM
        return batch_size * scale

    assert train(2) == 92 * 2
    assert tried == [128, 115, 103, 92]
    tried.clear()
    assert train(1) == 92  # the size that worked is remembered
    assert tried == [92]


def test_bare_decorator_and_custom_reduction() -> None:
    tried: list[int] = []

    @find_executable_batch_size
    def default_start(batch_size: int) -> int:
        return batch_size

    assert default_start() == 128

    size = 64

    def halve() -> int:
        nonlocal size
        size //= 2
        return size

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=halve)
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        if batch_size > 8:
            raise MemoryError
        return batch_size

    assert train() == 8
    assert tried == [64, 32, 16, 8]


def test_reaching_zero_is_an_error() -> None:
    @find_executable_batch_size(starting_batch_size=2)
    def never_fits(batch_size: int) -> None:
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match=r"No executable batch size found.*reached 0"):
        never_fits()


def test_other_errors_propagate_immediately() -> None:
    calls = []

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size: int) -> None:
        calls.append(batch_size)
        raise ValueError("bad data")

    with pytest.raises(ValueError, match="bad data"):
        broken()
    assert calls == [8]


def test_passing_the_batch_size_is_a_type_error() -> None:
    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size: int, model: str) -> None:
        del batch_size, model

    with pytest.raises(TypeError, match=r"Call it without the batch size: train\(model='m'\)"):
        train(8, "m")


def test_function_without_parameters_is_a_type_error() -> None:
    def no_params() -> None:
        return None

    with pytest.raises(TypeError, match=r"takes no parameters.*no_params\(batch_size, \.\.\.\)"):
        find_executable_batch_size(no_params)


def test_reduction_that_does_not_reduce_is_an_error() -> None:
    @find_executable_batch_size(starting_batch_size=8, reduce_batch_size_fn=lambda: 8)
    def train(batch_size: int) -> None:
        raise MemoryError

    with pytest.raises(RuntimeError, match=r"reduce_batch_size_fn returned 8.*smaller int"):
        train()


def test_release_memory_drops_references() -> None:
    tensor = torch.ones(1000)
    ref = weakref.ref(tensor)
    results = release_memory(tensor, "x")
    del tensor
    gc.collect()
    assert results == [None, None]
    assert ref() is None


def test_clear_device_cache_runs_on_cpu() -> None:
    clear_device_cache()
    clear_device_cache(garbage_collection=True)


def test_xpu_memory_goes_through_the_xpu_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "mem_get_info", lambda index: (123 + index, 1000), raising=False)
    assert get_xpu_available_memory(1) == 124
