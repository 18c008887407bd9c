"""MatMul, Gemm (lowered to FusedMatMul + Add) and com.microsoft FusedMatMul (numpy oracle)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime

import edgetrain
from edgetrain.errors import ShapeError
from edgetrain.ops import matmul

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")


def rand(shape, dtype=np.float32, key=None):
    rng = np.random.default_rng(zlib.crc32(repr(("mm", shape, str(np.dtype(dtype)), key)).encode()))
    if np.dtype(dtype).kind == "i":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def test_every_matmul_op_is_covered():
    assert {op.op_type for op in matmul.OPS} <= {"MatMul", "Gemm", "FusedMatMul", "Det", "DetGrad",
                                                 "PermutedMatMul"}


# --- MatMul ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sa, sb", [
    ((4,), (4,)), ((4,), (4, 3)), ((3, 4), (4,)), ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,)),
    ((2, 1, 3, 4), (5, 4, 6)), ((1, 3, 4), (2, 4, 2)), ((3, 0), (0, 2)),
])
def test_matmul_shapes(sa, sb):
    a, b = rand(sa, key="a"), rand(sb, key="b")
    m = model(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": a, "b": b}, ["y"])
    assert_matches(m, {"a": a, "b": b}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_matmul_dtypes(dtype):
    a, b = rand((2, 3, 4), dtype, "a"), rand((4, 5), dtype, "b")
    m = model(helper.make_node("MatMul", ["a", "b"], ["y"]), {"a": a, "b": b}, ["y"])
    assert_matches(m, {"a": a, "b": b})


def test_matmul_constant_weight_and_folded():
    a, w = rand((3, 4), key="a"), rand((4, 2), key="w")
    node = helper.make_node("MatMul", ["a", "w"], ["y"])
    assert_matches(model(node, {"a": a}, ["y"], initializers={"w": w}), {"a": a}, rtol=1e-5, atol=1e-5)
    folded = model(node, {}, ["y"], initializers={"a": a, "w": w})
    assert edgetrain.InferenceSession(folded.SerializeToString()).program({}).plan.n_kernels == 0
    assert_matches(folded, {}, rtol=1e-5, atol=1e-5)


def test_matmul_epilogue_fuses():
    """MatMul -> Add(bias) -> Relu: one matmul kernel plus one fused loop, in place over the accumulator."""
    x, w, b = rand((5, 4), key="x"), rand((4, 3), key="w"), rand((3,), key="b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    m = model(nodes, {"x": x}, ["y"], initializers={"w": w, "b": b})
    plan = edgetrain.InferenceSession(m.SerializeToString()).program({"x": x}).plan
    assert plan.n_kernels == 2
    assert_matches(m, {"x": x}, rtol=1e-5, atol=1e-6)


# --- Gemm --------------------------------------------------------------------------------------------------

M, K, N = 3, 4, 5


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [(N,), (M, 1), (), (M, N), (1, N), None])
def test_gemm(trans_a, trans_b, c_shape):
    a = rand((K, M) if trans_a else (M, K), key="a")
    b = rand((N, K) if trans_b else (K, N), key="b")
    feeds = {"a": a, "b": b}
    inputs = ["a", "b"]
    if c_shape is not None:
        feeds["c"] = rand(c_shape, key="c")
        inputs.append("c")
    node = helper.make_node("Gemm", inputs, ["y"], transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)
    assert_matches(model(node, feeds, ["y"]), feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (-1.5, 0.0), (1.0, 0.25), (2.0, 1.0)])
def test_gemm_alpha_beta_constant_weights(alpha, beta):
    """The usual Linear layer: B and C initializers, A fed; and everything constant (folded with numpy)."""
    a, b, c = rand((M, K), key="a"), rand((N, K), key="b"), rand((N,), key="c")
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=alpha, beta=beta)
    m = model(node, {"a": a}, ["y"], initializers={"b": b, "c": c})
    assert_matches(m, {"a": a}, rtol=1e-5, atol=1e-5)
    folded = model(node, {}, ["y"], initializers={"a": a, "b": b, "c": c})
    assert_matches(folded, {}, rtol=1e-5, atol=1e-5)


def test_gemm_float64_then_relu():
    a, b, c = rand((M, K), np.float64, "a"), rand((K, N), np.float64, "b"), rand((M, 1), np.float64, "c")
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], beta=0.5),
             helper.make_node("Relu", ["g"], ["y"])]
    feeds = {"a": a, "b": b, "c": c}
    assert_matches(model(nodes, feeds, ["y", "g"]), feeds, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("env", ["EDGETRAIN_NO_FUSION", "EDGETRAIN_NO_PLANNER"])
def test_gemm_switches(monkeypatch, env):
    a, b, c = rand((M, K), key="a"), rand((K, N), key="b"), rand((N,), key="c")
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], alpha=0.5, beta=3.0),
             helper.make_node("Sigmoid", ["g"], ["y"])]
    m = model(nodes, {"a": a}, ["y"], initializers={"b": b, "c": c})
    base = run_edgetrain(m, {"a": a})[0]
    monkeypatch.setenv(env, "1")
    np.testing.assert_array_equal(run_edgetrain(m, {"a": a})[0], base)
    assert_matches(m, {"a": a}, rtol=1e-5, atol=1e-6)


# --- com.microsoft FusedMatMul (numpy oracle) --------------------------------------------------------------

def fused_oracle(a, b, trans_a, trans_b, alpha):
    if trans_a and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if trans_b and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    return (alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))).astype(a.dtype)


@pytest.mark.parametrize("sa, sb, trans_a, trans_b", [
    ((3, 4), (4, 5), 0, 0), ((4, 3), (4, 5), 1, 0), ((3, 4), (5, 4), 0, 1), ((4, 3), (5, 4), 1, 1),
    ((2, 4, 3), (5, 4), 1, 1), ((2, 3, 4), (2, 5, 4), 0, 1), ((4,), (5, 4), 0, 1), ((4, 3), (4,), 1, 1),
])
@pytest.mark.parametrize("alpha", [1.0, 0.125])
def test_fused_matmul(sa, sb, trans_a, trans_b, alpha):
    a, b = rand(sa, key="a"), rand(sb, key="b")
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=trans_a,
                            transB=trans_b, alpha=alpha)
    for m, feeds in ((model(node, {"a": a, "b": b}, ["y"]), {"a": a, "b": b}),
                     (model(node, {}, ["y"], initializers={"a": a, "b": b}), {})):
        ours = run_edgetrain(m, feeds)[0]
        want = fused_oracle(a, b, trans_a, trans_b, alpha)
        assert ours.shape == want.shape and ours.dtype == want.dtype
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["loop", "blas"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n, trans_a, trans_b", [
    (32, 64, 32, 0, 1), (32, 32, 10, 0, 1), (32, 10, 32, 0, 0), (10, 32, 32, 1, 0), (7, 5, 3, 0, 1),
    (5, 9, 6, 1, 0), (6, 1, 7, 0, 0), (3, 0, 4, 0, 1), (5, 3, 2, 1, 1), (2, 3, 4, 0, 0),
])
def test_small_gemm_loops_and_blas(monkeypatch, path, dtype, m, k, n, trans_a, trans_b):
    """Tiny GEMMs run as Numba loops (kernels.matmul.SMALL_GEMM, SMALL_AXPY), the others through BLAS: both
    against numpy in float64, each layout (transA/transB), and the loop taken where it should be (both
    transposed: BLAS; an empty K: the loop writes the zeros)."""
    from edgetrain.kernels import matmul as kernels

    threshold = 1 << 16 if path == "loop" else 0
    monkeypatch.setattr(kernels, "SMALL_GEMM", threshold)
    monkeypatch.setattr(kernels, "SMALL_AXPY", threshold)
    a = rand((k, m) if trans_a else (m, k), dtype, "a")
    b = rand((n, k) if trans_b else (k, n), dtype, "b")
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=trans_a,
                            transB=trans_b)
    sess = edgetrain.InferenceSession(model(node, {"a": a, "b": b}, ["y"]).SerializeToString())
    ours = sess.run(None, {"a": a, "b": b})[0]
    np.testing.assert_allclose(ours, fused_oracle(a, b, trans_a, trans_b, 1.0), rtol=1e-5, atol=1e-5)
    fn = sess.program({"a": a, "b": b}).calls[0][0]
    assert (fn is not np.matmul) == (m * n * k <= threshold and not (trans_a and trans_b))


@pytest.mark.parametrize("path", ["loop", "blas"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("m, k, n, trans_b, bias_shape", [
    (32, 64, 32, 1, (32,)), (32, 32, 10, 1, (1, 10)), (7, 5, 6, 1, (6,)), (6, 9, 5, 0, (5,))])
def test_gemm_bias_relu_epilogue(monkeypatch, path, dtype, relu, m, k, n, trans_b, bias_shape):
    """Gemm (+ Relu) runs as one kernel step, its bias (and ReLU) added as the GEMM stores (plan.fusion's
    EPILOGUES): the same bits as the unfolded steps (EDGETRAIN_NO_FUSION), onnxruntime's numbers, and the
    small-GEMM loop kept where it ran before (its own epilogue; else BLAS or the other loops, then a bias loop)."""
    from edgetrain.kernels import matmul as kernels

    monkeypatch.setattr(kernels, "SMALL_GEMM", 1 << 16 if path == "loop" else 0)
    a, b = rand((m, k), dtype, "a"), rand((n, k) if trans_b else (k, n), dtype, "b")
    c = rand(bias_shape, dtype, "c")
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g" if relu else "y"], transB=trans_b)]
    nodes += [helper.make_node("Relu", ["g"], ["y"])] if relu else []
    m_ = model(nodes, {"a": a}, ["y"], initializers={"b": b, "c": c})
    sess = edgetrain.InferenceSession(m_.SerializeToString())
    prog = sess.program({"a": a})
    assert [s.label for s in prog.plan.steps] == ["kernel:FusedMatMul+Add" + ("+Relu" if relu else "")]
    if trans_b:
        assert (prog.calls[0][0] is kernels._gemm_nt_bias) == (path == "loop")
    ours = sess.run(None, {"a": a})[0].copy()
    assert relu is False or (ours == 0).any()
    monkeypatch.setenv("EDGETRAIN_NO_FUSION", "1")
    unfolded = edgetrain.InferenceSession(m_.SerializeToString())
    assert len(unfolded.program({"a": a}).plan.steps) == 2 + relu
    np.testing.assert_array_equal(ours, unfolded.run(None, {"a": a})[0])
    want = run_onnxruntime(m_, {"a": a})[0]
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_gemm_epilogue_not_folded_when_the_sum_is_read_elsewhere():
    """The GEMM's result read by another node too (Gemm's output a graph output): two steps, both outputs right."""
    a, b, c = rand((4, 3), key="a"), rand((5, 3), key="b"), rand((5,), key="c")
    nodes = [helper.make_node("Gemm", ["a", "b"], ["p"], transB=1), helper.make_node("Add", ["p", "c"], ["y"])]
    m_ = model(nodes, {"a": a}, ["y", "p"], initializers={"b": b, "c": c})
    sess = edgetrain.InferenceSession(m_.SerializeToString())
    assert [s.label for s in sess.program({"a": a}).plan.steps] == ["kernel:FusedMatMul", "fused:Add"]
    assert_matches(m_, {"a": a}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["loop", "blas"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k, m, n", [(32, 10, 32), (7, 2, 5), (5, 6, 3)])
def test_gemm_column_sums_sibling(monkeypatch, path, dtype, k, m, n):
    """A ReduceSum over the rows of a GEMM's transposed first operand (a Gemm's bias and weight gradients) runs
    in the GEMM's call (plan.fusion's SIBLINGS): the same bits as the two steps apart, onnxruntime's numbers."""
    from edgetrain.kernels import matmul as kernels

    monkeypatch.setattr(kernels, "SMALL_AXPY", 1 << 16 if path == "loop" else 0)
    x, b = rand((k, m), dtype, "x"), rand((k, n), dtype, "b")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("FusedMatMul", ["x", "b"], ["y"], domain="com.microsoft", transA=1)]
    m_ = model(nodes, {"x": x}, ["y", "s"], initializers={"b": b, "axes": np.array([0], np.int64)})
    sess = edgetrain.InferenceSession(m_.SerializeToString())
    prog = sess.program({"x": x})
    assert [s.label for s in prog.plan.steps] == ["kernel:FusedMatMul+ReduceSum"]
    assert (prog.calls[0][0] is kernels._gemm_tn_sums) == (path == "loop")
    ours = [o.copy() for o in sess.run(None, {"x": x})]
    monkeypatch.setenv("EDGETRAIN_NO_FUSION", "1")
    apart = edgetrain.InferenceSession(m_.SerializeToString()).run(None, {"x": x})
    for got, want in zip(ours, apart):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(ours, run_onnxruntime(m_, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, axis", [((4, 3), 1), ((9, 1), 0)])
def test_column_sums_not_folded_over_another_axis_or_one_column(shape, axis):
    """Over columns: not the GEMM's sums; one column: the ReduceSum kernel adds it in partial sums."""
    x, b = rand(shape, key="x"), rand((shape[0], 5), key="b")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("FusedMatMul", ["x", "b"], ["y"], domain="com.microsoft", transA=1)]
    m_ = model(nodes, {"x": x}, ["y", "s"], initializers={"b": b, "axes": np.array([axis], np.int64)})
    prog = edgetrain.InferenceSession(m_.SerializeToString()).program({"x": x})
    assert [s.label for s in prog.plan.steps] == ["kernel:ReduceSum", "kernel:FusedMatMul"]
    assert_matches(m_, {"x": x}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


def _permuted_model(pa, pb, py, alpha, feeds):
    node = helper.make_node("PermutedMatMul", ["a", "b"], ["y"], name="pmm", domain="ai.edgetrain", permA=pa,
                            permB=pb, permY=py, alpha=alpha)
    inputs = [helper.make_tensor_value_info(k, 1, v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "t", inputs, [helper.make_empty_tensor_value_info("y")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.edgetrain", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("pa, pb, py, alpha", [
    ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3), 1.0), ((0, 2, 3, 1), (0, 2, 1, 3), (0, 3, 1, 2), 0.5),
    ((0, 1, 2, 3), (0, 1, 3, 2), (0, 1, 2, 3), 2.0)])
def test_permuted_matmul_against_onnxruntime_transposes(pa, pb, py, alpha):
    """The planner's PermutedMatMul (strided views into BLAS) against onnxruntime running the Transposes,
    MatMul and scale it stands for."""
    from oracle import run_onnxruntime
    shape = (2, 5, 3, 4)
    a, b = rand(shape, key="pa"), rand(shape, key="pb")
    ta, tb = a.transpose(pa), b.transpose(pb)
    if ta.shape[-1] != tb.shape[-2]:
        b = rand((2, 5, 4, 3), key="pb")
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=list(pa)),
             helper.make_node("Transpose", ["b"], ["bt"], perm=list(pb)),
             helper.make_node("MatMul", ["at", "bt"], ["r"]), helper.make_node("Mul", ["r", "alpha"], ["s"]),
             helper.make_node("Transpose", ["s"], ["y"], perm=list(py))]
    want = run_onnxruntime(model(nodes, {"a": a, "b": b}, ["y"], initializers={"alpha": np.float32(alpha)}),
                           {"a": a, "b": b})[0]
    m = _permuted_model(pa, pb, py, alpha, {"a": a, "b": b})
    ours = edgetrain.InferenceSession(m.SerializeToString()).run(None, {"a": a, "b": b})[0]
    assert ours.shape == want.shape
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_permuted_matmul_refuses_a_perm_of_the_wrong_rank():
    feeds = {"a": rand((2, 3, 4)), "b": rand((2, 4, 5))}
    with pytest.raises(ShapeError, match="pmm.*permA"):
        m = _permuted_model((1, 0), (0, 1, 2), (0, 1, 2), 1.0, feeds)
        edgetrain.InferenceSession(m.SerializeToString()).program(feeds)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("node, shapes", [
    (helper.make_node("MatMul", ["a", "b"], ["y"]), ((37, 19), (19, 23))),
    (helper.make_node("MatMul", ["a", "b"], ["y"]), ((3, 13, 19), (19, 23))),      # flattened to one GEMM
    (helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=1, transB=1,
                      alpha=0.5), ((19, 37), (23, 19))),
    (helper.make_node("MatMul", ["a", "b"], ["y"]), ((11, 19), (19, 41))),          # wide: column blocks
    (helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=1, transB=1,
                      alpha=0.5), ((19, 9), (40, 19))),
])
def test_gemms_split_into_row_or_column_blocks_across_threads(monkeypatch, threads, node, shapes):
    """With EDGETRAIN_NUM_THREADS > 1 a large GEMM runs as blocks along its output's longer dim that the caller
    and helper threads claim (kernels/_gemm_threads.py); against onnxruntime, with every GEMM counted as large."""
    from oracle import run_onnxruntime

    from edgetrain import config
    from edgetrain.kernels import _gemm_threads
    monkeypatch.setattr(config, "num_threads", lambda: threads)
    monkeypatch.setattr(_gemm_threads, "MIN_FLOPS", 0)
    monkeypatch.setattr(_gemm_threads, "MIN_ROWS", 1)
    feeds = {"a": rand(shapes[0], key="ta"), "b": rand(shapes[1], key="tb")}
    m = model(node, feeds, ["y"])
    sess = edgetrain.InferenceSession(m.SerializeToString())
    fn, args = sess.program(feeds).calls[0]
    assert len(args[0]) == threads * _gemm_threads.BLOCKS_PER_THREAD      # the pool's run over the blocks
    for _ in range(3):
        want = run_onnxruntime(m, feeds)[0]
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


