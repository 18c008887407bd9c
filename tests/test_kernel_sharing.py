"""Fused loops that differ only in which operand of a commutative op is broadcast are one kernel (one compile
in a cold process); the argument order the kernel takes still feeds every operand its own array."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import edgetrain
from edgetrain import codegen


def _model(nodes):
    b = numpy_helper.from_array(np.linspace(-2, 2, 8, dtype=np.float32), "b")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, monkeypatch):
    sources = []
    load = codegen.load
    monkeypatch.setattr(codegen, "load", lambda source: sources.append(source) or load(source))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got = edgetrain.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
    return sources


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_swapped_operands_of_a_commutative_op_share_one_kernel(op, monkeypatch):
    first = _run(_model([helper.make_node(op, ["x", "b"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]),
                 monkeypatch)
    second = _run(_model([helper.make_node(op, ["b", "x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]),
                  monkeypatch)
    assert len(set(first)) == 1 and set(first) == set(second)


def test_operands_of_other_ops_keep_their_places():
    """b - x with b broadcast: the kernel takes x first (full before broadcast) and still computes b - x."""
    for nodes in ([helper.make_node("Sub", ["b", "x"], ["y"])], [helper.make_node("Sub", ["x", "b"], ["y"])],
                  [helper.make_node("Div", ["b", "x"], ["t"]), helper.make_node("Sub", ["t", "b"], ["y"])]):
        model = _model(nodes)
        x = np.random.default_rng(1).uniform(0.5, 2, (4, 8)).astype(np.float32)
        got = edgetrain.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
