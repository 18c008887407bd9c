"""Shape and data-movement ops (and Resize, Dropout) against the ONNX reference evaluator or onnxruntime."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from gradcheck import _with_loss, check_gradients
from onnx import TensorProto, helper, numpy_helper
from oracle import assert_matches, model, run_edgetrain, run_onnxruntime, run_reference

import edgetrain
from edgetrain.autodiff.builder import with_gradients
from edgetrain.errors import EdgetrainError, InputError, ShapeError, UnsupportedOpError
from edgetrain.ir import Graph, Node, TensorType, Value
from edgetrain.onnx_io import from_graph
from edgetrain.ops import tensor

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rand(shape, dtype=np.float32, key=None):
    rng = rng_for("rand", shape, str(np.dtype(dtype)), key)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    return rng.standard_normal(shape).astype(dtype)


def i64(*values):
    return np.array(values, np.int64)


def check(op, feeds, consts=None, attrs=None, outputs=("out",), opset=17, oracle=run_reference, **kw):
    """One ``op`` node; ``feeds`` are graph inputs, ``consts`` initializers (None values: omitted inputs)."""
    consts = consts or {}
    names = list(feeds) + list(consts)
    names = [n if (feeds.get(n) is not None or consts.get(n) is not None) else "" for n in names]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, list(outputs), **(attrs or {}))
    m = model(node, {k: v for k, v in feeds.items() if v is not None}, list(outputs),
              initializers={k: v for k, v in consts.items() if v is not None}, opset=opset)
    return assert_matches(m, {k: v for k, v in feeds.items() if v is not None}, oracle=oracle, **kw)


def plan_error(op, feeds, consts=None, attrs=None, outputs=("out",), opset=17, name="the_node",
               error=ShapeError):
    consts = consts or {}
    names = [n if (feeds.get(n) is not None or consts.get(n) is not None) else ""
             for n in list(feeds) + list(consts)]
    node = helper.make_node(op, names, list(outputs), name=name, **(attrs or {}))
    m = model(node, feeds, list(outputs), initializers={k: v for k, v in consts.items() if v is not None},
              opset=opset)
    with pytest.raises(error, match=name) as info:
        edgetrain.InferenceSession(m.SerializeToString()).program(feeds)
    return info.value


def test_every_tensor_op_is_covered():
    tested = {"Constant", "ConstantOfShape", "Shape", "Size", "Cast", "Concat", "Dropout", "Expand",
              "Flatten", "Gather", "Identity", "Pad", "Reshape", "Resize", "Slice", "Split", "Squeeze",
              "Transpose", "Unsqueeze", "GatherGrad", "SliceGrad", "DropoutGrad", "ResizeGrad", "Range", "Tile",
              "Trilu", "GatherElements", "GatherElementsGrad", "ScatterElements", "CastLike",
              "OneHot", "EyeLike", "Scatter", "ReverseSequence"}
    assert {op.op_type for op in tensor.OPS} <= tested


# --- views -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("src, shape, allowzero", [
    ((2, 3, 4), (0, -1), 0),
    ((2, 3, 4), (-1,), 0),
    ((2, 3, 4), (4, 0, 2), 0),
    ((2, 3, 4), (2, -1, 2, 1), 0),
    ((6,), (1, 2, 1, 3), 0),
    ((0, 3), (3, 0), 1),
    ((0, 3), (-1, 3), 0),
    ((2, 3), (3, 2), 1),
])
def test_reshape(src, shape, allowzero):
    check("Reshape", {"x": rand(src)}, {"shape": i64(*shape)}, {"allowzero": allowzero})


def test_reshape_of_intermediate_feeds_elementwise():
    x = rand((2, 3, 4))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["v"]),
             helper.make_node("Add", ["v", "b"], ["out"])]
    m = model(nodes, {"x": x}, ["out", "v"], initializers={"s": i64(6, 4), "b": rand((4,), key="b")})
    assert_matches(m, {"x": x})


@pytest.mark.parametrize("shape, axis", [((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), 3),
                                         ((2, 3, 4), -1), ((2, 3, 4), -3), ((5,), 1)])
def test_flatten(shape, axis):
    check("Flatten", {"x": rand(shape)}, attrs={"axis": axis})


@pytest.mark.parametrize("shape, axes", [((1, 3, 1, 2), None), ((1, 3, 1, 2), (-2,)), ((1, 3, 1, 2), (0, 2)),
                                         ((3, 1), (-1,))])
def test_squeeze(shape, axes):
    check("Squeeze", {"x": rand(shape)}, {"axes": None if axes is None else i64(*axes)})


@pytest.mark.parametrize("shape, axes", [((3, 2), (0,)), ((3, 2), (-1,)), ((3, 2), (0, -1)), ((3, 2), (1, 3)),
                                         ((), (0,))])
def test_unsqueeze(shape, axes):
    check("Unsqueeze", {"x": rand(shape)}, {"axes": i64(*axes)})


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_identity(dtype):
    check("Identity", {"x": rand((3, 4), dtype)})


# --- copies ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, perm", [((2, 3, 4), None), ((2, 3, 4), (1, 0, 2)),
                                         ((2, 3, 4, 5), (0, 2, 3, 1)), ((3,), None)])
def test_transpose(shape, perm):
    check("Transpose", {"x": rand(shape)}, attrs={} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_concat(axis):
    base = [2, 3, 4]
    shapes = []
    for k in range(3):
        s = list(base)
        s[axis] = k + 1
        shapes.append(tuple(s))
    check("Concat", {f"x{k}": rand(s, key=k) for k, s in enumerate(shapes)}, attrs={"axis": axis})


def test_concat_with_a_constant_and_int64():
    check("Concat", {"x": rand((2, 3), np.int64)}, {"c": rand((1, 3), np.int64, key="c")}, {"axis": 0})


@pytest.mark.parametrize("shape, axis, split, n", [
    ((6, 4), 0, (1, 2, 3), 3),
    ((6, 4), -1, (3, 1), 2),
    ((6, 4), 0, None, 3),
    ((2, 9), 1, (0, 9), 2),
])
def test_split(shape, axis, split, n):
    outs = tuple(f"y{k}" for k in range(n))
    check("Split", {"x": rand(shape)}, {"split": None if split is None else i64(*split)}, {"axis": axis},
          outputs=outs)


@pytest.mark.parametrize("dim, n", [(6, 3), (7, 3), (5, 2), (8, 3)])
def test_split_num_outputs_opset18(dim, n):
    outs = tuple(f"y{k}" for k in range(n))
    ours = check("Split", {"x": rand((2, dim))}, attrs={"axis": 1, "num_outputs": n}, outputs=outs, opset=18)
    assert [o.shape[1] for o in ours][:-1] == [-(-dim // n)] * (n - 1)


def test_split_only_some_outputs_used():
    x = rand((6, 2))
    nodes = [helper.make_node("Split", ["x", "s"], ["a", "b", "c"]), helper.make_node("Neg", ["b"], ["out"])]
    assert_matches(model(nodes, {"x": x}, ["out"], initializers={"s": i64(1, 2, 3)}), {"x": x})


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((1, 0), (3, 2), None, None),
    ((-3,), (-1,), (1,), None),
    ((0,), (I64_MAX,), (-1,), (2,)),
    ((-1,), (I64_MIN,), (0,), (-1,)),
    ((10,), (0,), (2,), (-2,)),
    ((3, -1), (0, -100), (0, 2), (-1, -2)),
    ((2,), (1,), (0,), None),                       # empty
    ((1, 1), (100, 3), (-1, 0), (3, 1)),
])
def test_slice(starts, ends, axes, steps):
    consts = {"starts": i64(*starts), "ends": i64(*ends), "axes": None if axes is None else i64(*axes),
              "steps": None if steps is None else i64(*steps)}
    if steps is not None and axes is None:
        consts["axes"] = i64(*range(len(starts)))
    check("Slice", {"x": rand((4, 5, 6))}, consts)


def test_slice_negative_step_start_before_beginning():
    """The spec clamps starts to [0, dim - 1] for negative steps: one element. numpy slicing (hence the
    reference evaluator) gives none; onnxruntime follows the spec."""
    consts = {"starts": i64(-100), "ends": i64(I64_MIN), "axes": i64(1), "steps": i64(-1)}
    assert check("Slice", {"x": rand((4, 5, 6))}, consts, oracle=run_onnxruntime)[0].shape == (4, 1, 6)


def test_slice_int32_params():
    check("Slice", {"x": rand((4, 5))}, {"starts": np.array([1], np.int32), "ends": np.array([-1], np.int32),
                                         "axes": np.array([1], np.int32)})


@pytest.mark.parametrize("axis, idx", [
    (0, np.array([2, 0, -1], np.int64)),
    (1, np.array([[0, -2], [3, 1]], np.int64)),
    (-1, np.array([-5, 4], np.int32)),
    (0, np.array(1, np.int64)),
])
def test_gather(axis, idx):
    check("Gather", {"x": rand((4, 5, 5)), "i": idx}, attrs={"axis": axis})


def test_gather_constant_table_fed_indices():
    table = rand((10, 3))
    idx = np.array([[1, 9], [-1, 0]], np.int64)
    node = helper.make_node("Gather", ["w", "i"], ["out"])
    assert_matches(model(node, {"i": idx}, ["out"], initializers={"w": table}), {"i": idx})


def test_gather_out_of_range_index_raises():
    table, idx = rand((4, 3)), np.array([4], np.int64)
    node = helper.make_node("Gather", ["w", "i"], ["out"], name="g")
    with pytest.raises(InputError, match="'g'.*holds 4 at \\[0\\]"):
        run_edgetrain(model(node, {"w": table, "i": idx}, ["out"]), {"w": table, "i": idx})


@pytest.mark.parametrize("src, shape", [((3, 1), (2, 1, 4)), ((3, 1), (3, 4)), ((1,), (2, 3)),
                                        ((2, 3), (1, 1)), ((), (2, 2))])
def test_expand(src, shape):
    check("Expand", {"x": rand(src)}, {"shape": i64(*shape)})


def test_expand_reads_each_runs_input():
    """The broadcast view is made once, when the program binds its arrays: each run still sees its feed."""
    m = model(helper.make_node("Expand", ["x", "shape"], ["y"]), {"x": rand((3, 1, 4))}, ["y"],
              initializers={"shape": i64(2, 3, 5, 4)})
    sess = edgetrain.InferenceSession(m.SerializeToString())
    for key in ("first", "second"):
        feeds = {"x": rand((3, 1, 4), key=key)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], run_onnxruntime(m, feeds)[0])


@pytest.mark.parametrize("mode, pads, value", [
    ("constant", (1, 0, 2, 3), 1.5),
    ("constant", (0, 2, 1, 0), None),
    ("reflect", (2, 1, 1, 2), None),
    ("edge", (1, 3, 2, 0), None),
])
def test_pad(mode, pads, value):
    consts = {"pads": i64(*pads), "value": None if value is None else np.array(value, np.float32)}
    check("Pad", {"x": rand((3, 4))}, consts, {"mode": mode})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_negative(mode):
    """Negative pads crop; onnxruntime is the oracle (numpy.pad, hence the reference, rejects them)."""
    consts = {"pads": i64(-1, 2, 1, -2), "value": np.array(2.0, np.float32) if mode == "constant" else None}
    check("Pad", {"x": rand((4, 5))}, consts, {"mode": mode}, oracle=run_onnxruntime)


def test_pad_axes_opset18():
    check("Pad", {"x": rand((2, 3, 4))}, {"pads": i64(1, 2, 0, 1), "value": np.array(-1.0, np.float32),
                                          "axes": i64(-1, 0)}, {"mode": "constant"}, opset=18)


@pytest.mark.parametrize("mode", ["wrap", "reflect", "edge"])
def test_pad_3d_and_wrap_opset19(mode):
    check("Pad", {"x": rand((2, 3, 4))}, {"pads": i64(1, 2, 3, 1, 0, 2)}, {"mode": mode}, opset=19)


def test_pad_int64_constant():
    check("Pad", {"x": rand((2, 3), np.int64)}, {"pads": i64(1, 1, 1, 1), "value": np.array(7, np.int64)})


@pytest.mark.parametrize("src, to", [
    (np.float32, TensorProto.INT64), (np.float32, TensorProto.INT32), (np.int64, TensorProto.FLOAT),
    (np.float32, TensorProto.BOOL), (np.bool_, TensorProto.FLOAT), (np.int64, TensorProto.BOOL),
    (np.bool_, TensorProto.INT64), (np.float64, TensorProto.FLOAT), (np.float32, TensorProto.DOUBLE),
    (np.int32, TensorProto.INT64),
])
def test_cast(src, to):
    x = rand((3, 5), src) * (3 if np.dtype(src).kind == "f" else 1)
    if np.dtype(src).kind == "f":
        x[0, :3] = [0.0, -0.0, 2.5]
    elif np.dtype(src).kind == "i":
        x[0, 0] = 0
    check("Cast", {"x": x}, attrs={"to": to})


@pytest.mark.parametrize("src, like", [(np.float32, np.int64), (np.int32, np.float64), (np.float64, np.uint8)])
def test_cast_like(src, like):
    """The like input fed at run time (its values unread, its type all that counts) and as a constant."""
    x = np.abs(rand((3, 5), src) * 3)
    check("CastLike", {"x": x, "like": np.zeros(2, like)}, opset=19, oracle=run_onnxruntime)
    check("CastLike", {"x": x}, consts={"like": np.zeros(2, like)}, opset=19, oracle=run_onnxruntime)


def test_cast_like_rule():
    grad_check("CastLike", ["x", "like"], {"x": rand((2, 3), F64, "castlike")}, {"like": np.zeros(1, F64)},
               [(2, 3)], opset=19)


# --- folded when planning ----------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 3}, {"start": 5},
                                   {"start": -10, "end": 10}])
def test_shape(attrs):
    check("Shape", {"x": rand((2, 3, 4, 5))}, attrs=attrs, opset=17)


def test_shape_feeds_reshape_and_size():
    """Shape arithmetic around Reshape (what exporters emit) folds; Size too."""
    x = rand((2, 3, 4))
    nodes = [helper.make_node("Shape", ["x"], ["s"], end=1),
             helper.make_node("Concat", ["s", "m1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["out"]),
             helper.make_node("Size", ["x"], ["n"])]
    m = model(nodes, {"x": x}, ["out", "n"], initializers={"m1": i64(-1)})
    assert_matches(m, {"x": x})
    assert edgetrain.InferenceSession(m.SerializeToString()).program({"x": x}).plan.n_kernels == 0


@pytest.mark.parametrize("value", [None, np.array([3], np.int64), np.array([1.5], np.float32),
                                   np.array([True])])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    node = helper.make_node("ConstantOfShape", ["s"], ["out"], **attrs)
    assert_matches(model(node, {}, ["out"], initializers={"s": i64(2, 3)}), {})


def test_constant_of_shape_from_shape_of_input():
    x = rand((4, 2))
    two = helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["z"], value=two),
             helper.make_node("Add", ["x", "z"], ["out"])]
    assert_matches(model(nodes, {"x": x}, ["out"]), {"x": x})


@pytest.mark.parametrize("attrs", [
    {"value": numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
    {"value_float": 2.5}, {"value_floats": [1.0, 2.0]}, {"value_int": 7}, {"value_ints": [1, 2, 3]},
])
def test_constant(attrs):
    nodes = [helper.make_node("Constant", [], ["c"], **attrs), helper.make_node("Identity", ["c"], ["out"])]
    assert_matches(model(nodes, {}, ["out"]), {})


# --- Dropout -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ratio", [0.3, 0.75])
@pytest.mark.parametrize("with_mask", [True, False])
def test_dropout_training(ratio, with_mask):
    x = (np.abs(rand((64, 128))) + 0.5).astype(np.float32)     # nonzero, so the mask shows in y
    outs = ["y", "mask"] if with_mask else ["y"]
    node = helper.make_node("Dropout", ["x", "r", "t"], outs, seed=3)
    m = model(node, {"x": x}, outs, initializers={"r": np.array(ratio, np.float32), "t": np.array(True)})
    sess = edgetrain.InferenceSession(m.SerializeToString())
    results = [sess.run(None, {"x": x}) for _ in range(2)]
    for res in results:
        y = res[0]
        mask = res[1] if with_mask else y != 0
        assert y.dtype == np.float32 and y.shape == x.shape
        if with_mask:
            assert mask.dtype == np.bool_ and mask.shape == x.shape
        np.testing.assert_allclose(y, x * mask / np.float32(1 - ratio), rtol=1e-6)
        assert abs(mask.mean() - (1 - ratio)) < 0.02
    assert not np.array_equal(results[0][0], results[1][0])      # a fresh mask every run


def test_dropout_training_float64_and_default_ratio():
    x = (np.abs(rand((50, 40), np.float64)) + 0.5)
    node = helper.make_node("Dropout", ["x", "", "t"], ["y", "mask"])
    m = model(node, {"x": x}, ["y", "mask"], initializers={"t": np.array(True)})
    y, mask = run_edgetrain(m, {"x": x})
    np.testing.assert_allclose(y, x * mask * 2.0)
    assert abs(mask.mean() - 0.5) < 0.05


@pytest.mark.parametrize("inputs", [("x",), ("x", "r"), ("x", "r", "f"), ("x", "r0", "t")])
def test_dropout_inference_is_identity(inputs):
    x = rand((4, 6))
    node = helper.make_node("Dropout", list(inputs), ["y", "mask"])
    consts = {"r": np.array(0.4, np.float32), "f": np.array(False), "r0": np.array(0.0, np.float32),
              "t": np.array(True)}
    m = model(node, {"x": x}, ["y", "mask"], initializers=consts)
    y, mask = assert_matches(m, {"x": x})
    np.testing.assert_array_equal(y, x)
    assert mask.all()


def test_dropout_ratio_one_rejected():
    plan_error("Dropout", {"x": rand((3,))}, {"r": np.array(1.0, np.float32), "t": np.array(True)},
               outputs=("y",))


# --- Resize ------------------------------------------------------------------------------------------------

COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize(x, scales=None, sizes=None, oracle=None, opset=19, **attrs):
    """Check against onnxruntime, and the reference evaluator too except where it differs:

    - with align_corners and half_pixel_symmetric it takes ``scale * length`` for the output length, not the
      integer length the spec (and onnxruntime) use; with ``axes`` it fails;
    - it computes coordinates in float64, onnxruntime (and edgetrain) in float32, so with a scale that float32
      cannot represent (0.6, sizes 7/4) a nearest coordinate on an exact tie may round the other way.
    """
    consts = {"roi": None, "scales": None if scales is None else np.array(scales, np.float32),
              "sizes": None if sizes is None else i64(*sizes)}
    oracles = [oracle] if oracle else [run_onnxruntime]
    exact = scales is not None and all(float(np.float32(s)) == s for s in scales)
    if oracle is None and "axes" not in attrs and attrs.get("coordinate_transformation_mode") not in (
            "align_corners", "half_pixel_symmetric") and (exact or attrs.get("mode") == "linear"):
        oracles.append(run_reference)
    for o in oracles:
        ours = check("Resize", {"x": x}, consts, attrs, opset=opset, oracle=o, rtol=1e-5, atol=1e-5)
    return ours


@pytest.mark.parametrize("coords", COORDS)
@pytest.mark.parametrize("nearest", NEAREST)
@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 0.5, 0.6), (1, 1, 1.7, 0.8)])
def test_resize_nearest(coords, nearest, scales):
    resize(rand((2, 3, 5, 7)), scales=scales, mode="nearest", coordinate_transformation_mode=coords,
           nearest_mode=nearest)


@pytest.mark.parametrize("coords", COORDS + ("half_pixel_symmetric",))
@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 0.5, 0.6), (1, 1, 1.7, 0.8)])
def test_resize_linear(coords, scales):
    resize(rand((2, 3, 5, 7)), scales=scales, mode="linear", coordinate_transformation_mode=coords)


@pytest.mark.parametrize("coords", COORDS)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_sizes(coords, mode):
    resize(rand((1, 2, 4, 6)), sizes=(1, 2, 7, 3), mode=mode, coordinate_transformation_mode=coords)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("shape, scales", [((2, 3, 8), (1, 1, 1.5)), ((6, 4), (0.5, 2)), ((5,), (2.5,))])
def test_resize_lower_ranks(mode, shape, scales):
    # onnxruntime's linear Resize takes 2-D and 4-D X only
    oracle = run_reference if len(shape) != 2 and mode == "linear" else None
    resize(rand(shape), scales=scales, mode=mode, oracle=oracle)


def test_resize_float32_scale_arithmetic():
    """0.7f * 10 is 7 in float32 (onnxruntime) and 6.99999988 in float64."""
    ours = resize(rand((1, 1, 10, 10)), scales=(1, 1, 0.7, 0.7), mode="nearest", oracle=run_onnxruntime)
    assert ours[0].shape == (1, 1, 7, 7)


def test_resize_nearest_int_and_every_axis():
    """onnxruntime has no int64 Resize."""
    resize(rand((2, 3, 4, 5), np.int64), scales=(2, 0.5, 1.5, 1), mode="nearest", oracle=run_reference)


def test_resize_axes_and_keep_aspect_ratio():
    """onnxruntime; the reference evaluator fails with axes (onnxruntime with negative axes and a policy)."""
    resize(rand((1, 3, 4, 6)), sizes=(8, 9), axes=(2, 3), mode="linear")
    resize(rand((1, 3, 4, 6)), sizes=(8, 9), axes=(-2, -1), mode="nearest")
    x = rand((1, 3, 4, 6))
    resize(x, sizes=(8, 9), axes=(2, 3), mode="nearest", keep_aspect_ratio_policy="not_larger")
    resize(x, sizes=(8, 9), axes=(2, 3), mode="linear", keep_aspect_ratio_policy="not_smaller")
    resize(rand((1, 3, 4, 6)), scales=(0.7, 1.5), axes=(3, 2), mode="nearest")


def test_resize_roi_ignored_and_antialias_upsampling():
    x = rand((1, 2, 4, 5))
    node = helper.make_node("Resize", ["x", "roi", "sc"], ["out"], mode="linear", antialias=1)
    consts = {"roi": np.array([0, 0, .2, .2, 1, 1, .8, .8], np.float32),
              "sc": np.array([1, 1, 2, 1.5], np.float32)}
    m = model(node, {"x": x}, ["out"], initializers=consts, opset=19)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("coords", COORDS)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_to_length_one(coords, mode):
    resize(rand((1, 2, 4, 5)), sizes=(1, 2, 1, 3), mode=mode, coordinate_transformation_mode=coords)


def test_resize_random_against_onnxruntime():
    """Random shapes, scales / sizes and modes (300 such cases matched onnxruntime exactly when written)."""
    rng = rng_for("resize-fuzz")
    steps = (0.3, 0.5, 0.6, 0.7, 0.75, 1.0, 1.3, 1.5, 2.0, 2.5, 3.0)
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(1, 9, 2))
        attrs = {"mode": str(rng.choice(["nearest", "linear"])),
                 "coordinate_transformation_mode": str(rng.choice(COORDS + ("half_pixel_symmetric",))),
                 "nearest_mode": str(rng.choice(NEAREST))}
        if rng.random() < 0.5:
            scales = (1, 1, float(rng.choice(steps)), float(rng.choice(steps)))
            if min(np.floor(np.float32(scales[2]) * h), np.floor(np.float32(scales[3]) * w)) < 1:
                continue
            resize(rand((1, 2, h, w)), scales=scales, oracle=run_onnxruntime, **attrs)
        else:
            sizes = (1, 2) + tuple(int(v) for v in rng.integers(1, 12, 2))
            resize(rand((1, 2, h, w)), sizes=sizes, oracle=run_onnxruntime, **attrs)


def test_resize_opset13_with_empty_scales():
    x = rand((1, 1, 3, 3))
    node = helper.make_node("Resize", ["x", "", "sc", "sz"], ["out"], mode="linear")
    m = model(node, {"x": x}, ["out"], initializers={"sc": np.zeros(0, np.float32), "sz": i64(1, 1, 5, 4)},
              opset=13)
    assert_matches(m, {"x": x}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs, scales, sizes", [
    ({"mode": "cubic"}, (1, 1, 2, 2), None),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, (1, 1, 2, 2), None),
    ({"mode": "linear"}, (2, 1, 2, 2), None),
    ({}, (1, 1, 2, 2), (1, 1, 4, 4)),
    ({}, (1, 2, 2), None),
    ({"nearest_mode": "nope"}, (1, 1, 2, 2), None),
])
def test_resize_rejected(attrs, scales, sizes):
    consts = {"roi": None, "scales": None if scales is None else np.array(scales, np.float32),
              "sizes": None if sizes is None else i64(*sizes)}
    plan_error("Resize", {"x": rand((1, 1, 3, 3))}, consts, attrs, opset=19)


# --- shape-rule errors -------------------------------------------------------------------------------------

def test_reshape_incompatible():
    err = plan_error("Reshape", {"x": rand((2, 3))}, {"shape": i64(4, -1)})
    assert "cannot reshape" in str(err)
    plan_error("Reshape", {"x": rand((2, 3))}, {"shape": i64(7)})
    plan_error("Reshape", {"x": rand((2, 3))}, {"shape": i64(-1, -1)})
    plan_error("Reshape", {"x": rand((2, 3))}, {"shape": i64(2, 0, 0)})
    plan_error("Reshape", {"x": rand((2, 3))}, {"shape": i64(-2, -3)})


def test_reshape_shape_must_be_constant():
    # a small shape input is planned per value (tests/test_value_inputs.py); one of 65 entries is not
    x, s = rand((1,)), np.ones(65, np.int64)
    plan_error("Reshape", {"x": x, "s": s}, name="the_node")


def test_concat_mismatch():
    err = plan_error("Concat", {"a": rand((2, 3)), "b": rand((2, 4))}, attrs={"axis": 0})
    assert "differ outside axis" in str(err)
    plan_error("Concat", {"a": rand((2, 3)), "b": rand((2, 3), np.float64)}, attrs={"axis": 0})
    plan_error("Concat", {"a": rand((2, 3)), "b": rand((2,))}, attrs={"axis": 0})
    plan_error("Concat", {"a": rand((2, 3))}, attrs={"axis": 2})


def test_other_shape_errors():
    plan_error("Flatten", {"x": rand((2, 3))}, attrs={"axis": 3})
    plan_error("Squeeze", {"x": rand((2, 3))}, {"axes": i64(0)})
    plan_error("Unsqueeze", {"x": rand((2, 3))}, {"axes": i64(0, 0)})
    plan_error("Transpose", {"x": rand((2, 3))}, attrs={"perm": (0, 0)})
    plan_error("Split", {"x": rand((5, 2))}, {"split": i64(2, 2)}, outputs=("a", "b"))
    plan_error("Split", {"x": rand((5, 2))}, attrs={"num_outputs": 4}, outputs=("a", "b", "c", "d"), opset=18)
    plan_error("Slice", {"x": rand((5, 2))}, {"starts": i64(0, 1), "ends": i64(2)})
    plan_error("Slice", {"x": rand((5, 2))}, {"starts": i64(0), "ends": i64(2), "axes": i64(0),
                                              "steps": i64(0)})
    plan_error("Gather", {"x": rand((5, 2)), "i": i64(0)}, attrs={"axis": 2})
    plan_error("Expand", {"x": rand((3, 2))}, {"shape": i64(4, 1)})
    plan_error("Pad", {"x": rand((3, 2))}, {"pads": i64(0, -2, 0, -1)})
    plan_error("Pad", {"x": rand((3, 2))}, {"pads": i64(0, 0, 0)})
    plan_error("Pad", {"x": rand((1, 2))}, {"pads": i64(1, 0, 0, 0)}, {"mode": "reflect"})
    plan_error("Cast", {"x": rand((3,))}, attrs={"to": 8}, error=EdgetrainError)   # strings


def test_training_dropout_on_a_constant_is_not_folded():
    """A random op with constant inputs must not be folded into one fixed mask at planning."""
    x = np.ones((64, 64), np.float32)
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])
    m = model(node, {"feed": np.ones(1, np.float32)}, ["y"],
              {"x": x, "ratio": np.array(0.5, np.float32), "training": np.array(True)})
    sess = edgetrain.InferenceSession(m.SerializeToString())
    a, = sess.run(None, {"feed": np.ones(1, np.float32)})
    b, = sess.run(None, {"feed": np.ones(1, np.float32)})
    assert set(np.unique(a)) <= {0.0, 2.0} and not np.array_equal(a, b)


# --- gradient rules (finite differences, float64) ---------------------------------------------------------

F64 = np.float64


def t64(*shape):
    return TensorType(F64, shape)


def grad_check(op, inputs, params, consts, out_shapes, attrs=None, outputs=("y",), opset=17, used=None):
    """One ``op`` node; the loss reads the outputs ``used`` (all by default)."""
    used = list(used if used is not None else outputs)
    shapes = dict(zip(outputs, out_shapes))
    return check_gradients([Node(op, list(inputs), list(outputs), attrs or {}, "n")], params, used,
                           [t64(*shapes[o]) for o in used], consts=consts, opset=opset)


@pytest.mark.parametrize("axis, idx", [
    (0, [[0, 4, -1], [2, 0, 0]]),               # repeated and negative indices accumulate
    (1, [[0, 2, -1], [1, 1, -3]]),
    (-1, [3, -4, 3]),
    (0, 2),                                     # a scalar index drops the axis
])
def test_gather_rule(axis, idx):
    x = rand((5, 4), F64, "gather")
    idx = np.array(idx, np.int64)
    out = np.take(x, idx, axis=axis).shape
    grad_check("Gather", ["x", "i"], {"x": x}, {"i": idx}, [out], {"axis": axis})


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([1, -1], [4, -6], [0, 2], [2, -2]),        # steps, negative starts/ends/steps, a subset of the axes
    ([1], [3], None, None),                     # leading axes only, no axes/steps
    ([-2, 0], [I64_MAX, 3], [-1, 1], None),
    ([4, 10], [0, -20], [0, 1], [-1, -3]),      # clamped ends, backwards
])
def test_slice_rule(starts, ends, axes, steps):
    x = rand((5, 4, 6), F64, "slice")
    consts = {"s": i64(*starts), "e": i64(*ends)}
    inputs = ["x", "s", "e"]
    if axes is not None or steps is not None:
        consts["a"] = i64(*(axes if axes is not None else range(len(starts))))
        inputs.append("a")
    if steps is not None:
        consts["st"] = i64(*steps)
        inputs.append("st")
    node = helper.make_node("Slice", inputs, ["y"])
    out, = run_reference(model(node, {"x": x}, ["y"], initializers={k: v for k, v in consts.items()}), {"x": x})
    grad_check("Slice", inputs, {"x": x}, consts, [out.shape])


@pytest.mark.parametrize("axis, shapes, fed", [
    (1, [(2, 3), (2, 4)], "ab"),
    (-1, [(2, 3), (2, 4), (2, 1)], "ac"),       # a constant input in the middle gets no gradient
    (0, [(3, 2), (3, 2)], "ab"),
    (0, [(2, 3)], "a"),
])
def test_concat_rule(axis, shapes, fed):
    values = {n: rand(s, F64, n) for n, s in zip("abc", shapes)}
    out = np.concatenate(list(values.values()), axis=axis).shape
    grad_check("Concat", list(values), {n: v for n, v in values.items() if n in fed},
               {n: v for n, v in values.items() if n not in fed}, [out], {"axis": axis})


def test_concat_rule_sizes_follow_symbolic_dims():
    """The split sizes are computed from the inputs' shapes when planning: one graph, several batch sizes."""
    b = rand((2, 3), F64, "b")
    nodes = [Node("Concat", ["a", "b"], ["y"], {"axis": 0}, "c"), Node("Mul", ["y", "y"], ["sq"], {}, "sq"),
             Node("ReduceSum", ["sq"], ["loss"], {"keepdims": 0}, "sum")]
    graph = Graph(nodes, [Value("a", TensorType(F64, ("N", 3)))], [Value("loss", TensorType(F64, ()))], {"b": b},
                  {"": 17}, name="symbolic")
    sess = edgetrain.InferenceSession(from_graph(with_gradients(graph, "loss", ["b"])).SerializeToString())
    for n in (1, 4, 7):
        a = rand((n, 3), F64, n)
        loss, db = sess.run(None, {"a": a, "b": b})
        np.testing.assert_allclose(db, 2 * b)
        np.testing.assert_allclose(loss, (a * a).sum() + (b * b).sum())


