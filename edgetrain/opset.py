"""Older ai.onnx opsets brought to the form edgetrain's op table implements (opset 13), at load.

edgetrain's ops implement the opset-13-and-later definitions; later opsets (up to the newest the installed
onnx defines) only add element types or attributes whose defaults keep the old behaviour, so they load as
they are. A model importing an opset below 13 is rewritten node by node with the rules of ``UPGRADES``
(attributes that became inputs become Constant nodes, changed defaults are written out) and then imports
opset 13. An op whose definition changed between the model's opset and 13 must have a rule here or be listed
in ``COMPATIBLE`` (the change only added types, attributes with neutral defaults, or lifted a restriction);
any other is refused with the node named.

Why a table and not ``onnx.version_converter``: the converter needs the whole model to pass onnx's checker
and shape inference first, raises bare RuntimeErrors on models it cannot type, and has no adapters for some
of the ops exporters still write (Upsample to Resize); the rules below are a few lines each, pure IR, and say
exactly what changes.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .errors import UnsupportedOpError
from .ir import Graph, Node

TARGET = 13     # the opset older models are brought to

# ops whose definition changed between opset 1 and 13 in ways that keep every model valid and its results
# the same: added types, added attributes whose defaults are the old behaviour, negative axes/indices allowed,
# broadcasting allowed, attribute-form inputs edgetrain still reads (ReduceX/Pad/Squeeze axes before 13/18)
COMPATIBLE = frozenset("""
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool Cast Ceil Concat Constant
    ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace Div Einsum Elu Equal Erf Exp Expand Flatten
    Floor Gather GatherElements GatherND Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual HardSigmoid
    Identity InstanceNormalization LRN LeakyRelu Less LessOrEqual Log LpNormalization MatMul Max MaxPool Mean Min
    Mod Mul Neg Not OneHot Or PRelu Pow Range Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp ReduceMax ReduceMean
    ReduceMin ReduceProd ReduceSumSquare Relu Reshape Resize ScatterElements ScatterND Selu Shape Sigmoid Sign Sin
    Sinh Size Softplus Softsign SpaceToDepth Sqrt Squeeze Sub Sum Tan Tanh Tile Transpose Unsqueeze Where Xor
""".split())


def _const(name: str, value: np.ndarray) -> Node:
    return Node("Constant", [], [name], {"value": np.asarray(value)}, name)


def _attr_to_input(attr: str, position: int, dtype, default=None, vector: bool = False):
    """A rule moving attribute ``attr`` into input ``position`` (a Constant, 1-D if ``vector``); absent:
    ``default``, or the input stays empty."""
    def rule(node: Node, fresh) -> list[Node]:
        attrs = dict(node.attrs)
        value = attrs.pop(attr, default)
        inputs = list(node.inputs) + [""] * max(0, position - len(node.inputs))
        extra = []
        if value is not None:
            name = fresh(f"{node.name}_{attr}")
            value = np.asarray(value, dtype)
            extra.append(_const(name, value.reshape(-1) if vector else value))
            inputs.insert(position, name)
        else:
            inputs.insert(position, "")
        while inputs and inputs[-1] == "":
            inputs.pop()
        return extra + [replace(node, inputs=inputs, attrs=attrs)]
    return rule


def _chain(*rules):
    def rule(node: Node, fresh) -> list[Node]:
        nodes = [node]
        for r in rules:
            *before, last = r(nodes[-1], fresh)
            nodes = nodes[:-1] + before + [last]
        return nodes
    return rule


def _slice(node: Node, fresh) -> list[Node]:
    """Slice-1..9: starts, ends, axes attributes -> inputs 1, 2, 3."""
    return _chain(_attr_to_input("starts", 1, np.int64), _attr_to_input("ends", 2, np.int64),
                  _attr_to_input("axes", 3, np.int64))(node, fresh)


def _softmax(node: Node, fresh) -> list[Node]:
    """Softmax-1..12 (and LogSoftmax, Hardmax) normalizes over the input flattened to 2-D at ``axis`` (default 1):
    Flatten, Softmax over the last axis, Reshape back to the input's shape."""
    axis = int(node.attrs.get("axis", 1))
    flat, soft, shape = fresh(f"{node.name}_2d"), fresh(f"{node.name}_2d_out"), fresh(f"{node.name}_shape")
    x = node.inputs[0]
    return [Node("Flatten", [x], [flat], {"axis": axis}, flat),
            replace(node, inputs=[flat], outputs=[soft], attrs={"axis": -1}),
            Node("Shape", [x], [shape], {}, shape),
            Node("Reshape", [soft, shape], list(node.outputs), {}, f"{node.name}_nd")]


def _dropout(node: Node, fresh) -> list[Node]:
    """Dropout-7..11: ``ratio`` attribute -> input; inference semantics (training_mode false) as before."""
    attrs = {k: v for k, v in node.attrs.items() if k != "is_test"}
    return _attr_to_input("ratio", 1, np.float32, 0.5)(replace(node, attrs=attrs), fresh)


