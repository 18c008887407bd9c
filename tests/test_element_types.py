"""float16 models (computed in float32 inside a plan, plan/widen.py) against onnxruntime, and the edges of that
choice: Casts round as numpy does, float16 sizes are still weighed against the budget, float16 parameters are
refused for training, bfloat16 is taken only by ops that move or convert values. Then the integer and bool
types a few ops declare beyond the arithmetic ones: bool ReduceMax/ReduceMin, 8-bit MaxPool, any-integer TopK."""
import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from edgetrain import InferenceSession, artifacts
from edgetrain.errors import EdgetrainError, MemoryBudgetError, UnsupportedOpError

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT
MB = 10**6


def _model(nodes, inputs, outputs, inits=(), opset=17) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _ort(model: bytes, feeds):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def _mlp(rng) -> bytes:
    w1, b1 = rng.standard_normal((8, 16)).astype(np.float16), rng.standard_normal(16).astype(np.float16)
    w2 = (rng.standard_normal((16, 4)) / 4).astype(np.float16)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F16, ["n", 8])],
                  [helper.make_tensor_value_info("logits", F16, None), helper.make_tensor_value_info("p", F16, None)],
                  [("w1", w1), ("b1", b1), ("w2", w2)])


def test_a_float16_mlp_agrees_with_onnxruntime():
    rng = np.random.default_rng(0)
    model = _mlp(rng)
    x = rng.standard_normal((5, 8)).astype(np.float16)
    sess = InferenceSession(model)
    got, want = sess.run(None, {"x": x}), _ort(model, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == np.float16 and g.shape == w.shape
        # edgetrain keeps float32 between ops, onnxruntime rounds each to float16: a float16 ulp or two apart
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=4e-3, atol=4e-3)
    assert [a.type for a in sess.get_inputs()] == ["tensor(float16)"]
    assert [a.type for a in sess.get_outputs()] == ["tensor(float16)"] * 2


def test_a_float16_cnn_agrees_with_onnxruntime():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((4, 2, 3, 3)) / 3).astype(np.float16)
    stats = [rng.uniform(0.5, 1.5, 4).astype(np.float16), rng.standard_normal(4).astype(np.float16),
             rng.standard_normal(4).astype(np.float16), rng.uniform(0.5, 1.5, 4).astype(np.float16)]
    fc = rng.standard_normal((4, 3)).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["mp"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["f"]), helper.make_node("MatMul", ["f", "fc"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F16, [2, 2, 8, 8])],
                   [helper.make_tensor_value_info("y", F16, [2, 3])],
                   [("w", w), ("s", stats[0]), ("b", stats[1]), ("m", stats[2]), ("v", stats[3]), ("fc", fc)])
    x = rng.standard_normal((2, 2, 8, 8)).astype(np.float16)
    got = InferenceSession(model).run(None, {"x": x})[0]
    want = _ort(model, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=4e-3, atol=4e-3)


