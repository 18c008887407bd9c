"""Fused loops whose output the planner put over one of their inputs (in-place reuse) read that input through the
output's array, so the loop vectorizes (two arrays that overlap make LLVM run its scalar loop): the results
match onnxruntime, also with two outputs of which only one takes an input's place, and at 2 threads."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgetrain
from edgetrain import codegen


def _model(shape):
    """t = x^T dies in the fused loop (its output goes over t); a = t*t + b is also read by a ReduceSum (a second
    output of the loop, in a buffer of its own)."""
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[1, 0]), n("Mul", ["t", "t"], ["m"]), n("Add", ["m", "b"], ["a"]),
             n("Sigmoid", ["a"], ["s"]), n("Mul", ["s", "t"], ["z"]), n("Transpose", ["z"], ["y"], perm=[1, 0]),
             n("ReduceSum", ["a"], ["r"], keepdims=0)]
    b = numpy_helper.from_array(np.linspace(-1, 1, shape[0], dtype=np.float32), "b")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape)),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [])], [b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("shape", [(3, 5), (1024, 300)])
def test_a_loop_over_its_own_input_matches_onnxruntime(monkeypatch, shape, threads):
    monkeypatch.setenv("EDGETRAIN_NUM_THREADS", threads)
    generated = []
    real = codegen.generate
    monkeypatch.setattr(codegen, "generate", lambda step, spec, aliases=None: generated.append(
        (step, dict(aliases or {}))) or real(step, spec, aliases))
    model = _model(shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = edgetrain.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    loops = [(step, aliases) for step, aliases in generated if len(step.outputs) == 2]
    assert loops, "the Mul+Add+Sigmoid+Mul loop with two outputs was not generated"
    step, aliases = loops[0]
    assert aliases == {"t": step.outputs[0]} or aliases == {"t": step.outputs[1]}
