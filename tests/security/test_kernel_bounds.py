"""Issue 11, item 2: every index a kernel reads from tensor data is checked, and a bad one is refused.

A hostile model (or a bad feed) can put any integer where a kernel expects an index: labels of
SoftmaxCrossEntropyLoss(Grad), Gather/GatherGrad indices, the Indices that MaxPoolGrad scatters to. Each
kernel checks every index in the loop that reads it, before using it, and its launcher raises InputError
naming the node, the input's tensor, the value and its position. Sizes that are known when planning (a
class-weights input shorter than the class count, a dY of the wrong shape) are refused then, as ShapeErrors.
Numbers are compared with onnxruntime / the ONNX reference / the spec's numpy formula.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper
from oracle import model, run_edgetrain, run_onnxruntime, run_reference

from edgetrain.errors import InputError, ShapeError

MS = "com.microsoft"
# in range of the index type and out of range of the array; 2**40 used to segfault
HOSTILE = [3, -1, 2**31 - 1, -2**31, 2**40, -2**40, 2**63 - 1, -2**63]
# (value, index type) pairs: each value in every index type that can hold it
HOSTILE_TYPED = [(v, t) for t in (np.int64, np.int32) for v in HOSTILE if np.iinfo(t).min <= v <= np.iinfo(t).max]


# --- SoftmaxCrossEntropyLoss and its gradient: labels --------------------------------------------------------

C = 3   # classes


def _sce_grad_feeds(reduction: str, weights: bool, label_dtype=np.int64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    log_prob = np.log(rng.dirichlet(np.ones(C), size=(2, 4)).transpose(0, 2, 1)).astype(np.float32)  # [2, C, 4]
    feeds = {"dy": rng.standard_normal((2, 4) if reduction == "none" else ()).astype(np.float32),
             "log_prob": log_prob, "labels": rng.integers(0, C, (2, 4)).astype(label_dtype)}
    if weights:
        feeds["w"] = rng.uniform(0.5, 2.0, C).astype(np.float32)
    return feeds


def _sce_grad_model(feeds, reduction: str, **attrs):
    inputs = ["dy", "log_prob", "labels"] + (["w"] if "w" in feeds else [])
    node = helper.make_node("SoftmaxCrossEntropyLossGrad", inputs, ["dx"], name="sce_grad", domain=MS,
                            reduction=reduction, **attrs)
    return model(node, feeds, ["dx"])


def _sce_grad_naive(feeds, reduction: str, ignore_index=None) -> np.ndarray:
    """dX[i, k, d] = (exp(log_prob[i, k, d]) - [k == label]) * w[label] * dY (/ sum of w over the non-ignored
    labels for mean); 0 where the label is ignore_index (onnxruntime's SoftmaxCrossEntropyLossGrad)."""
    lp, labels, dy = feeds["log_prob"].astype(np.float64), feeds["labels"], feeds["dy"].astype(np.float64)
    w_all = feeds["w"].astype(np.float64) if "w" in feeds else np.ones(C)
    dx = np.zeros_like(lp)
    kept = labels != ignore_index if ignore_index is not None else np.ones(labels.shape, bool)
    wsum = sum(w_all[labels[i, d]] for i, d in zip(*np.nonzero(kept)))
    for i, d in zip(*np.nonzero(kept)):
        w = w_all[labels[i, d]] * (dy[i, d] if reduction == "none" else dy)
        w = w / wsum if reduction == "mean" else w
        dx[i, :, d] = (np.exp(lp[i, :, d]) - (np.arange(C) == labels[i, d])) * w
    return dx


@pytest.mark.parametrize("bad, label_dtype", HOSTILE_TYPED)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weights", [False, True])
def test_sce_grad_refuses_a_label_out_of_range(bad, label_dtype, reduction, weights):
    feeds = _sce_grad_feeds(reduction, weights, label_dtype)
    feeds["labels"][1, 2] = bad
    with pytest.raises(InputError, match=rf"'sce_grad'.*input 2 \('labels'\) holds {bad} at \[1, 2\].*\[0, {C}\)"):
        run_edgetrain(_sce_grad_model(feeds, reduction), feeds)


@pytest.mark.arm64
def test_the_issues_segfault_is_an_input_error():
    """Label 2**40 with a weights input: it indexed weights (and log_prob) 8 TB past the array."""
    feeds = _sce_grad_feeds("sum", weights=True)
    feeds["labels"][0, 0] = 2**40
    with pytest.raises(InputError, match=r"'sce_grad'.*'labels'\) holds 1099511627776 at \[0, 0\]"):
        run_edgetrain(_sce_grad_model(feeds, "sum"), feeds)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_sce_grad_with_ignore_index_out_of_range_matches_the_formula(reduction):
    """ignore_index may be any integer: labels equal to it are skipped, never used as an index."""
    feeds = _sce_grad_feeds(reduction, weights=True)
    feeds["labels"][0, 1] = feeds["labels"][1, 3] = 2**40
    ours = run_edgetrain(_sce_grad_model(feeds, reduction, ignore_index=2**40), feeds)[0]
    np.testing.assert_allclose(ours, _sce_grad_naive(feeds, reduction, ignore_index=2**40), rtol=1e-5, atol=1e-6)
    assert not ours[0, :, 1].any() and not ours[1, :, 3].any()


@pytest.mark.arm64
@pytest.mark.parametrize("length", [C - 1, 1, C + 1])
def test_sce_grad_weights_not_one_per_class_are_refused_when_planning(length):
    """The issue's case: label 2 with a 2-element weights input read weights[2]. The length is known when
    planning, so the plan is refused before any kernel runs."""
    feeds = _sce_grad_feeds("mean", weights=True)
    feeds["w"] = np.ones(length, np.float32)
    with pytest.raises(ShapeError, match=rf"'sce_grad'.*weights must be float\[{C}\].*got float\[{length}\]"):
        run_edgetrain(_sce_grad_model(feeds, "mean"), feeds)


@pytest.mark.parametrize("reduction, dy_shape", [("none", (2,)), ("none", ()), ("none", (2, 3)),
                                                 ("mean", (2, 4)), ("sum", (0,))])
def test_sce_grad_dy_not_the_loss_shape_is_refused_when_planning(reduction, dy_shape):
    """dY is indexed per label (reduction none) or read once: a shorter one would be read past its end."""
    feeds = _sce_grad_feeds(reduction, weights=False)
    feeds["dy"] = np.ones(dy_shape, np.float32)
    with pytest.raises(ShapeError, match="'sce_grad'.*dY must be the gradient"):
        run_edgetrain(_sce_grad_model(feeds, reduction), feeds)


def _sce_model(feeds, **attrs):
    inputs = ["x", "labels"] + (["w"] if "w" in feeds else [])
    node = helper.make_node("SoftmaxCrossEntropyLoss", inputs, ["loss", "log_prob"], name="sce", **attrs)
    return model(node, feeds, ["loss", "log_prob"], opset=13)


def _sce_feeds(weights: bool, label_dtype=np.int64):
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, C, 4)).astype(np.float32),
             "labels": rng.integers(0, C, (2, 4)).astype(label_dtype)}
    if weights:
        feeds["w"] = rng.uniform(0.5, 2.0, C).astype(np.float32)
    return feeds