# float32 values at float16's rounding edges: ties to even, the largest finite value and past it, subnormals,
# below the smallest subnormal, signed zero, inf, nan
EDGES = np.array([1 + 2**-11, 1 + 3 * 2**-11, 2049, 2051, 65504, 65519.99, 65520, 1e6, 2**-24, 2**-25,
                  3 * 2**-26, 2**-26, 6.1e-5, -0.0, np.inf, -np.inf, np.nan, -3.14159], np.float32)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_casts_round_to_nearest_even_as_numpy_does():
    """float32 -> float16 -> float32 -> float16 and float64 -> float16 inside one graph: each Cast to float16
    rounds (the middle one is observable only through the float32 output after it)."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=F16), helper.make_node("Cast", ["h"], ["back"], to=F32),
             helper.make_node("Mul", ["back", "two"], ["twice"]),
             helper.make_node("Cast", ["twice"], ["h2"], to=F16),
             helper.make_node("Cast", ["d"], ["hd"], to=F16), helper.make_node("Cast", ["i"], ["hi"], to=F16)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [len(EDGES)]),
                           helper.make_tensor_value_info("d", TensorProto.DOUBLE, [4]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                   [helper.make_tensor_value_info(n, t, None) for n, t in
                    (("h", F16), ("back", F32), ("h2", F16), ("hd", F16), ("hi", F16))],
                   [("two", np.array(2, np.float32))])
    # 1 + 2**-11 + 2**-40: a double just past a float16 tie; rounding it through float32 first would tie to even
    feeds = {"x": EDGES, "d": np.array([1 + 2**-11 + 2**-40, 1e-8, 65520.5, -2.5], np.float64),
             "i": np.array([2049, 70000, -65505], np.int64)}
    got = InferenceSession(model).run(None, feeds)
    h = EDGES.astype(np.float16)
    want = [h, h.astype(np.float32), (h.astype(np.float32) * 2).astype(np.float16),
            feeds["d"].astype(np.float16), feeds["i"].astype(np.float16)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    # onnxruntime agrees except from double, which it rounds through float32 (1 + 2**-11 + 2**-40 ties to 1.0)
    for name, g, w in zip(("h", "back", "h2", "hd", "hi"), got, _ort(model, feeds)):
        if name != "hd":
            np.testing.assert_array_equal(g, w)


def test_castlike_and_constants_keep_float16():
    """CastLike to a float16 tensor rounds; a float16 Constant and a folded float16 subgraph enter as float16."""
    nodes = [helper.make_node("CastLike", ["x", "like"], ["y"]),
             helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([1.5, 1e-4], np.float16))),
             helper.make_node("Neg", ["k"], ["nk"]), helper.make_node("Add", ["y", "nk"], ["z"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [2]), helper.make_tensor_value_info("like", F16, [1])],
                   [helper.make_tensor_value_info("y", F16, None), ValueInfoProto(name="z")])    # z: no type
    feeds = {"x": np.array([1 + 2**-11, 3.0e-5], np.float32), "like": np.zeros(1, np.float16)}
    sess = InferenceSession(model)
    got = sess.run(None, feeds)
    assert sess.get_outputs()[1].type == "tensor(float16)"       # as ONNX types it, not as edgetrain computes it
    # numpy as the oracle: onnxruntime's optimizer drops the CastLike's rounding when it runs Add in float32
    y = feeds["x"].astype(np.float16)
    want = [y, (y.astype(np.float32) - np.array([1.5, 1e-4], np.float16).astype(np.float32)).astype(np.float16)]
    for g, w in zip(got, want):
        assert g.dtype == np.float16
        np.testing.assert_array_equal(g, w)


def test_a_float16_constant_is_weighed_against_the_budget():
    """ConstantOfShape of float16 ones sized past the budget is refused while folding, before allocating; a
    float16 initializer within the budget whose float32 copy is not is refused when planning."""
    shape = numpy_helper.from_array(np.array([2_000_000_000], np.int64), "shape")    # 4 GB of float16
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=helper.make_tensor("v", F16, [1], [1.0])), helper.make_node("Add", ["x", "c"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F16, [1])], [helper.make_tensor_value_info("y", F16, None)])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F16, [1])],
                              [helper.make_tensor_value_info("y", F16, None)], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(MemoryBudgetError, match="ConstantOfShape"):
        InferenceSession(model, max_memory=100 * MB).run(None, {"x": np.ones(1, np.float16)})

    w = np.ones(6 * MB, np.float16)                 # 12 MB as float16, 24 MB as float32
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F16, [1])],
                   [helper.make_tensor_value_info("y", F16, None)], [("w", w)])
    with pytest.raises(MemoryBudgetError, match="float16"):
        InferenceSession(model, max_memory=20 * MB).run(None, {"x": np.ones(1, np.float16)})
    y = InferenceSession(model, max_memory=200 * MB).run(None, {"x": np.full(1, 0.5, np.float16)})[0]
    assert y.dtype == np.float16 and y.shape == w.shape and np.all(y == np.float16(1.5))


def test_training_float16_parameters_is_refused_naming_the_parameter(tmp_path):
    rng = np.random.default_rng(2)
    model = _mlp(rng)
    with pytest.raises(EdgetrainError, match="parameter 'w1'.*float32"):
        artifacts.generate_artifacts(model, requires_grad=["w1"], loss=artifacts.LossType.MSELoss,
                                     loss_input_names=["logits"], optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=tmp_path)


def test_bfloat16_is_cast_and_moved_but_not_computed():
    bf16 = np.dtype(ml_dtypes.bfloat16)
    nodes = [helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
             helper.make_node("Transpose", ["b"], ["bt"]), helper.make_node("Cast", ["bt"], ["y"], to=F32)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [len(EDGES), 1])],
                   [helper.make_tensor_value_info("b", TensorProto.BFLOAT16, None),
                    helper.make_tensor_value_info("y", F32, None)])
    x = (EDGES * np.float32(1.01)).reshape(-1, 1)
    b, y = InferenceSession(model).run(None, {"x": x})
    assert b.dtype == bf16
    np.testing.assert_array_equal(b.astype(np.float32), x.astype(bf16).astype(np.float32))
    np.testing.assert_array_equal(y, x.astype(bf16).astype(np.float32).T)

    add = _model([helper.make_node("Add", ["a", "a"], ["s"], name="twice")],
                 [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [2])],
                 [helper.make_tensor_value_info("s", TensorProto.BFLOAT16, None)])
    with pytest.raises(UnsupportedOpError, match="twice.*bfloat16"):
        InferenceSession(add).run(None, {"a": np.ones(2, bf16)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("shape,axes,keepdims", [((3, 4), [1], 1), ((3, 4, 5), [0, 2], 0), ((2, 0, 3), [1], 1),
                                                 ((3, 4), None, 0)])
def test_bool_reduce_max_min_are_any_and_all(op, shape, axes, keepdims):
    inits = [] if axes is None else [("axes", np.array(axes, np.int64))]
    inputs = ["x"] + ([] if axes is None else ["axes"])
    model = _model([helper.make_node(op, inputs, ["y"], keepdims=keepdims)],
                   [helper.make_tensor_value_info("x", TensorProto.BOOL, list(shape))],
                   [helper.make_tensor_value_info("y", TensorProto.BOOL, None)], inits, opset=20)
    x = np.random.default_rng(3).random(shape) > 0.3
    got = InferenceSession(model).run(None, {"x": x})[0]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype,elem", [(np.uint8, TensorProto.UINT8), (np.int8, TensorProto.INT8)])
def test_8bit_max_pool_agrees_with_onnxruntime(dtype, elem):
    info = np.iinfo(dtype)
    x = np.random.default_rng(4).integers(info.min, info.max, (2, 3, 7, 7), endpoint=True).astype(dtype)
    for attrs in ({"kernel_shape": [2, 2], "strides": [2, 2]}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}):
        model = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)],
                       [helper.make_tensor_value_info("x", elem, list(x.shape))],
                       [helper.make_tensor_value_info("y", elem, None)], opset=12)
        got = InferenceSession(model).run(None, {"x": x})[0]
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, _ort(model, {"x": x})[0])


@pytest.mark.parametrize("dtype,elem", [(np.uint64, TensorProto.UINT64), (np.int8, TensorProto.INT8),
                                        (np.uint16, TensorProto.UINT16)])
@pytest.mark.parametrize("largest", [0, 1])
def test_integer_top_k_agrees_with_the_reference(dtype, elem, largest):
    x = np.random.default_rng(5).integers(0, 20, (3, 9)).astype(dtype)      # ties: lower index first
    if dtype == np.uint64:
        x[0, :3] = [2**64 - 1, 2**63, 2**63 + 1]                           # beyond int64
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)],
                   [helper.make_tensor_value_info("x", elem, list(x.shape))],
                   [helper.make_tensor_value_info("v", elem, None),
                    helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                   [("k", np.array([4], np.int64))], opset=11)
    got = InferenceSession(model).run(None, {"x": x})
    for g, w in zip(got, ReferenceEvaluator(model).run(None, {"x": x})):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_castlike_of_a_constant_folds_without_the_like_value():
    """Pad's constant_value = CastLike(constant, X) with X fed: the value is known when planning (only X's type
    matters), as the Attention function body's padding needs."""
    nodes = [helper.make_node("CastLike", ["neg_inf", "x"], ["fill"]),
             helper.make_node("Pad", ["x", "pads", "fill"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F16, [8, 10])],     # too big to plan per value
                   [helper.make_tensor_value_info("y", F16, None)],
                   [("neg_inf", np.array([-np.inf], np.float32)), ("pads", np.array([0, 1, 0, 2], np.int64))], opset=21)
    x = np.arange(80, dtype=np.float16).reshape(8, 10)
    got = InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (1, 2)], constant_values=-np.inf))


