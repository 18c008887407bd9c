"""Checkpoint files: read whole into one buffer; write atomically (temp file, fsync, rename, fsync folder)."""
from __future__ import annotations

import os
import secrets

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
    """Replace ``path`` by ``data`` so that a crash at any moment leaves the old file or the new one, whole.

    The bytes go to a temporary file in the same folder, are flushed to disk, and the file is renamed over
    ``path``; the folder is then synced so the rename itself survives a power cut. On any failure the
    temporary file is removed and ``path`` is untouched.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with open(fd, "wb", buffering=0, closefd=False) as f:
                view = memoryview(data)
                while view:                       # raw writes may be partial
                    view = view[f.write(view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write checkpoint '{path}': {e.strerror or e}; the previous file, "
                                  "if any, is unchanged") from e
        raise
    _fsync_folder(folder)
    _remove_orphans(folder, os.path.basename(path))


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