@pytest.mark.parametrize("split, used", [
    ([2, 4, 1], ["y0", "y2"]),                  # uneven, and y1 reaches no loss: zeros in its place
    ([3, 3, 3], ["y0", "y1", "y2"]),
    (None, ["y1"]),                             # equal parts from the output count
])
def test_split_rule(split, used):
    x = rand((9 if split is None or sum(split) == 9 else sum(split), 2), F64, "split")
    consts = {} if split is None else {"sp": i64(*split)}
    parts = np.split(x, np.cumsum(split)[:-1] if split else 3)
    grad_check("Split", ["x"] + list(consts), {"x": x}, consts, [p.shape for p in parts], {"axis": 0},
               outputs=("y0", "y1", "y2"), used=used, opset=13)


@pytest.mark.parametrize("pads, axes, value", [
    ([1, 2, 0, 1], None, None),                 # padding only: a Slice of dY
    ([-1, 2, 0, -1], None, 1.5),                # with crops: a Pad of dY with the negated pads
    ([0, 0, 0, 0], None, None),
    ([2, 1], [-1], 0.5),                        # axes (opset 18)
])
def test_pad_rule(pads, axes, value):
    x = rand((3, 4), F64, "pad")
    consts = {"p": i64(*pads), "v": None if value is None else np.array(value, F64),
              "ax": None if axes is None else i64(*axes)}
    node = helper.make_node("Pad", ["x", "p", "v" if value is not None else "", "ax" if axes else ""], ["y"])
    out, = run_onnxruntime(model(node, {"x": x.astype(np.float32)}, ["y"], opset=18,
                                 initializers={k: v.astype(np.float32) if k == "v" else v
                                               for k, v in consts.items() if v is not None}),
                           {"x": x.astype(np.float32)})
    inputs = ["x", "p", "v" if value is not None else "", "ax" if axes else ""]
    while inputs[-1] == "":
        inputs.pop()
    grad_check("Pad", inputs, {"x": x}, {k: v for k, v in consts.items() if v is not None}, [out.shape],
               opset=18)


