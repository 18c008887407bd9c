"""The large arrays a training process fills before its first step, on ordinary (4 KiB) pages.

numpy asks the kernel for transparent huge pages on every block from 4 MiB up (``madvise(MADV_HUGEPAGE)``).
A huge page needs a free, physically contiguous 2 MiB block, and on a virtual machine that hands free memory
back to its host (virtio-balloon free page reporting: what the bench host does, and any VM with a
balloon) the free blocks that large are exactly the ones returned: the first write to each goes back to the
host. Measured on the bench host, 100 MB first written: 120-260 ms on huge pages when the blocks had been
returned (a few seconds after another process freed them), 11-16 ms when they had not; 60-75 ms on 4 KiB
pages either way, which come from blocks too small to be reported. resnet18's state store (parameters,
gradients, AdamW's two moments: 225 MB) and checkpoint buffer made its warm start 1.22-1.35 s on huge pages
and 0.71-0.76 s on small ones (processes 3 s apart), against ONNX Runtime's 0.78-1.0 s (its allocator makes
no such request).

The step itself is unchanged within noise (the state arrays are streamed once per step; the arena keeps
numpy's pages, its kernels' loops revisit it). ``EDGETRAIN_HUGE_PAGES=1`` keeps numpy's allocation for these
arrays too: on a board with no balloon huge pages are faster to fill.
"""
from __future__ import annotations

import mmap

import numpy as np

from . import config

# numpy's own threshold for asking for huge pages: smaller blocks come from the heap, as before
MIN_BYTES = 1 << 22
_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)


def small_pages() -> bool:
    return bool(_FLAGS) and not config.flag("EDGETRAIN_HUGE_PAGES")


def zeros(count: int, dtype) -> np.ndarray:
    """A 1-D zeroed array of ``count`` elements; from 4 MiB up on 4 KiB pages (a private anonymous mapping,
    zero-filled by the kernel on first write like ``np.zeros``' calloc)."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if nbytes < MIN_BYTES or not small_pages():
        return np.zeros(count, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=_FLAGS), dtype, count)