@pytest.mark.parametrize("bad", HOSTILE)
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("ignore_index", [None, -100])
def test_sce_refuses_a_label_out_of_range(bad, weights, ignore_index):
    feeds = _sce_feeds(weights)
    feeds["labels"][1, 3] = bad
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    with pytest.raises(InputError, match=rf"'sce'.*input 1 \('labels'\) holds {bad} at \[1, 3\].*\[0, {C}\)"):
        run_edgetrain(_sce_model(feeds, **attrs), feeds)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_sce_with_ignore_index_out_of_range_matches_onnx(reduction):
    feeds = _sce_feeds(weights=True)
    feeds["labels"][0, 0] = 2**40
    m = _sce_model(feeds, ignore_index=2**40, reduction=reduction)
    ours = run_edgetrain(m, feeds)
    for oracle in (run_reference, run_onnxruntime):
        for a, b in zip(ours, oracle(m, feeds)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- Gather and GatherGrad: indices ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad, index_dtype", [(v, t) for v, t in HOSTILE_TYPED + [(-4, np.int64)] if v != -1])
@pytest.mark.parametrize("axis", [0, 1])
def test_gather_refuses_an_index_out_of_range(bad, index_dtype, axis):
    """data has 3 entries along the axis: -1 is in range (counted from the end), -4 is not."""
    data = np.arange(18, dtype=np.float32).reshape(3, 3, 2)
    idx = np.array([[0, 2], [-3, 1]], index_dtype)
    idx[1, 0] = bad
    node = helper.make_node("Gather", ["data", "idx"], ["y"], name="gather", axis=axis)
    with pytest.raises(InputError, match=rf"'gather'.*input 1 \('idx'\) holds {bad} at \[1, 0\].*\[-3, 3\)"):
        run_edgetrain(model(node, {"data": data, "idx": idx}, ["y"]), {"data": data, "idx": idx})


@pytest.mark.arm64
@pytest.mark.parametrize("axis", [0, 1])
def test_gather_with_negative_indices_matches_onnx(axis):
    """The check keeps the spec's negative indices (counted from the end)."""
    data = np.arange(18, dtype=np.float32).reshape(3, 3, 2)
    idx = np.array([[0, -1], [-3, 2]], np.int64)
    node = helper.make_node("Gather", ["data", "idx"], ["y"], axis=axis)
    m = model(node, {"data": data, "idx": idx}, ["y"])
    np.testing.assert_array_equal(run_edgetrain(m, {"data": data, "idx": idx})[0],
                                  run_reference(m, {"data": data, "idx": idx})[0])


def _gather_grad_model(feeds, shape, axis):
    node = helper.make_node("GatherGrad", ["shape", "idx", "dy"], ["dx"], name="gather_grad", domain=MS, axis=axis)
    return model(node, feeds, ["dx"], initializers={"shape": np.array(shape, np.int64)})


@pytest.mark.parametrize("bad", [v for v in HOSTILE if v != -1] + [-4])
@pytest.mark.parametrize("axis", [0, 1])
def test_gather_grad_refuses_an_index_out_of_range(bad, axis):
    shape = (3, 3, 2)
    idx = np.array([1, bad, 0], np.int64)
    dy_shape = shape[:axis] + idx.shape + shape[axis + 1:]
    feeds = {"idx": idx, "dy": np.ones(dy_shape, np.float32)}
    with pytest.raises(InputError, match=rf"'gather_grad'.*input 1 \('idx'\) holds {bad} at \[1\].*\[-3, 3\)"):
        run_edgetrain(_gather_grad_model(feeds, shape, axis), feeds)


@pytest.mark.arm64
def test_gather_grad_accumulates_repeated_and_negative_indices():
    """dX = 0, then dX[idx[k]] += dY[k] (np.add.at, the spec's formula), idx counted from the end when < 0."""
    rng = np.random.default_rng(2)
    idx = np.array([[2, -1], [0, -3]], np.int64)
    dy = rng.standard_normal((3, 2, 2, 2)).astype(np.float32)   # data [3, 3, 2] gathered on axis 1
    feeds = {"idx": idx, "dy": dy}
    want = np.zeros((3, 3, 2), np.float32)
    np.add.at(want, (slice(None), idx % 3), dy)
    np.testing.assert_allclose(run_edgetrain(_gather_grad_model(feeds, (3, 3, 2), 1), feeds)[0], want, rtol=1e-6)


# --- MaxPoolGrad: Indices wired from anywhere ------------------------------------------------------------------

@pytest.mark.parametrize("bad", [16, -2, 2**31, 2**40, -2**40, 2**63 - 1, -2**63])
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_grad_refuses_an_index_out_of_range(bad, storage_order):
    """A training model may wire any int64 tensor to MaxPoolGrad's Indices: dX has 16 elements here."""
    dy = np.ones((1, 1, 2, 2), np.float32)
    idx = np.array([0, 3, 9, 15], np.int64).reshape(1, 1, 2, 2)
    idx[0, 0, 1, 0] = bad
    node = helper.make_node("MaxPoolGrad", ["dY", "I"], ["dX"], name="mpg", kernel_shape=[2, 2], strides=[2, 2],
                            storage_order=storage_order)
    with pytest.raises(InputError, match=rf"'mpg'.*input 1 \('I'\) holds {bad} at \[0, 0, 1, 0\].*\[0, 16\)"):
        run_edgetrain(model(node, {"dY": dy, "I": idx}, ["dX"]), {"dY": dy, "I": idx})


@pytest.mark.arm64
def test_max_pool_grad_scatters_at_any_valid_index():
    """Any index in range is taken as given (dX[idx] += dY, -1 skipped), as onnxruntime's kernel does."""
    dy = np.array([1, 2, 4, 8], np.float32).reshape(1, 1, 2, 2)
    idx = np.array([15, 15, -1, 0], np.int64).reshape(1, 1, 2, 2)
    node = helper.make_node("MaxPoolGrad", ["dY", "I"], ["dX"], kernel_shape=[2, 2], strides=[2, 2])
    dx = run_edgetrain(model(node, {"dY": dy, "I": idx}, ["dX"]), {"dY": dy, "I": idx})[0]
    want = np.zeros(16, np.float32)
    want[15], want[0] = 3, 8
    np.testing.assert_array_equal(dx.reshape(-1), want)


# --- the errors reach users as errors ------------------------------------------------------------------------

@pytest.mark.native
@pytest.mark.parametrize("command", ["eval", "train"])
def test_the_cli_prints_a_bad_label_as_one_line(shared, tmp_path, command):
    """`edgetrain eval/train` on data with a hostile label: exit code 2 and one error line, no traceback."""
    art = shared / "ort_artifacts" / "digits"
    x = np.zeros((4, 64), np.float32)
    y = np.array([1, 2, 2**40, 3], np.int64)
    np.savez(tmp_path / "bad.npz", input=x, labels=y)
    extra = ["--batch-size", "4"] + (["-o", str(tmp_path / "run"), "--no-progress"] if command == "train" else [])
    out = subprocess.run([sys.executable, "-c", "import sys; from edgetrain.cli import main; sys.exit(main())",
                          command, str(art), "--data", str(tmp_path / "bad.npz"), *extra],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    # the CLI checks the data set before the first step (naming the sample); the kernels check every batch
    assert lines[0] == ("edgetrain: error: array 'labels' has value 1099511627776 at sample 2: valid values are 0 "
                        "to 9; 1 value(s) are out of range")


# --- the trimmed runtime: the same launchers over kernels compiled ahead of time ------------------------------

TRIMMED = r"""
import json, sys
import numpy as np
from edgetrain.errors import InputError
from edgetrain.ir import Node, TensorType
from edgetrain.kernels import softmax
from edgetrain.ops import OP_TABLE
from edgetrain.ops.base import NodeContext
from edgetrain.trainer import open_artifacts

state, module, optimizer = open_artifacts(sys.argv[1])
labels = np.array([1, 2, 2**40, 3], np.int64)
errors = []
try:                                     # a training step: the forward loss kernel reads the labels first
    module(np.zeros((4, 64), np.float32), labels)
except InputError as e:
    errors.append(str(e))
# the issue's kernel (the training model's SoftmaxCrossEntropyLossGrad), through its launcher
f32 = lambda *shape: TensorType(np.float32, shape)
node = Node("SoftmaxCrossEntropyLossGrad", ["dy", "log_prob", "labels"], ["dx"], {"reduction": "mean"}, "sce_grad",
            "com.microsoft")
op = OP_TABLE[("com.microsoft", "SoftmaxCrossEntropyLossGrad")]
run = softmax.softmax_cross_entropy_grad(NodeContext(node, op, 1, [f32(), f32(4, 10), TensorType(np.int64, (4,))],
                                                     [None] * 3, [f32(4, 10)]))
try:
    run(np.ones((), np.float32), np.full((4, 10), -np.log(10), np.float32), labels, np.zeros((4, 10), np.float32))
except InputError as e:
    errors.append(str(e))
print(json.dumps({"errors": errors, "kernel": repr(softmax._sce_grad), "numba": "numba" in sys.modules}))
"""


@pytest.mark.native
def test_the_trimmed_runtime_refuses_a_bad_label(shared, tmp_path):
    """The trimmed runtime ships the same launchers and compiles the same kernels (checks included) ahead of
    time; run without numba, a bad label is an InputError there too."""
    from edgetrain.minimal_build.reduce import compact_artifacts
    from edgetrain.minimal_build.runtime import blocked_python, build

    art = tmp_path / "artifacts"
    compact_artifacts(shared / "ort_artifacts" / "digits", art)
    b = build([art], tmp_path / "out", batch_sizes=[4])
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(b.wheel)], check=True)
    out = blocked_python([site], f"import sys\nsys.argv = ['-', {str(art)!r}]\n" + TRIMMED)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["kernel"].startswith("AotKernel(") and not result["numba"]
    forward, grad = result["errors"]
    assert "(SoftmaxCrossEntropyLoss): input 1 ('labels') holds 1099511627776 at [2]" in forward
    assert "'sce_grad' (SoftmaxCrossEntropyLossGrad): input 2 ('labels') holds 1099511627776 at [2]" in grad