@pytest.mark.parametrize("pads, out", [((1, -1, 0, 2), (4, 5)), ((1, 0, 0, 2), (4, 6))])
def test_pad_rule_with_pads_from_a_constant_node(pads, out):
    """Pads not among the initializers: Pad(dY, Neg(pads)), folded when planning."""
    nodes = [Node("Constant", [], ["p"], {"value": i64(*pads)}, "pads"),
             Node("Pad", ["x", "p", "v"], ["y"], {}, "pad")]
    check_gradients(nodes, {"x": rand((3, 4), F64, "pad")}, ["y"], [t64(*out)], consts={"v": np.array(0.7, F64)})


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads, axes", [((1, 2, 2, 1), None), ((0, 3, 0, 2), None), ((2, 3), (-1,))], ids=str)
def test_pad_rule_reflect_edge_wrap(mode, pads, axes):
    """Central differences, and torch's F.pad (reflect, replicate, circular) autograd on one cotangent."""
    import torch
    from gradcheck import gradient_session
    x = rand((4, 5), F64, "padmode")
    consts = {"p": i64(*pads)} | ({"ax": i64(*axes)} if axes else {})
    inputs = ["x", "p"] + (["", "ax"] if axes else [])
    widths = [(0, 0), (pads[0], pads[1])] if axes else [(pads[0], pads[2]), (pads[1], pads[3])]
    out = tuple(d + b + e for d, (b, e) in zip(x.shape, widths))
    grad_check("Pad", inputs, {"x": x}, consts, [out], {"mode": mode}, opset=19)
    sess, graph = gradient_session([Node("Pad", inputs, ["y"], {"mode": mode}, "pad")], {"x": x}, consts,
                                   ["y"], [t64(*out)], opset=19)
    dx = sess.run(None, {"x": x})[1]
    t = torch.from_numpy(x).requires_grad_()
    flat = [w for b, e in reversed(widths) for w in (b, e)]
    mode_t = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}[mode]
    y = torch.nn.functional.pad(t[None, None], flat, mode=mode_t)[0, 0]
    (y * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-12)


