"""Stage 4: liveness intervals, in-place reuse and arena offsets (greedy by size, best fit, 64-byte aligned).

Held buffers (graph inputs and outputs) live for the whole program and are never shared; constants live
outside the arena. A fused step may write an output over an input that dies at that step when both have
the step's full shape and dtype: each element is read before it is written, at the same index.
"""
from __future__ import annotations

from ..ir import TensorType
from ..record import Record
from .fusion import Step
from .specialize import Specialized

ALIGN = 64


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Buffer(Record):
    name: str            # the value (or workspace) that created it
    nbytes: int
    start: int           # first step that writes it (-1: before the first step)
    end: int             # last step that reads it (len(steps): after the last step)
    held: bool
    offset: int
    _fields = ("name", "nbytes", "start", "end", "held", "offset")

    def __init__(self, name: str, nbytes: int, start: int, end: int, held: bool = False, offset: int = -1):
        self.name, self.nbytes, self.start, self.end, self.held, self.offset = name, nbytes, start, end, held, offset

    def overlaps_in_time(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


class MemoryPlan(Record):
    buffers: list[Buffer]
    value_buffer: dict[str, int]          # arena value -> buffer index (views share their root's buffer)
    workspaces: dict[int, list[int]]      # step index -> buffer indices of its scratch tensors
    arena_bytes: int
    naive_bytes: int
    _fields = ("buffers", "value_buffer", "workspaces", "arena_bytes", "naive_bytes")

    def __init__(self, buffers, value_buffer, workspaces, arena_bytes, naive_bytes):
        self.buffers, self.value_buffer, self.workspaces = buffers, value_buffer, workspaces
        self.arena_bytes, self.naive_bytes = arena_bytes, naive_bytes


def plan_memory(spec: Specialized, steps: list[Step], workspace_types: dict[int, list[TensorType]],
                reuse: bool = True, external: frozenset[str] = frozenset()) -> MemoryPlan:
    """``external`` inputs live outside the arena (the state store binds them), so they get no buffer."""
    n = len(steps)
    last_use: dict[str, int] = {}
    for s, step in enumerate(steps):
        for i in step.inputs:
            if i:
                last_use[i] = s
    for name in spec.output_names:
        last_use[name] = n

    buffers: list[Buffer] = []
    value_buffer: dict[str, int] = {}
    held_names = set(spec.input_names) | set(spec.output_names)

    def new_buffer(name: str, t: TensorType, start: int, held: bool = False) -> int:
        buffers.append(Buffer(name, t.nbytes, start, max(start, last_use.get(name, start)), held))
        return len(buffers) - 1

    def extend(b: int, name: str):
        buffers[b].end = max(buffers[b].end, last_use.get(name, buffers[b].start))

    for name in spec.input_names:
        if name in external:
            continue
        value_buffer[name] = new_buffer(name, spec.types[name], -1, held=True)
        buffers[value_buffer[name]].end = n

    workspaces: dict[int, list[int]] = {}
    for s, step in enumerate(steps):
        if step.kind == "alias":
            src, out = step.inputs[0], step.outputs[0]
            if src not in value_buffer:     # a view of a constant or of an external array
                continue
            b = value_buffer[src]
            value_buffer[out] = b
            extend(b, out)
            buffers[b].held = buffers[b].held or out in held_names
            continue
        claimed: set[int] = set()
        for out in step.outputs:
            if not out or out in spec.consts or out in external:    # external: written where it is bound
                continue
            t = spec.types[out]
            b = _reusable_input(spec, step, s, t, value_buffer, buffers, claimed) if (
                reuse and step.kind == "fused" and out not in held_names) else None
            if b is None:
                b = new_buffer(out, t, s, held=out in held_names)
                if out in held_names:
                    buffers[b].end = n
            claimed.add(b)
            value_buffer[out] = b
            extend(b, out)
        for k, t in enumerate(workspace_types.get(s, [])):
            workspaces.setdefault(s, []).append(new_buffer(f"{step.label}#ws{k}", t, s))

    naive = sum(aligned(b.nbytes) for b in buffers) + sum(
        aligned(spec.types[o].nbytes) for step in steps if step.kind == "fused"
        for nd in step.nodes for o in nd.node.outputs if o and o not in step.outputs)
    arena = _assign_offsets(buffers) if reuse else _sequential_offsets(buffers)
    return MemoryPlan(buffers, value_buffer, workspaces, arena, naive)


def _reusable_input(spec, step, s, t, value_buffer, buffers, claimed):
    for i in step.inputs:
        if not i or i not in value_buffer:
            continue
        it = spec.types[i]
        b = value_buffer[i]
        buf = buffers[b]
        if (it.dtype == t.dtype and it.shape == step.shape == t.shape and not buf.held and b not in claimed
                and buf.nbytes == t.nbytes and buf.end <= s):
            return b
    return None


def _sequential_offsets(buffers: list[Buffer]) -> int:
    offset = 0
    for b in buffers:
        b.offset = offset
        offset += aligned(b.nbytes)
    return offset


def _assign_offsets(buffers: list[Buffer]) -> int:
    """Greedy by size: place big buffers first, each in the smallest gap left by those alive with it."""
    # (start, end, offset, aligned size) of each placed buffer: this loop is quadratic and runs in every
    # process's first step (resnet18: ~500 buffers), so it compares tuples, not Buffer attributes
    placed: list[tuple[int, int, int, int]] = []
    top = 0
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.start)):
        size = aligned(b.nbytes)
        start, end = b.start, b.end
        busy = sorted([p for p in placed if p[0] <= end and start <= p[1]], key=_offset_of)
        best, best_gap, cursor = None, None, 0
        for _, _, offset, psize in busy:
            gap = offset - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            if offset + psize > cursor:
                cursor = offset + psize
        b.offset = best if best is not None else cursor
        placed.append((start, end, b.offset, size))
        top = max(top, b.offset + size)
    return top


def _offset_of(placed: tuple[int, int, int, int]) -> int:
    return placed[2]


def live_at_peak(memory: MemoryPlan, n_steps: int) -> tuple[int, int, list[Buffer]]:
    """(step, bytes, buffers largest first) at the step where the most arena bytes are alive at once.

    The arena can exceed that sum (gaps the best-fit placement left), never fall below it."""
    best_step, best_bytes, best_live = -1, 0, []
    for s in range(max(n_steps, 1)):
        live = [b for b in memory.buffers if b.start <= s <= b.end]
        total = sum(aligned(b.nbytes) for b in live)
        if total > best_bytes:
            best_step, best_bytes, best_live = s, total, live
    return best_step, best_bytes, sorted(best_live, key=lambda b: -b.nbytes)
