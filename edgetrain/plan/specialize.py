"""Stage 1 of planning: bind input shapes, run every shape rule, fold constants, prune dead nodes.

The result holds only static shapes; everything computable from shapes and constants (the shape
arithmetic exporters emit around Reshape, Transpose of weights in an inference model, ...) is folded.
Every inferred type is checked here, whatever op's rule made it: dims are integers >= 0 and the size is exact
(no int64 wrap-around); constant folding stops before its results would exceed the memory budget.
"""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from .. import budget
from ..errors import EdgetrainError, ShapeError, UnsupportedOpError
from ..ir import Graph, TensorType
from ..ir.dtypes import CARRIED, ORT_TYPE_NAME, carrier
from ..ops import NodeContext, OpDef, lookup
from ..record import Record


class Bound(Record):
    """A node with its op definition and static types."""
    op: OpDef
    ctx: NodeContext
    _fields = ("op", "ctx")

    def __init__(self, op: OpDef, ctx: NodeContext):
        self.op, self.ctx = op, ctx

    @property
    def node(self):
        return self.ctx.node


class Specialized(Record):
    nodes: list[Bound]
    input_names: list[str]
    output_names: list[str]
    types: dict[str, TensorType]
    consts: dict[str, np.ndarray]
    declared: dict[str, np.dtype]       # edge values widened (widen.py)
    _fields = ("nodes", "input_names", "output_names", "types", "consts", "declared")

    def __init__(self, nodes, input_names, output_names, types, consts, declared=None):
        self.nodes, self.input_names, self.output_names, self.types, self.consts = (
            nodes, input_names, output_names, types, consts)
        self.declared = {} if declared is None else declared


ALWAYS_FOLD = {("", "Shape"), ("", "Size"), ("", "Constant"), ("", "EyeLike")}   # read shapes only


def specialize(graph: Graph, input_types: dict[str, TensorType], output_names: list[str],
               consts: dict[str, np.ndarray] | None = None, max_memory: int | None = None) -> Specialized:
    """Static types for every value of ``graph`` given concrete ``input_types``.

    ``consts`` are values known when planning (an inference model's initializers); names in
    ``input_types`` override initializers of the same name. ``max_memory`` (bytes; None: no bound) bounds
    the sum of the constants folding makes; checked before each fold allocates.
    """
    known = dict(graph.initializers if consts is None else consts)
    for name in input_types:
        known.pop(name, None)
    types = {name: TensorType(a.dtype, a.shape) for name, a in known.items()}
    types.update(input_types)
    kept: list[Bound] = []
    folded = 0          # bytes of the constants folded so far
    for node in graph.nodes:
        opset = graph.opset(node.domain)
        op = lookup(node, opset)
        node.attrs = op.checked_attrs(node)     # graphs built in memory meet the same checks as loaded ones
        in_types = [types[i] if i else None for i in node.inputs]
        ctx = NodeContext(node, op, opset, in_types, [known.get(i) if i else None for i in node.inputs])
        _check_dtype(op, ctx)
        try:
            out_types = list(op.infer(ctx))
        except ShapeError as e:
            e.node_context = ctx    # which node, with which input types: symbolic typing unifies from there
            raise
        out_types += [None] * (len(node.outputs) - len(out_types))
        ctx.out_types = out_types
        nbytes = 0
        for name, t in zip(node.outputs, out_types):
            if name:
                if t is None:
                    raise ctx.error(f"output '{name}' has no shape rule")
                nbytes += _checked(ctx, name, t)
                types[name] = t
        if op.known_outputs is not None and not _foldable(op, ctx):
            for i, value in op.known_outputs(ctx).items():
                if i < len(node.outputs) and node.outputs[i]:
                    known[node.outputs[i]] = value
        if _foldable(op, ctx):
            folded += nbytes + sum(w.nbytes for w in (op.workspace(ctx) if op.workspace else []))
            budget.check(folded, max_memory, f"constant folding (up to {node}, whose outputs take {nbytes} bytes)")
            for name, value in zip(node.outputs, fold(op, ctx)):
                if name:
                    known[name] = value
        else:
            kept.append(Bound(op, ctx))
    for name in output_names:
        if name not in types:
            raise EdgetrainError(f"graph '{graph.name}' has no value named '{name}' to output")
    return Specialized(_prune(kept, output_names), list(input_types), list(output_names), types,
                       {k: v for k, v in known.items()})


