"""edgetrain.pages: the state store's and the checkpoint buffer's large arrays are not asked onto huge pages."""
from __future__ import annotations

import os

import numpy as np
import pytest

from edgetrain import pages
from edgetrain.checkpoint import files
from edgetrain.runtime.state import StateStore

SMAPS = "/proc/self/smaps"
pytestmark = pytest.mark.skipif(not os.path.exists(SMAPS), reason="needs Linux's /proc/self/smaps")


def vm_flags(a: np.ndarray) -> set[str]:
    """The VmFlags of the mapping holding ``a``'s middle byte ("hg": madvise(MADV_HUGEPAGE) was asked; numpy
    asks from the first page boundary inside its block, so the block's first page is mapped apart)."""
    addr = a.ctypes.data + a.nbytes // 2
    inside = False
    with open(SMAPS) as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds address {addr:#x}")


def test_numpy_asks_for_huge_pages_and_pages_does_not():
    n = 3 * pages.MIN_BYTES // 4
    ours, numpys = pages.zeros(n, np.float32), np.zeros(n, np.float32)
    if "hg" not in vm_flags(numpys):
        pytest.skip("this numpy does not madvise huge pages (NUMPY_MADVISE_HUGEPAGE=0?)")
    assert "hg" not in vm_flags(ours)
    assert ours.dtype == np.float32 and ours.shape == (n,) and ours.flags.writeable and ours.flags.c_contiguous
    assert not ours.any()
    ours[-1] = 2.5
    assert ours[-1] == 2.5


def test_small_arrays_and_the_switch_keep_numpys_allocation(monkeypatch):
    small = pages.zeros(16, np.float64)
    assert small.base is None and not small.any()
    monkeypatch.setenv("EDGETRAIN_HUGE_PAGES", "1")
    assert pages.zeros(pages.MIN_BYTES, np.uint8).base is None


def test_state_store_and_checkpoint_buffer_use_small_pages(tmp_path):
    n = pages.MIN_BYTES // 4 + 1          # one parameter just over the threshold
    w = np.arange(n, dtype=np.float32)
    store = StateStore({"w": w}, {})
    store.ensure_moments(2)
    for a in (store.params, *store.grad_slots, *store.moments):
        assert "hg" not in vm_flags(a)
    np.testing.assert_array_equal(store.param("w"), w)
    assert not store.grad_slots[0].any() and not store.moments[1].any()
    path = tmp_path / "blob"
    path.write_bytes(w.tobytes())
    data = files.read(path)
    assert "hg" not in vm_flags(np.frombuffer(data, np.uint8))
    assert bytes(data) == w.tobytes()
