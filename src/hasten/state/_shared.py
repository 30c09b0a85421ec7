"""The one shared-state mechanism of hasten, and `reset_state()` for tests.

`PartialState`, `AcceleratorState` and `GradientState` keep Accelerate's contract: every
instance sees the same attributes (the "Borg" pattern: each instance's ``__dict__`` *is* one
dict owned by its class). That dict is the class attribute ``_shared_state``.

Under PyTorch/XLA with PJRT, several threads each drive one device and need their own state
(https://github.com/pytorch/xla/blob/r2.0/docs/pjrt.md#multithreading-on-tpu-v2v3), so there
``_shared_state`` is one dict per thread. Everywhere else it is a plain dict.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from hasten.platforms.checks import is_torch_xla_available

__all__ = [
    "SharedDict",
    "SharedState",
    "ThreadLocalSharedDict",
    "do_nothing",
    "register_reset_hook",
    "reset_state",
    "unreadable_state",
]

_REGISTRY: list[type[SharedState]] = []
_RESET_HOOKS: list[Callable[[], None]] = []


class ThreadLocalSharedDict(threading.local):
    """Class-attribute descriptor holding one dict per thread (the XLA/PJRT shared state).

    ``obj._shared_state`` and ``cls._shared_state`` both give this thread's dict, and
    ``obj._shared_state = {...}`` replaces it; assigning the *class* attribute would replace
    the descriptor itself, so reset with ``.clear()``.

    Args:
        thread_local: accepted for Accelerate compatibility; storage is always per thread.
    """

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: object, objtype: type | None = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: object, value: dict[str, Any]) -> None:
        self._storage = value


# The type of each state class's shared dict: one per thread only under PyTorch/XLA.
SharedDict: type = ThreadLocalSharedDict if is_torch_xla_available() else dict


class SharedState:
    """Base of the state classes: every instance of a subclass shares one attribute dict.

    A subclass gets its own ``_shared_state`` and is registered so `reset_state()` clears it.
    """

    _shared_state: ClassVar[dict[str, Any]]
    #: Attributes not pickled but rebuilt by `_restore` (closures, stores, weak references).
    _transient: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Asked per class (not the module's SharedDict) so tests can fake XLA for one class.
        if is_torch_xla_available():
            cls._shared_state = ThreadLocalSharedDict()  # type: ignore[assignment]
        else:
            cls._shared_state = {}
        _REGISTRY.append(cls)

    def _share(self) -> bool:
        """Attach this instance to the shared dict; return whether it was already populated."""
        shared = self._shared_state
        self.__dict__ = shared
        return bool(shared)

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps: the shared attributes, less the transient ones.

        Pickling works as in Accelerate (``torch.save(training_args)`` holds a `PartialState`):
        the object read back is a detached record of the state that was saved. It shares
        nothing with the live state of the process that reads it and sets nothing up.
        """
        return {k: v for k, v in self.__dict__.items() if k not in self._transient}

    def __setstate__(self, state: Any) -> None:
        """Read back a pickled state (hasten's, or Accelerate's attributes; see `_restore`).

        Raises:
            pickle.UnpicklingError: the pickle does not hold a state this class can read.
        """
        if not isinstance(state, dict):
            raise unreadable_state(type(self).__name__, f"it holds a {type(state).__name__}")
        self.__dict__ = dict(state)  # a plain dict of its own: detached from the live state
        self._restore()

    def _restore(self) -> None:
        """Rebuild the transient attributes after unpickling (override per class)."""

    @classmethod
    def _clear_shared(cls) -> None:
        """Forget everything this class holds (its next instance initialises afresh)."""
        cls._shared_state.clear()


def unreadable_state(class_name: str, why: str) -> pickle.UnpicklingError:
    """The error for a pickled state that cannot be read back (e.g. in a ``training_args.bin``)."""
    return pickle.UnpicklingError(
        f"Cannot read a pickled {class_name} (for example the distributed_state inside a "
        f"checkpoint's training_args.bin): {why}. It was written by a version of hasten or "
        "Accelerate whose state this version cannot read. The file only records how that run "
        "was set up (Trainer's resume_from_checkpoint does not read it): build the "
        "TrainingArguments (or state) again instead of loading it, or load it with the version "
        "that wrote it."
    )


def register_reset_hook(hook: Callable[[], None]) -> None:
    """Run `hook` on every `reset_state()` (for process-wide caches tied to the state)."""
    if hook not in _RESET_HOOKS:
        _RESET_HOOKS.append(hook)


def reset_state() -> None:
    """Forget PartialState, AcceleratorState and GradientState (and run the reset hooks).

    The process group, if any, stays as it is; destroy it first when a test needs that.
    """
    for cls in reversed(_REGISTRY):
        cls._clear_shared()
    for hook in _RESET_HOOKS:
        hook()


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept anything and return None: the stand-in for a call skipped on this process."""
    del args, kwargs
