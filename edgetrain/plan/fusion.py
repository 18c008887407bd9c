"""Stage 3: group the schedule into steps; chains of element-wise nodes of one shape become one step.

A group stays open while only its own members read its values; the first outside reader seals it,
and a sealed group runs before that reader. So a group never delays a value somebody else needs.

A group is bounded (``MAX_FUSED_OPS`` ops, ``MAX_FUSED_INPUTS`` arrays read): Numba/LLVM's time and memory grow
faster than linearly with a kernel's size (a 200-op chain: 5 s and 145 MB; 2000 ops: > 2 GiB), so a long chain
becomes several kernels, each compiled in about a second. Variadic ops with more inputs are split into bounded
pieces before fusion (``plan.lower``).

A GEMM followed by a fused step that only adds a bias row to its result (and maybe clamps it with ReLU) becomes
one kernel step (``EPILOGUES``): the Gemm lowering's bias Add is otherwise a call of its own, ~0.6 us on a tiny
GEMM (the digits MLP's whole step is ~26 us). The kernel adds the bias to each sum as it stores it. Likewise a
Gemm's bias gradient (ReduceSum over rows of dY) next to its weight gradient (dY^T @ X) becomes one step
(``SIBLINGS``): the GEMM loop sums each dY value it reads.
"""
from __future__ import annotations


import numpy as np

from ..ops.reduce import reduce_axes
from ..record import Record
from .specialize import Bound, Specialized

MAX_FUSED_OPS = 32       # ops in one generated kernel
MAX_FUSED_INPUTS = 16    # distinct arrays one generated kernel reads

# (core op, op types of the fused step after it) -> the kernel running both (reads core's inputs, then the bias)
EPILOGUES = {(("com.microsoft", "FusedMatMul"), ("Add",)): "matmul.gemm_bias",
             (("com.microsoft", "FusedMatMul"), ("Add", "Relu")): "matmul.gemm_bias_relu"}
# (op of a step, op of the GEMM step next to it reading the same first operand) -> the kernel running both
SIBLINGS = {(("", "ReduceSum"), ("com.microsoft", "FusedMatMul")): "matmul.gemm_column_sums"}


class Step(Record):
    """One unit of execution: a kernel call, a fused element-wise loop, or a view (alias, no work)."""
    kind: str                      # "kernel" | "fused" | "alias"
    nodes: list[Bound]
    inputs: list[str]              # values read from outside the step ("" = absent)
    outputs: list[str]             # values written (or, for alias, the view)
    shape: tuple[int, ...]         # iteration shape of a fused step
    kernel: str                    # a kernel step's launcher when not its op's (EPILOGUES)
    _fields = ("kind", "nodes", "inputs", "outputs", "shape", "kernel")
    __eq__, __hash__ = object.__eq__, object.__hash__    # a step is itself (keys of dicts while fusing)

    def __init__(self, kind, nodes, inputs=None, outputs=None, shape=(), kernel=""):
        self.kind, self.nodes = kind, nodes
        self.inputs = [] if inputs is None else inputs
        self.outputs = [] if outputs is None else outputs
        self.shape, self.kernel = shape, kernel

    @property
    def label(self) -> str:
        ops = "+".join(b.node.op_type for b in self.nodes)
        return f"{self.kind}:{ops}"


def fuse(spec: Specialized, enabled: bool = True) -> list[Step]:
    steps: list[Step] = []
    open_groups: list[Step] = []
    produced_by: dict[str, Step] = {}
    reads: dict[Step, set[str]] = {}     # arrays an open group reads from outside it
    readers: dict[str, int] = {}
    for b in spec.nodes:
        for i in b.node.inputs:
            if i:
                readers[i] = readers.get(i, 0) + 1
    graph_outputs = set(spec.output_names)

    def seal(group: Step):
        open_groups.remove(group)
        members = {o for n in group.nodes for o in n.node.outputs}
        inside_reads: dict[str, int] = {}
        ext_inputs: list[str] = []
        for n in group.nodes:
            for i in n.node.inputs:
                if i in members:
                    inside_reads[i] = inside_reads.get(i, 0) + 1
                elif i and i not in ext_inputs:
                    ext_inputs.append(i)
        group.inputs = ext_inputs
        group.outputs = [o for n in group.nodes for o in n.node.outputs
                         if o and (o in graph_outputs or readers.get(o, 0) > inside_reads.get(o, 0))]
        steps.append(group)

    def fits(group: Step, node) -> bool:
        outside = {i for i in node.inputs if i and produced_by.get(i) is not group}
        return len(group.nodes) < MAX_FUSED_OPS and len(reads[group] | outside) <= MAX_FUSED_INPUTS

    for b in spec.nodes:
        node = b.node
        sources = [produced_by[i] for i in node.inputs if i in produced_by and produced_by[i] in open_groups]
        target = None
        if enabled and b.op.kind == "elementwise":
            out_shape = b.ctx.out_types[0].shape
            target = next((g for g in sources if g.shape == out_shape and fits(g, node)), None)
        for g in dict.fromkeys(sources):
            if g is not target:
                seal(g)
        if b.op.kind == "elementwise":
            if target is None:
                target = Step("fused", [], shape=b.ctx.out_types[0].shape)
                open_groups.append(target)
                reads[target] = set()
            reads[target].update(i for i in node.inputs if i and produced_by.get(i) is not target)
            target.nodes.append(b)
            for o in node.outputs:
                produced_by[o] = target
        else:
            steps.append(Step(b.op.kind, [b], list(node.inputs), list(node.outputs)))
    for g in list(open_groups):
        seal(g)
    return fold_epilogues(steps, spec, readers) if enabled else steps


