"""The memory planner's invariants recomputed from a plan's steps alone (tinygrad's memory-planner tests).

Nothing here reads the planner's own liveness (``Buffer.start/end``, ``overlaps_in_time``, ``held``): which step
defines and which last reads each value is recounted from ``plan.steps``, views are joined to what they view
from the alias steps, and only each value's bytes (offset and size) are taken from the plan, since they are
what is checked.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from edgetrain.plan.memory import ALIGN


class _Storage:
    """Values that share bytes by construction (a value and its views): first write, last read, byte range."""

    def __init__(self, name: str, lo: int, hi: int, first: int, last: int):
        self.names, self.lo, self.hi, self.first, self.last = [name], lo, hi, first, last

    def __repr__(self) -> str:
        return f"{self.names} bytes [{self.lo}, {self.hi}) steps [{self.first}, {self.last}]"


def _byte_range(plan, name: str) -> tuple[int, int]:
    mem = plan.memory
    offset = mem.buffers[mem.value_buffer[name]].offset
    return offset, offset + plan.spec.types[name].nbytes


def storages(plan) -> tuple[list[_Storage], list[tuple[int, int, int]]]:
    """(storage of every arena value, [(step, lo, hi)] of every workspace), liveness counted from the steps."""
    spec, steps, n = plan.spec, plan.steps, len(plan.steps)
    arena = plan.memory.value_buffer
    group: dict[str, _Storage] = {}
    for name in spec.input_names:                      # fed by the caller before step 0: held to the end
        if name in arena:
            group[name] = _Storage(name, *_byte_range(plan, name), -1, n)
    for s, step in enumerate(steps):
        for i in step.inputs:
            if i in group:
                g = group[i]
                g.last = max(g.last, s)
            elif i and i in arena:
                raise AssertionError(f"step {s} ({step.label}) reads '{i}' before any step writes it")
        for o in step.outputs:
            if not o or o not in arena:                 # constants and external (state store) arrays
                continue
            assert o not in group, f"'{o}' is written twice (step {s})"
            if step.kind == "alias" and step.inputs[0] in group:
                g = group[step.inputs[0]]              # a view: the same bytes, live as long as any view
                lo, hi = _byte_range(plan, o)
                assert (lo, hi) == (g.lo, g.lo + (hi - lo)) and hi <= g.hi, f"view '{o}' is not inside {g}"
                g.names.append(o)
                group[o] = g
            else:
                group[o] = _Storage(o, *_byte_range(plan, o), s, s)
    for name in spec.output_names:                     # read by the caller after the last step
        if name in group:
            group[name].last = n
    workspaces = []
    for s, indices in plan.memory.workspaces.items():
        for b in indices:
            buf = plan.memory.buffers[b]
            workspaces.append((s, buf.offset, buf.offset + buf.nbytes))
    unique = list({id(g): g for g in group.values()}.values())
    return unique, workspaces


def _in_place(plan, a: _Storage, b: _Storage) -> bool:
    """b is written over a at the very step that last reads a, element by element at the same index: a fused
    step whose input (a) and output (b) both have its full iteration shape and one dtype, at one offset."""
    if a.last != b.first or b.first < 0 or (a.lo, a.hi) != (b.lo, b.hi):
        return False
    step = plan.steps[b.first]
    if step.kind != "fused":
        return False
    types = plan.spec.types
    ins = [x for x in a.names if x in step.inputs]
    outs = [x for x in b.names if x in step.outputs]
    return any(types[x].shape == step.shape and any(types[y] == types[x] for y in outs) for x in ins) and all(
        types[y].shape == step.shape for y in outs)


def check_plan(plan) -> None:
    """No two values (or workspaces) whose lives overlap share a byte; held values are never written over."""
    groups, workspaces = storages(plan)
    n = len(plan.steps)
    for b in plan.buffers:
        assert b.offset % ALIGN == 0, f"{b} is not {ALIGN}-byte aligned"
        assert 0 <= b.offset and b.offset + b.nbytes <= plan.arena_bytes, f"{b} lies outside the arena"
    assert not set(plan.external) & set(plan.memory.value_buffer), "an external (state store) value in the arena"
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            if a.lo >= b.hi or b.lo >= a.hi or a.hi == a.lo or b.hi == b.lo:
                continue
            if a.first <= b.last and b.first <= a.last and not (_in_place(plan, a, b) or _in_place(plan, b, a)):
                raise AssertionError(f"live together and overlapping in the arena: {a} and {b}")
    for s, lo, hi in workspaces:
        for g in groups:
            if g.first <= s <= g.last and lo < g.hi and g.lo < hi and hi > lo:
                raise AssertionError(f"step {s}'s workspace [{lo}, {hi}) overlaps {g}, live at that step")
    for g in groups:
        held = [x for x in g.names if x in plan.spec.input_names or x in plan.spec.output_names]
        if held:
            assert g.last == n, f"{g} holds graph input/output {held} but is not kept to the end"
    assert plan.arena_bytes <= sum(-(-b.nbytes // ALIGN) * ALIGN for b in plan.buffers)


def check_invariants(plan):
    """check_plan, plus: an input's bytes are never written."""
    check_plan(plan)
    value_buffer = plan.memory.value_buffer
    for name in plan.spec.input_names:
        if name not in value_buffer:
            continue
        for step in plan.steps:
            if step.kind != "alias":
                assert all(value_buffer.get(o) != value_buffer[name] for o in step.outputs if o), (name, step.label)
    assert plan.arena_bytes <= plan.naive_bytes