def test_pad_rule_refuses_crops_in_other_modes():
    with pytest.raises(UnsupportedOpError, match="negative pads"):
        grad_check("Pad", ["x", "p"], {"x": rand((3, 4), F64)}, {"p": i64(1, -1, 1, 1)}, [(5, 4)],
                   {"mode": "reflect"})


@pytest.mark.parametrize("inputs", [("x", "r0", "t"), ("x", "r", "f"), ("x",)])
def test_dropout_rule_when_nothing_is_dropped(inputs):
    """Ratio 0 in training mode (the bench transformer's), or inference mode: the identity."""
    x = rand((3, 4), F64, "dropout")
    consts = {"r0": np.array(0.0, np.float32), "r": np.array(0.5, np.float32), "t": np.array(True),
              "f": np.array(False)}
    grad_check("Dropout", inputs, {"x": x}, {k: consts[k] for k in inputs[1:]}, [(3, 4)])


def test_dropout_rule_ratio_zero_from_constant_nodes():
    """The bench transformer's form: ratio 0 and training_mode from Constant nodes, so DropoutGrad is emitted
    (the values are known only when planning) and passes dY through."""
    nodes = [Node("Constant", [], ["r"], {"value": np.array(0.0, np.float32)}, "ratio"),
             Node("Constant", [], ["t"], {"value": np.array(True)}, "training"),
             Node("Dropout", ["x", "r", "t"], ["y", "mask"], {}, "drop")]
    check_gradients(nodes, {"x": rand((3, 4), F64, "dropout")}, ["y"], [t64(3, 4)])


