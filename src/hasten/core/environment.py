"""Reading and temporarily changing process environment variables.

This module and `hasten.config.envvars` are the only places allowed to touch `os.environ`.
Code above `core` reads settings through `hasten.config.envvars`; these helpers exist for users
(they are part of Accelerate's public API) and for tests.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast, overload

__all__ = [
    "ACCELERATE_PREFIX",
    "CPUInformation",
    "are_libraries_initialized",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_cpu_distributed_information",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
]

ACCELERATE_PREFIX = "ACCELERATE_"

_TRUE = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE = frozenset({"n", "no", "f", "false", "off", "0"})

# Marks a callable already wrapped by purge_accelerate_environment, so a subclass hook does
# not wrap an inherited test twice.
_PURGED_MARK = "_hasten_purges_accelerate_environment"

T = TypeVar("T")

_FORBIDDEN_IN_ENV_LINES = (";", "\n", "<", ">", " ")

# Named after Accelerate's module for these messages (accelerate.utils.environment), which its
# tests and users' logging filters name; hasten.utils.environment is that path here.
logger = logging.getLogger("hasten.utils.environment")


@overload
def str_to_bool(value: str, to_bool: Literal[False] = False) -> int: ...
@overload
def str_to_bool(value: str, to_bool: Literal[True]) -> bool: ...
def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """Convert a truth string (y/yes/t/true/on/1 or n/no/f/false/off/0, any case) to 1/0.

    Args:
        value: the string to interpret.
        to_bool: return `True`/`False` instead of `1`/`0`.

    Raises:
        ValueError: `value` is not one of the recognised spellings.
    """
    lowered = str(value).strip().lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise ValueError(
        f"invalid truth value {value!r}: expected one of {sorted(_TRUE)} or {sorted(_FALSE)} "
        "(case-insensitive)"
    )


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Return the boolean value of environment variable `key`, or `default` when it is unset.

    Raises:
        ValueError: the variable is set to something that is not a truth string.
    """
    value = os.environ.get(key)
    if value is None:
        return default
    try:
        return str_to_bool(value, to_bool=True)
    except ValueError as err:
        raise ValueError(f"environment variable {key}={value!r} is not a boolean: {err}") from None


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """Return environment variable `key` as a string, or `str(default)` when it is unset."""
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: list[str] | tuple[str, ...], default: int) -> int:
    """Return the first of `env_keys` set to a non-negative integer, else `default`.

    Raises:
        ValueError: one of the variables holds something that is not an integer.
    """
    for key in env_keys:
        raw = os.environ.get(key)
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(
                f"environment variable {key}={raw!r} is not an integer; fix or unset it"
            ) from None
        if value >= 0:
            return value
    return default


@dataclass
class CPUInformation:
    """Where this process sits in a CPU (torchrun or MPI) job: global and per-node rank and size."""

    rank: int = field(default=0, metadata={"help": "The rank of the current process."})
    world_size: int = field(default=1, metadata={"help": "The total number of processes."})
    local_rank: int = field(default=0, metadata={"help": "The rank of the process on its node."})
    local_world_size: int = field(
        default=1, metadata={"help": "The number of processes on the local node."}
    )


