"""Output files that appear whole or not at all, and leave nothing behind when a run is killed.

A file is written under a hidden temporary name beside its target
(``.{target name}.{random}.onnxq-tmp``) and renamed onto the target when complete, so a
reader never sees half a file. The writer holds an exclusive ``flock`` on the temporary file
for as long as it exists; the kernel drops the lock when the process dies, even by
``kill -9``. `sweep` (called before each write into a folder) removes the temporary files
whose lock it can take: their writer is gone. So a killed run leaves at most hidden
``*.onnxq-tmp`` files, which the next onnxq run writing into that folder removes; nothing
else is ever removed by the sweep.

Files are created with mode 0666 minus the umask, like any file a program opens for writing
(``tempfile.mkstemp`` would give 0600).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks, so no sweeping either
    fcntl = None  # type: ignore[assignment]

__all__ = ["TEMP_SUFFIX", "locked", "new_file", "replace", "sweep"]

TEMP_SUFFIX = ".onnxq-tmp"


def _lock(fd: int, wait: bool) -> bool | None:
    """Take the exclusive lock.

    Returns:
        True when taken; False when another process holds it; None when this system or
        filesystem has no flock (then nothing is ever swept, to be safe).
    """
    if fcntl is None:  # pragma: no cover
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK and friends: a filesystem without locks
        return None
    return True


def locked(path: Path) -> bool:
    """True when a live process may hold ``path``'s lock (it is being written or committed)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        return _lock(fd, wait=False) is not True
    finally:
        os.close(fd)


def sweep(folder: Path) -> None:
    """Remove the temporary files that killed onnxq runs left in ``folder``."""
    if fcntl is None:  # pragma: no cover
        return
    with contextlib.suppress(OSError):
        for path in folder.glob(f".*{TEMP_SUFFIX}"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if _lock(fd, wait=False) is not True:
                    continue  # a live writer, or no way to tell
                st = os.fstat(fd)
                now = os.lstat(path)
                if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                    os.unlink(path)
            except OSError:
                pass
            finally:
                os.close(fd)


@contextlib.contextmanager
def new_file(target: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """A new locked temporary file beside ``target``: yields (binary file, its path).

    The file is removed if the block raises; otherwise it stays (still locked until the block
    ends) for the caller to `replace` onto its final name inside the block.
    """
    folder = target.parent
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = folder / f".{target.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        fd = os.open(path, flags, 0o666)  # the umask applies, as for any new file
        _lock(fd, wait=True)
        if os.fstat(fd).st_nlink:
            break
        os.close(fd)  # a sweep removed it between create and lock: take another name
    f = os.fdopen(fd, "w+b")
    try:
        yield f, path
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        f.close()


def replace(temp: Path, target: Path) -> None:
    """Rename a finished temporary file onto ``target`` (atomic on one filesystem)."""
    os.replace(temp, target)
