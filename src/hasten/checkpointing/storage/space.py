"""A full file system during a save: recognised, and told as how many bytes were needed.

torch's archive writer reports a full disk as a bare position mismatch (its errno is lost), so a
failed write is also taken as "out of space" when the file system holding the folder has less
than `NEARLY_FULL` bytes left. The error names the folder, the free and the needed bytes (the
newest earlier checkpoint beside it, or what this save had written when it failed), and the fix.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

__all__ = ["NEARLY_FULL", "disk_full_error", "out_of_space"]

#: A write that fails with less than this left on the file system is taken as a full disk.
NEARLY_FULL = 1 << 20


def out_of_space(folder: Path, error: BaseException) -> bool:
    """Whether ``error`` (raised while writing into ``folder``) came from a full file system."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(folder).free < NEARLY_FULL
    except OSError:
        return False


def _bytes_under(folder: Path) -> int:
    try:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:
        return 0


def _newest_sibling(final: Path) -> Path | None:
    """The newest earlier checkpoint folder beside ``final`` (staging folders left out)."""
    try:
        siblings = [
            d
            for d in final.parent.iterdir()
            if d.is_dir() and d != final and not d.name.startswith(".")
        ]
    except OSError:
        return None
    return max(siblings, key=lambda d: d.stat().st_mtime, default=None)


def disk_full_error(final: Path, staging: Path, name: str) -> OSError:
    """The error for a save of ``final`` that ran out of space writing ``name`` into ``staging``."""
    try:
        free = shutil.disk_usage(final.parent).free
    except OSError:
        free = 0
    written = _bytes_under(staging)
    previous = _newest_sibling(final)
    before = _bytes_under(previous) if previous is not None else 0
    if before > written:
        needed = f"about {before} bytes, the size of the earlier checkpoint {previous}"
    else:
        needed = f"more than the {written} bytes it had written when the disk filled"
    return OSError(
        errno.ENOSPC,
        f"No space left on device: the file system holding {final.parent} has {free} bytes free"
        f" while writing {name} of the checkpoint {final}, which needs {needed}. The checkpoint was not "
        "published, the earlier checkpoints are untouched and training can go on. Free space "
        "(remove old checkpoints, or keep fewer with ProjectConfiguration(total_limit=...)) or "
        "save to another folder, then save again.",
    )