# --- shape-rule errors -------------------------------------------------------------------------------------

def _plan_error(node, feeds):
    m = model(node, feeds, list(node.output))
    with pytest.raises(ShapeError, match=node.name):
        edgetrain.InferenceSession(m.SerializeToString()).program(feeds)


def test_matmul_inner_mismatch():
    _plan_error(helper.make_node("MatMul", ["a", "b"], ["y"], name="mm"),
                {"a": rand((3, 4)), "b": rand((5, 2))})


def test_matmul_batch_mismatch():
    _plan_error(helper.make_node("MatMul", ["a", "b"], ["y"], name="mmb"),
                {"a": rand((2, 3, 4)), "b": rand((3, 4, 2))})


def test_matmul_scalar_operand():
    _plan_error(helper.make_node("MatMul", ["a", "b"], ["y"], name="mms"), {"a": rand(()), "b": rand((3,))})


def test_gemm_errors():
    _plan_error(helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gc"),
                {"a": rand((3, 4)), "b": rand((4, 5)), "c": rand((3, 2))})
    _plan_error(helper.make_node("Gemm", ["a", "b"], ["y"], name="gk", transA=1),
                {"a": rand((3, 4)), "b": rand((4, 5))})
    _plan_error(helper.make_node("Gemm", ["a", "b"], ["y"], name="g3"),
                {"a": rand((2, 3, 4)), "b": rand((4, 5))})