SMALL_TYPES = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
               TensorProto.FLOAT4E2M1, TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2]


@pytest.mark.parametrize("to", SMALL_TYPES, ids=lambda t: TensorProto.DataType.Name(t))
@pytest.mark.parametrize("saturate", [0, 1])
def test_casts_to_and_from_the_ml_dtypes_types_agree_with_the_reference(to, saturate):
    """float32 -> small type -> float16 and -> int8, with values past the range, ties, inf and nan: the small
    type rounds (and saturates) as onnx's reference does, and going back is exact."""
    x = np.array([0.3, -1.7, 2.5, 3.5, 7.5, -9.0, 300.0, 1e5, -1e9, np.inf, -np.inf, np.nan, -0.0, 0.0139],
                 np.float32)
    if to in (TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2):
        x = x[np.isfinite(x) & (np.abs(x) < 100)]       # float -> int outside the range is not defined
    nodes = [helper.make_node("Cast", ["x"], ["small"], to=to, saturate=saturate),
             helper.make_node("Reshape", ["small", "shape"], ["moved"]),
             helper.make_node("Cast", ["moved"], ["half"], to=F16)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [len(x)])],
                   [helper.make_tensor_value_info("small", to, None), helper.make_tensor_value_info("half", F16, None)],
                   [("shape", np.array([1, -1], np.int64))], opset=21)
    got = InferenceSession(model).run(None, {"x": x})
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32))


def test_a_float16_initializer_whose_data_does_not_fill_its_dims_is_named():
    """dims of 10**9 float16 values over 8 bytes of data: a load error naming the initializer, nothing allocated."""
    from edgetrain.errors import ModelLoadError

    w = TensorProto(name="w", data_type=F16, dims=[10**9], raw_data=b"\0" * 8)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F16, [1])],
                              [helper.make_tensor_value_info("y", F16, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(ModelLoadError, match="initializer 'w'.*1000000000"):
        InferenceSession(model)
