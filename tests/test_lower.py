"""Lowering rewrites (``edgetrain.plan.lower``): each keeps the answer of onnxruntime on the original graph."""
import numpy as np
import pytest
from onnx import helper
from oracle import model, run_edgetrain, run_onnxruntime

from edgetrain.onnx_io import to_graph
from edgetrain.plan import make_plan
from edgetrain.session import bind_feeds


def _plan_ops(m, feeds):
    graph = to_graph(m)
    plan = make_plan(graph, bind_feeds(graph.inputs, feeds, "test"), [o.name for o in graph.outputs])
    return [(b.op.key[1], dict(b.node.attrs)) for step in plan.steps for b in step.nodes]


RNG = np.random.default_rng(0)
A = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
B = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
C = RNG.standard_normal((7, 6)).astype(np.float32)


@pytest.mark.arm64
@pytest.mark.parametrize("name, nodes, feeds, outputs, folds", [
    # attention's Q @ K^T: the transposed operand is read only by the GEMM
    ("matmul_b", [helper.make_node("Transpose", ["B"], ["Bt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", ["B", "Bt"], ["Y"])], {"B": B}, ["Y"], 1),
    # a gradient-style FusedMatMul already transposing that operand: the flags cancel
    ("fused_a", [helper.make_node("Transpose", ["A"], ["At"], perm=[0, 1, 3, 2]),
                 helper.make_node("FusedMatMul", ["At", "B"], ["Y"], domain="com.microsoft", transA=0, transB=0,
                                  alpha=0.5),
                 helper.make_node("FusedMatMul", ["B", "At"], ["Z"], domain="com.microsoft", transA=1, transB=1)],
     {"A": A, "B": B}, ["Y", "Z"], 1),
    # 2-D with the default perm (reverse: the same swap)
    ("default_perm", [helper.make_node("Transpose", ["C"], ["Ct"]),
                      helper.make_node("MatMul", ["B", "Ct"], ["Y"])], {"B": B, "C": C}, ["Y"], 1),
    # another reader, or a graph output, keeps the transpose
    ("other_reader", [helper.make_node("Transpose", ["B"], ["Bt"], perm=[0, 1, 3, 2]),
                      helper.make_node("MatMul", ["B", "Bt"], ["Y"]),
                      helper.make_node("Relu", ["Bt"], ["Z"])], {"B": B}, ["Y", "Z"], 0),
    ("is_output", [helper.make_node("Transpose", ["B"], ["Bt"], perm=[0, 1, 3, 2]),
                   helper.make_node("MatMul", ["B", "Bt"], ["Y"])], {"B": B}, ["Y", "Bt"], 0),
    # not a swap of the last two dims
    ("other_perm", [helper.make_node("Transpose", ["A"], ["At"], perm=[0, 2, 1, 3]),
                    helper.make_node("MatMul", ["At", "A"], ["Y"])],
     {"A": RNG.standard_normal((2, 4, 4, 4)).astype(np.float32)}, ["Y"], 0),
])
def test_transposes_read_only_by_gemms_fold_into_their_flags(name, nodes, feeds, outputs, folds):
    m = model(nodes, feeds, outputs, ms_opset=1 if any(n.domain for n in nodes) else None)
    ops = _plan_ops(m, feeds)
    assert sum(op == "Transpose" for op, _ in ops) == 1 - folds, ops
    ours = run_edgetrain(m, feeds)
    for got, want, out in zip(ours, run_onnxruntime(m, feeds), outputs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=out)
