"""Opening files edgetrain reads (models, checkpoints, data): regular files only.

A FIFO, a device or a socket at a model's or a checkpoint's path would block the reader forever or feed it
without end; the file is therefore opened without blocking and checked with ``fstat`` (on the open file, so it
cannot be swapped between the check and the read) before a byte is read.
"""
from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """The path names something other than a regular file (``strerror`` says what)."""


def open_regular(path, follow_symlinks: bool = True):
    """``path`` opened for binary reading (unbuffered), after checking that it is a regular file.

    Raises
    ------
    NotRegularFileError
        A directory, FIFO, device or socket (or, with ``follow_symlinks=False``, a symlink).
    OSError
        The file cannot be opened.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularFileError(errno.EINVAL, "not a regular file (a symlink)", path) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise NotRegularFileError(errno.EINVAL, f"not a regular file ({kind})", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, allocate=bytearray):
    """The whole regular file at ``path`` in one writable buffer (one allocation, sized by ``fstat``):
    ``allocate(size)``, a writable bytes-like object of ``size`` bytes (default a zeroed ``bytearray``).

    Raises
    ------
    OSError
        Not a regular file (``NotRegularFileError``), unreadable, or shorter than ``fstat`` said when read
        (it shrank while being read).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = allocate(size)
        view = memoryview(data).cast("B")
        got = 0
        while got < size:                       # raw reads may be partial
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
        view.release()
    if got != size:
        raise OSError(errno.EIO, f"the file shrank while being read ({got} of {size} bytes)", os.fspath(path))
    return data
