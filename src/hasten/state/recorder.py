"""No silent hangs: remember what each collective is, and explain a timeout on every rank.

`guarded` wraps every collective hasten issues. On the hot path it only bumps a per-process
sequence number (about a hundred nanoseconds; the call site is read only on failure). When the
collective raises a timeout, each rank publishes what it was doing (operation, shapes, call site,
sequence number) through the default process group's store, waits briefly for the other ranks'
records, and raises a `CollectiveTimeoutError` whose message is a table of every rank's story.

Longer operations that are not one collective (writing or reading a checkpoint) leave a `note`
of the step and file they are at, in the same store, as they go: the report shows each rank's
last note, so even a rank that died says where it got to.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

__all__ = [
    "CollectiveTimeoutError",
    "FlightRecord",
    "REPORT_WAIT_S",
    "default_store",
    "describe",
    "guarded",
    "is_peer_lost_error",
    "is_timeout_error",
    "note",
    "reset",
    "sequence_number",
]

T = TypeVar("T")

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_KEY = "hasten/flight/{rank}"
_DONE = "hasten/flight/read"
_NOTE = "hasten/flight/note/{rank}"
# How long a rank that timed out waits for the others' records: the process-group timeout,
# clamped to this range (peers blocked in a collective time out within about that long).
REPORT_WAIT_S = (5.0, 60.0)
_TIMEOUT_WORDS = ("timed out", "timeout", "time out")
# When one rank's collective times out, gloo closes its connections and the peers see these a
# few milliseconds before their own timeout would fire; a crashed peer looks the same.
_PEER_LOST_WORDS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote process exited",
)
_seq = 0


class CollectiveTimeoutError(RuntimeError):
    """A collective timed out; the message tells what every rank was doing at that moment."""


@dataclass(frozen=True)
class FlightRecord:
    """What one rank was doing when its collective timed out."""

    rank: int
    op: str
    shapes: str
    site: str
    seq: int


def reset() -> None:
    """Restart the per-process sequence numbering (tests call this between runs)."""
    global _seq
    _seq = 0


def default_store() -> Any:
    """The default process group's store (torch keeps its getter private; None without a group
    or where that changes)."""
    import torch.distributed as dist

    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return getter() if getter is not None else None
    except (RuntimeError, ValueError):
        return None


def note(step: str | None) -> None:
    """Leave word of what this process is doing now (None: nothing worth reporting).

    One store write when several processes share a group (nothing otherwise); a report raised
    on any rank later shows every rank's last note, even that of a rank that has died since.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    try:
        default_store().set(_NOTE.format(rank=dist.get_rank()), step or "")
    except Exception:  # noqa: BLE001 - a note only helps a report; never fail the work for it
        pass


def _notes(world_size: int) -> dict[int, str]:
    """Every rank's last `note` that says something."""

    found: dict[int, str] = {}
    try:
        store = default_store()
        for rank in range(world_size):
            key = _NOTE.format(rank=rank)
            if store.check([key]):
                text = bytes(store.get(key)).decode()
                if text:
                    found[rank] = text
    except Exception:  # noqa: BLE001 - the store's host may be gone; report what was read
        pass
    return found


def sequence_number() -> int:
    """Return how many guarded collectives this process has started."""
    return _seq


def guarded(op: str, fn: Callable[[], T], *, shapes: Any = None) -> T:
    """Run the collective ``fn``; if it times out (or loses a peer), raise what every rank was doing.

    Args:
        op: the user-facing operation name (``gather``, ``wait_for_everyone``, ...).
        fn: the zero-argument call that performs the collective.
        shapes: a string, or the data being communicated; summarised only if a timeout happens.

    Raises:
        CollectiveTimeoutError: ``fn`` timed out (gloo or NCCL) or a peer closed the connection;
            chained to the original error.
    """
    global _seq
    _seq += 1
    seq = _seq
    try:
        return fn()
    except RuntimeError as err:
        if not (is_timeout_error(err) or is_peer_lost_error(err)):
            raise
        # The callers' frames are still live here, so the call site costs nothing until needed.
        raise _explain(op, describe(shapes), _call_site(sys._getframe(1)), seq, err) from err


def _call_site(frame: Any) -> str:
    """Return ``file.py:line`` of the first frame outside the hasten package."""
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_ROOT):
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def is_timeout_error(err: BaseException) -> bool:
    """Return True when ``err`` is a collective timeout (gloo, NCCL watchdog or store wait)."""
    if isinstance(err, CollectiveTimeoutError):
        return False
    message = str(err).lower()
    return any(word in message for word in _TIMEOUT_WORDS)


def is_peer_lost_error(err: BaseException) -> bool:
    """Return True when ``err`` says a peer closed its connection (it timed out or died)."""
    if isinstance(err, CollectiveTimeoutError):
        return False
    message = str(err).lower()
    return any(word in message for word in _PEER_LOST_WORDS)


