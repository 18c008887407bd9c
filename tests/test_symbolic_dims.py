"""Models whose every input axis is dynamic (issue 12, item 1): artifacts type them symbolically.

The unifier (edgetrain/autodiff/symbolic.py) ties a symbol to the size or formula the graph forces on it
(Gemm's K, BatchNorm's and Conv's channels, broadcasting against a constant, labels against logits [N*T, V]);
the written value_info keeps every other dim symbolic, as onnx.shape_inference does; the artifacts train at
two batch sizes exactly as ORT 1.19.2 trains its own artifacts for the same model.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from edgetrain import artifacts
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.autodiff.builder import symbolic_types
from edgetrain.errors import ShapeError
from edgetrain.onnx_io import to_graph


def _weight(name, shape, rng, scale=0.1, offset=0.0):
    return numpy_helper.from_array((offset + scale * rng.standard_normal(shape)).astype(np.float32), name)


def _model(name, nodes, inputs, outputs, inits):
    graph = h.make_graph(nodes, name, [h.make_tensor_value_info(*i) for i in inputs],
                         [h.make_tensor_value_info(*o) for o in outputs], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)   # ORT 1.19 reads IR <= 10


def mlp():
    """[batch, features] into a Gemm with 784 inputs, then a MatMul."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
             h.make_node("Relu", ["h"], ["r"], name="relu"),
             h.make_node("MatMul", ["r", "w2"], ["m"], name="fc2"),
             h.make_node("Add", ["m", "b2"], ["logits"], name="bias2")]
    inits = [_weight("w1", (32, 784), rng, 0.05), _weight("b1", (32,), rng), _weight("w2", (32, 10), rng),
             _weight("b2", (10,), rng)]
    return _model("mlp", nodes, [("x", TensorProto.FLOAT, ["batch", "features"])],
                  [("logits", TensorProto.FLOAT, ["batch", 10])], inits)


def cnn():
    """BatchNorm on [N, C, H, W], all dynamic, then Conv, BatchNorm, ReLU, global pooling and a Gemm; exported
    in training mode, as torch writes it (ORT trains BatchNorm on batch statistics whatever the mode)."""
    rng = np.random.default_rng(1)
    inits = []

    def batchnorm(name, x, y, c):
        inits.extend([_weight(f"{name}.scale", (c,), rng, 0.1, 1.0), _weight(f"{name}.bias", (c,), rng),
                      _weight(f"{name}.mean", (c,), rng),
                      numpy_helper.from_array((1 + 0.1 * rng.random(c)).astype(np.float32), f"{name}.var")])
        return h.make_node("BatchNormalization", [x] + [f"{name}.{k}" for k in ("scale", "bias", "mean", "var")],
                           [y, f"{name}.running_mean", f"{name}.running_var"], name=name, training_mode=1)

    nodes = [batchnorm("bn0", "x", "a", 3),
             h.make_node("Conv", ["a", "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             batchnorm("bn1", "c", "d", 8),
             h.make_node("Relu", ["d"], ["e"], name="relu"),
             h.make_node("GlobalAveragePool", ["e"], ["p"], name="gap"),
             h.make_node("Flatten", ["p"], ["f"], name="flatten"),
             h.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], transB=1, name="fc")]
    inits += [_weight("conv.w", (8, 3, 3, 3), rng, 0.3), _weight("conv.b", (8,), rng),
              _weight("fc.w", (5, 8), rng, 0.5), _weight("fc.b", (5,), rng)]
    return _model("cnn", nodes, [("x", TensorProto.FLOAT, ["N", "C", "H", "W"])],
                  [("logits", TensorProto.FLOAT, ["N", 5])], inits)


def bcast():
    """[N, F] broadcast against constants [1, 16] and [16], then a MatMul: F is 16 (1 would broadcast too,
    but ONNX and ORT read the broadcast of a symbol against 16 as 16)."""
    rng = np.random.default_rng(2)
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Mul", ["r", "scale"], ["s"], name="scale_mul"),
             h.make_node("Add", ["s", "shift"], ["t"], name="shift_add"),
             h.make_node("MatMul", ["t", "w"], ["logits"], name="fc")]
    inits = [_weight("scale", (1, 16), rng, 0.1, 1.0),
             numpy_helper.from_array(np.linspace(-1, 1, 16).astype(np.float32), "shift"),
             _weight("w", (16, 4), rng, 0.3)]
    return _model("bcast", nodes, [("x", TensorProto.FLOAT, ["N", "F"])],
                  [("logits", TensorProto.FLOAT, ["N", 4])], inits)


def lm():
    """Token ids [N, T] -> embedding -> vocabulary head -> logits reshaped to [N*T, V] (the output declares
    its own symbol, 'NT', as exporters write it); the labels CrossEntropy makes are then [N*T]."""
    rng = np.random.default_rng(3)
    nodes = [h.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
             h.make_node("MatMul", ["e", "w"], ["z"], name="head"),
             h.make_node("Reshape", ["z", "shape"], ["logits"], name="flat")]
    inits = [_weight("emb", (12, 8), rng, 0.5), _weight("w", (8, 12), rng, 0.5),
             numpy_helper.from_array(np.array([-1, 12], np.int64), "shape")]
    return _model("lm", nodes, [("ids", TensorProto.INT64, ["N", "T"])],
                  [("logits", TensorProto.FLOAT, ["NT", 12])], inits)


