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
    # not a swap of the last two dims, nor a strided view BLAS can read (the last dim moves first)
    ("other_perm", [helper.make_node("Transpose", ["A"], ["At"], perm=[3, 1, 0, 2]),
                    helper.make_node("MatMul", ["At", "A"], ["Y"])],
     {"A": RNG.standard_normal((4, 4, 4, 4)).astype(np.float32)}, ["Y"], 0),
])
def test_transposes_read_only_by_gemms_fold_into_their_flags(name, nodes, feeds, outputs, folds):
    m = model(nodes, feeds, outputs, ms_opset=1 if any(n.domain for n in nodes) else None)
    ops = _plan_ops(m, feeds)
    assert sum(op == "Transpose" for op, _ in ops) == 1 - folds, ops
    ours = run_edgetrain(m, feeds)
    for got, want, out in zip(ours, run_onnxruntime(m, feeds), outputs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=out)


def _fmm(inputs, output, **attrs):
    return helper.make_node("FusedMatMul", inputs, [output], domain="com.microsoft", **attrs)


def _t(x, y, perm=(0, 1, 3, 2)):
    return helper.make_node("Transpose", [x], [y], perm=list(perm))


D = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
X2, DY2 = RNG.standard_normal((9, 4)).astype(np.float32), RNG.standard_normal((9, 6)).astype(np.float32)


@pytest.mark.arm64
@pytest.mark.parametrize("name, nodes, feeds, outputs, transposes", [
    # torch Linear's weight gradient: Transpose(X^T dY)
    ("weight_grad", [_fmm(["X", "dY"], "G", transA=1), _t("G", "Y", (1, 0))], {"X": X2, "dY": DY2}, ["Y"], 0),
    ("matmul", [helper.make_node("MatMul", ["A", "D"], ["R"]), _t("R", "Y")], {"A": A, "D": D}, ["Y"], 0),
    *[(f"flags{ta}{tb}", [_fmm(["P", "Q"], "R", transA=ta, transB=tb, alpha=0.5), _t("R", "Y")],
       {"P": A.swapaxes(-1, -2).copy() if ta else A, "Q": D.swapaxes(-1, -2).copy() if tb else D}, ["Y"], 0)
      for ta in (0, 1) for tb in (0, 1)],
    # an operand's transpose folds too, then the result's
    ("both", [_t("D", "Dt"), helper.make_node("MatMul", ["A", "Dt"], ["R"]), _t("R", "Y")],
     {"A": A, "D": D.swapaxes(-1, -2).copy()}, ["Y"], 0),
    # kept: another reader of the result, the result an output, an N-D A times a 2-D B (one flattened GEMM)
    ("other_reader", [helper.make_node("MatMul", ["A", "D"], ["R"]), _t("R", "Y"),
                      helper.make_node("Relu", ["R"], ["Z"])], {"A": A, "D": D}, ["Y", "Z"], 1),
    ("is_output", [helper.make_node("MatMul", ["A", "D"], ["R"]), _t("R", "Y")], {"A": A, "D": D}, ["Y", "R"],
     1),
    ("flattened", [helper.make_node("MatMul", ["A", "C"], ["R"]), _t("R", "Y")],
     {"A": A, "C": RNG.standard_normal((4, 7)).astype(np.float32)}, ["Y"], 1),
    ("other_perm", [helper.make_node("MatMul", ["A", "D"], ["R"]), _t("R", "Y", (0, 3, 2, 1))],
     {"A": A, "D": D}, ["Y"], 1),
])
def test_transposed_gemm_results_fold_into_the_gemm(name, nodes, feeds, outputs, transposes):
    m = model(nodes, feeds, outputs, ms_opset=1 if any(n.domain for n in nodes) else None)
    ops = _plan_ops(m, feeds)
    assert sum(op == "Transpose" for op, _ in ops) == transposes, ops
    for got, want, out in zip(run_edgetrain(m, feeds), run_onnxruntime(m, feeds), outputs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=out)


NTHD = [RNG.standard_normal((2, 5, 3, 4)).astype(np.float32) for _ in range(3)]


