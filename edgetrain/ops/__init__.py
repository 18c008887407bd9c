"""The op table: every op edgetrain runs, keyed by (domain, op_type), sorted, readable without Numba.

Each family module lists its ops in a tuple ``OPS``; a family's kernels live in ``edgetrain.kernels``
under the same file stem and its tests in ``tests/ops/test_<family>.py``.
"""
from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import Graph, Node
from . import conv, elementwise, matmul, normalization, pool, reduce, softmax, tensor, training
from .base import NodeContext, OpDef

FAMILIES = (conv, elementwise, matmul, normalization, pool, reduce, softmax, tensor, training)


def _build_table() -> dict[tuple[str, str], OpDef]:
    table: dict[tuple[str, str], OpDef] = {}
    for family in FAMILIES:
        for op in family.OPS:
            if op.key in table:
                raise RuntimeError(f"op {op.key} is defined twice")
            table[op.key] = op
    return dict(sorted(table.items()))


OP_TABLE: dict[tuple[str, str], OpDef] = _build_table()


def supported_ops() -> list[str]:
    return [f"{d}::{o}" if d else o for d, o in OP_TABLE]


def check_attributes(graph: Graph) -> Graph:
    """Check every attribute of the graph's nodes against its op's schema and make it canonical
    (``edgetrain.ops.attrs``); return the graph. Nodes of ops outside the table keep theirs: planning refuses
    them before any attribute is read."""
    for node in graph.nodes:
        op = OP_TABLE.get((node.domain, node.op_type))
        if op is not None:
            node.attrs = op.checked_attrs(node)
    return graph


def node_attr(node: Node, name: str):
    """Attribute ``name`` of ``node``, or the default its op declares (the op must be in the table)."""
    return OP_TABLE[(node.domain, node.op_type)].attr(node, name)


def lookup(node: Node, opset: int) -> OpDef:
    """The definition of ``node``'s op, or an error naming the node, op, domain and opset."""
    op = OP_TABLE.get((node.domain, node.op_type))
    if op is None:
        domain = node.domain or "ai.onnx"
        raise UnsupportedOpError(f"{node}: op '{node.op_type}' of domain '{domain}' (opset {opset}) is not "
                                 f"supported; supported ops: {', '.join(supported_ops())}")
    return op


__all__ = ["OP_TABLE", "OpDef", "NodeContext", "check_attributes", "lookup", "node_attr", "supported_ops"]