def fold_epilogues(steps: list[Step], spec: Specialized, readers: dict[str, int]) -> list[Step]:
    """Each 2-D GEMM step followed by a fused step of an ``EPILOGUES`` pattern that reads the GEMM's result
    (read by nothing else) and a bias of its column count, folded into one kernel step."""
    out: list[Step] = []
    for step in steps:
        prev = out[-1] if out else None
        kernel = _epilogue_kernel(prev, step, spec, readers) if prev is not None else None
        if kernel is None:
            pair = _sibling_pair(prev, step, spec) if prev is not None else None
            if pair is not None:
                gemm, other = pair
                out[-1] = Step("kernel", gemm.nodes + other.nodes, list(gemm.inputs), gemm.outputs + other.outputs,
                               kernel=SIBLINGS[(other.nodes[0].op.key, gemm.nodes[0].op.key)])
            else:
                out.append(step)
            continue
        acc = prev.outputs[0]
        bias = next(i for i in step.nodes[0].node.inputs if i != acc)
        out[-1] = Step("kernel", prev.nodes + step.nodes, prev.inputs + [bias], list(step.outputs), kernel=kernel)
    return out


def _epilogue_kernel(core: Step, step: Step, spec: Specialized, readers: dict[str, int]) -> str | None:
    if core.kind != "kernel" or core.kernel or step.kind != "fused" or len(core.outputs) != 1:
        return None
    kernel = EPILOGUES.get((core.nodes[0].op.key, tuple(b.node.op_type for b in step.nodes)))
    acc = core.outputs[0]
    if kernel is None or not acc or readers.get(acc, 0) != 1 or acc in spec.output_names:
        return None
    add = step.nodes[0].node
    if len(step.outputs) != 1 or step.outputs[0] != step.nodes[-1].node.outputs[0] or acc not in add.inputs:
        return None
    bias = next((i for i in add.inputs if i != acc), None)
    if bias is None or not all(b.node.inputs[0] == step.nodes[n].node.outputs[0]     # a chain on the sum
                               for n, b in enumerate(step.nodes[1:])):
        return None
    t_acc, t_bias = spec.types[acc], spec.types[bias]
    if len(t_acc.shape) != 2:      # not on sizes: a batch size must not change which kernels a plan needs
        return None
    if t_bias.dtype != t_acc.dtype or t_bias.shape not in ((t_acc.shape[1],), (1, t_acc.shape[1])):
        return None
    return kernel if np.dtype(t_acc.dtype) in (np.float32, np.float64) else None


def _sibling_pair(first: Step, second: Step, spec: Specialized) -> tuple[Step, Step] | None:
    """(GEMM step, ReduceSum step) when two adjacent steps are a ``SIBLINGS`` pair: the GEMM takes its first
    operand, a 2-D float matrix, transposed (so it reads it row by row) and the ReduceSum sums it over rows
    (of more than one column: the ReduceSum kernel sums one column in another order, in partial sums)."""
    for gemm, other in ((first, second), (second, first)):
        if gemm.kind != "kernel" or other.kind != "kernel" or gemm.kernel or other.kernel:
            continue
        if (other.nodes[0].op.key, gemm.nodes[0].op.key) not in SIBLINGS:
            continue
        g, r = gemm.nodes[0], other.nodes[0]
        x = r.node.inputs[0]
        if len(gemm.outputs) != 1 or len(other.outputs) != 1 or g.node.inputs[0] != x or x in g.node.outputs:
            continue
        t = spec.types[x]
        if len(t.shape) != 2 or t.shape[1] < 2 or np.dtype(t.dtype) not in (np.float32, np.float64) or reduce_axes(r.ctx) != (0,):
            continue
        if g.ctx.attr("transA") != 1 or other.outputs[0] in gemm.inputs or gemm.outputs[0] in other.inputs:
            continue
        if spec.types[gemm.outputs[0]].dtype != t.dtype or spec.types[other.outputs[0]].dtype != t.dtype:
            continue
        return gemm, other
    return None