def _batches(name, rng):
    """Eight steps alternating two batch sizes (and, where the model leaves them free, other dims)."""
    out = []
    for step in range(8):
        n = (4, 7)[step % 2]
        if name == "mlp":
            out.append([rng.standard_normal((n, 784)).astype(np.float32), rng.integers(0, 10, n)])
        elif name == "cnn":
            hw = (6, 6) if step % 2 else (5, 7)
            out.append([rng.standard_normal((n, 3, *hw)).astype(np.float32), rng.integers(0, 5, n)])
        elif name == "bcast":
            out.append([rng.standard_normal((n, 16)).astype(np.float32), rng.integers(0, 4, n)])
        else:
            t = (5, 3)[step % 2]
            out.append([rng.integers(0, 12, (n, t)), rng.integers(0, 12, n * t)])
    return out


# builder, trainable parameters, frozen ones (BatchNorm's running statistics, as `edgetrain artifacts` freezes them)
MODELS = {"mlp": (mlp, ["w1", "b1", "w2", "b2"], []),
          "cnn": (cnn, ["conv.w", "conv.b", "bn1.scale", "bn1.bias", "fc.w", "fc.b"],
                  [f"bn{k}.{s}" for k in (0, 1) for s in ("mean", "var")]),
          "bcast": (bcast, ["scale", "w"], []),
          "lm": (lm, ["emb", "w"], [])}
# symbols the graph ties to a size (the model's own weights say so; onnx.shape_inference keeps the name)
FIXED = {"mlp": {"features": 784}, "cnn": {"C": 3}, "bcast": {"F": 16}, "lm": {}}
# dims onnx.shape_inference leaves unknown ('unk__k') or takes from the output's declaration, and the graph says
EXPECTED = {"cnn": {"c": ["N", 8, "H", "W"], "e": ["N", 8, "H", "W"]},
            "lm": {"logits": ["N*T", 12], "labels": ["N*T"]}}

ORT_TRAIN = r'''
import onnx
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NoTorch"]   # torch is not installed
from onnxruntime.training import artifacts     # ORT's tools package asks importlib whether torch exists
d = ARGS["dir"]
artifacts.generate_artifacts(onnx.load(ARGS["model"]), requires_grad=ARGS["params"], frozen_params=ARGS["frozen"],
                             loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                             artifact_directory=d)
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
# no eval model: ORT's eval model of a BatchNorm exported in training mode does not load (ANCHORS.md)
m = ort_api.Module(d + "/training_model.onnx", state, session_options=so)
opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
opt.set_learning_rate(0.01)
m.train()
losses = []
for k in range(ARGS["steps"]):
    losses.append(float(m(ARRAYS[f"{k}/x"], ARRAYS[f"{k}/y"])))
    opt.step()
    m.lazy_reset_grad()
OUT["losses"] = losses
'''


