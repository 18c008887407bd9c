"""Bounds-checked access to a flatbuffer: every offset, length and alignment is checked before it is followed.

The ``flatbuffers`` Python runtime trusts its input (a forged offset reads garbage or raises IndexError), and
ORT 1.19.2 itself crashes on some corrupted checkpoints. ``Buffer`` and ``Table`` check what the flatbuffers
C++ ``Verifier`` checks, at the moment a field is read: the root offset, the table's vtable (inside the
buffer, aligned, sizes consistent), each field inside its table, vectors and strings inside the buffer with
their length prefix aligned, strings NUL-terminated and UTF-8.

Two budgets keep forged files from making the reader slow or greedy. Offsets in a flatbuffer only point
forward, so structures cannot loop, but many references to one shared object can multiply work: ``visit``
allows one table visit per 4 bytes of file (a table needs at least 4 bytes of its own). ``charge`` counts
bytes the reader allocates (strings, dims, copies of tensor data) and allows no more than the file holds,
since in a well-formed file these come from disjoint byte ranges.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator

from .state import CheckpointError

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_SCALARS = {"b": (struct.Struct("<?"), 1), "u8": (struct.Struct("<B"), 1), "u32": (struct.Struct("<I"), 4),
            "i32": (struct.Struct("<i"), 4), "i64": (struct.Struct("<q"), 8),
            "f32": (struct.Struct("<f"), 4)}


class Buffer:
    """A flatbuffer held in memory, with the reader's work and allocation budgets."""

    __slots__ = ("bytes_left", "data", "extent", "size", "visits_left")

    def __init__(self, data):
        self.data = data
        self.size = len(data)
        self.visits_left = self.size // 4 + 16
        self.bytes_left = self.size + 4096
        self.extent = 0         # one past the last byte any read touched (tests use it for truncation)

    def _need(self, pos: int, n: int, what: str) -> None:
        if pos < 0 or pos + n > self.size:
            raise CheckpointError(f"{what} at byte {pos} (+{n} bytes) lies outside the file ({self.size} "
                                  "bytes): the file is truncated or corrupt")
        self.extent = max(self.extent, pos + n)

    def _aligned(self, pos: int, align: int, what: str) -> None:
        if pos % align:
            raise CheckpointError(f"{what} at byte {pos} is not aligned to {align} bytes: the file is "
                                  "corrupt")

    def u16(self, pos: int, what: str) -> int:
        self._need(pos, 2, what)
        return _U16.unpack_from(self.data, pos)[0]

    def u32(self, pos: int, what: str) -> int:
        self._need(pos, 4, what)
        return _U32.unpack_from(self.data, pos)[0]

    def visit(self, what: str) -> None:
        self.visits_left -= 1
        if self.visits_left < 0:
            raise CheckpointError(f"{what}: the file references more objects than it can hold (shared or "
                                  "overlapping tables): the file is corrupt")

    def charge(self, nbytes: int, what: str) -> None:
        self.bytes_left -= nbytes
        if self.bytes_left < 0:
            raise CheckpointError(f"{what}: reading it would allocate more bytes than the file holds "
                                  "(overlapping or shared data): the file is corrupt")

    def follow(self, pos: int, what: str) -> int:
        """The position a uoffset stored at ``pos`` points to."""
        self._aligned(pos, 4, f"offset to {what}")
        return pos + self.u32(pos, f"offset to {what}")

    def root(self, what: str) -> Table:
        if self.size < 8:
            raise CheckpointError(f"the file has {self.size} bytes, fewer than a flatbuffer header (8)")
        return Table(self, self.follow(0, what), what)

    def vector(self, pos: int, elem_size: int, what: str) -> tuple[int, int]:
        """(position of the first element, element count) of the vector at ``pos``, all inside the file."""
        self._aligned(pos, 4, f"length of {what}")
        count = self.u32(pos, f"length of {what}")
        self._need(pos + 4, count * elem_size, f"{what} ({count} elements of {elem_size} bytes)")
        return pos + 4, count

    def string(self, pos: int, what: str) -> str:
        start, n = self.vector(pos, 1, what)
        self._need(start + n, 1, f"terminator of {what}")
        if self.data[start + n] != 0:
            raise CheckpointError(f"{what} at byte {pos} is not NUL-terminated: the file is corrupt")
        self.charge(n, what)
        try:
            return bytes(self.data[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{what} at byte {pos} is not UTF-8 ({e.reason}): the file is "
                                  "corrupt") from None


class Table:
    """One table: its vtable checked on construction, each field checked when read."""

    __slots__ = ("_size", "_vt", "_vt_size", "buf", "pos", "what")

    def __init__(self, buf: Buffer, pos: int, what: str):
        buf.visit(what)
        buf._aligned(pos, 4, what)
        buf._need(pos, 4, what)
        vt = pos - _I32.unpack_from(buf.data, pos)[0]
        buf._aligned(vt, 2, f"vtable of {what}")
        vt_size = buf.u16(vt, f"vtable of {what}")
        table_size = buf.u16(vt + 2, f"vtable of {what}")
        if vt_size < 4 or vt_size % 2:
            raise CheckpointError(f"vtable of {what} at byte {vt} has a bad size {vt_size}: the file is "
                                  "corrupt")
        buf._need(vt, vt_size, f"vtable of {what}")
        if table_size < 4:
            raise CheckpointError(f"{what} at byte {pos} declares {table_size} bytes: the file is corrupt")
        buf._need(pos, table_size, what)
        self.buf, self.pos, self.what = buf, pos, what
        self._vt, self._vt_size, self._size = vt, vt_size, table_size

    def _field(self, fid: int, size: int) -> int | None:
        """Absolute position of field ``fid`` (``size`` bytes, aligned to its size), or None if absent."""
        slot = 4 + 2 * fid
        if slot >= self._vt_size:
            return None
        off = _U16.unpack_from(self.buf.data, self._vt + slot)[0]
        if off == 0:
            return None
        if off + size > self._size:
            raise CheckpointError(f"field {fid} of {self.what} (offset {off}, {size} bytes) lies outside its "
                                  f"table ({self._size} bytes): the file is corrupt")
        self.buf._aligned(self.pos + off, size, f"field {fid} of {self.what}")
        return self.pos + off

    def scalar(self, fid: int, kind: str, default):
        st, size = _SCALARS[kind]
        p = self._field(fid, size)
        return default if p is None else st.unpack_from(self.buf.data, p)[0]

    def offset(self, fid: int, what: str) -> int | None:
        """Where the uoffset field ``fid`` points, or None if absent."""
        p = self._field(fid, 4)
        return None if p is None else self.buf.follow(p, what)

    def table(self, fid: int, what: str) -> Table | None:
        p = self.offset(fid, what)
        return None if p is None else Table(self.buf, p, what)

    def string(self, fid: int, what: str) -> str | None:
        p = self.offset(fid, what)
        return None if p is None else self.buf.string(p, what)

    def vector(self, fid: int, elem_size: int, what: str) -> tuple[int, int] | None:
        """(first element position, count) of vector field ``fid``, or None if absent."""
        p = self.offset(fid, what)
        return None if p is None else self.buf.vector(p, elem_size, what)

    def tables(self, fid: int, what: str) -> Iterator[Table]:
        """The tables of vector field ``fid``, one at a time (none if absent); ``what`` names one."""
        v = self.vector(fid, 4, f"vector of {what}")
        if v is None:
            return
        start, count = v
        self.buf.charge(4 * count, f"vector of {what}")
        for i in range(count):
            yield Table(self.buf, self.buf.follow(start + 4 * i, what), f"{what} #{i}")