def dropout_training_step(outputs, ratio, dtype=F64, ratio_input="r"):
    """Gradient graph of loss = sum(C * Dropout(x)) that also outputs the mask: dX must be C * mask / (1 - r)."""
    x = (np.abs(rand((40, 50), dtype, "dropout")) + 0.5).astype(dtype)
    cot = rand((40, 50), dtype, "cot")
    inputs = ["x", ratio_input, "t"]
    node = Node("Dropout", inputs, list(outputs), {"seed": 5}, "drop")
    consts = {"cot_0": cot, "t": np.array(True)}
    if ratio_input:
        consts[ratio_input] = np.array(ratio, np.float32)
    graph = Graph(_with_loss([node], ["y"], {}), [], [Value("loss", TensorType(dtype, ()))], {"x": x, **consts},
                  {"": 17}, name="dropout")
    train = with_gradients(graph, "loss", ["x"])
    mask = outputs[1] if len(outputs) > 1 else "drop_saved_1"       # added for the gradient
    train.outputs.append(Value(mask, TensorType(np.bool_, x.shape)))
    assert any(n.op_type == "DropoutGrad" and n.domain == "com.microsoft" for n in train.nodes)
    sess = edgetrain.InferenceSession(from_graph(train).SerializeToString())
    masks = []
    for _ in range(2):
        loss, dx, mask = sess.run(None, {"x": x})
        np.testing.assert_allclose(dx, cot * mask / dtype(1 - ratio), rtol=1e-6)
        np.testing.assert_allclose(loss, (cot * x * mask / dtype(1 - ratio)).sum(), rtol=1e-5)
        assert abs(mask.mean() - (1 - ratio)) < 0.05
        masks.append(mask.copy())
    assert not np.array_equal(*masks)                                 # a fresh mask every step


