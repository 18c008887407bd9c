"""edgetrain.atomic.write_atomic: the data is synced before the rename and the folder after it, so a power cut
leaves the old file or the new one, and the new name survives once write_atomic returns."""
import os

import pytest

from edgetrain import atomic
from edgetrain.atomic import write_atomic


@pytest.fixture
def io_log(monkeypatch):
    """Every fsync (with the path its descriptor is open on, read from /proc) and every rename, in order."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        events.append(("replace", os.path.abspath(dst)))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads descriptors' paths from /proc")
def test_data_synced_before_the_rename_and_folder_after(tmp_path, io_log):
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old")
    write_atomic(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    renames = [k for k, e in enumerate(io_log) if e == ("replace", str(target))]
    assert len(renames) == 1, io_log
    before, after = io_log[:renames[0]], io_log[renames[0] + 1:]
    # the temporary file (named after the target, in its folder) is synced before it takes the target's name
    assert any(kind == "fsync" and os.path.dirname(p) == str(tmp_path) and p != str(tmp_path) for kind, p in before), \
        io_log
    assert ("fsync", str(tmp_path)) in after, f"the folder is not synced after the rename: {io_log}"


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_locked_without_waiting_says_whether_it_holds_the_lock(tmp_path, kind):
    """flock locks belong to open file descriptions: a second open in this process contends like another process."""
    path = tmp_path / "lock"
    if kind == "folder":
        path.mkdir()
    with atomic.locked(str(path)) as held:
        assert held
        with atomic.locked(str(path), wait=False) as second:
            assert not second
    with atomic.locked(str(path), wait=False) as again:
        assert again
    assert path.is_dir() if kind == "folder" else path.stat().st_size == 0
