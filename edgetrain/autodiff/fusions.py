"""Pattern rewrites of a forward graph before its gradient is built, as ORT's training transformers make them.

Exporters decompose some layers into primitive ops; differentiated node by node, each primitive saves its
input and adds a backward kernel. Recognised here, the layer becomes one op with one gradient op:

- the erf form of GELU, ``x * 0.5 * (1 + erf(x / sqrt(2)))`` as the legacy torch exporter writes it (the
  constant as a divisor sqrt(2) or a factor 1/sqrt(2), the 0.5 applied first or last, operands of Add and Mul
  in either order) -> ``com.microsoft::Gelu`` (whose gradient is ``GeluGrad``), as ORT's GeluFusion does.

A match needs its intermediate values read only inside the pattern (and not be graph outputs), so the
rewrite changes no value anyone else sees.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node

MS = "com.microsoft"


class _View:
    """Producers, readers and constant values of a graph, for matching."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer = graph.producers()
        self.readers = graph.consumers()
        self.outputs = {v.name for v in graph.outputs}
        self.constants = dict(graph.initializers)
        for n in graph.nodes:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and "value" in n.attrs:
                self.constants[n.outputs[0]] = np.asarray(n.attrs["value"])

    def scalar(self, name: str, want: float) -> bool:
        """``name`` is a constant float scalar (any shape of one element) equal to ``want`` (float32 close)."""
        c = self.constants.get(name)
        return (c is not None and c.size == 1 and c.dtype.kind == "f"
                and math.isclose(float(c.reshape(())), want, rel_tol=1e-6))

    def private(self, name: str, reader: Node) -> bool:
        """Only ``reader`` reads ``name``, and it is no graph output."""
        return name not in self.outputs and [id(n) for n in self.readers.get(name, [])] == [id(reader)]

    def only_reader(self, name: str, op_type: str) -> Node | None:
        readers = self.readers.get(name, [])
        if name in self.outputs or len(readers) != 1 or readers[0].op_type != op_type or readers[0].domain:
            return None
        return readers[0]

    def other(self, node: Node, name: str) -> str | None:
        """The other input of a two-input node reading ``name``."""
        if len(node.inputs) != 2 or name not in node.inputs:
            return None
        return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _erf_gelu(v: _View, erf: Node) -> tuple[list[Node], Node] | None:
    """(the nodes to drop, the Gelu replacing them) for the pattern around ``erf``, or None."""
    scale = v.producer.get(erf.inputs[0])
    if scale is None or scale.domain or not v.private(erf.inputs[0], erf):
        return None
    if scale.op_type == "Div" and v.scalar(scale.inputs[1], math.sqrt(2.0)):
        x = scale.inputs[0]
    elif scale.op_type == "Mul" and len(scale.inputs) == 2:
        x = next((a for a, b in (scale.inputs, scale.inputs[::-1]) if v.scalar(b, 1 / math.sqrt(2.0))), None)
    else:
        return None
    if x is None:
        return None
    plus = v.only_reader(erf.outputs[0], "Add")
    if plus is None or not v.scalar(v.other(plus, erf.outputs[0]), 1.0):
        return None
    # 0.5 last: Mul(Mul(x, 1 + erf), 0.5), or first: Mul(Mul(x, 0.5), 1 + erf); factors in either order
    outer = v.only_reader(plus.outputs[0], "Mul")
    if outer is None:
        return None
    other = v.other(outer, plus.outputs[0])
    if other == x:
        half = v.only_reader(outer.outputs[0], "Mul")
        if half is None or not v.scalar(v.other(half, outer.outputs[0]), 0.5):
            return None
        drop, y = [scale, erf, plus, outer, half], half.outputs[0]
    else:
        pre = v.producer.get(other)
        if (pre is None or pre.op_type != "Mul" or pre.domain or not v.private(other, outer)
                or v.other(pre, x) is None or not v.scalar(v.other(pre, x), 0.5)):
            return None
        drop, y = [scale, erf, plus, pre, outer], outer.outputs[0]
    return drop, Node("Gelu", [x], [y], {}, f"{erf.name or y}/GeluFusion", MS)


def fuse_patterns(graph: Graph) -> Graph:
    """``graph`` with the patterns above rewritten (a new Graph; the input is not changed)."""
    v = _View(graph)
    dropped: set[int] = set()
    placed: dict[int, Node] = {}       # id of the pattern's last node -> its replacement
    for node in graph.nodes:
        if node.op_type != "Erf" or node.domain or id(node) in dropped:
            continue
        match = _erf_gelu(v, node)
        if match is None or any(id(n) in dropped for n in match[0]):
            continue
        drop, gelu = match
        dropped.update(id(n) for n in drop)
        placed[id(drop[-1])] = gelu
    if not placed:
        return graph
    nodes = [placed.get(id(n), n) for n in graph.nodes if id(n) not in dropped or id(n) in placed]
    read = {i for n in nodes for i in n.inputs} | v.outputs
    nodes = [n for n in nodes if n.op_type != "Constant" or n.domain or n.outputs[0] in read]   # the pattern's
    opsets = graph.opsets if MS in graph.opsets else {MS: 1} | graph.opsets
    return Graph(nodes, graph.inputs, graph.outputs, graph.initializers, opsets, graph.value_types, graph.name)