@pytest.mark.arm64
@pytest.mark.parametrize("name, nodes, outputs, transposes", [
    # attention: heads split (0, 2, 1, 3) and (0, 2, 3, 1) into the GEMMs, merged back (0, 2, 1, 3) out of one
    ("attention", [_t("Q", "q", (0, 2, 1, 3)), _t("K", "kt", (0, 2, 3, 1)), _t("V", "v", (0, 2, 1, 3)),
                   helper.make_node("MatMul", ["q", "kt"], ["S"]),
                   helper.make_node("MatMul", ["S", "v"], ["O"]), _t("O", "Y", (0, 2, 1, 3))], ["Y", "S"], 0),
    # gradient-style: flags and alpha composed with the views, and a result written through (0, 3, 1, 2)
    ("flags", [_t("Q", "q", (0, 2, 1, 3)), _t("V", "v", (0, 2, 1, 3)),
               _fmm(["q", "v"], "S", transB=1, alpha=0.5), _fmm(["S", "v"], "R", transA=1),
               _fmm(["q", "S"], "G", transA=1), _t("G", "Y", (0, 3, 1, 2))], ["Y", "R"], 0),
    # kept: the data's last dim moved out of the last two, another reader, a 2-D operand (one flattened GEMM)
    ("last_dim_moved", [_t("Q", "q", (3, 1, 2, 0)), _t("K", "k", (3, 1, 0, 2)),
                        helper.make_node("MatMul", ["q", "k"], ["Y"])], ["Y"], 2),
    ("other_reader", [_t("Q", "q", (0, 2, 1, 3)), _t("K", "kt", (0, 2, 3, 1)),
                      helper.make_node("MatMul", ["q", "kt"], ["Y"]), helper.make_node("Relu", ["q"], ["Z"])],
     ["Y", "Z"], 1),
    ("flattened", [_t("Q", "q", (0, 2, 1, 3)), helper.make_node("MatMul", ["q", "W"], ["Y"])], ["Y"], 1),
])
def test_head_transposes_become_strided_gemm_operands(name, nodes, outputs, transposes):
    feeds = dict(zip("QKV", NTHD), W=RNG.standard_normal((4, 6)).astype(np.float32))
    used = {i for n in nodes for i in n.input}
    feeds = {k: v for k, v in feeds.items() if k in used}
    m = model(nodes, feeds, outputs, ms_opset=1 if any(n.domain for n in nodes) else None)
    ops = _plan_ops(m, feeds)
    assert sum(op == "Transpose" for op, _ in ops) == transposes, ops
    for got, want, out in zip(run_edgetrain(m, feeds), run_onnxruntime(m, feeds), outputs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=out)


def _steps(m, feeds):
    graph = to_graph(m)
    plan = make_plan(graph, bind_feeds(graph.inputs, feeds, "test"), [o.name for o in graph.outputs])
    return [step.label for step in plan.steps]


@pytest.mark.arm64
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (4, 3), (2, 3, 7)])
def test_inference_batch_norm_fuses_with_its_activation(shape):
    """Conv's bias, inference BatchNormalization and ReLU6 become one pass; statistics far from 0 and 1 (a
    large mean, a small variance) and a negative scale keep each term of (X - mean) * a + B honest."""
    c = shape[1]
    feeds = {"X": RNG.standard_normal(shape).astype(np.float32) * 0.1 + 3.0,
             "scale": np.array([1.5, -0.5, 2.0], np.float32), "B": np.array([0.2, 6.5, -0.1], np.float32),
             "mean": np.full(c, 3.0, np.float32) + RNG.standard_normal(c).astype(np.float32) * 0.05,
             "var": np.array([0.01, 0.02, 0.005], np.float32)}
    lo, hi = np.array(0.0, np.float32), np.array(6.0, np.float32)
    nodes = [helper.make_node("Add", ["X", "X"], ["X2"]),
             helper.make_node("BatchNormalization", ["X2", "scale", "B", "mean", "var"], ["Y"], epsilon=1e-3),
             helper.make_node("Clip", ["Y", "lo", "hi"], ["Z"])]
    m = model(nodes, feeds, ["Z"], initializers={"lo": lo, "hi": hi})
    steps = _steps(m, feeds)
    assert not any("BatchNormalization" in s for s in steps), steps
    assert any(s.startswith("fused:") and s.endswith("Sub+Mul+Add+Clip") for s in steps), steps
    np.testing.assert_allclose(run_edgetrain(m, feeds)[0], run_onnxruntime(m, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.arm64
def test_pow_by_two_or_one_becomes_mul_or_a_view():
    """Pow by a constant 2 is Mul(X, X), by 1 a view of X (the MSE loss and its gradient 2 * Pow(d, 1)); other
    exponents, and one fed at run time, stay Pow. Special values included: the same numbers as onnxruntime."""
    x = np.concatenate([RNG.standard_normal(20).astype(np.float32) * 3,
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e20, -1e-30], np.float32)])
    feeds = {"X": x, "E": np.array(2.0, np.float32)}
    consts = {"two": np.array(2.0, np.float32), "one": np.array([1.0], np.float32),
              "three": np.array(3.0, np.float32), "two_int": np.array(2, np.int64)}
    nodes = [helper.make_node("Pow", ["X", e], [f"Y_{e}"]) for e in ("two", "one", "three", "two_int", "E")]
    outputs = [n.output[0] for n in nodes]
    m = model(nodes, feeds, outputs, initializers=consts)
    ops = [op for op, _ in _plan_ops(m, feeds)]
    assert ops.count("Pow") == 2 and ops.count("Mul") == 2, ops
    for got, want, out in zip(run_edgetrain(m, feeds), run_onnxruntime(m, feeds), outputs):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=out)