@pytest.mark.parametrize("outputs", [("y", "mask"), ("y",)])
@pytest.mark.parametrize("ratio", [0.25, 0.6])
def test_dropout_rule_in_training_mode(outputs, ratio):
    dropout_training_step(outputs, ratio)


def test_dropout_rule_float32_default_ratio():
    dropout_training_step(("y",), 0.5, np.float32, ratio_input="")


RESIZE_CASES = [
    ({"mode": "linear"}, (1, 1, 2, 1.5), None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, (1, 1, 0.6, 1.7), None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, (1, 2, 5, 3)),
    ({"mode": "nearest"}, (1, 1, 2, 1.5), None),
    ({"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"},
     (1, 2, 0.5, 2), None),
]


@pytest.mark.parametrize("attrs, scales, sizes", RESIZE_CASES)
def test_resize_rule(attrs, scales, sizes):
    x = rand((1, 2, 3, 4), F64, "resize")
    consts = {"roi": None, "scales": None if scales is None else np.array(scales, np.float32),
              "sizes": None if sizes is None else i64(*sizes)}
    node = helper.make_node("Resize", ["x", "", "scales" if scales else "", "sizes" if sizes else ""], ["y"],
                            **attrs)
    x32 = x.astype(np.float32)                  # onnxruntime's Resize has no double kernel
    out, = run_onnxruntime(model(node, {"x": x32}, ["y"], opset=19,
                                 initializers={k: v for k, v in consts.items() if v is not None}), {"x": x32})
    inputs = ["x", "", "scales" if scales else "", "sizes" if sizes else ""]
    while inputs[-1] == "":
        inputs.pop()
    grad_check("Resize", inputs, {"x": x}, {k: v for k, v in consts.items() if v is not None}, [out.shape],
               attrs, opset=19)


def test_resize_rule_refuses_sizes_with_an_aspect_ratio_policy():
    with pytest.raises(UnsupportedOpError, match="keep_aspect_ratio_policy"):
        grad_check("Resize", ["x", "", "", "sz"], {"x": rand((1, 1, 3, 4), F64)}, {"sz": i64(6, 6)}, [(1, 1, 5, 6)],
                   {"mode": "linear", "axes": (2, 3), "keep_aspect_ratio_policy": "not_larger"}, opset=19)


# --- gradient ops against naive loops -------------------------------------------------------------------------

def ms_model(op, inputs, feeds, consts, attrs=None, opset=17):
    node = helper.make_node(op, list(inputs), ["dx"], domain="com.microsoft", **(attrs or {}))
    return model(node, feeds, ["dx"], initializers=consts, opset=opset, ms_opset=1)


@pytest.mark.parametrize("data, axis, idx, dtype", [
    ((100, 64), 0, rng_for("tokens").integers(-100, 100, (8, 32)), np.float32),   # the transformer's embedding
    ((3, 5, 2), 1, np.array([[4, -1, 0], [-5, 4, 4]], np.int32), np.float64),
    ((4, 3), -1, np.array(1, np.int64), np.float32),
])
def test_gather_grad_kernel(data, axis, idx, dtype):
    idx = np.asarray(idx)
    out = np.take(np.zeros(data), idx, axis=axis).shape
    dy = rand(out, dtype, "dy")
    m = ms_model("GatherGrad", ["shape", "i", "dy"], {"i": idx, "dy": dy}, {"shape": i64(*data)}, {"axis": axis})
    dx, = run_edgetrain(m, {"i": idx, "dy": dy})
    ref = np.zeros(data, dtype)
    a = axis % len(data)
    for pos in np.ndindex(out):                  # dX[.., idx[k], ..] += dY[.., k, ..]
        k = pos[a:a + idx.ndim]
        dst = pos[:a] + (int(idx[k]) % data[a],) + pos[a + idx.ndim:]
        ref[dst] += dy[pos]
    assert dx.dtype == dtype and dx.shape == data
    np.testing.assert_allclose(dx, ref, rtol=1e-6, atol=1e-6)


def test_gather_grad_out_of_range_index_raises():
    idx, dy = np.array([0, 4], np.int64), rand((2, 3), np.float32)
    m = ms_model("GatherGrad", ["shape", "i", "dy"], {"i": idx, "dy": dy}, {"shape": i64(4, 3)})
    with pytest.raises(InputError, match="holds 4 at \\[1\\]"):
        run_edgetrain(m, {"i": idx, "dy": dy})


@pytest.mark.parametrize("shape, starts, ends, axes, steps", [
    ((5, 4, 6), [1, -1], [4, -6], [0, 2], [2, -2]),
    ((6, 3), [-2], [I64_MAX], None, None),
    ((4, 5), [3, 0], [I64_MIN, 5], [0, -1], [-1, 2]),
])
def test_slice_grad_kernel(shape, starts, ends, axes, steps):
    """The reference evaluator's Slice of the element positions says where each dY element goes."""
    consts = {"starts": i64(*starts), "ends": i64(*ends)}
    if axes is not None:
        consts["axes"] = i64(*axes)
    if steps is not None:
        consts["steps"] = i64(*steps)
    where = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    node = helper.make_node("Slice", ["x"] + list(consts), ["y"])
    pos, = run_reference(model(node, {"x": where}, ["y"], initializers=consts), {"x": where})
    dy = rand(pos.shape, np.float32, "dy")
    m = ms_model("SliceGrad", ["dy", "shape"] + list(consts), {"dy": dy}, {"shape": i64(*shape), **consts})
    dx, = run_edgetrain(m, {"dy": dy})
    ref = np.zeros(shape, np.float32)
    for k in np.ndindex(pos.shape):
        ref.reshape(-1)[pos[k]] += dy[k]
    np.testing.assert_array_equal(dx, ref)


@pytest.mark.parametrize("ratio, training, scale", [(0.25, True, 4 / 3), (0.0, True, None), (0.4, False, None),
                                                    (None, True, 2.0), (0.3, None, None)])
