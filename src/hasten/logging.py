"""Logging and progress bars that know about processes: print once, or in rank order.

`get_logger(name)` returns an adapter whose records are emitted on the main process only,
unless a call passes ``main_process_only=False`` (every process) or ``in_order=True`` (every
process, one after the other). `tqdm` shows its bar on each machine's main process only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, MutableMapping
from typing import Any

from hasten.config import envvars
from hasten.core.imports import require
from hasten.state.partial import PartialState

__all__ = ["MultiProcessAdapter", "get_logger", "tqdm"]


def _state() -> PartialState:
    if not PartialState._shared_state:
        raise RuntimeError(
            "hasten's multi-process logger needs the process state: create PartialState() or "
            "Accelerator() before logging through get_logger()."
        )
    return PartialState()


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger adapter that logs on the main process only unless told otherwise.

    Every logging call accepts two extra keywords: ``main_process_only`` (default True) and
    ``in_order`` (default False: log on every process, one process at a time, in rank order;
    it overrides ``main_process_only``). Every record is prefixed with the process index
    (``[RANK 0]`` on one process too, as in Accelerate).
    """

    def __init__(self, logger: logging.Logger, extra: Any = None) -> None:
        super().__init__(logger, extra or {})
        self._warned: set[tuple[Any, ...]] = set()

    def process(
        self, msg: object, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Prefix the message with the process index (``[RANK i]``)."""
        # stacklevel 2: report the caller of this adapter, not the adapter itself.
        kwargs.setdefault("stacklevel", 2)
        # Every record, one process included, as Accelerate does: a log read later (or grepped
        # across runs) names its process whatever the job size was.
        msg = f"[RANK {_state().process_index}] {msg}"
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Log `msg` at `level` on the processes chosen by `main_process_only` / `in_order`.

        Raises:
            RuntimeError: the process state has not been created yet.
        """
        state = _state()
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, processed = self.process(msg, kwargs)
        if in_order:
            for index in range(state.num_processes):
                if index == state.process_index:
                    self.logger.log(level, msg, *args, **processed)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            self.logger.log(level, msg, *args, **processed)

    def warning_once(self, *args: object, **kwargs: Any) -> None:
        """Log a warning the first time these exact arguments are seen by this logger."""
        key = (args, tuple(sorted(kwargs.items())))
        if key in self._warned:
            return
        self._warned.add(key)
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """Return a process-aware logger for `name` (main process only unless asked otherwise).

    Args:
        name: the logger name, usually ``__name__``.
        log_level: level for this logger and the root logger; defaults to
            ``ACCELERATE_LOG_LEVEL`` (left unchanged when neither is set).

    Example:
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> # logger.info("on the main process"); logger.info("everywhere", main_process_only=False)
    """
    if log_level is None:
        log_level = envvars.setting("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logging.getLogger().setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})


def tqdm(*args: object, main_process_only: bool = True, **kwargs: Any) -> Iterable[Any]:
    """Return a `tqdm.auto.tqdm` bar shown only on each machine's main process by default.

    Args:
        args: passed to tqdm (the iterable first).
        main_process_only: hide the bar on every process but the local main one.
        kwargs: passed to tqdm; ``disable=True`` hides it everywhere.

    Raises:
        ImportError: tqdm is not installed.
        ValueError: a bool was passed first (the old ``tqdm(True, iterable)`` form).
    """
    tqdm_auto = require("tqdm.auto", feature="hasten.utils.tqdm", pip_name="tqdm")  # optional: tqdm
    if args and isinstance(args[0], bool):
        raise ValueError(
            f"tqdm({args[0]!r}, ...) passes main_process_only positionally, which is not "
            "supported; write tqdm(iterable, main_process_only=...) instead."
        )
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = PartialState().local_process_index != 0
    return tqdm_auto.tqdm(*args, disable=disable, **kwargs)
