"""Pattern rewrites before autodiff (``edgetrain.autodiff.fusions``): the erf-form GELU as exporters write it
becomes one com.microsoft Gelu, and the training model's loss and gradients still match torch autograd run
on the original, unfused graph (tests/torch_ref.py)."""
import math

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from edgetrain import artifacts
from edgetrain.api import CheckpointState, Module
from edgetrain.autodiff.fusions import fuse_patterns
from edgetrain.onnx_io import to_graph

SQRT2 = math.sqrt(2.0)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32)))


# each variant: nodes from "h" to "y" computing gelu(h) the way some exporter writes it
VARIANTS = {
    "div_half_last": [_const("c", SQRT2), helper.make_node("Div", ["h", "c"], ["d"]),
                      helper.make_node("Erf", ["d"], ["e"]), _const("one", 1.0),
                      helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["m"]),
                      _const("half", 0.5), helper.make_node("Mul", ["m", "half"], ["y"])],
    "mul_swapped_operands": [_const("c", 1 / SQRT2), helper.make_node("Mul", ["c", "h"], ["d"]),
                             helper.make_node("Erf", ["d"], ["e"]), _const("one", [1.0]),
                             helper.make_node("Add", ["one", "e"], ["a"]), helper.make_node("Mul", ["a", "h"], ["m"]),
                             _const("half", 0.5), helper.make_node("Mul", ["half", "m"], ["y"])],
    "half_first": [_const("half", 0.5), helper.make_node("Mul", ["h", "half"], ["p"]),
                   _const("c", SQRT2), helper.make_node("Div", ["h", "c"], ["d"]),
                   helper.make_node("Erf", ["d"], ["e"]), _const("one", 1.0),
                   helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["p", "a"], ["y"])],
}
# not GELU, or an intermediate someone else reads: must stay as written
KEPT = {
    "wrong_constant": [_const("c", 2.0), helper.make_node("Div", ["h", "c"], ["d"]),
                       helper.make_node("Erf", ["d"], ["e"]), _const("one", 1.0),
                       helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["m"]),
                       _const("half", 0.5), helper.make_node("Mul", ["m", "half"], ["y"])],
    "quarter_not_half": [_const("c", SQRT2), helper.make_node("Div", ["h", "c"], ["d"]),
                         helper.make_node("Erf", ["d"], ["e"]), _const("one", 1.0),
                         helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["m"]),
                         _const("half", 0.25), helper.make_node("Mul", ["m", "half"], ["y"])],
    "erf_read_twice": [_const("c", SQRT2), helper.make_node("Div", ["h", "c"], ["d"]),
                       helper.make_node("Erf", ["d"], ["e"]), _const("one", 1.0),
                       helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["m"]),
                       _const("half", 0.5), helper.make_node("Mul", ["m", "half"], ["g"]),
                       helper.make_node("Add", ["g", "e"], ["y"])],
    "another_input": [_const("c", SQRT2), helper.make_node("Div", ["h", "c"], ["d"]),
                      helper.make_node("Erf", ["d"], ["e"]), _const("one", 1.0),
                      helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
                      _const("half", 0.5), helper.make_node("Mul", ["m", "half"], ["y"])],
}


def _model(pattern):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"])] + pattern
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 6])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("name", list(VARIANTS) + list(KEPT))
def test_erf_gelu_becomes_one_gelu_op(name):
    fused = fuse_patterns(to_graph(_model({**VARIANTS, **KEPT}[name])))
    ops = [n.op_type for n in fused.nodes]
    if name in VARIANTS:
        assert ops == ["Gemm", "Gelu"] and fused.nodes[1].domain == "com.microsoft"
        assert fused.nodes[1].inputs == ["h"] and fused.nodes[1].outputs == ["y"]
    else:
        assert "Gelu" not in ops and "Erf" in ops


@pytest.mark.parametrize("name", list(VARIANTS) + ["erf_read_twice"])
def test_training_through_a_fused_gelu_matches_torch_on_the_original_graph(name, tmp_path):
    torch = pytest.importorskip("torch")
    import torch_ref
    model = _model(VARIANTS.get(name) or KEPT[name])
    artifacts.generate_artifacts(model, requires_grad=["w", "b"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "training_model.onnx")).graph.node}
    assert ("GeluGrad" in ops) == (name in VARIANTS) and ("Erf" in ops) == (name not in VARIANTS)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state)
    rng = np.random.default_rng(1)
    x, target = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    loss = float(module(x, target))
    params = {p: numpy_helper.to_array(t) for t in model.graph.initializer for p in [t.name]}
    (y,), leaves = torch_ref.run(model, {"x": x}, params)
    want = torch.mean((y - torch.tensor(target, dtype=y.dtype)) ** 2)
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    for p, leaf in leaves.items():
        np.testing.assert_allclose(state.parameters[p].grad, leaf.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=p)