def test_dropout_grad_kernel(ratio, training, scale):
    """dX = dY * mask / (1 - ratio) in training mode (ratio defaults to 0.5); dY with ratio 0 or in inference mode."""
    dy = rand((6, 7), np.float32, "dy")
    mask = rand((6, 7), np.bool_, "mask")
    consts = {"r": None if ratio is None else np.array(ratio, np.float32),
              "t": None if training is None else np.array(training)}
    inputs = ["dy", "mask", "r" if ratio is not None else "", "t" if training is not None else ""]
    while inputs[-1] == "":
        inputs.pop()
    m = ms_model("DropoutGrad", inputs, {"dy": dy, "mask": mask}, {k: v for k, v in consts.items() if v is not None})
    dx, = run_edgetrain(m, {"dy": dy, "mask": mask})
    ref = dy.copy() if scale is None else np.array([d * float(k) * scale for d, k in zip(dy.flat, mask.flat)],
                                                   np.float32).reshape(dy.shape)
    np.testing.assert_allclose(dx, ref, rtol=1e-6)


@pytest.mark.parametrize("attrs, scales", [
    ({"mode": "linear"}, (1, 1, 2.5, 0.6)),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, (1, 1, 1.5, 3)),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, (1, 1, 0.7, 2)),
])
def test_resize_grad_kernel_is_the_adjoint_of_onnxruntime_resize(attrs, scales):
    """<Resize(x), dY> == <x, ResizeGrad(dY)> for random x, with onnxruntime computing Resize."""
    x = rand((2, 3, 5, 4), np.float32, "x")
    scales = np.array(scales, np.float32)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    y, = run_onnxruntime(model(node, {"x": x}, ["y"], initializers={"scales": scales}, opset=19), {"x": x})
    dy = rand(y.shape, np.float32, "dy")
    m = ms_model("ResizeGrad", ["dy", "x", "", "scales"], {"dy": dy, "x": x}, {"scales": scales}, attrs, opset=19)
    dx, = run_edgetrain(m, {"dy": dy, "x": x})
    assert dx.shape == x.shape
    np.testing.assert_allclose(np.vdot(y.astype(np.float64), dy), np.vdot(x.astype(np.float64), dx), rtol=1e-5)


# --- Range, Trilu, Tile ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, start, limit, delta", [
    (np.float32, 0.5, 3.2, 0.7), (np.float64, 5.0, -1.0, -1.5), (np.int64, 10, -3, -4), (np.int32, 0, 7, 2),
    (np.int64, 3, 3, 1), (np.int64, 5, 0, 1), (np.int16, -2, 9, 3)], ids=str)
def test_range_folds_as_the_spec_says(dtype, start, limit, delta):
    """start + i * delta for max(ceil((limit - start) / delta), 0) elements, against the ONNX reference (whose
    float arithmetic is the spec's formula; onnxruntime accumulates) and onnxruntime for integers."""
    consts = {"s": np.array(start, dtype), "l": np.array(limit, dtype), "d": np.array(delta, dtype)}
    x = np.zeros(1, np.float32)
    m = model([helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
              {"x": x}, ["y"], initializers=consts)
    assert_matches(m, {"x": x}, oracle=run_reference if np.dtype(dtype).kind == "f" else run_onnxruntime)


def test_range_of_a_shape_folds_and_a_fed_limit_is_named():
    """nanoGPT's positions: Range(0, Shape(x)[1], 1) folds when planning; a limit fed at run time is planned per
    value."""
    x = np.zeros((2, 7), np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape", "zero"], ["t"]),
             helper.make_node("Range", ["s", "t", "d"], ["y"])]
    consts = {"s": np.array(0, np.int64), "d": np.array(1, np.int64), "zero": np.array([0], np.int64)}
    (y,) = run_edgetrain(model(nodes, {"x": x}, ["y"], initializers=consts), {"x": x})
    np.testing.assert_array_equal(y, np.arange(7))
    fed = model([helper.make_node("Range", ["s", "t", "d"], ["y"])], {"t": np.array(5, np.int64)}, ["y"],
                initializers={"s": np.array(0, np.int64), "d": np.array(1, np.int64)})
    np.testing.assert_array_equal(run_edgetrain(fed, {"t": np.array(5, np.int64)})[0], np.arange(5))
    zero = model([helper.make_node("Range", ["s", "l", "d"], ["y"])], {"x": x}, ["y"],
                 initializers={"s": np.array(0, np.int64), "l": np.array(3, np.int64), "d": np.array(0, np.int64)})
    with pytest.raises(ShapeError, match="delta must not be 0"):
        run_edgetrain(zero, {"x": x})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -2, 0, 1, 7])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 6, 4)], ids=str)
def test_trilu_against_onnxruntime(upper, k, shape):
    x = rng_for("trilu", upper, k, shape).standard_normal(shape).astype(np.float32)
    inputs, consts = ["x"], {}
    if k is not None:
        inputs.append("k")
        consts["k"] = np.array(k, np.int64)
    m = model(helper.make_node("Trilu", inputs, ["y"], upper=upper), {"x": x}, ["y"], initializers=consts)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


def test_trilu_zeroes_nan_outside_the_triangle_and_keeps_integers():
    x = np.full((3, 3), np.nan, np.float32)
    (y,) = run_edgetrain(model(helper.make_node("Trilu", ["x"], ["y"]), {"x": x}, ["y"]), {"x": x})
    assert np.isnan(y[np.triu_indices(3)]).all() and (y[np.tril_indices(3, -1)] == 0).all()
    xi = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert_matches(model(helper.make_node("Trilu", ["x"], ["y"], upper=0), {"x": xi}, ["y"]), {"x": xi},
                   oracle=run_onnxruntime)


@pytest.mark.parametrize("reps", [(1, 1, 1), (2, 1, 3), (1, 4, 1), (3, 2, 2), (0, 1, 2)], ids=str)
def test_tile_against_onnxruntime(reps):
    x = rng_for("tile", reps).standard_normal((2, 3, 4)).astype(np.float32)
    m = model(helper.make_node("Tile", ["x", "r"], ["y"]), {"x": x}, ["y"], initializers={"r": np.array(reps, np.int64)})
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


def test_trilu_and_tile_gradients_by_finite_differences():
    f64 = lambda *s: TensorType(np.float64, s)  # noqa: E731
    x = rng_for("grad").standard_normal((2, 3, 4))
    check_gradients([Node("Trilu", ["x", "k"], ["y"], {"upper": 0}, "tri")], {"x": x}, ["y"], [f64(2, 3, 4)],
                    consts={"k": np.array(1, np.int64)})
    check_gradients([Node("Tile", ["x", "r"], ["y"], {}, "tile")], {"x": x}, ["y"], [f64(4, 3, 12)],
                    consts={"r": np.array([2, 1, 3], np.int64)})


# --- GatherElements and onnxruntime's GatherElementsGrad ------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("index_shape", [(3, 4, 5), (2, 3, 4), (3, 4, 1)], ids=str)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32], ids=str)
def test_gather_elements_against_onnxruntime(axis, index_shape, index_dtype):
    rng = rng_for("gather_elements", axis, index_shape)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    n = x.shape[axis]
    idx = rng.integers(-n, n, index_shape).astype(index_dtype)          # negative indices count from the end
    m = model(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis), {"x": x, "i": idx}, ["y"])
    assert_matches(m, {"x": x, "i": idx}, oracle=run_onnxruntime)


@pytest.mark.parametrize("bad", [5, -6, 2**40, -(2**63)])
def test_gather_elements_refuses_an_index_outside_the_axis(bad):
    x = np.zeros((2, 5), np.float32)
    idx = np.array([[0, 1], [bad, 2]], np.int64)
    m = model(helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="ge"), {"x": x, "i": idx}, ["y"])
    with pytest.raises(InputError, match=rf"'ge'.*input 1 \('i'\) holds {bad} at \[1, 0\]"):
        run_edgetrain(m, {"x": x, "i": idx})


def test_gather_elements_gradient_adds_repeated_indices():
    """Finite differences through GatherElementsGrad, with indices that repeat (their gradients add)."""
    x = rng_for("ge-grad").standard_normal((3, 4))
    idx = np.array([[0, 0, 2], [1, 3, 3], [2, 2, 2]], np.int64)
    check_gradients([Node("GatherElements", ["x", "i"], ["y"], {"axis": 1}, "ge")], {"x": x}, ["y"],
                    [TensorType(np.float64, (3, 3))], consts={"i": idx})


