"""The one pool of threads every checkpoint save and load of this process works on.

Files are written, hashed and fsynced, and read and verified block by block, on a few threads
started on first use and kept: a thread start per save or load costs more than a small
checkpoint's fsyncs or reads. Large writes, reads and fsyncs release the GIL, so the threads
overlap the disk with each other and with the caller. A forked child starts a pool of its own
(the parent's threads do not exist there); Python joins the idle threads at exit.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["io_threads"]

_MAX_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def io_threads() -> ThreadPoolExecutor:
    """The process's checkpoint I/O threads (at most one per core, eight at most).

    Tasks write, read, hash or fsync and never wait for other tasks of the pool, so saves and
    loads running at once (a load beside an asynchronous save's thread, say) share it safely.
    """
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(_MAX_THREADS, os.cpu_count() or 1))
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="hasten-io")
        return _pool


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