def _batch_norm(node: Node, fresh) -> list[Node]:
    """BatchNormalization-7..13: ``spatial`` (7-8) must be 1; extra outputs (running mean/var, saved mean/var)
    mean training mode, which opset 14 says with ``training_mode``."""
    attrs = dict(node.attrs)
    if int(attrs.pop("spatial", 1)) != 1:
        raise UnsupportedOpError(f"{node}: BatchNormalization with spatial=0 (per-element statistics, opset < 9) "
                                 "is not supported")
    outputs = list(node.outputs)
    if any(outputs[3:]):
        raise UnsupportedOpError(f"{node}: BatchNormalization's saved_mean/saved_var outputs (opset < 14) are "
                                 "not supported; use opset 14 or later")
    outputs = outputs[:3]
    while outputs and outputs[-1] == "":
        outputs.pop()
    if len(outputs) > 1:
        attrs["training_mode"] = 1
    return [replace(node, outputs=outputs, attrs=attrs)]


def _upsample(node: Node, fresh) -> list[Node]:
    """Upsample-7..9 (deprecated at 10): Resize with asymmetric coordinates, nearest rounding down."""
    attrs = dict(node.attrs)
    mode = attrs.pop("mode", "nearest")
    scales = attrs.pop("scales", None)
    extra, scale_input = [], node.inputs[1] if len(node.inputs) > 1 else ""
    if scales is not None:
        scale_input = fresh(f"{node.name}_scales")
        extra.append(_const(scale_input, np.asarray(scales, np.float32)))
    resize_attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return extra + [Node("Resize", [node.inputs[0], "", scale_input], list(node.outputs), resize_attrs,
                         node.name, node.domain)]


def _resize_10(node: Node, fresh) -> list[Node]:
    """Resize-10 (X, scales): as Upsample, asymmetric coordinates and nearest rounding down."""
    attrs = {"mode": node.attrs.get("mode", "nearest"), "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "floor"}
    return [replace(node, inputs=[node.inputs[0], "", node.inputs[1]], attrs=attrs)]


def _rename(op_type: str):
    return lambda node, fresh: [replace(node, op_type=op_type)]


# op -> (first opset whose form edgetrain reads as is, rule bringing an older node to that form)
UPGRADES = {
    "BatchNormalization": (14, _batch_norm),
    "Clip": (11, _chain(_attr_to_input("min", 1, np.float32), _attr_to_input("max", 2, np.float32))),
    "Dropout": (12, _dropout),
    "Hardmax": (13, _softmax),      # Hardmax-1..11 coerces to 2-D exactly as Softmax does
    "LogSoftmax": (13, _softmax),
    # Pad-2..10: pads and the (float) value as inputs; the kernel writes the value in the data's type
    "Pad": (11, _chain(_attr_to_input("pads", 1, np.int64), _attr_to_input("value", 2, np.float32))),
    "ReduceSum": (13, _attr_to_input("axes", 1, np.int64)),
    "Resize": (11, _resize_10),
    "Scatter": (11, _rename("ScatterElements")),
    "Slice": (10, _slice),
    "Softmax": (13, _softmax),
    "Split": (13, _attr_to_input("split", 1, np.int64)),
    "TopK": (10, _attr_to_input("k", 1, np.int64, vector=True)),
    "Upsample": (10, _upsample),
}


def upgrade(graph: Graph, schema_changed) -> Graph:
    """``graph`` with its ai.onnx nodes in their opset-13 form if it imports an older opset (else unchanged).

    ``schema_changed(op_type, old, new)``: whether ONNX's definition of ``op_type`` differs between opsets
    ``old`` and ``new`` (``onnx_io`` answers from onnx's schemas; this module imports no onnx).
    """
    opset = graph.opsets.get("")
    if opset is None or opset >= TARGET:
        return graph
    taken = {o for n in graph.nodes for o in n.outputs} | {v.name for v in graph.inputs} | set(graph.initializers)

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    nodes = []
    for node in graph.nodes:
        if node.domain:
            nodes.append(node)
            continue
        first, rule = UPGRADES.get(node.op_type, (None, None))
        if rule is not None and opset < first:
            nodes.extend(rule(node, fresh))
        elif rule is None and node.op_type not in COMPATIBLE and schema_changed(node.op_type, opset, TARGET):
            raise UnsupportedOpError(f"{node}: {node.op_type}'s definition changed between the model's ai.onnx "
                                     f"opset {opset} and opset {TARGET}, and edgetrain has no rule to upgrade "
                                     "it; convert the model with onnx.version_converter")
        else:
            nodes.append(node)
    graph.nodes = nodes
    graph.opsets = dict(graph.opsets, **{"": TARGET})
    return graph