def _checked(ctx: NodeContext, name: str, t) -> int:
    """Bytes of output ``name``: dims integers >= 0, the size exact (no int64 wrap-around)."""
    if not isinstance(t, TensorType):     # a tensor sequence (optimizer models): no storage of its own
        return 0
    return budget.checked_shape(t.shape, t.dtype.itemsize, f"{ctx.node}: output '{name}'")


def _check_dtype(op: OpDef, ctx: NodeContext):
    i = op.type_input
    if (i is not None and i < len(ctx.in_types) and ctx.in_types[i] is not None
            and ctx.in_types[i].dtype not in op.element_types):
        got = ORT_TYPE_NAME.get(ctx.in_types[i].dtype, str(ctx.in_types[i].dtype))
        raise UnsupportedOpError(f"{ctx.node}: element type '{got}' of input {i} is not supported by "
                                 f"{op.op_type}; supported: {', '.join(ORT_TYPE_NAME[d] for d in op.element_types)}")


def _foldable(op: OpDef, ctx: NodeContext) -> bool:
    if op.key in ALWAYS_FOLD:
        return True
    if not op.deterministic:
        return False
    present = [c for i, c in enumerate(ctx.consts) if ctx.has_input(i) and i not in op.type_inputs]
    return bool(present) and all(c is not None for c in present)


def fold(op: OpDef, ctx: NodeContext) -> list[np.ndarray]:
    """Evaluate a node whose inputs are all known, with its numpy form or its kernel."""
    args = [c if ctx.has_input(i) else None for i, c in enumerate(ctx.consts)]
    if op.kind == "alias":
        results = [args[0].reshape(ctx.out_types[0].shape)]
    elif op.fold is not None:
        results = op.fold(ctx, *args)
        results = list(results) if isinstance(results, (list, tuple)) else [results]
    else:
        results = _run_kernel(op, ctx, args)
    values = []
    for name, t, r in zip(ctx.node.outputs, ctx.out_types, results):
        if not name:
            values.append(None)
            continue
        r = np.asarray(np.asarray(r).astype(t.dtype, copy=False), order="C")  # keeps 0-d (ascontiguousarray: 1-d)
        if r.shape != t.shape:
            raise ctx.error(f"folding produced shape {r.shape} for output '{name}', the shape rule says {t.shape}")
        values.append(r)
    return values


def _run_kernel(op: OpDef, ctx: NodeContext, args):
    family, name = op.kernel.split(".")
    launcher = getattr(importlib.import_module(f"edgetrain.kernels.{family}"), name)
    ctx = carried_context(ctx)      # kernels compute float16 in float32; fold() rounds the results back
    args = [a.astype(carrier(a.dtype)) if isinstance(a, np.ndarray) else a for a in args]
    outs = [np.empty(t.shape, t.dtype) if t is not None and n else None
            for n, t in zip(ctx.node.outputs, ctx.out_types)]
    scratch = [np.empty(t.shape, t.dtype) for t in (op.workspace(ctx) if op.workspace else [])]
    launcher(ctx)(*args, *outs, *scratch)
    return outs


def _carried(t):
    return TensorType(carrier(t.dtype), t.shape) if isinstance(t, TensorType) and t.dtype in CARRIED else t


def carried_context(ctx: NodeContext, consts: dict[str, np.ndarray] | None = None) -> NodeContext:
    """``ctx`` with carried element types (float16) replaced by the types kernels compute them in; its constant
    inputs converted, or taken from ``consts`` (already converted) by name."""
    values = ([consts.get(i) if i else None for i in ctx.node.inputs] if consts is not None else
              [c.astype(carrier(c.dtype)) if isinstance(c, np.ndarray) else c for c in ctx.consts])
    return dataclasses.replace(ctx, in_types=[_carried(t) for t in ctx.in_types],
                               out_types=[_carried(t) for t in ctx.out_types], consts=values)


def _prune(nodes: list[Bound], output_names: list[str]) -> list[Bound]:
    needed = set(output_names)
    kept = []
    for b in reversed(nodes):
        if any(o in needed for o in b.node.outputs if o):
            kept.append(b)
            needed.update(i for i in b.node.inputs if i)
    return kept[::-1]