def _distinct_indices(rng, shape, axis, n):
    """Indices of ``shape`` that never repeat along ``axis`` (so reduction 'none' has one answer)."""
    moved = [d for k, d in enumerate(shape) if k != axis]
    rows = np.stack([rng.permutation(n)[:shape[axis]] for _ in range(int(np.prod(moved)))])
    return np.moveaxis(rows.reshape(moved + [shape[axis]]), -1, axis).astype(np.int64)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_against_onnxruntime(reduction, axis):
    rng = rng_for("scatter", reduction, axis)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    shape = [3, 4, 5]
    shape[axis] = 2
    idx = _distinct_indices(rng, shape, axis % 3, x.shape[axis])
    u = rng.standard_normal(shape).astype(np.float32)
    m = model(helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction),
              {"x": x, "i": idx, "u": u}, ["y"], opset=18)
    assert_matches(m, {"x": x, "i": idx, "u": u}, oracle=run_onnxruntime)


def test_scatter_elements_refuses_an_index_outside_the_axis():
    x, u = np.zeros((2, 3), np.float32), np.ones((2, 1), np.float32)
    idx = np.array([[1], [3]], np.int64)
    m = model(helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, name="sc"),
              {"x": x, "i": idx, "u": u}, ["y"], opset=18)
    with pytest.raises(InputError, match=r"'sc'.*input 1 \('i'\) holds 3 at \[1, 0\]"):
        run_edgetrain(m, {"x": x, "i": idx, "u": u})


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_gradients_by_finite_differences(reduction):
    rng = rng_for("scatter-grad", reduction)
    x, u = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    idx = _distinct_indices(rng, [3, 2], 1, 4) if reduction == "none" else np.array([[0, 0], [3, 1], [2, 2]])
    check_gradients([Node("ScatterElements", ["x", "i", "u"], ["y"], {"axis": 1, "reduction": reduction}, "sc")],
                    {"x": x, "u": u}, ["y"], [TensorType(np.float64, (3, 4))], consts={"i": idx}, opset=18)


@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_opset10_against_onnxruntime_and_its_gradient(axis):
    """Scatter (opsets 9-10) is ScatterElements without reduction; a bad index is refused the same way."""
    rng = rng_for("scatter10", axis)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    shape = [3, 4]
    shape[axis] = 2
    idx = _distinct_indices(rng, shape, axis % 2, x.shape[axis])
    u = rng.standard_normal(shape).astype(np.float32)
    m = model(helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=axis, name="sc"), {"x": x, "i": idx, "u": u},
              ["y"], opset=10)
    assert_matches(m, {"x": x, "i": idx, "u": u}, oracle=run_onnxruntime)
    check_gradients([Node("Scatter", ["x", "i", "u"], ["y"], {"axis": axis}, "sc")],
                    {"x": x.astype(np.float64), "u": u.astype(np.float64)}, ["y"], [TensorType(np.float64, (3, 4))],
                    consts={"i": idx}, opset=10)
    bad = idx.copy()
    bad.reshape(-1)[1] = 7
    with pytest.raises(InputError, match=r"'sc'.*input 1 \('i'\) holds 7"):
        run_edgetrain(m, {"x": x, "i": bad, "u": u})


@pytest.mark.parametrize("limit", [np.inf, np.nan])
def test_range_refuses_a_non_finite_bound(limit):
    """A hostile model's limit of inf or NaN: a ShapeError naming the node, not an OverflowError from int()."""
    consts = {"s": np.array(0, np.float32), "l": np.array(limit, np.float32), "d": np.array(1, np.float32)}
    x = np.zeros(1, np.float32)
    m = model([helper.make_node("Range", ["s", "l", "d"], ["y"], name="rng")], {"x": x}, ["y"], initializers=consts)
    with pytest.raises(ShapeError, match="'rng'.*must be finite"):
        run_edgetrain(m, {"x": x})


def test_trilu_and_range_refuse_malformed_scalars():
    x = np.zeros((3, 3), np.float32)
    m = model(helper.make_node("Trilu", ["x", "k"], ["y"], name="tri"), {"x": x}, ["y"],
              initializers={"k": np.array([1, 2], np.int64)})
    with pytest.raises(ShapeError, match="'tri'.*k must be one int64"):
        run_edgetrain(m, {"x": x})
    consts = {"s": np.array([0, 1], np.int64), "l": np.array(3, np.int64), "d": np.array(1, np.int64)}
    m = model([helper.make_node("Range", ["s", "l", "d"], ["y"], name="rng")], {"x": x}, ["y"], initializers=consts)
    with pytest.raises(ShapeError, match="'rng'.*must be scalars"):
        run_edgetrain(m, {"x": x})


# --- OneHot, EyeLike -------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32, np.float32], ids=str)
def test_one_hot_against_reference(axis, idx_dtype):
    """Negative indices count back; indices outside [-depth, depth) give rows of off_value (the reference
    evaluator: onnxruntime lacks most index/value type pairs)."""
    idx = np.array([[0, 3, -1], [-4, 5, 2]], idx_dtype) if idx_dtype != np.float32 else np.array(
        [[0.0, 3.0, -1.0], [-4.0, 9.0, 2.0]], np.float32)   # integral: the evaluator does not truncate
    values = np.array([-2.0, 5.0], np.float32)
    m = model(helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis), {"i": idx}, ["y"],
              initializers={"d": np.array(4, np.int64), "v": values}, opset=11)
    assert_matches(m, {"i": idx}, oracle=run_reference)


def test_one_hot_with_nan_and_huge_indices_writes_only_off_values():
    idx = np.array([np.nan, 1e30, -1e30, np.inf, 1.0], np.float32)
    m = model(helper.make_node("OneHot", ["i", "d", "v"], ["y"]), {"i": idx}, ["y"],
              initializers={"d": np.array(3, np.int64), "v": np.array([0, 1], np.int64)}, opset=11)
    y = run_edgetrain(m, {"i": idx})[0]
    np.testing.assert_array_equal(y, [[0, 0, 0]] * 4 + [[0, 1, 0]])


@pytest.mark.parametrize("k", [0, 1, -2, 7])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.DOUBLE])
def test_eye_like_against_onnxruntime(k, dtype):
    x = np.zeros((3, 5), np.float32)
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    m = model(helper.make_node("EyeLike", ["x"], ["y"], **attrs), {"x": x}, ["y"], opset=9)
    assert_matches(m, {"x": x}, oracle=run_onnxruntime)


# --- ReverseSequence ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("time_axis", [0, 1])
def test_reverse_sequence_against_onnxruntime_and_its_gradient(time_axis):
    batch_axis = 1 - time_axis
    shape = [5, 3, 2] if time_axis == 0 else [3, 5, 2]
    x = rng_for("revseq", time_axis).standard_normal(shape).astype(np.float32)
    lens = np.array([5, 0, 3], np.int64)
    m = model(helper.make_node("ReverseSequence", ["x", "l"], ["y"], time_axis=time_axis, batch_axis=batch_axis,
                               name="rs"), {"x": x, "l": lens}, ["y"], opset=10)
    assert_matches(m, {"x": x, "l": lens}, oracle=run_onnxruntime)
    check_gradients([Node("ReverseSequence", ["x", "l"], ["y"], {"time_axis": time_axis, "batch_axis": batch_axis},
                          "rs")], {"x": x.astype(np.float64)}, ["y"], [TensorType(np.float64, tuple(shape))],
                    consts={"l": lens}, opset=10)
    with pytest.raises(InputError, match=r"'rs'.*input 1 \('l'\) holds 6 at \[1\]"):
        run_edgetrain(m, {"x": x, "l": np.array([1, 6, 2], np.int64)})