def test_fused_matmul_trans_batch_rejected():
    _plan_error(helper.make_node("FusedMatMul", ["a", "b"], ["y"], name="fb", domain="com.microsoft",
                                 transBatchA=1), {"a": rand((2, 3, 4)), "b": rand((4, 5))})


# --- Det --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1), (2, 3, 2, 2)])
def test_det_against_onnxruntime(shape):
    from oracle import run_onnxruntime
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    m = model(helper.make_node("Det", ["x"], ["y"]), {"x": x}, ["y"], opset=11)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


def test_det_gradient_by_finite_differences_also_where_singular():
    """det is linear in each entry, so central differences are exact up to rounding: an oracle that also holds
    at a singular X, where the gradient is the (non-zero) adjugate and X^-1 does not exist (torch 2.13 returns
    zeros there)."""
    from gradcheck import check_gradients

    from edgetrain.ir import Node, TensorType
    x = np.random.default_rng(0).standard_normal((2, 3, 3))
    check_gradients([Node("Det", ["x"], ["y"], {}, "det")], {"x": x}, ["y"], [TensorType(np.float64, (2,))], opset=11)
    x[1, 2] = x[1, 0] + x[1, 1]
    check_gradients([Node("Det", ["x"], ["y"], {}, "det")], {"x": x}, ["y"], [TensorType(np.float64, (2,))], opset=11,
                    samples=18)