def describe(data: Any, limit: int = 80) -> str:
    """Summarise the shapes in ``data`` as short text, e.g. ``tensor[4, 3]`` or ``{a: tensor[2]}``."""
    if data is None:
        return "-"
    if isinstance(data, str):
        return data
    text = _describe(data)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(data: Any) -> str:
    if isinstance(data, torch.Tensor):
        dtype = str(data.dtype).replace("torch.", "")
        suffix = "" if data.dtype == torch.float32 else f" {dtype}"
        return f"tensor[{', '.join(str(s) for s in data.shape)}]{suffix}"
    if isinstance(data, Mapping):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in data.items()) + "}"
    if isinstance(data, (list, tuple)):
        inner = ", ".join(_describe(v) for v in data)
        return f"[{inner}]" if isinstance(data, list) else f"({inner})"
    return type(data).__name__


def _timeout_seconds() -> float | None:
    import torch.distributed as dist

    try:
        group = dist.distributed_c10d._get_default_group()
        backend = group._get_backend(torch.device("cpu"))
        timeout = backend.options._timeout
    except Exception:  # noqa: BLE001 - private API; the report works without it
        return None
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else None


def _collect(
    mine: FlightRecord, world_size: int, wait_s: float
) -> tuple[dict[int, FlightRecord], str]:
    """Publish this rank's record and read the others' until all arrived or ``wait_s`` passed.

    Returns the records found and a note when the store failed part-way.
    """
    import torch.distributed as dist

    records = {mine.rank: mine}
    deadline = time.monotonic() + wait_s
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(_KEY.format(rank=mine.rank), json.dumps(asdict(mine)))
        pending = [r for r in range(world_size) if r != mine.rank]
        while pending and time.monotonic() < deadline:
            for rank in list(pending):
                key = _KEY.format(rank=rank)
                if store.check([key]):
                    records[rank] = FlightRecord(**json.loads(store.get(key)))
                    pending.remove(rank)
            if pending:
                time.sleep(0.01)
        read = store.add(_DONE, 1)
    except Exception as err:  # noqa: BLE001 - what was collected so far still helps
        return records, f"\n(could not reach every rank through the store: {err})"
    # The store may live in this process (rank 0): stay until the ranks that reported have read
    # the table too, or the window closes, so nobody loses the store mid-read.
    try:
        while read < len(records) and time.monotonic() < deadline:
            time.sleep(0.01)
            read = store.add(_DONE, 0)
    except Exception:  # noqa: BLE001 - the host left: everyone it waited for has read
        pass
    return records, ""


def _table(records: dict[int, FlightRecord], world_size: int) -> str:
    rows = [("rank", "operation", "shapes", "call site", "seq")]
    for rank in range(world_size):
        rec = records.get(rank)
        if rec is None:
            rows.append((str(rank), "no report", "-", "-", "-"))
        else:
            rows.append((str(rank), rec.op, rec.shapes, rec.site, str(rec.seq)))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _explain(op: str, shapes: str, site: str, seq: int, err: BaseException) -> Exception:
    """Build the error raised on this rank, with every reachable rank's record."""
    import torch.distributed as dist

    timeout = _timeout_seconds()
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - no process group: report this rank alone
        rank, world_size = 0, 1
    mine = FlightRecord(rank=rank, op=op, shapes=shapes, site=site, seq=seq)
    low, high = REPORT_WAIT_S
    wait_s = low if timeout is None else min(high, max(low, timeout))
    if is_peer_lost_error(err):
        # the peers still in a collective lose the same connection within milliseconds and
        # report at once; waiting longer would only wait for the one that is gone
        wait_s = low
    records, note = _collect(mine, world_size, wait_s)
    notes = _notes(world_size)
    steps = "".join(f"\n  rank {r}: {text}" for r, text in sorted(notes.items()))
    if steps:
        steps = "\nWhere each rank got to (its last step):" + steps
    silent = [r for r in range(world_size) if r not in records]
    after = f" after {timeout:g}s" if timeout is not None else ""
    hint = (
        "\nRanks marked 'no report' were not inside a hasten collective within "
        f"{wait_s:g}s (busy elsewhere, stuck, or dead)."
        if silent
        else ""
    )
    what = (
        f"timed out{after}"
        if is_timeout_error(err)
        else "failed: a peer closed its connection (its collective timed out, or it died)"
    )
    message = (
        f"Collective `{op}` {what} on rank {rank}. What each rank was doing:\n"
        f"{_table(records, world_size)}{hint}{steps}{note}\n"
        "Every rank must call the same collectives in the same order with matching shapes. "
        "Raise the limit with InitProcessGroupKwargs(timeout=...) if the work is just slow; "
        f"run with ACCELERATE_DEBUG_MODE=1 to check shapes before each collective.\n"
        f"Original error: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    )
    return CollectiveTimeoutError(message)
