"""The op table: every op edgetrain runs, keyed by (domain, op_type), sorted, readable without Numba.

Each family module lists its ops in a tuple ``OPS``; a family's kernels live in ``edgetrain.kernels``
under the same file stem and its tests in ``tests/ops/test_<family>.py``.
"""
from __future__ import annotations

from ..errors import UnsupportedOpError
from ..ir import Graph, Node
from . import (
    conv,
    einsum,
    elementwise,
    indexing,
    matmul,
    normalization,
    ort_training,
    pool,
    reduce,
    rnn,
    sampling,
    softmax,
    tensor,
    training,
)
from .base import NodeContext, OpDef

FAMILIES = (conv, elementwise, matmul, normalization, pool, reduce, softmax, tensor, training, ort_training, rnn,
            einsum, indexing, sampling)


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


# near alternatives for ops users meet that the table lacks: what to export instead
ALTERNATIVES: dict[tuple[str, str], str] = {}


def _alternative(node: Node) -> str:
    hint = ALTERNATIVES.get((node.domain, node.op_type))
    if hint is None:
        same_name = [d or "ai.onnx" for d, o in OP_TABLE if o == node.op_type]
        if same_name:
            hint = f"{node.op_type} from {', '.join(same_name)} is supported"
    return f"; {hint}" if hint else ""


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
                                 f"supported{_alternative(node)}. `edgetrain ops` lists the {len(OP_TABLE)} "
                                 "supported ops, their opsets and which have gradients")
    return op


__all__ = ["OP_TABLE", "OpDef", "NodeContext", "check_attributes", "lookup", "node_attr", "supported_ops"]
