"""Checkpoint files: read whole into one buffer; write atomically (temp file, fsync, rename, fsync folder)."""
from __future__ import annotations

import os

from .. import atomic
from ..reading import read_regular
from .state import CheckpointError


def read(path) -> bytearray:
    """The file's bytes in a writable buffer (the decoded arrays are views into it)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint '{path}' is a directory: ORT's folder checkpoints (*.pbseq, "
                              "before ORT 1.16) are not supported; edgetrain reads the single-file ODTC "
                              "checkpoint")
    try:
        return read_regular(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint '{path}': {e.strerror or e}") from e


def write_atomic(path, data) -> None:
    """Replace ``path`` by ``data`` atomically (``edgetrain.atomic``); I/O failures become a CheckpointError and
    leave ``path`` untouched."""
    try:
        atomic.write_atomic(path, data)
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint '{os.fspath(path)}': {e.strerror or e}; the previous file, "
                              "if any, is unchanged") from e
