"""Reading and writing the torch files of runs (checkpoints, policy files): atomic writes and weights-only reads
with one-line errors. Shared by :mod:`bcg.agents.checkpoint` and :mod:`bcg.agents.export`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from bcg.files import new_file_mode

__all__ = ["atomic_torch_save", "read_torch_file"]


def _fsync_dir(folder: Path) -> None:
    """fsync a directory so that a rename inside it is durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened; rename durability is the filesystem's
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically: temporary file in the same folder, flush, fsync, rename, fsync of
    the folder. Either the old file or the complete new one is under ``path`` at every moment; the file gets the mode
    of any other new file (0o666 less the umask, not mkstemp's 0o600). A temporary file left by a process killed
    mid-write is removed by :func:`bcg.files.remove_stale_temporaries` at the run's next start. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt included: never leave the temporary file behind
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def read_torch_file(path: str | Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """``torch.load(path, weights_only=True)`` with errors that say what is wrong (``what``: the kind of file, for
    the message).

    Raises ``error`` (a ``ValueError`` subclass: the caller's own, e.g. a policy-file or checkpoint error) for a
    missing, empty, truncated or corrupt file, and for one holding a pickled Python object that a weights-only load
    refuses to build (never executed)."""
    import pickle

    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {p} does not exist (or is not a file)")
    size = p.stat().st_size
    if size == 0:
        raise error(f"{what} {p} is empty (0 bytes): an interrupted write or a truncated copy")
    with open(p, "rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04" and not head.startswith(b"\x80"):  # torch.save's zip archive, or a legacy pickle
        raise error(f"{what} {p} ({size} bytes) is not a torch file: it starts with {head!r}, neither the zip "
                    "signature of torch.save nor a pickle header")
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        import re

        msg = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", msg)
        what_obj = f"the global {found.group(1)!r}" if found else "a Python object"
        detail = msg.strip().splitlines()[0] if msg.strip() else ""
        raise error(f"{what} {p} holds a pickled Python object ({what_obj}) that a safe (weights_only) load refuses "
                    f"to build, so it was not loaded and nothing in it ran. torch says: {detail[:300]}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged stream fails anywhere in the unpickler (EOF, Index, Key...)
        raise error(f"{what} {p} ({size} bytes) is truncated or corrupt: it is not a complete torch "
                              f"file ({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''})"
                              ) from None