# --- random graphs and the switches -----------------------------------------------------------------------

SWITCHES = {"planned+fused": {}, "planned": {"EDGETRAIN_NO_FUSION": "1"}, "fused": {"EDGETRAIN_NO_PLANNER": "1"},
            "neither": {"EDGETRAIN_NO_FUSION": "1", "EDGETRAIN_NO_PLANNER": "1"}}
SHAPE = (4, 6)


def switched(monkeypatch, switches: dict):
    for var in ("EDGETRAIN_NO_FUSION", "EDGETRAIN_NO_PLANNER"):
        monkeypatch.delenv(var, raising=False)
    for var, value in switches.items():
        monkeypatch.setenv(var, value)


def _node(kind: int, a: str, b: str, out: str) -> list:
    """One op of a random DAG over float[4, 6] values: fusable element-wise ops, kernels, views."""
    from onnx import helper
    return [
        lambda: [helper.make_node("Add", [a, b], [out])],
        lambda: [helper.make_node("Mul", [a, "b"], [out])],                    # broadcast: not in place
        lambda: [helper.make_node("Relu", [a], [out])],
        lambda: [helper.make_node("MatMul", [a, "w"], [out])],
        lambda: [helper.make_node("Flatten", [a], [f"{out}_f"], axis=0),       # two views
                 helper.make_node("Reshape", [f"{out}_f", "shape"], [out])],
        lambda: [helper.make_node("Sub", [a, b], [out])],
        lambda: [helper.make_node("Softmax", [a], [out], axis=1)],
        lambda: [helper.make_node("Sigmoid", [a], [out])],
    ][kind]()


def dag_model(ops: list[tuple[int, int, int]], outputs: list[int], seed: int = 0):
    """ops: (kind, first input, second input), inputs counted back from the newest value made so far (0: the
    newest, wrapping around to x): recent values get several readers, the cases that stress liveness."""
    from oracle import model
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32)}
    inits = {"w": (rng.standard_normal((6, 6)) / 2).astype(np.float32),
             "b": rng.standard_normal((6,)).astype(np.float32), "shape": np.array(SHAPE, np.int64)}
    values, nodes = ["x"], []
    for k, (kind, i, j) in enumerate(ops):
        nodes += _node(kind, values[-1 - i % len(values)], values[-1 - j % len(values)], f"v{k}")
        values.append(f"v{k}")
    names = list(dict.fromkeys(values[1:][o % len(ops)] for o in outputs))
    return model(nodes, feeds, names, inits), feeds


DAGS = st.tuples(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5), st.integers(0, 5)),
                           min_size=1, max_size=24),
                  st.lists(st.integers(0, 10**6), min_size=1, max_size=3))