# torchrun first, then Intel MPI / MPICH (PMI_*), Open MPI and MVAPICH2.
_CPU_RANK_VARIABLES: dict[str, tuple[str, ...]] = {
    "rank": ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"),
    "world_size": ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"),
    "local_rank": (
        "LOCAL_RANK",
        "MPI_LOCALRANKID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_RANK",
    ),
    "local_world_size": (
        "LOCAL_WORLD_SIZE",
        "MPI_LOCALNRANKS",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
}


def get_cpu_distributed_information() -> CPUInformation:
    """Read this process's rank and world sizes from torchrun's or an MPI launcher's variables."""
    defaults = {"rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1}
    values = {
        key: get_int_from_env(_CPU_RANK_VARIABLES[key], default)
        for key, default in defaults.items()
    }
    return CPUInformation(**values)


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """Return `KEY=value` lines (newline-terminated) for an env file, skipping (with a warning) unsafe entries.

    An entry is skipped when its key or value is empty or contains `;`, a newline, `<`, `>` or a
    space, since those would break or inject into the shell file it is written to.
    """
    lines = []
    for key, value in current_env.items():
        text = f"{key}{value}"
        if key and value and not any(char in text for char in _FORBIDDEN_IN_ENV_LINES):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(
                "WARNING: Skipping %s=%s as it contains forbidden characters or missing values. "
                "(hasten: an env-file line needs a non-empty key and value without ; < > space "
                "or newline.)",
                key,
                value,
            )
    return lines


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Return the names among `library_names` that are already imported in this process."""
    return [name for name in library_names if name in sys.modules]


class _EnvironmentPatch:
    """Context manager and decorator that sets variables and restores the previous values."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values
        self._saved: list[dict[str, str | None]] = []

    def __enter__(self) -> None:
        self._saved.append({key: os.environ.get(key) for key in self._values})
        os.environ.update(self._values)

    def __exit__(self, *exc_info: object) -> None:
        for key, old in self._saved.pop().items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

    def __call__(self, func: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            with self:
                return func(*args, **kwargs)

        return wrapper


def patch_environment(**kwargs: Any) -> _EnvironmentPatch:
    """Set each keyword as an environment variable for the duration of a block, then restore.

    Keys are upper-cased and values converted with `str()`. Variables that existed before get
    their old value back; the others are removed. Works as a context manager and as a decorator.

    Example:
        >>> import os
        >>> with patch_environment(hasten_demo="1"):
        ...     os.environ["HASTEN_DEMO"]
        '1'
        >>> "HASTEN_DEMO" in os.environ
        False
    """
    return _EnvironmentPatch({key.upper(): str(value) for key, value in kwargs.items()})


@contextmanager
def clear_environment() -> Iterator[None]:
    """Empty `os.environ` for the duration of a block, then restore it exactly as it was.

    Example:
        >>> import os
        >>> with clear_environment():
        ...     len(os.environ)
        0
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _accelerate_variables_restored() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(ACCELERATE_PREFIX)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(ACCELERATE_PREFIX)]:
            if key not in saved:
                del os.environ[key]
        os.environ.update(saved)


def _purging(func: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with _accelerate_variables_restored():
            return func(*args, **kwargs)

    setattr(wrapper, _PURGED_MARK, True)
    return wrapper


def _wrap_test_methods(cls: type) -> None:
    for name in dir(cls):
        if not name.startswith("test"):
            continue
        method = getattr(cls, name)
        if callable(method) and not getattr(method, _PURGED_MARK, False):
            setattr(cls, name, _purging(method))


def purge_accelerate_environment(func_or_cls: T) -> T:
    """Undo any `ACCELERATE_*` variable a test function (or every test of a class) sets.

    After each call, `ACCELERATE_*` variables added during the call are removed and changed or
    deleted ones get their previous value back. On a class, every attribute whose name starts
    with `test` is wrapped, including in subclasses defined later; this works for
    `unittest.TestCase` and for plain pytest classes.
    """
    if not isinstance(func_or_cls, type):
        if not callable(func_or_cls):
            raise TypeError(
                f"purge_accelerate_environment expects a function or a class, got "
                f"{func_or_cls!r}; decorate the test function or the test class instead"
            )
        return _purging(func_or_cls)  # type: ignore[return-value]

    cls = cast(type, func_or_cls)
    _wrap_test_methods(cls)
    previous_hook = cls.__dict__.get("__init_subclass__")

    def _hook(subclass: type, **kw: Any) -> None:
        if previous_hook is not None:
            previous_hook.__get__(None, subclass)(**kw)
        else:
            # No hook of its own: defer to whatever the decorated class inherited.
            parent_hook: Any = super(cls, subclass)
            parent_hook.__init_subclass__(**kw)
        _wrap_test_methods(subclass)

    cls.__init_subclass__ = classmethod(_hook)  # type: ignore[assignment,method-assign]
    return func_or_cls