def _generate(name, folder):
    build, params, frozen = MODELS[name]
    artifacts.generate_artifacts(build(), requires_grad=params, frozen_params=frozen, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=folder)


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.ort119
@pytest.mark.native
@pytest.mark.parametrize("name", sorted(MODELS))
def test_trains_at_two_batch_sizes_like_ort_on_its_own_artifacts(ort, tmp_path, name):
    _generate(name, tmp_path / "edgetrain")
    batches = _batches(name, np.random.default_rng(7))
    (tmp_path / "ort").mkdir()
    onnx.save(MODELS[name][0](), tmp_path / "model.onnx")
    out = ort.run(ORT_TRAIN, args={"dir": str(tmp_path / "ort"), "model": str(tmp_path / "model.onnx"),
                                   "params": MODELS[name][1], "frozen": MODELS[name][2], "steps": len(batches)},
                  arrays={f"{k}/{n}": a for k, b in enumerate(batches) for n, a in zip("xy", b)})
    folder = tmp_path / "edgetrain"
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    optimizer = Optimizer(folder / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.01)
    module.train()
    losses = []
    for x, y in batches:
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    assert np.ptp(losses) > 0.05, losses      # the comparison is not between two flat lines
    np.testing.assert_allclose(losses, out["losses"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_written_dims_are_symbolic_where_free_and_fixed_where_the_graph_fixes_them(tmp_path, name):
    _generate(name, tmp_path)
    model = MODELS[name][0]()
    theirs = {v.name: _dims(v) for v in onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
    for kind in ("training", "eval"):
        written = onnx.load(tmp_path / f"{kind}_model.onnx")
        ours = {v.name: _dims(v) for v in list(written.graph.value_info) + list(written.graph.input)}
        assert _dims(written.graph.input[0]) == _dims(model.graph.input[0])   # inputs as declared, as ORT
        for value, dims in theirs.items():
            if value not in ours:       # BatchNorm's running statistics: not outputs of its training form
                continue
            want = [FIXED[name].get(d, d) if isinstance(d, str) and not d.startswith("unk__") else d
                    for d in dims]
            got = [g if isinstance(w, (int, str)) and not str(w).startswith("unk__") else "?"
                   for g, w in zip(ours[value], want)]
            want = [w if isinstance(w, (int, str)) and not str(w).startswith("unk__") else "?" for w in want]
            assert got == want, f"{kind} model, value '{value}': {ours[value]}, onnx says {dims}"
        for value, dims in EXPECTED.get(name, {}).items():
            assert ours[value] == dims, f"{kind} model, value '{value}'"
    # the exported inference model's output: the formula, where the model only declared a name
    module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"),
                    tmp_path / "eval_model.onnx")
    module.export_model_for_inferencing(tmp_path / "inference.onnx", ["logits"])
    logits = _dims(onnx.load(tmp_path / "inference.onnx").graph.output[0])
    assert logits == EXPECTED.get(name, {}).get("logits", _dims(model.graph.output[0]))


def _dims_of(model, value):
    return symbolic_types(to_graph(model))[value].shape


def test_sums_products_and_unknowns_are_read_back():
    """Concat of two symbolic axes is their sum, a valid 3x3 Conv takes 2 off, a strided one is unknown
    (a floor division), Flatten multiplies, and an input dim declared without a name stays unnamed."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Concat", ["a", "b"], ["cat"], axis=1, name="cat"),
             h.make_node("Conv", ["img", "w"], ["valid"], name="valid"),
             h.make_node("Conv", ["img", "w"], ["strided"], strides=[2, 2], name="strided"),
             h.make_node("Flatten", ["img"], ["flat"], axis=2, name="flat"),
             h.make_node("Relu", ["anon"], ["anon_out"], name="relu")]
    model = _model("m", nodes, [("a", TensorProto.FLOAT, ["N", "A"]), ("b", TensorProto.FLOAT, ["N", "B"]),
                                ("img", TensorProto.FLOAT, ["N", 1, "H", "W"]), ("anon", TensorProto.FLOAT, [None, 4])],
                   [(o, TensorProto.FLOAT, None) for o in ("cat", "valid", "strided", "flat", "anon_out")],
                   [_weight("w", (2, 1, 3, 3), rng)])
    assert _dims_of(model, "cat") == ("N", "A + B")
    assert _dims_of(model, "valid") == ("N", 2, "H - 2", "W - 2")
    assert _dims_of(model, "strided") == ("N", 2, None, None)
    assert _dims_of(model, "flat") == ("N", "H*W")
    assert _dims_of(model, "anon_out") == (None, 4)


def test_two_symbols_tied_by_an_elementwise_op_become_one():
    nodes = [h.make_node("Add", ["x", "y"], ["s"], name="add"), h.make_node("Relu", ["y"], ["r"], name="relu")]
    model = _model("m", nodes, [("x", TensorProto.FLOAT, ["N", "F"]), ("y", TensorProto.FLOAT, ["M", "G"])],
                   [("s", TensorProto.FLOAT, None), ("r", TensorProto.FLOAT, None)], [])
    assert _dims_of(model, "s") == ("N", "F")
    assert _dims_of(model, "r") == ("N", "F")


def test_conflicting_fixed_dims_name_the_node_and_both_shapes(tmp_path):
    model = mlp()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 100      # fixed, and not 784
    with pytest.raises(ShapeError, match=r"'fc1'.*100 vs 784.*float\[\d+,100\], float\[32,784\]"):
        artifacts.generate_artifacts(model, requires_grad=["w1"], loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=tmp_path)
    # a symbol the graph ties to 100 first (a [1, 100] scale) cannot also be 784: the probe sizes are named
    scale = numpy_helper.from_array(np.ones((1, 100), np.float32), "scale")
    model = mlp()
    model.graph.initializer.append(scale)
    model.graph.node.insert(0, h.make_node("Mul", ["x", "scale"], ["xs"], name="scale_mul"))
    model.graph.node[1].input[0] = "xs"
    with pytest.raises(ShapeError, match=r"'fc1'.*100 vs 784.*symbolic dims were typed as batch=\d+"):
        artifacts.generate_artifacts(model, requires_grad=["w1"], loss=artifacts.LossType.CrossEntropyLoss,
                                     artifact_directory=tmp_path)


def test_every_axis_dynamic_against_a_4d_constant_ties_all_four():
    """[a, b, c, d] plus a [2, 3, 4, 5] constant: four symbols tied at one node (single and pair bindings do not
    get past it); the types are what onnx's shape inference says, and the artifacts are made."""
    rng = np.random.default_rng(4)
    nodes = [h.make_node("Add", ["x", "w"], ["s"], name="add"), h.make_node("Relu", ["s"], ["y"], name="relu")]
    model = _model("m", nodes, [("x", TensorProto.FLOAT, ["a", "b", "c", "d"])], [("y", TensorProto.FLOAT, None)],
                   [_weight("w", (2, 3, 4, 5), rng)])
    theirs = {v.name: _dims(v) for v in onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.value_info}
    assert list(_dims_of(model, "s")) == theirs["s"] == [2, 3, 4, 5]
