"""Training checkpoints in ONNX Runtime 1.19's format: the ``ODTC`` flatbuffer, version 2.

One file holds the module state (trainable and frozen parameters, or only their names and types in a nominal
checkpoint), optimizer groups (step, initial learning rate, per-parameter moments ``momentum0``/``momentum1``)
and a property bag (int64, float32 and string values). The schema ships beside this file
(``ort_training_checkpoint.fbs``). Device side: needs numpy and flatbuffers only.

>>> ckpt = load("checkpoint")                    # doctest: +SKIP
>>> ckpt.trainable["fc1.weight"].shape           # doctest: +SKIP
(256, 784)
>>> ckpt.properties["epoch"] = 3                 # doctest: +SKIP
>>> save(ckpt, "checkpoint")                     # doctest: +SKIP

Reading checks every offset, length, alignment and tensor size against the file before following or
allocating anything, and raises ``CheckpointError`` (naming the file and the problem) for a truncated,
corrupt, foreign or unsupported-version file. Saving is atomic: a crash leaves the previous file intact.
External data files (ORT's ``has_external_data`` for checkpoints over 2 GB) are not supported.
"""
from __future__ import annotations

import os

from . import files
from .reader import decode
from .schema import SCHEMA_PATH, VERSION
from .state import MOMENTUM_NAMES, Checkpoint, CheckpointError, OptimizerGroup

__all__ = [
    "MOMENTUM_NAMES",
    "SCHEMA_PATH",
    "VERSION",
    "Checkpoint",
    "CheckpointError",
    "OptimizerGroup",
    "dumps",
    "load",
    "loads",
    "save",
]


def load(path: str | os.PathLike) -> Checkpoint:
    """Read the checkpoint at ``path``.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    Checkpoint
        Arrays are writable views into the file's bytes where aligned (ORT aligns them to 4 bytes, edgetrain
        to 16), copies otherwise.

    Raises
    ------
    CheckpointError
        The file is missing, unreadable, truncated, corrupt, not a checkpoint, of another version, or
        uses features edgetrain does not support (external data, string or bfloat16 tensors).
    """
    return decode(files.read(path), f"'{os.fspath(path)}'")


def loads(data: bytes | bytearray | memoryview) -> Checkpoint:
    """Decode checkpoint bytes (see ``load``); immutable input is copied once so the arrays are writable."""
    if isinstance(data, memoryview) and not data.readonly:
        data = data.cast("B")
    elif not isinstance(data, bytearray):
        data = bytearray(data)
    return decode(data)


def dumps(ckpt: Checkpoint) -> bytes:
    """The checkpoint as bytes, in the layout ORT 1.19.2 writes (see ``save``)."""
    return bytes(_encode(ckpt))


def save(ckpt: Checkpoint, path: str | os.PathLike) -> None:
    """Write ``ckpt`` to ``path`` atomically: temporary file in the same folder, fsync, rename, fsync folder.

    Parameters
    ----------
    ckpt : Checkpoint
        In a nominal checkpoint only names and dtypes are written.
    path : str or os.PathLike

    Raises
    ------
    CheckpointError
        The content cannot be stored (a dtype without an ONNX type, a non-int64 step, a property that is not
        int/float/str, more than 2 GiB) or the file cannot be written; ``path`` is then unchanged.
    """
    try:
        data = _encode(ckpt)
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint '{os.fspath(path)}': {e}") from None
    files.write_atomic(path, data)


def _encode(ckpt: Checkpoint) -> memoryview:
    # the writer builds with flatbuffers' Builder: imported by a process that writes a checkpoint, not by every one
    # that only reads (a training start: flatbuffers is ~6 modules of import)
    from .writer import encode
    return encode(ckpt)
