"""Files that concurrent or killed runs cannot damage: atomic writes, the
temporary files a killed writer leaves, and a lock that makes concurrent
runs take turns. Nothing here imports Torch or JAX."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["exclusive_lock", "remove_stale", "save_figure", "write_atomic"]


def write_atomic(path: Path, data: bytes | bytearray | memoryview | Sequence[bytes | memoryview]) -> None:
    """Replace ``path`` with ``data`` atomically (temporary file in the same
    folder, fsync, rename, fsync of the folder). On any failure the
    temporary file is removed and ``path`` is as it was. ``data`` may be
    parts, written one after another (a large body is then not copied to
    be joined to its header).

    Raises:
        OSError: the write failed (e.g. the disk is full) and ``path`` is
            as it was; or, rarely, the folder's fsync failed after the
            rename, when ``path`` already holds ``data``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for part in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # an interrupt too: no half-written file stays behind
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def save_figure(figure: Any, path: Path, dpi: int = 110) -> None:
    """A Matplotlib ``figure`` at ``path``, in the format its suffix names
    (PNG without one). A regular file (or none yet) is written atomically
    (`write_atomic`), a link's target in its place: an interrupted or
    failed drawing leaves it as it was. What is no regular file (a device,
    a named pipe) is written as it is.

    Raises:
        OSError: as `write_atomic`, or the write to a device or pipe failed.
    """
    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".").lower() or "png", dpi=dpi)
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        with open(target, "wb") as f:
            f.write(buffer.getvalue())
    else:
        write_atomic(target, buffer.getvalue())


def remove_stale(folder: Path, name: str) -> list[Path]:
    """Remove the temporary files (``.NAME.*.tmp``) that killed writers of
    ``folder/name`` left behind; returns them. Call it only where no live
    writer of ``name`` can be at work (a single run's folder, or under
    `exclusive_lock`)."""
    stale = sorted(Path(folder).glob(f".{name}.*.tmp"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@contextlib.contextmanager
def exclusive_lock(path: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created when missing, left in
    place) for the block. When another process holds it, call ``waiting``
    once, then wait for it. The kernel releases the lock when its holder
    exits, however it ends, so a killed run never blocks the next.

    Where ``path`` is missing and cannot be created (a folder this process
    may only read, such as a filled cache on a read-only file system), the
    block runs without the lock: this process cannot write there either.

    Raises:
        OSError: ``path`` cannot be opened for another reason.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        if not os.path.exists(path):
            yield
            return
        fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
