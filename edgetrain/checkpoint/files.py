"""Checkpoint files: read whole into one buffer; write atomically (temp file, fsync, rename, fsync folder)."""
from __future__ import annotations

import os

from .. import atomic
from .state import CheckpointError


def read(path) -> bytearray:
    """The file's bytes in a writable buffer (the decoded arrays are views into it)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint '{path}' is a directory: ORT's folder checkpoints (*.pbseq, "
                              "before ORT 1.16) are not supported; edgetrain reads the single-file ODTC "
                              "checkpoint")
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            data = bytearray(size)
            view = memoryview(data)
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
            view.release()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint '{path}': {e.strerror or e}") from e
    if got != size:
        raise CheckpointError(f"checkpoint '{path}' shrank while being read ({got} of {size} bytes)")
    return data


def write_atomic(path, data) -> None:
    """Replace ``path`` by ``data`` atomically (``edgetrain.atomic``); I/O failures become a CheckpointError and
    leave ``path`` untouched."""
    try:
        atomic.write_atomic(path, data)
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint '{os.fspath(path)}': {e.strerror or e}; the previous file, "
                              "if any, is unchanged") from e
