"""Valid ranges of integer graph inputs: the class count of a loss an input labels, the rows of a table it
gathers from. Used to check data before training (a clear error naming the sample) and to make valid
synthetic inputs for profiling."""
from __future__ import annotations

from ..ir import Graph, TensorType
from ..ops import node_attr

INDEX_PASS_THROUGH = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"}
LABEL_LOSSES = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")


def index_bound(graph: Graph, types: dict[str, TensorType], name: str) -> int | None:
    """The exclusive upper bound of valid values of integer input ``name`` (``types``: planned types of the
    graph's values): the class count of a loss it labels, or the size of the axis a Gather indexes with it;
    None when it indexes nothing."""
    consumers = graph.consumers()
    bounds, todo, seen = [], [name], set()
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        for node in consumers.get(v, []):
            op = node.op_type
            if op in INDEX_PASS_THROUGH and node.inputs[0] == v:
                todo.extend(o for o in node.outputs[:1] if o)
            elif (op.startswith(LABEL_LOSSES) and not op.endswith("Grad")
                  and len(node.inputs) > 1 and node.inputs[1] == v and node.inputs[0] in types):
                scores = types[node.inputs[0]].shape
                bounds.append(scores[1] if len(scores) > 1 else scores[0])
            elif op == "Gather" and len(node.inputs) > 1 and node.inputs[1] == v and node.inputs[0] in types:
                data = types[node.inputs[0]].shape
                bounds.append(data[node_attr(node, "axis") % len(data)])
    return min(bounds) if bounds else None


def ignored_label(graph: Graph, name: str) -> int | None:
    """The ``ignore_index`` of a loss that input ``name`` labels directly, if any (that value is allowed)."""
    for node in graph.consumers().get(name, []):
        if node.op_type.startswith(LABEL_LOSSES) and len(node.inputs) > 1 and node.inputs[1] == name:
            return node_attr(node, "ignore_index")
    return None
