"""Planning: IR graph + concrete input shapes -> Plan (steps, buffers, offsets). Pure: no Numba.

    specialize -> lower -> widen -> fuse -> plan_memory

Each stage can be switched off for bisecting a wrong answer: ``EDGETRAIN_NO_FUSION=1`` gives one step per
node, ``EDGETRAIN_NO_PLANNER=1`` gives every buffer its own bytes.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import budget, config
from ..budget import format_bytes
from ..errors import EdgetrainError, MemoryBudgetError
from ..ir import Graph, TensorType
from ..record import Record
from .fusion import Step, fuse
from .gradients import direct_gradients as direct_gradients_into
from .lower import lower
from .memory import Buffer, MemoryPlan, live_at_peak, plan_memory
from .specialize import Specialized, specialize
from .widen import widen


class Plan(Record):
    spec: Specialized
    steps: list[Step]
    memory: MemoryPlan
    external: frozenset[str]            # inputs bound to arrays outside the arena
    direct_gradients: tuple[str, ...]   # external buffers their gradient's producer writes (gradients.py)
    _fields = ("spec", "steps", "memory", "external", "direct_gradients")

    def __init__(self, spec, steps, memory, external=frozenset(), direct_gradients=()):
        self.spec, self.steps, self.memory = spec, steps, memory
        self.external, self.direct_gradients = external, direct_gradients

    @property
    def fed_inputs(self) -> list[str]:
        """The inputs ``Program.run`` takes, in order: every graph input that is not external."""
        return [n for n in self.spec.input_names if n not in self.external]

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes

    @property
    def naive_bytes(self) -> int:
        return self.memory.naive_bytes

    @property
    def buffers(self) -> list[Buffer]:
        return self.memory.buffers

    @property
    def n_kernels(self) -> int:
        return sum(1 for s in self.steps if s.kind != "alias")

    @property
    def n_ops(self) -> int:
        return sum(len(s.nodes) for s in self.steps)

    def summary(self) -> str:
        return (f"arena {format_bytes(self.arena_bytes)} (naive {format_bytes(self.naive_bytes)}), "
                f"{self.n_kernels} kernels ({self.n_ops} ops), "
                f"constants {format_bytes(sum(np.asarray(c).nbytes for c in self.spec.consts.values()))}")

    def describe(self) -> str:
        """One line per step: what runs, what it reads and writes."""
        lines = [self.summary()]
        for s, step in enumerate(self.steps):
            lines.append(f"{s:4d} {step.label:40s} {', '.join(i for i in step.inputs if i)} -> "
                         f"{', '.join(o for o in step.outputs if o)}")
        return "\n".join(lines)


def peak_tensors(plan: Plan, top: int = 5) -> tuple[int, int, list[tuple[str, str, int]]]:
    """(step, live bytes, [(name, type, bytes)] largest first) where the plan's live arena bytes peak."""
    step, live, buffers = live_at_peak(plan.memory, len(plan.steps))
    scratch = {id(plan.memory.buffers[b]): s for s, bs in plan.memory.workspaces.items() for b in bs}
    rows = []
    for b in buffers[:top]:
        t = plan.spec.types.get(b.name)
        if id(b) in scratch:     # a kernel's scratch (im2col columns, ...): name the node it serves
            node = plan.steps[scratch[id(b)]].nodes[0].node
            rows.append((f"{node.name or node.op_type} scratch", "workspace", b.nbytes))
        else:
            rows.append((b.name, str(t) if t is not None else "?", b.nbytes))
    return step, live, rows


def _over_budget(name: str, plan: Plan, max_memory: int) -> str:
    step, live, rows = peak_tensors(plan)
    where = "the inputs"
    if 0 <= step < len(plan.steps):
        where = f"step {step} ({plan.steps[step].label} '{plan.steps[step].nodes[0].node.name}')"
    return (f"graph '{name}' needs an arena of {plan.arena_bytes} bytes ({format_bytes(plan.arena_bytes)}), over the "
            f"budget of {max_memory} bytes ({format_bytes(max_memory)}); at its peak, {where}, {live} bytes are alive; "
            "largest tensors there: " + ", ".join(f"'{n}' {t} {format_bytes(b)}" for n, t, b in rows))


def make_plan(graph: Graph, input_types: dict[str, TensorType], output_names: list[str],
              consts: dict[str, np.ndarray] | None = None, max_memory: int | None = None,
              external=(), direct_gradients: bool = False) -> Plan:
    """``external``: inputs that a caller binds to persistent arrays (parameters, gradient buffers), which
    kernels may update in place; they take no arena bytes and are not copied per run.
    ``max_memory``: bytes the arena and the constants (folded ones: before folding) may each take (None:
    the default budget, ``edgetrain.budget``); planning fails before allocating beyond it.
    ``direct_gradients``: gradients go straight into their external accumulation buffers
    (listed in ``Plan.direct_gradients``); the caller then handles accumulation without reset."""
    external = frozenset(external)
    max_memory = budget.resolve(max_memory)
    unknown = external - set(input_types)
    if unknown:
        raise EdgetrainError(f"external inputs {sorted(unknown)} are not inputs of graph '{graph.name}'")
    spec = widen(lower(specialize(graph, input_types, output_names, consts, max_memory)), max_memory)
    redirected = direct_gradients_into(spec, external) if direct_gradients else []
    spec.output_names += redirected        # written by the program: fusion must materialize them
    steps = fuse(spec, enabled=config.fusion_enabled())
    workspaces = {s: step.nodes[0].op.workspace(step.nodes[0].ctx) for s, step in enumerate(steps)
                  if step.kind == "kernel" and step.nodes[0].op.workspace is not None}
    memory = plan_memory(spec, steps, workspaces, reuse=config.planner_enabled(), external=external)
    plan = Plan(spec, steps, memory, external, tuple(redirected))
    if max_memory is not None and plan.arena_bytes > max_memory:
        raise MemoryBudgetError(_over_budget(graph.name, plan, max_memory))
    budget.check(sum(np.asarray(c).nbytes for c in spec.consts.values()), max_memory,
                 f"graph '{graph.name}': its constants")
    if config.debug():
        print(f"edgetrain: {graph.name}: {plan.summary()}", file=sys.stderr)
    return plan


__all__ = ["Plan", "Step", "make_plan", "peak_tensors", "specialize"]
