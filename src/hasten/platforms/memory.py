"""Out-of-memory handling: recognise OOM on every platform, retry with smaller batches.

The retry decorator follows the idea of the toma library (https://github.com/BlackHC/toma):
run, and on an out-of-memory error free the cache and try again with a smaller batch.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from hasten.platforms.registry import PLATFORMS, current_platform, get_platform

__all__ = [
    "clear_device_cache",
    "find_executable_batch_size",
    "get_xpu_available_memory",
    "release_memory",
    "should_reduce_batch_size",
]

T = TypeVar("T")

# Every family's OOM wording, gathered once: an exception may come from any device in use.
_OOM_MESSAGES: tuple[str, ...] = tuple(
    dict.fromkeys(message for name in PLATFORMS for message in get_platform(name).oom_messages)
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the allocator cache of this process's platform (and run `gc.collect()` if asked).

    Garbage collection is slow (tens of ms); ask for it only around an OOM or a model swap.
    """
    if garbage_collection:
        gc.collect()
    current_platform().empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references to `objects`, collect garbage and empty the device cache.

    Returns a list of ``None`` to assign back: ``a, b = release_memory(a, b)``.
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Return whether `exception` is an out-of-memory error (any platform, CPU included).

    Also True for cuDNN's NOT_SUPPORTED, which large batches trigger as well.
    """
    if isinstance(exception, (MemoryError, torch.OutOfMemoryError)):
        return True
    if not isinstance(exception, RuntimeError):
        return False
    message = str(exception)
    return any(marker in message for marker in _OOM_MESSAGES)


def _check_signature(
    function: Callable[..., Any], args: tuple[Any, ...], params: list[str]
) -> None:
    if len(params) < len(args) + 1:
        passed = ", ".join(f"{name}={value!r}" for name, value in zip(params[1:], args[1:]))
        raise TypeError(
            f"{function.__name__}() got the batch size as an argument, but "
            "@find_executable_batch_size passes it already as the first argument. "
            f"Call it without the batch size: {function.__name__}({passed})"
        )


def find_executable_batch_size(
    function: Callable[..., T] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Run `function(batch_size, *args, **kwargs)`, shrinking the batch size on out-of-memory.

    Usable as ``@find_executable_batch_size`` or ``@find_executable_batch_size(starting_batch_size=64)``.
    The batch size is multiplied by 0.9 after each OOM unless `reduce_batch_size_fn` (no
    arguments, returns the new size) says otherwise; the last size that worked is kept for the
    next call.

    Args:
        function: the function to wrap; its first parameter receives the batch size.
        starting_batch_size: the first batch size to try.
        reduce_batch_size_fn: returns the next (smaller) batch size after an OOM.

    Raises:
        TypeError: `function` takes no parameter, or the caller passed the batch size itself.
        RuntimeError: the batch size reached 0, or `reduce_batch_size_fn` did not reduce it.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    params = list(inspect.signature(function).parameters)
    if not params:
        raise TypeError(
            f"{function.__name__}() takes no parameters, but @find_executable_batch_size passes "
            f"the batch size as its first argument. Define it as {function.__name__}(batch_size, ...)."
        )
    batch_size = starting_batch_size

    def reduce_by_ten_percent() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn or reduce_by_ten_percent

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> T:
        nonlocal batch_size
        _check_signature(function, args, params)
        clear_device_cache(garbage_collection=True)
        while True:
            if batch_size <= 0:
                raise RuntimeError(
                    f"No executable batch size found for {function.__name__}(): every size from "
                    f"{starting_batch_size} down ran out of memory and the batch size reached 0. "
                    "Reduce the model or sequence size, or use gradient accumulation."
                )
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
                del error
                clear_device_cache(garbage_collection=True)
                previous, batch_size = batch_size, reduce()
                if batch_size >= previous:
                    raise RuntimeError(
                        f"reduce_batch_size_fn returned {batch_size!r} after an out-of-memory "
                        f"error at batch size {previous}; it must return a smaller int."
                    ) from None

    return decorator


def get_xpu_available_memory(device_index: int) -> int:
    """Return the free memory, in bytes, of Intel XPU `device_index`."""
    return get_platform("xpu").mem_get_info(device_index)[0]
