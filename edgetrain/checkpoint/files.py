"""Checkpoint files: read whole into one buffer; write atomically (temp file, fsync, rename, fsync folder)."""
from __future__ import annotations

import os

import numpy as np

from .. import atomic, pages
from ..reading import read_regular
from .state import CheckpointError


def _uninitialized(size: int) -> memoryview:
    """``size`` writable bytes the read fills: no zero pass first (unlike ``bytearray``), and a large file on
    4 KiB pages (``edgetrain.pages``: numpy's huge pages made resnet18's 45 MB read 35-190 ms on the bench host,
    as their blocks often had gone back to the VM's host)."""
    return memoryview(pages.zeros(size, np.uint8))


def read(path) -> memoryview:
    """The file's bytes in a writable buffer (the decoded arrays are views into it)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint '{path}' is a directory: ORT's folder checkpoints (*.pbseq, "
                              "before ORT 1.16) are not supported; edgetrain reads the single-file ODTC "
                              "checkpoint")
    try:
        return read_regular(path, _uninitialized)
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
