"""Small file helpers shared by the run, checkpoint, policy and motion code: content hash, the mode a new file gets,
and the removal of temporary files that an interrupted atomic write left behind.

Atomic writes in bcg go through a temporary file named ``.NAME.*tmp`` beside the target (flush, fsync, rename), so a
process killed during a write (``kill -9``) leaves that file and never a half-written target. Nothing else in a run
directory starts with a dot and ends with ``.tmp``: :func:`remove_stale_temporaries` deletes them at the next start.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

__all__ = ["TEMPORARY_GLOB", "file_sha256", "new_file_mode", "remove_stale_temporaries"]

TEMPORARY_GLOB = ".*.tmp"
"""Names of the temporary files of bcg's atomic writes (``.NAME.XXXX.tmp`` / ``.NAME.tmp`` beside ``NAME``)."""

_UMASK_LOCK = threading.Lock()


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def new_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file: 0o666 without the process's umask.

    ``tempfile.mkstemp`` creates 0o600 files; an atomic write chmods its temporary file to this before the rename, so
    that checkpoints and policies get the same mode as the run's other files."""
    with _UMASK_LOCK:  # the umask can only be read by setting it; the lock keeps our own threads from racing
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def remove_stale_temporaries(*folders: str | Path) -> list[Path]:
    """Delete the temporary files of interrupted atomic writes (:data:`TEMPORARY_GLOB`) in ``folders`` (not below
    them); returns the files removed. Missing folders are skipped."""
    removed = []
    for folder in folders:
        for f in sorted(Path(folder).glob(TEMPORARY_GLOB)):
            if f.is_file():
                f.unlink(missing_ok=True)
                removed.append(f)
    return removed
